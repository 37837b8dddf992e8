//! `intact-bench hash`: intact sum vs b3sum, xxhsum, openssl, md5sum;
//! with `--strategies`, whole processes per file size, directory and read
//! strategy (see [`strategies`]).

mod proc_time;
mod strategies;

use std::path::PathBuf;

use crate::runner::{have, intact_binary, medians, Cmd};
use anyhow::{bail, Context};

#[derive(clap::Args)]
pub struct HashArgs {
    /// Size of the test file, in GiB.
    #[arg(long, default_value_t = 2)]
    size_gib: u64,
    /// Runs per measurement (the median is reported) [default: 5; 7 with --strategies].
    #[arg(long)]
    runs: Option<usize>,
    /// Directory for the test file (tmpfs, so the disk is not measured).
    #[arg(long, default_value = "/dev/shm")]
    dir: PathBuf,
    /// Instead: whole `intact sum` processes (default, --no-mmap, --mmap)
    /// against xxhsum -H3, b3sum and sha256sum, per size and directory.
    #[arg(long)]
    strategies: bool,
    /// With --strategies: the directories (file systems) to measure in.
    #[arg(long, value_delimiter = ',', default_value = "/dev/shm,/var/tmp")]
    dirs: Vec<PathBuf>,
    /// With --strategies: file sizes in bytes (K, M, G suffixes: powers of 1024).
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "4K,1M,64M,1G")]
    sizes: Vec<u64>,
    /// Measure this intact binary instead of building target/release/intact
    /// (e.g. the static build of `cargo static-release`).
    #[arg(long, value_name = "PATH")]
    intact: Option<PathBuf>,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let (num, shift) = match s.trim().to_ascii_uppercase() {
        t if t.ends_with('K') => (t[..t.len() - 1].to_string(), 10),
        t if t.ends_with('M') => (t[..t.len() - 1].to_string(), 20),
        t if t.ends_with('G') => (t[..t.len() - 1].to_string(), 30),
        t => (t, 0),
    };
    num.parse::<u64>()
        .map(|n| n << shift)
        .map_err(|_| format!("'{s}' is not a size (examples: 4K, 1M, 1G)"))
}

/// One row: an algorithm, how intact computes it, and the public tool.
struct Row {
    algo: &'static str,
    tool_single: Option<Cmd>,
    tool_all: Option<Cmd>,
    /// Extracts the hex digest from the tool's output, to prove both agree.
    tool_name: &'static str,
}

pub fn run(a: &HashArgs) -> anyhow::Result<()> {
    let intact = match &a.intact {
        Some(path) if path.is_file() => path.clone(),
        Some(path) => bail!("--intact {}: no such file", path.display()),
        None => intact_binary()?,
    };
    if a.strategies {
        return strategies::run(&intact, &a.dirs, &a.sizes, a.runs.unwrap_or(7));
    }
    let runs = a.runs.unwrap_or(5);
    let dir = tempfile::Builder::new()
        .prefix("intact-bench-")
        .tempdir_in(&a.dir)
        .with_context(|| format!("making a directory in {}", a.dir.display()))?;
    let file = dir.path().join("data.bin");
    intact_sample::write_file(
        &file,
        a.size_gib << 30,
        &mut intact_sample::SampleBytes::new(1),
    )?;
    let f = file.to_str().context("temp path is not UTF-8")?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());

    let tool = |p: &str, args: &[&str]| have(p).then(|| Cmd::new(p, args));
    let rows = [
        Row {
            algo: "blake3",
            tool_single: tool("b3sum", &["--num-threads", "1", f]),
            tool_all: tool("b3sum", &[f]),
            tool_name: "b3sum",
        },
        Row {
            algo: "xxh3",
            tool_single: tool("xxhsum", &["-H3", f]),
            tool_all: tool("xxhsum", &["-H3", f]),
            tool_name: "xxhsum -H3",
        },
        Row {
            algo: "xxh128",
            tool_single: tool("xxhsum", &["-H2", f]),
            tool_all: tool("xxhsum", &["-H2", f]),
            tool_name: "xxhsum -H2",
        },
        Row {
            algo: "sha256",
            tool_single: tool("openssl", &["dgst", "-sha256", f]),
            tool_all: tool("openssl", &["dgst", "-sha256", f]),
            tool_name: "openssl dgst -sha256",
        },
        Row {
            algo: "sha1",
            tool_single: tool("openssl", &["dgst", "-sha1", f]),
            tool_all: tool("openssl", &["dgst", "-sha1", f]),
            tool_name: "openssl dgst -sha1",
        },
        Row {
            algo: "md5",
            tool_single: tool("md5sum", &[f]),
            tool_all: tool("md5sum", &[f]),
            tool_name: "md5sum",
        },
        Row {
            algo: "crc32c",
            tool_single: None,
            tool_all: None,
            tool_name: "(no common tool)",
        },
        Row {
            algo: "adler32",
            tool_single: None,
            tool_all: None,
            tool_name: "(no common tool)",
        },
    ];

    let gib = a.size_gib as f64;
    let cat = Cmd::new("cat", &[f]);
    let cat_s = medians(&[&cat], runs)?[0];
    println!(
        "intact-bench hash: {} GiB file in {}, {} cores, median of {} runs; GiB/s (higher is better)",
        a.size_gib,
        a.dir.display(),
        threads,
        runs
    );
    println!("reference: cat {:.2} GiB/s\n", gib / cat_s);
    println!(
        "| algorithm | tool | 1 thread: intact | tool | ratio | all threads: intact | tool | ratio |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for row in &rows {
        let single = Cmd::new(&intact, &["sum", "--algo", row.algo, "--jobs", "1", f]);
        let all = Cmd::new(&intact, &["sum", "--algo", row.algo, f]);
        if let Some(t) = &row.tool_single {
            agree(&single, t)?;
        }
        let mut line = format!("| {} | {} |", row.algo, row.tool_name);
        for (ours, theirs) in [(&single, &row.tool_single), (&all, &row.tool_all)] {
            let mut cmds = vec![ours];
            cmds.extend(theirs.iter());
            let m = medians(&cmds, runs)?;
            let rate = |s: f64| gib / s;
            match m.get(1) {
                Some(&t) => line.push_str(&format!(
                    " {:.2} | {:.2} | {:.2} |",
                    rate(m[0]),
                    rate(t),
                    t / m[0]
                )),
                None => line.push_str(&format!(" {:.2} | – | – |", rate(m[0]))),
            }
        }
        println!("{line}");
    }
    println!("\nratio = tool time / intact time (> 1: intact is faster). Command: cargo run --release -p intact-bench -- hash");
    Ok(())
}

/// Checks that intact and the tool print the same digest for the file.
pub(crate) fn agree(intact: &Cmd, tool: &Cmd) -> anyhow::Result<()> {
    let ours = first_hex(&intact.output()?);
    let theirs = first_hex(&tool.output()?);
    if ours.is_none() || ours != theirs {
        bail!(
            "digests disagree: {} gave {:?}, {} gave {:?}",
            intact.display(),
            ours,
            tool.display(),
            theirs
        );
    }
    Ok(())
}

/// The longest run of hex digits in the output: the digest, whatever the line format.
fn first_hex(out: &str) -> Option<String> {
    out.split(|c: char| !c.is_ascii_hexdigit())
        .filter(|w| w.len() >= 8)
        .max_by_key(|w| w.len())
        .map(str::to_ascii_lowercase)
}
