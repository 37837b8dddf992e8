//! `intact-bench hash --strategies`: whole `intact sum` processes against
//! `xxhsum -H3`, `b3sum` and `sha256sum`, per file size and directory, with
//! the default read strategy, forced reads (`--no-mmap`) and forced
//! mapping (`--mmap`). This is what chose the default rule in
//! intact-digest's `ReadStrategy::Auto`, and what shows it is never slower
//! than the C tools.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::proc_time::{self, Cost};
use crate::runner::{have, median, Cmd};

/// One algorithm and the public tool it is compared with.
struct Pair {
    algo: &'static str,
    tool: &'static str,
    tool_args: &'static [&'static str],
}

const PAIRS: [Pair; 3] = [
    Pair {
        algo: "xxh3",
        tool: "xxhsum",
        tool_args: &["-H3"],
    },
    Pair {
        algo: "blake3",
        tool: "b3sum",
        tool_args: &[],
    },
    Pair {
        algo: "sha256",
        tool: "sha256sum",
        tool_args: &[],
    },
];

/// min, median and max of some runs.
struct Spread {
    min: f64,
    median: f64,
    max: f64,
}

impl Spread {
    fn of(v: impl Iterator<Item = f64>) -> Spread {
        let v: Vec<f64> = v.collect();
        Spread {
            min: v.iter().copied().fold(f64::INFINITY, f64::min),
            max: v.iter().copied().fold(0.0, f64::max),
            median: median(v),
        }
    }
}

/// One line of the summary: the default against the tool.
struct Summary {
    dir: String,
    size: String,
    algo: &'static str,
    tool: String,
    wall: f64,
    cpu: f64,
    read_cpu: f64,
    mmap_cpu: f64,
}

/// Runs the whole matrix and prints one table per cell and a summary.
pub fn run(intact: &Path, dirs: &[PathBuf], sizes: &[u64], runs: usize) -> anyhow::Result<()> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "intact-bench hash --strategies: whole processes, {runs} runs each, interleaved (order reversed every other round), {threads} cores; milliseconds"
    );
    let mut summary = Vec::new();
    for dir in dirs {
        let tmp = tempfile::Builder::new()
            .prefix("intact-bench-")
            .tempdir_in(dir)
            .with_context(|| format!("making a directory in {}", dir.display()))?;
        for &size in sizes {
            let file = tmp.path().join(format!("data-{size}.bin"));
            intact_sample::write_file(&file, size, &mut intact_sample::SampleBytes::new(size))?;
            let f = file.to_str().context("temp path is not UTF-8")?;
            for pair in &PAIRS {
                if !have(pair.tool) {
                    println!("({} not installed: {} skipped)", pair.tool, pair.algo);
                    continue;
                }
                let mut tool_args = pair.tool_args.to_vec();
                tool_args.push(f);
                let tool = Cmd::new(pair.tool, &tool_args);
                let sum = |extra: &[&str]| {
                    let mut a = vec!["sum", "--algo", pair.algo];
                    a.extend_from_slice(extra);
                    a.push(f);
                    Cmd::new(intact, &a)
                };
                let cmds = [tool, sum(&[]), sum(&["--no-mmap"]), sum(&["--mmap"])];
                let labels = [
                    format!("{} {}", pair.tool, pair.tool_args.join(" ")),
                    format!("intact sum -a {}", pair.algo),
                    format!("intact sum -a {} --no-mmap", pair.algo),
                    format!("intact sum -a {} --mmap", pair.algo),
                ];
                super::agree(&cmds[1], &cmds[0])?;
                let costs = interleaved(&cmds, runs)?;
                println!("\n{} in {}, {}:\n", human(size), dir.display(), pair.algo);
                println!("| command | wall ms min | median | max | CPU ms min | median | max | peak RSS MiB | tool/this wall | tool/this CPU |");
                println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
                let spreads: Vec<(Spread, Spread, f64)> = costs
                    .iter()
                    .map(|c| {
                        (
                            Spread::of(c.iter().map(|c| c.wall)),
                            Spread::of(c.iter().map(|c| c.cpu)),
                            median(c.iter().map(|c| c.max_rss_mib).collect()),
                        )
                    })
                    .collect();
                let (tool_wall, tool_cpu) = (spreads[0].0.median, spreads[0].1.median);
                for (label, (w, c, rss)) in labels.iter().zip(&spreads) {
                    println!(
                        "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.0} | {:.2} | {:.2} |",
                        label.trim(),
                        w.min * 1e3,
                        w.median * 1e3,
                        w.max * 1e3,
                        c.min * 1e3,
                        c.median * 1e3,
                        c.max * 1e3,
                        rss,
                        tool_wall / w.median,
                        tool_cpu / c.median.max(1e-6)
                    );
                }
                summary.push(Summary {
                    dir: dir.display().to_string(),
                    size: human(size),
                    algo: pair.algo,
                    tool: labels[0].trim().to_string(),
                    wall: tool_wall / spreads[1].0.median,
                    cpu: tool_cpu / spreads[1].1.median.max(1e-6),
                    read_cpu: tool_cpu / spreads[2].1.median.max(1e-6),
                    mmap_cpu: tool_cpu / spreads[3].1.median.max(1e-6),
                });
            }
            std::fs::remove_file(&file)?;
        }
    }
    println!("\nSummary, ratio = tool median / intact median (> 1: intact is faster):\n");
    println!("| dir | size | algorithm | tool | default: wall | default: CPU | --no-mmap: CPU | --mmap: CPU |");
    println!("|---|---:|---|---|---:|---:|---:|---:|");
    for s in &summary {
        println!(
            "| {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
            s.dir, s.size, s.algo, s.tool, s.wall, s.cpu, s.read_cpu, s.mmap_cpu
        );
    }
    println!("\nCommand: cargo run --release -p intact-bench -- hash --strategies");
    Ok(())
}

/// Runs every command `runs` times, in order on even rounds and in reverse
/// on odd ones, so drifting load hits all alike; returns the costs per command.
fn interleaved(cmds: &[Cmd], runs: usize) -> anyhow::Result<Vec<Vec<Cost>>> {
    let mut costs = vec![Vec::with_capacity(runs); cmds.len()];
    for round in 0..runs {
        let order: Vec<usize> = if round % 2 == 0 {
            (0..cmds.len()).collect()
        } else {
            (0..cmds.len()).rev().collect()
        };
        for i in order {
            costs[i].push(proc_time::run(&cmds[i])?);
        }
    }
    Ok(costs)
}

/// `4 KiB`, `64 MiB`, `1 GiB`.
fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}
