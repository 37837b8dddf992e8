//! `intact copy`: the sender half and the receiver half of `intact send`
//! and `intact serve`, joined in process.
//!
//! Each of `streams` streams is one sender-half stream and one receiver
//! half on its own thread, linked by [`crate::link::LocalOut`]: messages
//! are handed over as values, a block's bytes moved, never serialised.
//! Everything else is the network pipeline's own: the destination is a
//! root like a server's (locked while the copy runs, journaled under
//! `DST/.intact/`), so a copy resumes after a crash, finds files it
//! already holds unchanged by their recorded digest, and re-verifies them
//! with `reverify`, exactly as a send to a server would.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Instant;

use intact_cache::ReadPath;
use intact_digest::defaults;
use intact_proto::SessionId;

use crate::dest::Destination;
use crate::journal::Journal;
use crate::link::{Arrival, LocalOut, Outbound};
use crate::net::bounds::Shares;
use crate::net::receiver::{Inbox, ReceiveOptions};
use crate::net::sender::{run_sender, SendOptions, SenderLink};
use crate::net::{RootError, RootLock};
use crate::report::{CopyReport, Progress};
use crate::source::{scan, Scan};
use crate::source_cache::SourceCacheSetting;
use crate::verify::{VerifyLevel, VerifyMode};
use crate::TransferError;

#[cfg(feature = "fault-hooks")]
use crate::hooks::{LinkFault, WriteHook};

/// How to copy.
#[derive(Clone)]
pub struct CopyOptions {
    /// Verification mode.
    pub verify: VerifyMode,
    /// Block size in bytes.
    pub block_size: usize,
    /// Streams (sender and receiver pairs) at once.
    pub streams: usize,
    /// Resends of one block before its file fails.
    pub retries: u32,
    /// How device-level reads reach the device.
    pub read_path: ReadPath,
    /// A file that cannot reach this level fails instead of being committed.
    pub require_level: Option<VerifyLevel>,
    /// Re-check files the destination already holds instead of trusting
    /// its journal.
    pub reverify: bool,
    /// Where the digests of sources are cached, for the quick check of
    /// files the destination holds whole (off: each such source is read).
    pub source_cache: SourceCacheSetting,
    /// Fault injection on the link (tests and the fault lab only: built
    /// with the `fault-hooks` feature, never in the `intact` binary).
    #[cfg(feature = "fault-hooks")]
    pub link_fault: Option<LinkFault>,
    /// Fault injection after a block is written (tests and the fault lab
    /// only, as `link_fault`).
    #[cfg(feature = "fault-hooks")]
    pub after_write: Option<WriteHook>,
    /// Fault injection on a received block's bytes after their digest was
    /// checked and before they are written (tests and the fault lab only).
    #[cfg(feature = "fault-hooks")]
    pub after_check: Option<LinkFault>,
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            verify: VerifyMode::DEFAULT,
            block_size: defaults::BLOCK_BYTES,
            streams: 4,
            retries: 3,
            read_path: ReadPath::default(),
            require_level: None,
            reverify: false,
            source_cache: SourceCacheSetting::Off,
            #[cfg(feature = "fault-hooks")]
            link_fault: None,
            #[cfg(feature = "fault-hooks")]
            after_write: None,
            #[cfg(feature = "fault-hooks")]
            after_check: None,
        }
    }
}

impl CopyOptions {
    /// The sender half's options.
    fn send_options(&self) -> SendOptions {
        SendOptions {
            verify: self.verify,
            block_size: self.block_size,
            streams: self.streams.max(1),
            retries: self.retries,
            key: None,
            subdir: None,
            reverify: self.reverify,
            read_path: self.read_path,
            require_level: self.require_level,
            source_cache: self.source_cache.clone(),
        }
    }

    /// The receiver half's options: a local user's own copy keeps modes
    /// as they are (setuid bits included, as `cp -a` does); all streams
    /// are one session, so directories any of them made are finished.
    fn receive_options(&self) -> ReceiveOptions {
        ReceiveOptions {
            keep_special_bits: true,
            session: Some(SessionId([0; 16])),
            #[cfg(feature = "fault-hooks")]
            after_write: self.after_write.clone(),
            #[cfg(feature = "fault-hooks")]
            after_check: self.after_check.clone(),
            ..ReceiveOptions::default()
        }
    }

    /// The link from a sender stream to its receiver, with the link fault
    /// on it in a build that has hooks.
    fn link<'a>(
        &self,
        to_receiver: Box<dyn Outbound + Send + 'a>,
    ) -> Box<dyn Outbound + Send + 'a> {
        #[cfg(feature = "fault-hooks")]
        if let Some(fault) = self.link_fault.clone() {
            return Box::new(crate::link::Tampered {
                inner: to_receiver,
                tamper: corrupting(fault),
            });
        }
        to_receiver
    }
}

/// The link fault as a tamper on messages: every Block's bytes pass
/// through it (after their digest was computed), with its file's path.
#[cfg(feature = "fault-hooks")]
fn corrupting(fault: LinkFault) -> Box<dyn FnMut(&mut intact_proto::Message) + Send> {
    use intact_proto::Message;
    let mut paths = std::collections::HashMap::new();
    Box::new(move |m: &mut Message| match m {
        Message::Entry(e) => {
            paths.insert(e.file, e.path.to_string());
        }
        Message::Block(b) => {
            let path = paths.get(&b.file).map_or("", String::as_str);
            fault(path, b.index, &mut b.data);
        }
        _ => {}
    })
}

/// Copies `sources` into the directory `dest_root` (created if missing),
/// as [`scan`] places them.
pub fn copy(
    sources: &[PathBuf],
    dest_root: &Path,
    opts: &CopyOptions,
    progress: Progress<'_>,
) -> Result<CopyReport, TransferError> {
    copy_scanned(scan(sources), dest_root, opts, progress)
}

/// Copies what a scan found (see [`crate::scan_with`]) into the directory
/// `dest_root` (created if missing): the sender half and the receiver
/// half, in process.
pub fn copy_scanned(
    scanned: Scan,
    dest_root: &Path,
    opts: &CopyOptions,
    progress: Progress<'_>,
) -> Result<CopyReport, TransferError> {
    let start = Instant::now();
    crate::verify::check_reachable(opts.verify, opts.require_level)?;
    crate::raise_open_file_limit();
    let _lock = lock_destination(dest_root)?;
    let dest = Destination::open(dest_root)?;
    let journal = Journal::open(dest_root)?;
    let send_opts = opts.send_options();
    let recv_opts = opts.receive_options();
    let shares = Shares::alone(&recv_opts.limits);
    let (dest, journal, recv_opts) = (&dest, &journal, &recv_opts);
    std::thread::scope(|s| {
        let mut links = Vec::new();
        let mut receivers = Vec::new();
        for _ in 0..send_opts.streams {
            let inbox = Inbox::new();
            let to_receiver = opts.link(inbox.local_link());
            let (tx, answers) = mpsc::channel::<Arrival>();
            let shares = shares.clone();
            receivers.push(s.spawn(move || {
                let mut to_sender = LocalOut::new(tx, None, |a| a);
                inbox.run(
                    &mut to_sender,
                    shares,
                    dest,
                    dest_root,
                    journal,
                    recv_opts,
                    || {},
                )
            }));
            links.push(SenderLink::local(to_receiver, answers));
        }
        let mut report = run_sender(&scanned, &send_opts, links, progress, start);
        for r in receivers {
            match r.join() {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => report.receiver_failed(e.to_string()),
                Err(_) => report.receiver_failed("the receiver half panicked".into()),
            }
        }
        Ok(report)
    })
}

/// Locks the destination for this copy, as a server locks its root: two
/// copies (or a copy and a server) into one destination would race on its
/// partial files and journal.
fn lock_destination(root: &Path) -> Result<RootLock, TransferError> {
    RootLock::acquire(root).map_err(|e| match e {
        RootError::InUse { root, pid } => TransferError::Destination {
            path: root.display().to_string(),
            source: std::io::Error::other(format!(
                "in use by another intact copy or serve ({}); wait for it to end, or copy elsewhere",
                pid.map_or("PID unknown".to_string(), |p| format!("PID {p}"))
            )),
        },
        RootError::NotADirectory(p) => TransferError::Usage(format!(
            "{}: not a directory; the destination of a copy is a directory (created if missing)",
            p.display()
        )),
        RootError::Unusable { path, source } => TransferError::Destination {
            path: path.display().to_string(),
            source,
        },
        RootError::State(e) => e,
    })
}
