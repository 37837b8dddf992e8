//! `intact mount ROOT MOUNTPOINT`: the root's files, every read checked
//! against the catalog, for programs that know nothing of checksums.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use intact_mount::{choose_switch, MountError, MountOptions, Reliability};
use signal_hook::consts::{SIGINT, SIGTERM};

use crate::stdout::outln;

pub const MOUNT_ABOUT: &str = "\
Presents ROOT (a root `intact serve` or `intact copy` received into) at
MOUNTPOINT through FUSE, so that unmodified programs read and write its
files with every byte checked against the catalog.

Reads: every page a read touches is checked against its catalog CRC-32C
(an unaligned read checks the whole pages around it and returns only the
bytes asked for). A page that does not match fails that read with EIO, is
logged here and recorded in the catalog (`intact status` counts it); the
file's other pages stay readable.

Writes: a page a write covers whole gets its new CRC from the program's
buffer before the bytes are written; a page covered in part is read,
checked, merged and summed again (read-verify-modify-write). New CRCs go
to an intent log before the bytes are written, and into the catalog (with
the blocks' new digests: hashed from the program's buffers where writes
covered a block in order from its start, else from the block read back
and checked) at fsync and close, so a crash of this process
never leaves a page whose CRC disagrees with a write it acknowledged: the
next `intact mount`, `serve`, `copy`, `scrub` or `status` of the root
reconciles the log first. A write whose check fails returns EIO, and the
error is owed again: every close of the open file reports it until an
fsync takes it (as Linux does with write-back errors). A file written
here is recorded at level `none` (its bytes came from a program, not a
source) and loses its whole-file BLAKE3 until it is received again.

Checksum switching (Z²FS): pages the kernel caches were checked when read
and are unprotected while cached. After t_switch (from the reliability
model for --mem-index and --disk-index: 92 s for the paper's non-ECC
memory and a regular disk; or --t-switch) a file's cached pages are
dropped, so the next read checks them again from the disk.

Extended attributes (getfattr -d -m user.intact FILE): user.intact.state,
user.intact.level, user.intact.verified, user.intact.page_size and, while
the bytes are those that arrived, user.intact.blake3.

Files the catalog does not describe (not cataloged, or changed by another
program since) are served unchecked and say so in user.intact.state.
Hard links are refused. The root is locked while mounted: no server, copy
or second mount uses it meanwhile, and `intact status` or `scrub` of it
is refused, naming this process. One write or truncate may grow a file by
at most 4 GiB (EFBIG). Files opened with O_DIRECT bypass the kernel's
cache: each request, unaligned ones too, reaches the mount as made.

Runs in the foreground until unmounted (`umount MOUNTPOINT`, or
`fusermount3 -u MOUNTPOINT`) or interrupted (Ctrl-C, SIGTERM: unmounts,
if no file under it is open). Exit status: 0; 1 if any read found a bad
page; 2 for a usage error.";

/// `intact mount`.
#[derive(Args, Debug)]
pub struct MountArgs {
    /// The root to present (received into by `intact serve` or `intact copy`).
    pub root: PathBuf,
    /// Where to present it (an existing directory outside ROOT).
    pub mountpoint: PathBuf,
    /// Refuse every change.
    #[arg(long)]
    pub read_only: bool,
    /// Drop cached pages after this long instead of the model's t_switch
    /// (e.g. 500ms, 30s, 5m, 1h).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub t_switch: Option<Duration>,
    /// Memory reliability index for t_switch (−log10 λ; 14.2: the paper's
    /// non-ECC memory).
    #[arg(long, value_name = "INDEX")]
    pub mem_index: Option<f64>,
    /// Disk reliability index for t_switch (−log10 UBER; 12: a regular disk).
    #[arg(long, value_name = "INDEX")]
    pub disk_index: Option<f64>,
    /// FUSE worker threads.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub threads: u16,
    /// Let other users use the mount (root, or user_allow_other in /etc/fuse.conf).
    #[arg(long)]
    pub allow_other: bool,
    /// Print the report at the end as JSON.
    #[arg(long)]
    pub json: bool,
}

/// A time: a number (fractions allowed) with ms, s, m, h or d (bare: s).
fn parse_time(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a time (examples: 500ms, 30s, 5m)"))?;
    let scale = match unit {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        other => {
            return Err(format!(
                "unknown time unit '{other}' (use ms, s, m, h or d)"
            ))
        }
    };
    Duration::try_from_secs_f64(n * scale)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("'{s}': give a time above zero"))
}

pub fn run(a: &MountArgs) -> anyhow::Result<ExitCode> {
    let mut r = Reliability::default();
    if let Some(m) = a.mem_index {
        r.mem_index = m;
    }
    if let Some(d) = a.disk_index {
        r.disk_index = d;
    }
    for (name, v) in [("--mem-index", r.mem_index), ("--disk-index", r.disk_index)] {
        if !(v.is_finite() && v > 0.0 && v < 40.0) {
            return Err(crate::exit::usage(format!(
                "{name} {v}: give an index between 0 and 40 (e.g. 14.2 for non-ECC memory, 12 for a regular disk)"
            )));
        }
    }
    let switch = choose_switch(a.t_switch, r);
    let opts = MountOptions {
        read_only: a.read_only,
        check: true,
        switch: switch.clone(),
        threads: usize::from(a.threads),
        allow_other: a.allow_other,
    };
    let start = Instant::now();
    let mounted = intact_mount::mount(&a.root, &a.mountpoint, &opts).map_err(|e| match e {
        MountError::Usage(m) => crate::exit::usage(m),
        e => e.into(),
    })?;
    eprintln!(
        "intact: {} mounted on {}{} (catalog {})",
        a.root.display(),
        mounted.mountpoint.display(),
        if a.read_only { ", read-only" } else { "" },
        mounted.catalog.display()
    );
    eprintln!(
        "intact: cached pages {}: {}",
        switch
            .after
            .map_or("are never dropped".to_string(), |t| format!(
                "are dropped after {:.1} s",
                t.as_secs_f64()
            )),
        switch.why
    );
    eprintln!(
        "intact: unmount with `umount {}` (or Ctrl-C here)",
        mounted.mountpoint.display()
    );
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(SIGINT, Arc::clone(&stop))?;
    signal_hook::flag::register(SIGTERM, Arc::clone(&stop))?;
    let mut mounted = Some(mounted);
    loop {
        let m = mounted.as_ref().expect("still mounted");
        m.wait_until(&stop, Duration::from_millis(100));
        if !m.is_running() {
            break;
        }
        // Interrupted: unmount, unless something under it is open.
        if unmount(&m.mountpoint) {
            break;
        }
        eprintln!(
            "intact: {} is busy (a file under it is open); close it and interrupt again, or `umount -l` it",
            m.mountpoint.display()
        );
        stop.store(false, Ordering::Relaxed);
    }
    let m = mounted.take().expect("mounted");
    let s = m.stats();
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let (checked, unchecked, written, bad, inval) = (
        get(&s.bytes_checked),
        get(&s.bytes_unchecked),
        get(&s.bytes_written),
        get(&s.bad_pages),
        get(&s.invalidations),
    );
    let seconds = start.elapsed().as_secs_f64();
    if let Err(e) = m.unmount() {
        eprintln!("intact: unmounting: {e}");
    }
    if a.json {
        let v = serde_json::json!({
            "root": a.root,
            "mountpoint": a.mountpoint,
            "seconds": seconds,
            "bytes_read_checked": checked,
            "bytes_read_unchecked": unchecked,
            "bytes_written": written,
            "bad_pages": bad,
            "t_switch_seconds": switch.after.map(|t| t.as_secs_f64()),
            "t_switch_why": switch.why,
            "cache_invalidations": inval,
        });
        outln!("{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        eprintln!(
            "intact: unmounted after {seconds:.0} s: read {checked} bytes checked, {unchecked} unchecked (not cataloged); wrote {written} bytes; {bad} bad pages refused; cached pages dropped {inval} times"
        );
    }
    Ok(if bad > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Unmounts `at` as root does (`umount`) or as a user may
/// (`fusermount3 -u`); whether it went.
fn unmount(at: &std::path::Path) -> bool {
    let quiet = |cmd: &str, args: &[&std::ffi::OsStr]| {
        std::process::Command::new(cmd)
            .args(args)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    quiet("umount", &[at.as_os_str()])
        || quiet("fusermount3", &["-u".as_ref(), at.as_os_str()])
        || quiet("fusermount", &["-u".as_ref(), at.as_os_str()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_take_units_and_fractions() {
        assert_eq!(parse_time("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_time("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_time("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_time("0").is_err());
        assert!(parse_time("5x").is_err());
        assert!(parse_time("fast").is_err());
    }
}
