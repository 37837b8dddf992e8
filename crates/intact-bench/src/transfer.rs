//! `intact-bench transfer`: intact send/copy against a raw pipe (the
//! baseline: one pass, one socket, fsync at the receiving end; see
//! [`crate::pipe`]), cp, rsync and rsync over ssh (default cipher and
//! AES-128-GCM), on the same datasets in the same run, interleaved, with
//! the page cache dropped before every run. Each timed run ends with
//! `sync`, so tools that do not fsync (cp, rsync) are charged for their
//! writeback as intact and the raw pipe are for their fsyncs. Wall time
//! and CPU time (user + system of the tool's processes) are both kept;
//! the tables quote CPU per GiB or per 1,000 files, and every tool's
//! medians against rsync over ssh, cp -r and the raw pipe. After each run
//! (untimed) the destination must hold the dataset's files and bytes, so a
//! tool that left files out is an error, not a fast row. Each dataset's
//! tables end with intact's per-stage profile ([`stages`]). `--warm` runs
//! the per-file comparison with the source in the page cache instead
//! ([`warm`]).

pub(crate) mod datasets;
pub(crate) mod sshd;
mod stages;
mod table;
mod tools;
mod warm;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context};

pub(crate) use datasets::{make_dataset, Dataset};

use crate::loop_ext4::LoopExt4;
use crate::runner::{command_line, have, intact_binary, interleaved, stop_on_signals};
use datasets::{Shape, MIB};
use sshd::Sshd;
use table::{render, Baseline, Row, Style, Work};
use tools::Paths;

#[derive(clap::Args)]
pub struct TransferArgs {
    /// Directory for datasets and destinations (on a real disk, not tmpfs).
    #[arg(long, default_value = "/var/tmp/intact-bench")]
    dir: PathBuf,
    /// Runs per tool, interleaved in alternating order (min, median and
    /// max are reported).
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// Scale of the datasets' file counts and large sizes (1.0: full size;
    /// every group keeps at least one file).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Only these datasets, comma-separated: large (one 4 GiB file),
    /// medium (2,000 × 1 MiB), small (20,000 × 16 KiB), dirs (5,000 ×
    /// 16 KiB in 50 directories), mixed (a 1 GiB file, 200 × 1 MiB,
    /// 5,000 × 16 KiB, 50 empty and 5 one-byte files, in nested
    /// directories). Default: all five; with --warm: small, dirs, mixed.
    #[arg(long, value_delimiter = ',')]
    datasets: Vec<String>,
    /// Leave out rsync over ssh.
    #[arg(long)]
    no_ssh: bool,
    /// Measure on a RAM-backed ext4 (a loop device over a file in
    /// /dev/shm, made and removed by this run) instead of --dir.
    #[arg(long)]
    ram_ext4: bool,
    /// Measure on a fresh, journaled ext4 on the disk instead of --dir
    /// itself: a loop device doing direct I/O over a file in --dir, made
    /// and removed by this run (see the note the table prints when --dir
    /// is an ext4 without a journal).
    #[arg(long, conflicts_with = "ram_ext4")]
    disk_ext4: bool,
    /// Also run `intact send --verify none` with a key: frames encrypted,
    /// and frames authenticated only (`serve --no-encrypt`), to measure
    /// what sealing costs against the keyless (plain) run.
    #[arg(long)]
    keyed: bool,
    /// Warm cache instead: the source is read through before every run and
    /// the cache never dropped; intact copy and send with --verify none
    /// against cp -r and rsync -a (local), in files per second. Isolates
    /// the tools' own per-file cost from the disk (use with --ram-ext4 to
    /// take the destination's device out too).
    #[arg(long, conflicts_with = "keyed")]
    warm: bool,
    /// Instead of the tools: intact copy and intact send (riva) at each of
    /// these block sizes, e.g. 1MiB,4MiB,16MiB,auto; ratios against copy
    /// and send at the default, 4MiB (give it in the list).
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["warm", "keyed"])]
    block_sizes: Vec<String>,
}

/// What every cold table says about encryption.
const ENCRYPTION_NOTE: &str = "rsync over ssh encrypts; intact send encrypts only with a key \
     (rows marked \"key\"; the others are keyless: plain frames); the raw pipe does not";

/// The cold tables' ratio columns.
const BASELINES: [Baseline; 3] = [
    Baseline {
        label: "rsync over ssh",
        prefix: "rsync -a -e ssh (",
    },
    Baseline {
        label: "cp -r",
        prefix: "cp -r",
    },
    Baseline {
        label: "raw pipe",
        prefix: "raw pipe",
    },
];

pub fn run(a: &TransferArgs) -> anyhow::Result<()> {
    stop_on_signals();
    if a.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let all = datasets::standard(a.scale);
    let chosen = choose(&all, &a.datasets, a.warm)?;
    let intact = intact_binary()?;
    for need in ["cp", "rsync"] {
        if !have(need) {
            bail!("{need} is not installed: run scripts/setup --bench");
        }
    }
    let own = match (a.ram_ext4, a.disk_ext4) {
        (true, _) => Some(LoopExt4::in_ram(ram_mib(&chosen))?),
        (_, true) => Some(LoopExt4::on_disk(&a.dir, ram_mib(&chosen))?),
        _ => None,
    };
    let dir = own
        .as_ref()
        .map_or(a.dir.clone(), |r| r.mount.join("bench"));
    std::fs::create_dir_all(&dir)?;
    let storage = match &own {
        Some(_) if a.ram_ext4 => "a RAM-backed ext4 (loop device over /dev/shm)".to_string(),
        Some(_) => format!(
            "a fresh journaled ext4 on the disk (loop device with direct I/O over a file in {})",
            a.dir.display()
        ),
        None => format!("the disk ({}, {})", a.dir.display(), fs_type(&dir)),
    };
    let no_journal = own.is_none() && ext4_without_journal(&dir);
    let dst = dir.join("dst");
    if a.warm {
        println!(
            "intact-bench transfer --warm: on {storage}, scale {}, {} interleaved runs per tool (alternating order), \
             source read through before each run, page cache never dropped, each run ends with sync",
            a.scale, a.runs
        );
        if no_journal {
            println!("{NO_JOURNAL_NOTE}");
        }
        for shape in chosen {
            let src = made_source(&dir, shape)?;
            let p = Paths {
                intact: &intact,
                src: &src,
                dst: &dst,
            };
            warm::run_dataset(p, shape, a.runs, &storage)?;
        }
        footer(
            a.runs,
            "files/s = files / wall seconds (min from the slowest run, max from the fastest).",
        );
        return Ok(());
    }
    // The sshd's own files stay on the disk: only the data moves to RAM.
    let ssh = if a.no_ssh {
        None
    } else {
        Some(Sshd::start(&a.dir.join("sshd"))?)
    };
    let key = if a.keyed {
        std::fs::create_dir_all(&a.dir)?;
        let k = a.dir.join("bench.key");
        run_cmd(Command::new(&intact).arg("keygen").arg("--force").arg(&k))?;
        Some(k)
    } else {
        None
    };
    let can_drop = drop_caches();
    println!(
        "intact-bench transfer: on {storage}, scale {}, {} interleaved runs per tool (alternating order), page cache {}, each run ends with sync",
        a.scale,
        a.runs,
        if can_drop { "dropped before each run" } else { "NOT dropped (not root)" }
    );
    if no_journal {
        println!("{NO_JOURNAL_NOTE}");
    }
    for shape in chosen {
        let src = made_source(&dir, shape)?;
        let p = Paths {
            intact: &intact,
            src: &src,
            dst: &dst,
        };
        let tools = if a.block_sizes.is_empty() {
            tools::cold(p, key.as_deref(), ssh.as_ref())
        } else {
            tools::block_sizes(p, &a.block_sizes)
        };
        let baselines: &[Baseline] = if a.block_sizes.is_empty() {
            &BASELINES
        } else {
            &tools::BLOCK_BASELINES
        };
        let rows = measure(&tools, a.runs, shape, &dst, || {
            drop_caches();
            Ok(())
        })?;
        println!(
            "\n{}: {}, {:.0} MiB; on {storage}\n",
            shape.name,
            shape.describe(),
            shape.bytes() as f64 / MIB as f64
        );
        print!(
            "{}",
            render(&rows, &Work::of(shape), baselines, Style::Cold)
        );
        println!("\n{ENCRYPTION_NOTE}.");
        stages::print(p, shape)?;
    }
    footer(
        a.runs,
        "MiB/s and files/s at the median wall time; \"vs rsync over ssh\" is ssh's default cipher.",
    );
    Ok(())
}

/// `shape`'s source tree under `dir` (made unless it is there already).
fn made_source(dir: &Path, shape: &Shape) -> anyhow::Result<PathBuf> {
    let src = dir.join(format!("src-{}", shape.name)).join("data");
    shape.make(&src)?;
    Ok(src)
}

/// Runs `tools` `runs` times each, interleaved, every run into a fresh
/// `dst` after `before` (untimed), and checks each copy holds `shape`'s
/// files and bytes; one row per tool.
fn measure(
    tools: &[tools::Tool<'_>],
    runs: usize,
    shape: &Shape,
    dst: &Path,
    mut before: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Row>> {
    let samples = interleaved(tools.len(), runs, |i| {
        fresh(dst)?;
        before()?;
        let sample = (tools[i].1)().with_context(|| tools[i].0.clone())?;
        shape
            .check_copy(&dst.join("data"))
            .with_context(|| tools[i].0.clone())?;
        Ok(sample)
    })?;
    fresh(dst)?;
    Ok(tools
        .iter()
        .zip(&samples)
        .map(|(t, s)| Row::of(&t.0, s))
        .collect())
}

/// The notes under the last table.
fn footer(runs: usize, extra: &str) {
    println!("\nwall and CPU: min / median / max seconds of {runs} runs; CPU = user + system seconds of the tool's processes (intact serve's included, and for rsync over ssh the sshd's sessions; kernel writeback threads are nobody's).");
    println!("CPU s per GiB (large, medium) or per 1,000 files (small, dirs, mixed): the median CPU seconds over the dataset's GiB or thousands of files.");
    println!("ratio = the other tool's median / this tool's median (> 1: this tool is faster or cheaper).");
    println!("{extra}");
    println!("command: {}", command_line());
}

/// The datasets named (all, or the warm default, when none are), in
/// their standard order; an unknown name is an error.
fn choose<'a>(all: &'a [Shape], names: &[String], warm: bool) -> anyhow::Result<Vec<&'a Shape>> {
    for n in names {
        if !all.iter().any(|s| s.name == n) {
            bail!(
                "unknown dataset {n:?} (known: {})",
                datasets::NAMES.join(", ")
            );
        }
    }
    Ok(all
        .iter()
        .filter(|s| match names.is_empty() {
            true if warm => datasets::WARM_DEFAULT.contains(&s.name),
            true => true,
            false => names.iter().any(|n| n == s.name),
        })
        .collect())
}

/// MiB for a RAM-backed ext4 holding `shapes`' sources, one destination
/// as large as the largest, and ext4's metadata (an inode and a block
/// for each file and directory, source and destination).
fn ram_mib(shapes: &[&Shape]) -> u64 {
    let bytes: u64 = shapes.iter().map(|s| s.bytes()).sum();
    let largest = shapes.iter().map(|s| s.bytes()).max().unwrap_or(0);
    let entries: u64 = shapes.iter().map(|s| s.files() + s.dirs()).sum();
    (bytes + largest) / MIB + entries * 2 * 8 / 1024 + 512
}

/// Printed when the destination is an ext4 without a journal.
const NO_JOURNAL_NOTE: &str = "note: the destination is on an ext4 without a journal. Such an \
     ext4 does not reuse an inode deleted in the last 60 s (360 s while its inode table block is \
     dirty) and scans past each one when it allocates: every run here first deletes the copy \
     the run before made, so every tool's file creation pays that scan (seen: a fifth of \
     `intact copy`'s CPU time on 20,000 files). --disk-ext4 measures on a fresh journaled ext4 \
     on the same disk instead.";

/// Whether `dir` is on an ext4 that has no journal (ext4's sysfs says
/// `<none>` for its journal thread).
fn ext4_without_journal(dir: &Path) -> bool {
    let Ok(out) = Command::new("findmnt")
        .args(["-n", "-o", "SOURCE,FSTYPE", "-T"])
        .arg(dir)
        .output()
    else {
        return false;
    };
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let mut parts = line.split_whitespace();
    let (Some(source), Some("ext4")) = (parts.next(), parts.next()) else {
        return false;
    };
    let Some(name) = Path::new(source).file_name() else {
        return false;
    };
    let task = Path::new("/sys/fs/ext4").join(name).join("journal_task");
    std::fs::read_to_string(task).is_ok_and(|t| t.trim() == "<none>")
}

/// The file system type `dir` is on ("ext4"), or "?".
fn fs_type(dir: &Path) -> String {
    Command::new("findmnt")
        .args(["-n", "-o", "FSTYPE", "-T"])
        .arg(dir)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "?".into())
}

/// An empty `dst`, with no state of an earlier `intact copy` into it
/// (its journal lives in [`copy_state_home`], not in `dst`), so that every
/// run starts as the first did.
pub(crate) fn fresh(dst: &Path) -> anyhow::Result<()> {
    for dir in [dst.to_path_buf(), copy_state_home(dst)] {
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
    }
    std::fs::create_dir_all(dst)?;
    run_cmd(&mut Command::new("sync"))
}

/// The `XDG_STATE_HOME` the benchmark's `intact copy` into `dst` runs
/// with: beside `dst`, removed by [`fresh`] (not the user's own).
pub(crate) fn copy_state_home(dst: &Path) -> std::path::PathBuf {
    dst.with_extension("state")
}

/// Writes back dirty pages and drops the page cache; false if not allowed.
pub(crate) fn drop_caches() -> bool {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", b"3\n").is_ok()
}

pub(crate) fn run_cmd(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).output()?;
    if !out.status.success() {
        bail!("{:?} failed: {}", cmd, String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// One timed run of a peer's client `cmd`, synced after; its CPU also
/// counts what `server_cpu` (a server's CPU seconds so far, settled) grew
/// by meanwhile.
pub(crate) fn timed_run(
    cmd: &mut Command,
    server_cpu: impl Fn() -> anyhow::Result<f64>,
) -> anyhow::Result<crate::runner::Sample> {
    let before = server_cpu()?;
    let mut m = crate::runner::Meter::start();
    run_cmd(cmd)?;
    run_cmd(&mut Command::new("sync"))?;
    m.stop();
    let after = server_cpu()?;
    Ok(m.finish(after - before))
}

/// Starts an `intact serve` command line; returns it and the address it
/// printed.
pub(crate) fn start_server(cmd: &mut Command) -> anyhow::Result<(Child, String)> {
    let mut server = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn()?;
    let mut line = String::new();
    BufReader::new(server.stdout.take().expect("piped")).read_line(&mut line)?;
    let addr = line
        .split("listening on ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .context("no address from intact serve")?
        .to_string();
    Ok((server, addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datasets_default_to_all_or_to_the_warm_set() {
        let all = datasets::standard(0.01);
        let names = |v: Vec<&Shape>| v.iter().map(|s| s.name).collect::<Vec<_>>();
        assert_eq!(names(choose(&all, &[], false).unwrap()), datasets::NAMES);
        assert_eq!(
            names(choose(&all, &[], true).unwrap()),
            datasets::WARM_DEFAULT
        );
        let picked = choose(&all, &["mixed".into(), "large".into()], true).unwrap();
        assert_eq!(names(picked), ["large", "mixed"]);
        assert!(choose(&all, &["huge".into()], false).is_err());
    }

    #[test]
    fn ram_disk_holds_sources_a_destination_and_metadata() {
        let all = datasets::standard(1.0);
        let small: Vec<&Shape> = all.iter().filter(|s| s.name == "small").collect();
        // 312.5 MiB twice, 20,020 entries × 16 KiB twice over, 512 spare.
        assert_eq!(ram_mib(&small), 625 + 20_020 * 16 / 1024 + 512);
    }
}
