//! `intact-bench scrub`: `intact scrub` of a cataloged tree on a cold
//! cache against the device's own limit (a direct read of the same files,
//! in the same run), `b3sum` and `sha256sum -c` of the same files; and
//! the cost the catalog adds to a `riva` transfer (the same copy with and
//! without the page CRC-32C it computes). Runs interleaved, min / median
//! / max of wall seconds, median CPU seconds, ratios.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context};

use crate::loop_ext4::LoopExt4;
use crate::runner::{children_cpu, have, intact_binary, interleaved, self_cpu, Quartiles, Spread};
use crate::transfer::{copy_state_home, drop_caches, fresh, make_dataset, run_cmd, Dataset};

#[derive(clap::Args)]
pub struct ScrubArgs {
    /// Runs per command (interleaved).
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// Directory on the disk to measure in (a RAM-backed ext4 is measured
    /// too, unless --no-ram).
    #[arg(long, default_value = "/var/tmp/intact-bench-scrub")]
    dir: PathBuf,
    /// Skip the RAM-backed ext4.
    #[arg(long)]
    no_ram: bool,
    /// Large files: this many of 256 MiB.
    #[arg(long, default_value_t = 4)]
    large_files: u64,
    /// Small files: this many of 16 KiB.
    #[arg(long, default_value_t = 20_000)]
    small_files: u64,
    /// Measure only the catalog's cost in a riva copy (not the scrubs).
    #[arg(long)]
    catalog_cost_only: bool,
}

pub fn run(a: &ScrubArgs) -> anyhow::Result<()> {
    crate::runner::stop_on_signals();
    for tool in ["b3sum", "sha256sum", "dd"] {
        if !have(tool) {
            bail!("{tool} is needed (apt install b3sum coreutils)");
        }
    }
    if !drop_caches() {
        bail!("dropping the page cache needs root: the comparison is on a cold cache");
    }
    let intact = intact_binary()?;
    let sets = [
        Dataset {
            name: "large",
            files: a.large_files,
            file_size: 256 << 20,
        },
        Dataset {
            name: "small",
            files: a.small_files,
            file_size: 16 << 10,
        },
    ];
    println!(
        "# intact-bench scrub ({} runs each, interleaved, cold cache)",
        a.runs
    );
    println!("# {}", crate::runner::command_line());
    let mut places = vec![("disk", a.dir.clone(), None)];
    if !a.no_ram {
        // Sources and cataloged copies of both sets, and the catalog-cost copy.
        let mib = (a.large_files * 256 * 3 + a.small_files * 16 * 2 / 1024) + 1024;
        // (The RAM ext4 is made even for the catalog's cost alone: that
        // copy is measured there.)
        let ram = LoopExt4::in_ram(mib)?;
        places.push(("RAM ext4", ram.mount.clone(), Some(ram)));
    }
    for (place, dir, _keep) in places.iter().filter(|_| !a.catalog_cost_only) {
        for d in &sets {
            crate::runner::check_stop()?;
            measure(&intact, place, dir, d, a.runs)?;
        }
    }
    catalog_cost(&places[places.len() - 1].1, &sets[0], a.runs)
}

/// The cataloged tree of `d` under `dir` (made once per place).
fn prepare(intact: &Path, dir: &Path, d: &Dataset) -> anyhow::Result<(PathBuf, PathBuf)> {
    let src = dir.join(format!("src-{}", d.name));
    let root = dir.join(format!("root-{}", d.name));
    make_dataset(&src, d)?;
    fresh(&root)?;
    run_cmd(
        Command::new(intact)
            .env("XDG_STATE_HOME", copy_state_home(&root))
            .args(["copy", "--verify", "riva"])
            .arg(format!("{}/", src.display()))
            .arg(&root),
    )?;
    let manifest = dir.join(format!("sha256-{}.txt", d.name));
    let out = Command::new("sh")
        .arg("-c")
        .arg("find . -type f -print0 | xargs -0 sha256sum")
        .current_dir(&root)
        .output()?;
    std::fs::write(&manifest, out.stdout)?;
    Ok((root, manifest))
}

fn measure(intact: &Path, place: &str, dir: &Path, d: &Dataset, runs: usize) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let (root, manifest) = prepare(intact, dir, d)?;
    let bytes = d.files * d.file_size;
    let state = copy_state_home(&root);
    let mut cmds: Vec<(&str, Command)> = Vec::new();
    let mut scrub = Command::new(intact);
    scrub
        .env("XDG_STATE_HOME", &state)
        .args(["scrub", "--restart"])
        .arg(&root);
    cmds.push(("intact scrub", scrub));
    let mut direct = Command::new("sh");
    direct.arg("-c").arg(
        "find . -type f -print0 | xargs -0 -P1 -n1 sh -c 'dd if=\"$0\" of=/dev/null bs=4M iflag=direct status=none'",
    );
    direct.current_dir(&root);
    if d.name == "large" {
        cmds.push(("direct read (device limit)", direct));
    }
    let mut b3 = Command::new("sh");
    b3.arg("-c")
        .arg("find . -type f -print0 | xargs -0 b3sum > /dev/null")
        .current_dir(&root);
    cmds.push(("b3sum", b3));
    let mut sha = Command::new("sha256sum");
    sha.args(["-c", "--quiet"])
        .arg(&manifest)
        .current_dir(&root);
    cmds.push(("sha256sum -c", sha));
    let samples = interleaved(cmds.len(), runs, |i| {
        drop_caches();
        let cpu0 = children_cpu();
        let t0 = Instant::now();
        let st = cmds[i].1.output().with_context(|| cmds[i].0.to_string())?;
        let wall = t0.elapsed().as_secs_f64();
        if !st.status.success() {
            bail!(
                "{} failed: {}{}",
                cmds[i].0,
                String::from_utf8_lossy(&st.stdout),
                String::from_utf8_lossy(&st.stderr)
            );
        }
        Ok((wall, children_cpu() - cpu0))
    })?;
    println!();
    println!(
        "## {place}, {}: {} files × {} KiB = {:.0} MiB",
        d.name,
        d.files,
        d.file_size >> 10,
        bytes as f64 / (1 << 20) as f64
    );
    println!("| tool | wall s min / median / max | CPU s median | MiB/s (median) | intact scrub's speed ÷ this |");
    println!("|---|---|---|---|---|");
    let med = |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| {
        Spread::of(&v.iter().map(f).collect::<Vec<_>>()).median
    };
    let intact_wall = med(&samples[0], |s| s.0);
    for ((name, _), s) in cmds.iter().zip(&samples) {
        let wall = Spread::of(&s.iter().map(|x| x.0).collect::<Vec<_>>());
        let cpu = med(s, |x| x.1);
        println!(
            "| {name} | {wall} | {cpu:.2} | {:.0} | {:.2} |",
            bytes as f64 / (1 << 20) as f64 / wall.median,
            wall.median / intact_wall
        );
    }
    Ok(())
}

/// The catalog's cost in a `riva` transfer, A/B: the same copy in this
/// process with the receiver's page CRC-32C (what the catalog adds to
/// each block; its rows grow by 4 bytes per 4 KiB) and without them (a
/// control only this benchmark's build has), interleaved, on a fresh
/// root each time; CPU seconds of this process over the copy.
fn catalog_cost(dir: &Path, d: &Dataset, runs: usize) -> anyhow::Result<()> {
    use intact_transfer::{copy, open_or_create_catalog, CopyOptions, VerifyMode};
    let src = dir.join(format!("src-{}", d.name));
    make_dataset(&src, d)?;
    let dst = dir.join("dst-cost");
    let bytes = d.files * d.file_size;
    let from = PathBuf::from(format!("{}/", src.display()));
    let cases = ["riva with the catalog's page CRCs", "riva without them"];
    let mut stage_secs = vec![Vec::new(); cases.len()];
    let samples = interleaved(cases.len(), runs, |i| {
        fresh(&dst)?;
        drop(open_or_create_catalog(&dst)?);
        drop_caches();
        let opts = CopyOptions {
            verify: VerifyMode::Riva,
            without_page_crcs: i == 1,
            ..CopyOptions::default()
        };
        let cpu0 = self_cpu();
        let t0 = Instant::now();
        let r = copy(std::slice::from_ref(&from), &dst, &opts, &|_| {})?;
        let sample = (t0.elapsed().as_secs_f64(), self_cpu() - cpu0);
        let check: f64 = r
            .stages
            .iter()
            .filter(|t| t.stage == CATALOG_STAGE)
            .map(|t| t.seconds)
            .sum();
        stage_secs[i].push(check);
        if r.failed > 0 {
            bail!("{}: {} file(s) failed", cases[i], r.failed);
        }
        Ok(sample)
    })?;
    println!();
    println!(
        "## the catalog's cost in riva ({:.0} MiB copied on the RAM ext4 if measured, else the disk; A/B in one process)",
        bytes as f64 / (1 << 20) as f64
    );
    println!("| copy | CPU s min / median / max | wall s min / median / max |");
    println!("|---|---|---|");
    let spread = |i: usize, f: fn(&(f64, f64)) -> f64| {
        Spread::of(&samples[i].iter().map(f).collect::<Vec<_>>())
    };
    for (i, name) in cases.iter().enumerate() {
        println!(
            "| {name} | {} | {} |",
            spread(i, |s| s.1),
            spread(i, |s| s.0)
        );
    }
    let (with, without) = (spread(0, |s| s.1).median, spread(1, |s| s.1).median);
    let (wwith, wwithout) = (spread(0, |s| s.0).median, spread(1, |s| s.0).median);
    println!(
        "catalog page CRCs: {:+.1}% CPU, {:+.1}% wall (medians; target: at most +3%)",
        100.0 * (with - without) / without,
        100.0 * (wwith - wwithout) / wwithout
    );
    // Each round ran both copies back to back: the ratio within a round
    // leaves out the machine's drift between rounds, which is larger
    // than the effect measured.
    let paired = |f: fn(&(f64, f64)) -> f64| {
        let r: Vec<f64> = samples[0]
            .iter()
            .zip(&samples[1])
            .map(|(a, b)| 100.0 * (f(a) / f(b) - 1.0))
            .collect();
        Quartiles::of(&r)
    };
    println!(
        "paired by round: {} % CPU, {} % wall (quartiles of the rounds' differences)",
        paired(|s| s.1),
        paired(|s| s.0)
    );
    // The page CRCs are computed in the check stage only, which is pure
    // computation on a block in memory: its time (thread-seconds) is the
    // catalog's own cost, measured inside the same copies without the
    // rest's noise (eviction, device reads, scheduling of the other
    // threads).
    let extra: Vec<f64> = stage_secs[0]
        .iter()
        .zip(&stage_secs[1])
        .zip(&samples[1])
        .map(|((with, without), base)| 100.0 * (with - without) / base.1)
        .collect();
    println!(
        "in the check stage, where the page CRCs are computed: {} % of the copy's CPU without them (quartiles of the rounds; target: at most +3%)",
        Quartiles::of(&extra)
    );
    Ok(())
}

/// The stage of a receiver the catalog's page CRCs are computed in: the
/// block's check. (They are recorded in the journal stage too, 4 bytes a
/// page in the block's row, but that stage's time is mostly waiting for
/// the journal's lock and commits, which the rows' size does not change
/// measurably and which would drown the CRCs' cost in its spread.)
const CATALOG_STAGE: intact_transfer::Stage = intact_transfer::Stage::Check;
