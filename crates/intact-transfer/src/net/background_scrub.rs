//! `intact serve --scrub-every`: a long-running server scrubs its own
//! catalogs (the root's, and each keyring client's subtree's) in the
//! background, through the journals its sessions use (SQLite's exclusive
//! lock allows one opener), at the idle I/O priority class and at most
//! `--scrub-rate`, and logs what it found: one line per pass and one per
//! damaged file. A pass takes the files not scrubbed within the period;
//! it stops between files at shutdown and goes on at the next start.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use intact_proto::WirePath;

use super::confine::confine;
use super::sessions::Log;
use crate::journal::{Journal, STATE_DIR};
use crate::scrub::{scrub_catalog, ScrubOptions, ScrubReport};
use crate::Destination;

/// When and how fast a server scrubs.
#[derive(Debug, Clone, Copy)]
pub struct ScrubSchedule {
    /// A file is due when it was last scrubbed longer ago than this; a
    /// pass runs at start and then once per period.
    pub every: Duration,
    /// At most this many bytes read per second (None: no limit).
    pub rate: Option<u64>,
}

/// Starts the scrub thread of a server rooted at `root`.
pub(crate) fn start(
    root: PathBuf,
    journal: Arc<Journal>,
    schedule: ScrubSchedule,
    shutdown: Arc<AtomicBool>,
    log: Log,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("intact-scrub".into())
        .spawn(move || {
            if let Err(e) = idle_io_priority() {
                log(format!(
                    "scrub: cannot take the idle I/O class ({e}); scrubbing at normal priority"
                ));
            }
            loop {
                let began = Instant::now();
                pass(&root, &journal, schedule, &shutdown, &log);
                let next = began + schedule.every;
                while Instant::now() < next {
                    if shutdown.load(Ordering::SeqCst) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        })
}

/// Scrubs every catalog of the root once.
fn pass(root: &Path, journal: &Journal, s: ScrubSchedule, shutdown: &Arc<AtomicBool>, log: &Log) {
    let opts = ScrubOptions {
        older_than: Some(s.every),
        rate: s.rate,
        stop: Some(Arc::clone(shutdown)),
        ..ScrubOptions::default()
    };
    let name = root.join(STATE_DIR).join("journal.sqlite");
    let result = Destination::open(root).and_then(|dest| {
        scrub_catalog(
            &dest,
            journal,
            name.display().to_string(),
            &opts,
            None,
            false,
            &mut |_| {},
        )
    });
    report("root", result, log);
    for subtree in subtrees(root) {
        if shutdown.load(Ordering::SeqCst) {
            return;
        }
        let result = confine(root, Some(&subtree), journal).and_then(|c| {
            scrub_catalog(
                &c.dest,
                &c.journal,
                format!("subtree {subtree}"),
                &opts,
                None,
                false,
                &mut |_| {},
            )
        });
        report(&format!("subtree {subtree}"), result, log);
    }
}

/// The subtrees that have journals (`ROOT/.intact/clients/*/subtree`).
fn subtrees(root: &Path) -> Vec<WirePath> {
    let Ok(dirs) = std::fs::read_dir(root.join(STATE_DIR).join("clients")) else {
        return Vec::new();
    };
    let mut out: Vec<WirePath> = dirs
        .filter_map(Result::ok)
        .filter_map(|d| std::fs::read(d.path().join("subtree")).ok())
        .filter_map(|b| WirePath::parse(b.strip_suffix(b"\n").unwrap_or(&b)).ok())
        .collect();
    out.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    out
}

fn report(what: &str, result: Result<ScrubReport, crate::TransferError>, log: &Log) {
    let r = match result {
        Ok(r) => r,
        Err(e) => {
            log(format!("scrub of {what}: {e}"));
            return;
        }
    };
    if r.files == 0 && !r.stopped {
        return;
    }
    for f in &r.reports {
        let ranges: Vec<String> = f
            .rot
            .iter()
            .map(|x| {
                format!(
                    "{}..{} ({})",
                    x.offset,
                    x.offset + x.len,
                    x.failed.join(", ")
                )
            })
            .collect();
        log(format!(
            "scrub of {what}: {} {}: {}",
            f.state.to_uppercase(),
            f.path,
            ranges
                .into_iter()
                .chain(f.note.clone())
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    log(format!(
        "scrub of {what}: {} files, {:.1} MiB in {:.1} s{}: {} clean, {} rotten, {} changed, {} missing, {} unreadable; {} read from the device, {} through the page cache only",
        r.files,
        r.bytes as f64 / (1024.0 * 1024.0),
        r.seconds,
        if r.stopped { " (stopped; goes on at the next start)" } else { "" },
        r.clean,
        r.rotten,
        r.changed,
        r.missing,
        r.unreadable,
        r.at_device,
        r.below_device
    ));
}

/// Puts the calling thread in the idle I/O scheduling class (`ionice -c
/// 3`): its reads wait while anything else uses the disk.
fn idle_io_priority() -> std::io::Result<()> {
    const IOPRIO_WHO_PROCESS: libc::c_long = 1;
    const IOPRIO_CLASS_IDLE: libc::c_long = 3;
    const IOPRIO_CLASS_SHIFT: u32 = 13;
    // SAFETY: ioprio_set takes three integers; `who` 0 is this thread.
    let r = unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            0 as libc::c_long,
            IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}
