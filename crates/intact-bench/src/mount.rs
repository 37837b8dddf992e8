//! `intact-bench mount`: fio on `intact mount`, on the same FUSE code with
//! checking turned off (so the checksums' cost is separated from FUSE's
//! own), and on the plain directory; sequential and random, read and
//! write, 4 KiB and 4 MiB requests, aligned and unaligned (PVFS §5's
//! table). Each configuration has its own copy of the file, so that one's
//! writes never leave another's catalog describing other bytes.
//!
//! Both mounts run in this process (the no-check one is not something
//! the `intact` binary offers), so this process's CPU time around a run
//! is the mount daemon's. FUSE runs are O_DIRECT (`direct=1`): each
//! request reaches the daemon as fio made it, unaligned ones too. The
//! plain directory runs O_DIRECT where the kernel allows it (aligned),
//! buffered otherwise, and say so.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use intact_mount::{MountOptions, Switch};

use crate::loop_ext4::LoopExt4;
use crate::runner::{have, interleaved, self_cpu, Spread};

#[derive(clap::Args)]
pub struct MountArgs {
    /// Runs per configuration and job (interleaved).
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// Directory on the disk to measure in (a RAM-backed ext4 is measured
    /// too, unless --no-ram).
    #[arg(long, default_value = "/var/tmp/intact-bench-mount")]
    dir: PathBuf,
    /// Skip the RAM-backed ext4.
    #[arg(long)]
    no_ram: bool,
    /// Skip the disk.
    #[arg(long)]
    no_disk: bool,
    /// Size of the file fio works on, MiB.
    #[arg(long, default_value_t = 256)]
    file_mib: u64,
    /// Seconds each fio run lasts.
    #[arg(long, default_value_t = 2)]
    runtime: u64,
    /// Only jobs whose name contains this.
    #[arg(long)]
    only: Option<String>,
}

/// One fio job: its name, its arguments, whether it writes, whether its
/// offsets are unaligned.
struct Job {
    name: &'static str,
    args: &'static [&'static str],
    writes: bool,
    unaligned: bool,
}

const JOBS: &[Job] = &[
    Job {
        name: "seq read 4 MiB",
        args: &["--rw=read", "--bs=4m"],
        writes: false,
        unaligned: false,
    },
    Job {
        name: "seq read 4 KiB",
        args: &["--rw=read", "--bs=4k"],
        writes: false,
        unaligned: false,
    },
    Job {
        name: "rand read 4 MiB",
        args: &["--rw=randread", "--bs=4m"],
        writes: false,
        unaligned: false,
    },
    Job {
        name: "rand read 4 KiB",
        args: &["--rw=randread", "--bs=4k"],
        writes: false,
        unaligned: false,
    },
    Job {
        name: "seq write 4 MiB",
        args: &["--rw=write", "--bs=4m"],
        writes: true,
        unaligned: false,
    },
    Job {
        name: "seq write 4 KiB",
        args: &["--rw=write", "--bs=4k"],
        writes: true,
        unaligned: false,
    },
    Job {
        name: "rand write 4 MiB",
        args: &["--rw=randwrite", "--bs=4m"],
        writes: true,
        unaligned: false,
    },
    Job {
        name: "rand write 4 KiB",
        args: &["--rw=randwrite", "--bs=4k"],
        writes: true,
        unaligned: false,
    },
    Job {
        name: "unaligned rand read 4 KiB",
        args: &["--rw=randread", "--bs=4k", "--blockalign=1"],
        writes: false,
        unaligned: true,
    },
    Job {
        name: "unaligned seq write 4 KiB",
        args: &["--rw=write", "--bs=4k", "--offset=1"],
        writes: true,
        unaligned: true,
    },
    Job {
        name: "unaligned rand write 4 KiB",
        args: &["--rw=randwrite", "--bs=4k", "--blockalign=1"],
        writes: true,
        unaligned: true,
    },
    Job {
        name: "unaligned rand write 4 MiB",
        args: &["--rw=randwrite", "--bs=4m", "--blockalign=1"],
        writes: true,
        unaligned: true,
    },
];

const CONFIGS: [&str; 3] = ["plain", "no-check", "intact mount"];

pub fn run(a: &MountArgs) -> anyhow::Result<()> {
    crate::runner::stop_on_signals();
    if !have("fio") {
        bail!("fio is needed (scripts/setup --bench, or apt install fio)");
    }
    println!(
        "# intact-bench mount ({} runs of {} s per job and configuration, interleaved; MB/s min / median / max)",
        a.runs, a.runtime
    );
    println!("# {}", crate::runner::command_line());
    let mut places: Vec<(&str, PathBuf, Option<LoopExt4>)> = Vec::new();
    if !a.no_disk {
        places.push(("disk", a.dir.clone(), None));
    }
    if !a.no_ram {
        let ram = LoopExt4::in_ram(a.file_mib * 4 + 512)?;
        places.push(("RAM ext4", ram.mount.clone(), Some(ram)));
    }
    for (place, dir, _keep) in &places {
        // A directory of its own (the RAM ext4's root is a mount point).
        measure(a, place, &dir.join("mount-bench"))?;
    }
    Ok(())
}

fn measure(a: &MountArgs, place: &str, dir: &Path) -> anyhow::Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir)?;
    let size = a.file_mib << 20;
    // Three copies: plain, the no-check mount's root, the cataloged root.
    let src = dir.join("src");
    std::fs::create_dir_all(&src)?;
    let data = intact_sample::bytes(size as usize, 5);
    std::fs::write(src.join("data"), &data)?;
    drop(data);
    let plain = dir.join("plain");
    let bare = dir.join("bare");
    let cataloged = dir.join("cataloged");
    for d in [&plain, &bare] {
        std::fs::create_dir_all(d)?;
        std::fs::copy(src.join("data"), d.join("data"))?;
    }
    // The catalog as `intact copy` leaves it (its state beside it).
    let state = dir.join("state");
    let intact = crate::runner::intact_binary()?;
    crate::transfer::run_cmd(
        Command::new(&intact)
            .args(["copy", "-q"])
            .arg(format!("{}/", src.display()))
            .arg(&cataloged)
            .env("XDG_STATE_HOME", &state),
    )?;
    // The three start alike: none of their pages cached. `intact copy`
    // leaves its destination's pages as its riva re-read brought them in,
    // one 4 KiB folio at a time (readahead off), where the two plain copies
    // are written in large folios; fio's writes over small folios cost the
    // kernel ~20% more per byte (filemap lookups, write_begin per page),
    // which earlier runs counted against the checks.
    for f in [
        plain.join("data"),
        bare.join("data"),
        cataloged.join("data"),
    ] {
        let file = std::fs::File::open(&f)?;
        let left = intact_cache::evict(&file, 0, size)
            .with_context(|| format!("evicting {}", f.display()))?
            .resident;
        if left > 0 {
            println!("# {}: {left} pages stayed cached", f.display());
        }
    }
    // This process opens that catalog (XDG_STATE_HOME names where `intact
    // copy` keeps it); nothing else here reads the variable meanwhile.
    std::env::set_var("XDG_STATE_HOME", &state);
    let mnt_bare = dir.join("mnt-no-check");
    let mnt_checked = dir.join("mnt-checked");
    let never = Switch {
        after: None,
        why: "benchmark".into(),
    };
    let opts = |check| MountOptions {
        read_only: false,
        check,
        switch: never.clone(),
        threads: 4,
        allow_other: false,
    };
    for m in [&mnt_bare, &mnt_checked] {
        std::fs::create_dir_all(m)?;
    }
    let m_bare = intact_mount::mount(&bare, &mnt_bare, &opts(false)).context("no-check mount")?;
    let m_checked =
        intact_mount::mount(&cataloged, &mnt_checked, &opts(true)).context("intact mount")?;
    let files = [
        plain.join("data"),
        mnt_bare.join("data"),
        mnt_checked.join("data"),
    ];
    println!();
    println!("## {place}: one file of {} MiB", a.file_mib);
    println!(
        "| job | plain | no-check mount | intact mount | intact ÷ no-check time | intact ÷ plain time | daemon CPU s/GiB no-check / intact |"
    );
    println!("|---|---|---|---|---|---|---|");
    for job in JOBS
        .iter()
        .filter(|j| a.only.as_deref().is_none_or(|o| j.name.contains(o)))
    {
        let runs = interleaved(CONFIGS.len(), a.runs, |i| {
            let direct = i > 0 || !job.unaligned;
            let cpu0 = self_cpu();
            let (bw, bytes) = fio(&files[i], size, a.runtime, job, direct)?;
            Ok((
                bw,
                (self_cpu() - cpu0) / (bytes as f64 / f64::from(1u32 << 30)),
            ))
        })?;
        let bw: Vec<Spread> = runs
            .iter()
            .map(|r| Spread::of(&r.iter().map(|x| x.0 / 1e6).collect::<Vec<_>>()))
            .collect();
        let cpu: Vec<f64> = runs
            .iter()
            .map(|r| crate::runner::median(r.iter().map(|x| x.1).collect()))
            .collect();
        println!(
            "| {}{} | {} | {} | {} | {:.3} | {:.3} | {:.2} / {:.2} |",
            job.name,
            if job.unaligned {
                " (plain: buffered)"
            } else {
                ""
            },
            bw[0],
            bw[1],
            bw[2],
            bw[1].median / bw[2].median,
            bw[0].median / bw[2].median,
            cpu[1],
            cpu[2],
        );
    }
    drop(m_checked);
    drop(m_bare);
    // The catalog the writes left holds: an independent check.
    let out = Command::new(&intact)
        .arg("scrub")
        .arg(&cataloged)
        .env("XDG_STATE_HOME", &state)
        .output()?;
    println!(
        "\nscrub of the cataloged root after the runs: exit {} {}",
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).trim()
    );
    std::fs::remove_dir_all(dir)?;
    Ok(())
}

/// One fio run of `job` on `file`; its bandwidth (bytes/s, read plus
/// write) and the bytes it moved.
fn fio(
    file: &Path,
    size: u64,
    runtime: u64,
    job: &Job,
    direct: bool,
) -> anyhow::Result<(f64, u64)> {
    let mut cmd = Command::new("fio");
    cmd.args([
        "--name=j",
        "--ioengine=psync",
        "--time_based",
        "--output-format=json",
        "--randrepeat=0",
    ])
    .arg(format!("--filename={}", file.display()))
    .arg(format!("--size={size}"))
    .arg(format!("--runtime={runtime}"))
    .arg(format!("--direct={}", u8::from(direct)))
    .args(job.args);
    if job.writes {
        cmd.arg("--end_fsync=1");
    }
    let out = cmd.output().context("fio")?;
    if !out.status.success() {
        bail!("fio {}: {}", job.name, String::from_utf8_lossy(&out.stderr));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("fio's JSON: {}", String::from_utf8_lossy(&out.stdout)))?;
    let j = &v["jobs"][0];
    let get = |rw: &str, k: &str| j[rw][k].as_f64().unwrap_or(0.0);
    let bw = get("read", "bw_bytes") + get("write", "bw_bytes");
    let bytes = (get("read", "io_bytes") + get("write", "io_bytes")) as u64;
    Ok((bw, bytes.max(1)))
}
