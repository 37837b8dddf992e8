//! `intact copy`: the sender half and the receiver half of `intact send`
//! and `intact serve`, joined in process.
//!
//! Each of `streams` streams is one sender-half stream and one receiver
//! half on its own thread, linked by [`crate::link::LocalOut`]: messages
//! are handed over as values, a block's bytes moved, never serialised.
//! Everything else is the network pipeline's own: the destination is a
//! root like a server's (locked while the copy runs, journaled in the
//! user's state directory, see [`copy_state`]), so a copy resumes after a
//! crash, finds files it already holds unchanged by their recorded digest,
//! and re-verifies them with `reverify`, exactly as a send would.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
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
use crate::profile::Profile;
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
    /// `--block-size auto`: choose the block size before copying, from
    /// Eq. 1 and a short probe of the source and the destination's file
    /// system (see the `block_size` module).
    pub block_auto: bool,
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
    /// The benchmark's control: blocks recorded without page CRCs (see
    /// `ReceiveOptions::without_page_crcs`).
    #[cfg(feature = "fault-hooks")]
    pub without_page_crcs: bool,
    /// `block_auto` with these stage costs instead of the probe's (tests
    /// only: a choice other than the default, which no device here
    /// forces).
    #[cfg(feature = "fault-hooks")]
    pub block_stages: Option<crate::Stages>,
    /// `--verify flash`: the destination device's write-cache window and
    /// the filler budget (`--device-cache`, `--max-filler`).
    pub flash: crate::flash::FlashSettings,
    /// The verifier threads the receiver's re-reads share (`--verifiers`).
    pub verifiers: crate::Verifiers,
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            verify: VerifyMode::DEFAULT,
            block_size: defaults::BLOCK_BYTES,
            block_auto: false,
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
            #[cfg(feature = "fault-hooks")]
            without_page_crcs: false,
            #[cfg(feature = "fault-hooks")]
            block_stages: None,
            flash: Default::default(),
            verifiers: Default::default(),
        }
    }
}

impl CopyOptions {
    /// The sender half's options.
    fn send_options(&self) -> SendOptions {
        SendOptions {
            verify: self.verify,
            block_size: self.block_size,
            block_auto: false,
            #[cfg(feature = "fault-hooks")]
            block_stages: None,
            streams: self.streams.max(1),
            // No TCP windows to grow past.
            max_streams: self.streams.max(1),
            retries: self.retries,
            key: None,
            subdir: None,
            reverify: self.reverify,
            read_path: self.read_path,
            require_level: self.require_level,
            source_cache: self.source_cache.clone(),
            cache_filter: Default::default(),
            // One process, no TCP windows to fill.
            spread: crate::Spread::Never,
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
            #[cfg(feature = "fault-hooks")]
            without_page_crcs: self.without_page_crcs,
            flash: self.flash.for_local_sender(),
            verifiers: self.verifiers.clone(),
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
            if b.patch.is_empty() {
                fault(path, b.index, &mut b.data);
            } else {
                patch_fault(&fault, path, b);
            }
        }
        _ => {}
    })
}

/// The link fault on a resend of some pages: it sees them at their
/// offsets in the block (zeros between), and what it does to them crosses.
#[cfg(feature = "fault-hooks")]
fn patch_fault(fault: &LinkFault, path: &str, b: &mut intact_proto::Block) {
    use intact_proto::WIRE_PAGE;
    let last = *b.patch.last().expect("a patch") as usize;
    let mut view = vec![0; (last + 1) * WIRE_PAGE];
    let place = |view: &mut [u8], data: &mut [u8], into: bool| {
        let mut at = 0;
        for &p in &b.patch {
            let n = WIRE_PAGE.min(data.len() - at);
            let start = p as usize * WIRE_PAGE;
            if into {
                view[start..start + n].copy_from_slice(&data[at..at + n]);
            } else {
                data[at..at + n].copy_from_slice(&view[start..start + n]);
            }
            at += n;
        }
    };
    place(&mut view, &mut b.data, true);
    fault(path, b.index, &mut view);
    place(&mut view, &mut b.data, false);
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

/// The block size at which the destination's journal holds one of the
/// files of `scanned` larger than a block (done or partial, the same
/// size), with its path: `--block-size auto` keeps it, since at another
/// size the file would be sent again. Looks at most at the
/// [`HELD_LOOKUPS`] largest files.
fn held_block_size(
    scanned: &Scan,
    journal: &Journal,
) -> Result<Option<(String, u64)>, TransferError> {
    let mut files: Vec<_> = scanned
        .entries
        .iter()
        .filter(|e| {
            e.kind == crate::source::SourceKind::File && e.size > crate::AUTO_BLOCK_CANDIDATES[0]
        })
        .collect();
    files.sort_by_key(|e| std::cmp::Reverse(e.size));
    for e in files.into_iter().take(HELD_LOOKUPS) {
        if let Some(row) = journal.lookup(e.rel.as_bytes())? {
            let block = u64::from(row.block_size);
            if row.size == e.size && crate::AUTO_BLOCK_CANDIDATES.contains(&block) {
                return Ok(Some((e.rel.to_string(), block)));
            }
        }
    }
    Ok(None)
}

/// Journal lookups [`held_block_size`] makes at most.
const HELD_LOOKUPS: usize = 1024;

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
    if let Some(report) = CopyReport::nothing_listed(&scanned, start) {
        return Ok(report);
    }
    crate::raise_open_file_limit();
    let state = copy_state(dest_root)?;
    let _lock = lock_destination(dest_root, &state)?;
    let dest = Destination::open(dest_root)?;
    let journal = Journal::open_in(&state)?;
    // What a mount that did not end cleanly left in its intent log.
    crate::journal::recover_intents(&journal, &state, dest_root)?;
    #[cfg(feature = "fault-hooks")]
    let given = opts.block_stages;
    #[cfg(not(feature = "fault-hooks"))]
    let given = None;
    let auto = match opts.block_auto {
        true => Some(crate::block_size::auto::decide(
            &scanned,
            opts.verify,
            opts.streams.max(1),
            crate::block_size::auto::Receiver::Local(
                dest_root,
                held_block_size(&scanned, &journal)?,
            ),
            given,
        )),
        false => None,
    };
    let mut send_opts = opts.send_options();
    if let Some(a) = &auto {
        send_opts.block_size = a.chosen as usize;
    }
    let mut recv_opts = opts.receive_options();
    // Both halves sum their stage times into one profile.
    let profile = Arc::new(Profile::default());
    recv_opts.profile = Arc::clone(&profile);
    let shares = Shares::alone(&recv_opts.limits);
    let filler_before = recv_opts.flash.filler_written();
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
        let mut report = run_sender(
            &scanned, &send_opts, links, progress, start, &profile, None, None,
        );
        for r in receivers {
            match r.join() {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => report.receiver_failed(e.to_string()),
                Err(_) => report.receiver_failed("the receiver half panicked".into()),
            }
        }
        report.stages = profile.stages();
        report.block_size = auto;
        if opts.verify == VerifyMode::Flash {
            report.filler_bytes = Some(recv_opts.flash.filler_written() - filler_before);
        }
        Ok(report)
    })
}

/// Where a copy into `root` keeps its journal and lock: the user's own
/// state directory (`$XDG_STATE_HOME/intact/copies/`, else
/// `~/.local/state/intact/copies/`), one private directory per destination
/// (named by the BLAKE3 of its canonical path), so a copy leaves nothing
/// of its own in DST and no other user can hold or plant its state there.
/// Without a usable home, or when `root/.intact` already holds a catalog
/// (a server's root, or one `intact catalog init` made), `root/.intact`.
fn copy_state(root: &Path) -> Result<PathBuf, TransferError> {
    let dest_err = |path: &Path, source| TransferError::Destination {
        path: path.display().to_string(),
        source,
    };
    if let Ok(m) = std::fs::metadata(root) {
        if !m.is_dir() {
            return Err(TransferError::Usage(format!(
                "{}: not a directory; the destination of a copy is a directory (created if missing)",
                root.display()
            )));
        }
    }
    std::fs::create_dir_all(root).map_err(|e| dest_err(root, e))?;
    let canonical = std::fs::canonicalize(root).map_err(|e| dest_err(root, e))?;
    // A root that keeps its catalog in ROOT/.intact (a server's, or one
    // `intact catalog init` made) is copied into with that catalog: one
    // catalog per root, whichever command writes into it.
    if canonical
        .join(crate::journal::STATE_DIR)
        .join("journal.sqlite")
        .is_file()
    {
        return crate::net::private::state_dir(&canonical)
            .map_err(|e| TransferError::Journal(e.to_string()));
    }
    let private = |dir: &Path| {
        crate::net::private::private_dir(dir).map_err(|e| TransferError::Journal(e.to_string()))
    };
    let in_home = state_home().and_then(|base| {
        let copies = base.join("intact").join("copies");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&copies)
            .ok()?;
        private(&copies).ok()?;
        forget_gone(&copies);
        let dir = private(&copies.join(state_name(&canonical))).ok()?;
        // Which destination it is for, so that it can go once DST is gone.
        name_destination(&dir, &canonical).ok()?;
        Some(dir)
    });
    match in_home {
        Some(dir) => Ok(dir),
        // No home of this user's to keep it in (e.g. HOME is another
        // user's): in DST, as a server keeps its root's.
        None => crate::net::private::state_dir(&canonical)
            .map_err(|e| TransferError::Journal(e.to_string())),
    }
}

/// The user's state directory: `$XDG_STATE_HOME`, else `~/.local/state`
/// (absolute paths only).
fn state_home() -> Option<PathBuf> {
    std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
                .map(|h| h.join(".local/state"))
        })
}

/// The name of the state directory of copies into `canonical`.
fn state_name(canonical: &Path) -> String {
    let name = blake3::hash(canonical.as_os_str().as_bytes()).to_hex();
    name.as_str()[..32].to_string()
}

/// Where copies into `root` kept their journal, if they did (nothing is
/// created): the user's state directory for it, else `root/.intact`.
pub(crate) fn existing_copy_state(root: &Path) -> Option<PathBuf> {
    let canonical = std::fs::canonicalize(root).ok()?;
    let in_home = state_home()?
        .join("intact")
        .join("copies")
        .join(state_name(&canonical));
    in_home.join("journal.sqlite").is_file().then_some(in_home)
}

/// The file in a copy's state directory that names its destination.
const DESTINATION: &str = "destination";

/// Writes `dest` into `dir`'s [`DESTINATION`] file, whole or not at all: a
/// concurrent [`forget_gone`] must never read it empty or in part (it would
/// take DST for gone and remove this state before its copy locks it).
fn name_destination(dir: &Path, dest: &Path) -> std::io::Result<()> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let bytes = dest.as_os_str().as_bytes();
    let path = dir.join(DESTINATION);
    if std::fs::read(&path).is_ok_and(|b| b == bytes) {
        return Ok(());
    }
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!("{DESTINATION}.{}.{n}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, &path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Removes the state of copies whose destination no longer exists (and
/// that no copy holds now): a removed DST leaves nothing behind for long.
fn forget_gone(copies: &Path) {
    let Ok(entries) = std::fs::read_dir(copies) else {
        return;
    };
    for dir in entries.flatten().map(|e| e.path()) {
        let Ok(dest) = std::fs::read(dir.join(DESTINATION)) else {
            continue;
        };
        let dest = Path::new(std::ffi::OsStr::from_bytes(&dest));
        if !dest.is_absolute() {
            continue;
        }
        let gone = matches!(std::fs::symlink_metadata(dest), Err(e) if e.kind() == std::io::ErrorKind::NotFound);
        if !gone {
            continue;
        }
        let Ok(lock) = std::fs::File::open(dir.join(crate::net::LOCK_FILE)) else {
            continue;
        };
        if rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// Locks the destination for this copy, as a server locks its root: two
/// copies (or a copy and a server) into one destination would race on its
/// partial files and journal.
fn lock_destination(root: &Path, state: &Path) -> Result<RootLock, TransferError> {
    RootLock::acquire_with(root, Some(state)).map_err(|e| match e {
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
