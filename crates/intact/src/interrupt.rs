//! Ctrl-C and SIGTERM during `copy` and `send`: the run ends with a line
//! saying what was done and the command that resumes it (and a final JSON
//! report with `--json`), then dies by the signal as usual, so that a
//! shell sees it was interrupted.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use signal_hook::consts::{SIGINT, SIGTERM};

use crate::summary::{bytes, command_line};

/// Counts bytes sent and watches for SIGINT and SIGTERM until dropped.
pub struct Watch {
    sent: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
}

impl Watch {
    /// Starts watching. `send` says whether the destination keeps a
    /// journal to resume from; `json`, whether to end with a JSON report.
    /// `report`: where `--report` writes the report (the interrupted
    /// run's is written there too).
    pub fn start(
        pb: indicatif::ProgressBar,
        send: bool,
        json: bool,
        report: Option<crate::summary::ReportOut>,
    ) -> anyhow::Result<Watch> {
        let sent = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
        let (counter, finished) = (Arc::clone(&sent), Arc::clone(&done));
        let start = Instant::now();
        std::thread::spawn(move || {
            let Some(sig) = signals.forever().next() else {
                return;
            };
            if !finished.load(Ordering::SeqCst) {
                pb.finish_and_clear();
                let name = if sig == SIGINT { "SIGINT" } else { "SIGTERM" };
                let n = counter.load(Ordering::SeqCst);
                let kept = if send {
                    "blocks the server verified are kept in its journal and nothing unverified has its final name; to resume, run"
                } else {
                    "nothing unverified has its final name; to finish, run the same command again"
                };
                let cmd = command_line();
                eprintln!(
                    "intact: interrupted by {name} after {:.1} s: {} sent; {kept}: {cmd}",
                    start.elapsed().as_secs_f64(),
                    bytes(n)
                );
                let v = serde_json::json!({
                    "interrupted": name,
                    "complete": false,
                    "bytes_sent": n,
                    "seconds": start.elapsed().as_secs_f64(),
                    "resume": cmd,
                });
                if let Some(r) = report.as_ref().filter(|r| r.file.is_some()) {
                    if let Err(e) = r.write(v.clone(), false) {
                        eprintln!("intact: {e:#}");
                    }
                }
                if json {
                    // A reader that is gone is no reason not to stop.
                    let _ = crate::stdout::line(format_args!("{v:#}"));
                }
                let _ = std::io::stdout().flush();
            }
            let _ = signal_hook::low_level::emulate_default_handler(sig);
            std::process::exit(128 + sig);
        });
        Ok(Watch { sent, done })
    }

    /// Records the bytes sent so far.
    pub fn sent(&self, n: u64) {
        self.sent.store(n, Ordering::SeqCst);
    }

    /// Bytes sent so far.
    pub fn sent_so_far(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }

    /// The transfer is over: a signal now just ends the process.
    pub fn finished(&self) {
        self.done.store(true, Ordering::SeqCst);
    }
}
