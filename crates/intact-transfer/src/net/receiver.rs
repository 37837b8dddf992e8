//! The receiving side of one connection.
//!
//! Every Entry gets exactly one FileResult. A file's blocks are checked
//! against the digests that travel with them, written, and (block mode)
//! re-read; each Block gets a BlockResult, and a failed one is resent by
//! the sender. At FileEnd the file is re-read if the mode says so, bad
//! blocks are asked for again, and only a fully verified file is fsynced
//! and renamed to its final name.
//!
//! Held blocks (a resume) and files held whole (a repeated send) are
//! trusted only up to the level their journal records say they were
//! verified at. Below the mode's aim they are re-verified in place by the
//! mode's own means (`riva`: evicted and re-read from the device), and
//! those reads count in the file's level like any other; the FileResult
//! says how many bytes were re-verified and how many were trusted, and at
//! which recorded level.
//!
//! Before a file is committed, the BLAKE3 of the bytes held for it must
//! equal the sender's FileEnd digest, and the journal records it (see
//! [`crate::net::whole_digest`]). A file held whole is answered with that
//! recorded digest (or, re-verified in place, the digest of what the
//! re-read found), and is unchanged only if the sender's FileEnd confirms
//! its source has the same: size and mtime only pick the candidate.
//!
//! Riva (and block-mode) blocks are verified off the session thread: a verifier thread
//! flushes, evicts and re-reads each written block from the device while
//! the session thread receives and writes the next ones (the RIVA paper's
//! Figure 4). A reader thread turns the socket into events, so that the
//! session thread waits on one channel for either the next message or a
//! verifier's verdict; it reads at most a few messages ahead, so memory
//! stays bounded and TCP still pushes back on the sender.

use std::collections::HashMap;
use std::fs::File;
use std::net::TcpStream;
use std::os::unix::fs::FileExt;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use intact_cache::{DeviceReader, ReadPath};
use intact_digest::{defaults, hash, Algorithm, AlignedBuf, Digest};
use intact_proto::{
    Connection, Entry, EntryKind, FileResult, FileStatus, Holding, Message, ProtoError, WirePath,
    MAX_STATUS_BLOCKS,
};

use crate::dest::{CreatedDirs, Destination, Mtime, PartialFile};
use crate::journal::{unix_now, BlockRecord, DoneFile, Journal, VerifiedAt};
use crate::link::{Arrival, LocalOut, Outbound};
use crate::net::bounds::{self, InUse, ReceiveLimits, Shares, Slot};
use crate::net::delete::Pending;
use crate::net::session_dirs::SessionDirs;
use crate::net::watchdog::Working;
use crate::net::whole_digest::{HeldWhole, Stamp, WholeDigest};
use crate::recheck::{recheck_batch, recheck_batch_seen, Recheck, BATCH_BYTES};
use crate::verify::{DeviceStats, Reached, VerifyLevel, VerifyMode};
use crate::TransferError;

mod admit;
mod data_clock;
mod digests;
mod hooks;

use data_clock::DataClock;
use digests::BlockDigests;

/// Messages the reader thread may hold ahead of the session thread.
const READ_AHEAD: usize = 4;

/// Riva blocks queued for the verifier at most (written, not yet
/// verified; they hold no memory here, only page cache).
const VERIFY_QUEUE: usize = 64;

/// How many times one file may come back for re-verification rounds.
const MAX_ROUNDS: u32 = 16;

/// Verified files committed together at most (one syncfs, one fsync per
/// directory, one journal transaction).
const GROUP_COMMIT_FILES: usize = 1024;

/// Path bytes of directories one stream keeps to finish at its end; past
/// this, a directory it created is finished at once.
const MAX_PENDING_DIR_BYTES: usize = 64 << 20;

/// Verified-but-unjournaled data after which the partial file is
/// fdatasynced and its blocks recorded, in bytes: what a server crash can
/// cost a file in resent data, against one fdatasync per batch.
const JOURNAL_BATCH: u64 = 8 << 20;

/// What one session did, for the server's log.
#[derive(Debug, Default, Clone)]
pub struct SessionSummary {
    /// Files verified and committed.
    pub verified: u64,
    /// Entries that failed.
    pub failed: u64,
    /// Blocks that failed verification and were asked for again.
    pub blocks_rejected: u64,
    /// Bytes of block payload received.
    pub bytes: u64,
    /// The first [`MAX_FAILURES_KEPT`] failed entries: (path, why), for
    /// the server's log (the rest are only counted in `failed`).
    pub failures: Vec<(String, String)>,
    /// Entries a `send --delete` removed.
    pub deleted: u64,
}

/// Failed entries a session keeps by name for the log at most.
pub const MAX_FAILURES_KEPT: usize = 100;

impl SessionSummary {
    /// Counts a failed entry, keeping its path and reason while there is room.
    fn fail(&mut self, path: &str, why: &str) {
        self.failed += 1;
        if self.failures.len() < MAX_FAILURES_KEPT {
            self.failures.push((path.to_string(), why.to_string()));
        }
    }
}

struct Incoming {
    entry: Entry,
    mode: VerifyMode,
    /// The partial file; None while the file is held whole under its final
    /// name and no block has come for it.
    partial: Option<PartialFile>,
    /// Riva: the file shared with the verifier, its device reader, and
    /// what its reads did.
    riva: Option<RivaIn>,
    /// Blocks at the verifier now.
    checking: u32,
    /// The sender's FileEnd, held while blocks are still at the verifier.
    ended: Option<u64>,
    /// Per block: the digest it verified against, once it has.
    verified: BlockDigests,
    rounds: u32,
    /// The file's journal row.
    row: i64,
    /// Verified blocks not yet in the journal, and their bytes.
    unjournaled: Vec<BlockRecord>,
    unjournaled_bytes: u64,
    /// What the bytes held from an earlier run contributed.
    held: Held,
    /// The level the sender's reads of the source reached (its FileEnd).
    source_level: Option<VerifyLevel>,
    /// The whole-file BLAKE3 of the bytes held, checked at FileEnd.
    whole: WholeDigest,
    /// What the file holds of the stream's and the server's limits.
    slot: Option<Slot>,
}

/// Blocks a file already held when this run began: re-verified in place,
/// or trusted from the journal at the level it records. A held block the
/// sender replaces (its source changed) is forgotten here.
#[derive(Debug, Default, Clone)]
struct Held {
    /// Per block: its length, and the record it was trusted on (None:
    /// re-verified in place in this run).
    blocks: HashMap<u64, (u64, Option<VerifiedAt>)>,
}

impl Held {
    fn trust(&mut self, index: u64, bytes: u64, v: VerifiedAt) {
        self.blocks.insert(index, (bytes, Some(v)));
    }

    fn reverified(&mut self, index: u64, bytes: u64) {
        self.blocks.insert(index, (bytes, None));
    }

    fn forget(&mut self, index: u64) {
        self.blocks.remove(&index);
    }

    fn reverified_bytes(&self) -> u64 {
        self.blocks
            .values()
            .filter(|(_, v)| v.is_none())
            .map(|(n, _)| n)
            .sum()
    }

    fn trusted_bytes(&self) -> u64 {
        self.blocks
            .values()
            .filter(|(_, v)| v.is_some())
            .map(|(n, _)| n)
            .sum()
    }

    /// The lowest level recorded for a trusted block.
    fn trusted_level(&self) -> Option<VerifyLevel> {
        self.blocks
            .values()
            .filter_map(|(_, v)| v.map(|v| v.level))
            .min()
    }

    /// When the oldest trusted block was verified.
    fn trusted_at(&self) -> Option<i64> {
        self.blocks
            .values()
            .filter_map(|(_, v)| v.map(|v| v.at))
            .min()
    }
}

impl Incoming {
    /// Makes the verified data durable, then records it.
    fn journal(&mut self, journal: &Journal) -> Result<(), TransferError> {
        if self.unjournaled.is_empty() {
            return Ok(());
        }
        if let Some(partial) = &self.partial {
            partial
                .file()
                .sync_data()
                .map_err(|e| TransferError::Destination {
                    path: self.entry.path.to_string(),
                    source: e,
                })?;
        }
        journal.add_blocks(self.row, &self.unjournaled)?;
        self.unjournaled.clear();
        self.unjournaled_bytes = 0;
        Ok(())
    }

    /// The level the receiver's end reached for this file: the mode's aim,
    /// lowered by every re-read that did not reach the device and by the
    /// recorded level of every trusted block.
    fn reached(&self) -> Reached {
        let mut r = Reached::aim(self.mode);
        if let (Some(riva), VerifyMode::Riva) = (&self.riva, self.mode) {
            let b = riva.reader.lock().expect("no panics hold it").backing();
            riva.stats.lower(&mut r, "destination", b);
        }
        if let Some(level) = self.source_level {
            r.lower(level, format!("the source's reads reached level {level}"));
        }
        if let Some(level) = self.held.trusted_level() {
            r.lower(
                level,
                format!(
                    "{} bytes were trusted from the journal, where they are recorded at level {level}",
                    self.held.trusted_bytes()
                ),
            );
        }
        r
    }

    /// How the file as a whole was verified, for the journal.
    fn verified_at(&self, level: VerifyLevel) -> VerifiedAt {
        let now = unix_now();
        VerifiedAt {
            mode: self.mode,
            level,
            at: self.held.trusted_at().map_or(now, |t| t.min(now)),
        }
    }
}

struct RivaIn {
    file: Arc<File>,
    reader: Arc<Mutex<DeviceReader>>,
    stats: DeviceStats,
    check: Duration,
}

impl RivaIn {
    fn open(file: &File, path: ReadPath) -> std::io::Result<RivaIn> {
        let file = Arc::new(file.try_clone()?);
        let reader = DeviceReader::new(&file, path)?;
        Ok(RivaIn {
            file,
            reader: Arc::new(Mutex::new(reader)),
            stats: DeviceStats::default(),
            check: Duration::ZERO,
        })
    }

    /// Why no read of this file can reach a device, if none can.
    fn no_device_reason(&self) -> Option<String> {
        let b = self.reader.lock().expect("no panics hold it").backing();
        b.no_device_reason()
    }
}

/// The level of a block checked on arrival (its digest against the bytes
/// received), before any re-read.
fn arrival_level(mode: VerifyMode) -> VerifyLevel {
    match mode {
        VerifyMode::None => VerifyLevel::None,
        _ => VerifyLevel::Network,
    }
}

/// A level from the wire; an id this build does not know is the weakest.
fn wire_level(id: u8) -> VerifyLevel {
    VerifyLevel::from_wire_id(id).unwrap_or(VerifyLevel::None)
}

/// The level of a block re-read by the verifier or in place.
fn reread_level(out: &intact_cache::ReadOutcome) -> VerifyLevel {
    if out.device {
        VerifyLevel::Device
    } else {
        VerifyLevel::Cache
    }
}

/// Work for the verifier thread: re-read a written block from the device.
struct Check {
    id: u64,
    index: u64,
    /// The level of the sender's read behind the digest.
    source_level: VerifyLevel,
    offset: u64,
    len: usize,
    digest: Digest,
    file: Arc<File>,
    reader: Arc<Mutex<DeviceReader>>,
}

/// The verifier's verdict on one block.
struct Checked {
    id: u64,
    index: u64,
    source_level: VerifyLevel,
    digest: Digest,
    ok: Result<bool, std::io::Error>,
    outcome: intact_cache::ReadOutcome,
    took: Duration,
}

/// What the session thread waits for.
enum Event {
    /// The next message(s) from the link (none: closed cleanly), and the
    /// share of the server's frame memory a socket's frame holds.
    Msg(Arrival, Option<intact_proto::Held>),
    /// A verifier's verdict.
    Checked(Checked),
}

/// The verifier thread of a session: it takes the blocks queued so far as
/// one batch (see [`crate::recheck`]) and sends a verdict for each.
fn verifier(jobs: mpsc::Receiver<Check>, events: mpsc::Sender<Event>) {
    // Grown by the first re-read to its length: an idle session holds none.
    let mut buf = AlignedBuf::new(0);
    while let Ok(first) = jobs.recv() {
        let mut bytes = first.len;
        let mut batch = vec![first];
        while bytes < BATCH_BYTES {
            match jobs.try_recv() {
                Ok(c) => {
                    bytes += c.len;
                    batch.push(c);
                }
                Err(_) => break,
            }
        }
        let items: Vec<Recheck<'_>> = batch
            .iter()
            .map(|c| Recheck {
                file: &c.file,
                reader: Some(&*c.reader),
                offset: c.offset,
                len: c.len,
                digest: &c.digest,
            })
            .collect();
        let results = recheck_batch(&items, &mut buf);
        drop(items);
        for (c, r) in batch.into_iter().zip(results) {
            let done = Checked {
                id: c.id,
                index: c.index,
                source_level: c.source_level,
                digest: c.digest,
                ok: r.ok,
                outcome: r.outcome,
                took: r.took,
            };
            if events.send(Event::Checked(done)).is_err() {
                return;
            }
        }
    }
}

/// How a receiver works, beyond what each Entry asks for.
#[derive(Clone, Default)]
pub struct ReceiveOptions {
    /// Called after each block is written, before it is verified (tests
    /// and the fault lab only: built with the `fault-hooks` feature, never
    /// in the `intact` binary).
    #[cfg(feature = "fault-hooks")]
    pub after_write: Option<crate::hooks::WriteHook>,
    /// Called on each received block's bytes after their digest was
    /// checked and before they are written: a memory fault in the window
    /// the Z²FS paper calls t0–t1 (tests and the fault lab only).
    #[cfg(feature = "fault-hooks")]
    pub after_check: Option<crate::hooks::LinkFault>,
    /// Negative control for the fault lab: `riva` re-reads through the
    /// page cache instead of after eviction (as a broken riva would), so
    /// the lab can prove its device-write cells are able to fail.
    #[cfg(feature = "fault-hooks")]
    pub reread_through_cache: bool,
    /// Most paths one `send --delete` may keep (None: [`MAX_KEEP_PATHS`]).
    ///
    /// [`MAX_KEEP_PATHS`]: crate::net::MAX_KEEP_PATHS
    pub max_delete_paths: Option<usize>,
    /// What the server allows one file, one stream and all its sessions
    /// (see [`ReceiveLimits`]); clones share its counts of what is open.
    pub limits: ReceiveLimits,
    /// Keep the setuid, setgid and sticky bits of received files and
    /// directories (`intact serve --keep-special-bits`).
    ///
    /// By default a server applies only the permission bits a sender
    /// asks for, `mode & 0o777`, as rsync's daemon applies its `incoming
    /// chmod` to whatever its clients send: a client (any local user of a
    /// keyless loopback server) must not be able to create a setuid file
    /// owned by the server's user. Directories the session did not create
    /// keep their mode and time in any case.
    pub keep_special_bits: bool,
    /// The session (one `intact send` run, all its streams) this stream
    /// belongs to, set by the server per stream: the directories its
    /// streams create are its own, and only those get its modes and
    /// times. Without it a stream finishes only the directories it
    /// created itself.
    pub session: Option<intact_proto::SessionId>,
    /// The directories each running session created (shared by clones).
    pub session_dirs: SessionDirs,
    /// Marks the server's own work for the session (commits, whole-file
    /// reads), during which its watchdog's idle clock stops.
    pub working: Working,
    /// The session's places in its server's shared budgets, set by the
    /// server per stream; without them a stream has the block budget of
    /// `limits` to itself and its frames are not budgeted.
    pub shares: Option<Shares>,
    /// A stream that holds open files must send data (a Block or a
    /// FileEnd) at least this often, or it ends and gives back what it
    /// holds: answered Dir entries alone keep a connection alive for the
    /// watchdog, not its files. None: no such deadline.
    pub data_timeout: Option<std::time::Duration>,
}

/// How long a frame may wait for its session's share of the server's
/// memory for what clients send before its stream ends ("server busy").
const FRAME_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs the receiving side of a session that passed its handshake.
/// Returns when the sender says Bye or goes away; a protocol violation
/// ends the session with an error (partial files stay for resume).
pub fn receive(
    conn: Connection<TcpStream>,
    dest: &Destination,
    root: &std::path::Path,
    journal: &Journal,
    opts: &ReceiveOptions,
) -> Result<SessionSummary, TransferError> {
    let clone = |s: &TcpStream| s.try_clone().map_err(|e| TransferError::Path(e.into()));
    let stream = clone(conn.get_ref())?;
    let shares = opts
        .shares
        .clone()
        .unwrap_or_else(|| Shares::alone(&opts.limits));
    let mut conn = conn;
    // The reader's own handle on the session's memory: stopped when this
    // stream ends, so a reader waiting for its share ends with it.
    let reader_memory = shares.memory.as_ref().map(|m| m.handle());
    if let Some(memory) = &reader_memory {
        conn.set_budget(memory.clone(), FRAME_WAIT);
    }
    // Each half carries its own direction's sealing state.
    let (conn, mut out) = conn.split(clone(&stream)?);
    let inbox = Inbox::new();
    let (reader_tx, credit_tx) = (inbox.tx.clone(), inbox.credit_tx.clone());
    let reader = std::thread::spawn(move || {
        let mut conn = conn;
        loop {
            let m = conn.read_message();
            // The frame's share of the server's memory, held until the
            // session thread is done with the message.
            let held = conn.take_held();
            let stop = !matches!(m, Ok(Some(_)));
            if credit_tx.send(()).is_err()
                || reader_tx.send(Event::Msg(Arrival::Read(m), held)).is_err()
                || stop
            {
                return;
            }
        }
    });
    let result = inbox.run(&mut out, shares, dest, root, journal, opts, || {
        // The reader is unblocked by the shutdown (or by the credits
        // going away).
        let _ = stream.shutdown(std::net::Shutdown::Both);
        if let Some(memory) = &reader_memory {
            memory.stop();
        }
    });
    let _ = reader.join();
    result
}

/// A receiver half's event queue: the messages its link delivers (at most
/// [`READ_AHEAD`] ahead of the session thread) and its verifier's verdicts.
pub(crate) struct Inbox {
    tx: mpsc::Sender<Event>,
    events: mpsc::Receiver<Event>,
    credit_tx: mpsc::SyncSender<()>,
    credits: mpsc::Receiver<()>,
}

impl Inbox {
    pub(crate) fn new() -> Inbox {
        let (tx, events) = mpsc::channel::<Event>();
        // The link takes a credit before it hands over a message and the
        // session thread gives one back as it takes the message: at most
        // READ_AHEAD messages wait in memory.
        let (credit_tx, credits) = mpsc::sync_channel::<()>(READ_AHEAD);
        Inbox {
            tx,
            events,
            credit_tx,
            credits,
        }
    }

    /// The in-process link into this half: a sender half's messages, moved.
    pub(crate) fn local_link(&self) -> Box<dyn Outbound + Send> {
        Box::new(LocalOut::new(
            self.tx.clone(),
            Some(self.credit_tx.clone()),
            |m| Event::Msg(m, None),
        ))
    }

    /// Runs the session on this queue, answering through `out`, until the
    /// sender says Bye or its link closes; then `stop_link` (which must end
    /// whatever feeds the queue) and the verifier are stopped, and what
    /// verified is journaled for the next attempt.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(
        self,
        out: &mut dyn Outbound,
        shares: Shares,
        dest: &Destination,
        root: &std::path::Path,
        journal: &Journal,
        opts: &ReceiveOptions,
        stop_link: impl FnOnce(),
    ) -> Result<SessionSummary, TransferError> {
        let Inbox {
            tx,
            events,
            credit_tx,
            credits,
        } = self;
        drop(credit_tx);
        let (jobs, jobs_rx) = mpsc::sync_channel::<Check>(VERIFY_QUEUE);
        let checker = std::thread::spawn(move || verifier(jobs_rx, tx));
        let mut files: HashMap<u64, Incoming> = HashMap::new();
        let mut ready: Vec<(u64, Incoming)> = Vec::new();
        let mut sess = Session {
            out,
            dest,
            root,
            pending_delete: None,
            journal,
            opts,
            jobs,
            files: &mut files,
            ready: &mut ready,
            dirs: Vec::new(),
            dir_bytes: 0,
            dir_held: None,
            created: opts.session_dirs.join(opts.session),
            in_use: InUse::default(),
            shares,
            at_verifier: HashMap::new(),
            summary: SessionSummary::default(),
            buf: AlignedBuf::new(0),
            deferred: Default::default(),
        };
        let result = sess.run(&events, &credits);
        drop(sess);
        stop_link();
        // The verifier stops as its queue closes.
        drop(credits);
        drop(events);
        let _ = checker.join();
        // However the session ended, keep what verified for the next
        // attempt (files still waiting for the group commit included: they
        // stay partial, every block journaled, and the next send only ends
        // them).
        files.extend(ready);
        for f in files.values_mut() {
            let _ = f.journal(journal);
        }
        let _ = journal.flush();
        result
    }
}

struct Session<'a> {
    out: &'a mut dyn Outbound,
    dest: &'a Destination,
    root: &'a std::path::Path,
    pending_delete: Option<Pending>,
    journal: &'a Journal,
    opts: &'a ReceiveOptions,
    jobs: mpsc::SyncSender<Check>,
    files: &'a mut HashMap<u64, Incoming>,
    ready: &'a mut Vec<(u64, Incoming)>,
    /// Directories this session created, to finish at the end, and the
    /// bytes of their paths.
    dirs: Vec<(WirePath, u32, Mtime)>,
    dir_bytes: usize,
    /// What `dirs` holds of the client's memory share.
    dir_held: Option<intact_proto::Held>,
    /// Every directory the session (all its streams) created.
    created: Arc<CreatedDirs>,
    /// What this stream's open files hold of its limits.
    in_use: InUse,
    /// Its session's places in the server's budgets.
    shares: Shares,
    /// Blocks at the verifier now, per file id (also of files that
    /// failed meanwhile): an id is not reused until they are back.
    at_verifier: HashMap<u64, u32>,
    summary: SessionSummary,
    buf: AlignedBuf,
    /// Entries waiting for a place in the session's share (in order).
    deferred: std::collections::VecDeque<admit::Deferred>,
}

impl Session<'_> {
    fn run(
        &mut self,
        events: &mpsc::Receiver<Event>,
        credits: &mpsc::Receiver<()>,
    ) -> Result<SessionSummary, TransferError> {
        self.dest.record_created_dirs(Arc::clone(&self.created));
        let mut data = DataClock::new(self.opts.data_timeout);
        loop {
            self.admit_deferred()?;
            let ev = match events.try_recv() {
                Ok(ev) => ev,
                Err(_) => {
                    // Nothing more to do without waiting: send the replies.
                    self.out.flush()?;
                    let t = std::time::Instant::now();
                    let got = events.recv_timeout(self.tick(data.tick()));
                    data.waited(t.elapsed());
                    match got {
                        Ok(ev) => ev,
                        Err(mpsc::RecvTimeoutError::Timeout) => {
                            data.check(self.files.len())?;
                            continue;
                        }
                        Err(mpsc::RecvTimeoutError::Disconnected) => {
                            return Err(ProtoError::Closed.into())
                        }
                    }
                }
            };
            match ev {
                Event::Checked(c) => {
                    data.moved();
                    data.check(self.files.len())?;
                    self.checked(c)?;
                }
                Event::Msg(arrival, _held) => {
                    let _ = credits.try_recv();
                    let Some(msgs) = arrival.messages()? else {
                        return Ok(std::mem::take(&mut self.summary));
                    };
                    for msg in msgs {
                        if matches!(msg, Message::Block(_) | Message::FileEnd { .. }) {
                            data.moved();
                        }
                        data.check(self.files.len())?;
                        if msg == Message::Bye {
                            self.bye()?;
                            return Ok(std::mem::take(&mut self.summary));
                        }
                        self.message(msg)?;
                    }
                }
            }
        }
    }

    fn message(&mut self, msg: Message) -> Result<(), TransferError> {
        match msg {
            Message::Entry(mut e) => {
                if self.in_use(e.file) {
                    return Err(ProtoError::Malformed {
                        message: "Entry",
                        detail: "its file id is still in use by a file not yet answered",
                    }
                    .into());
                }
                e.mode = bounds::incoming_mode(e.mode, self.opts.keep_special_bits);
                self.entry(e)?;
            }
            Message::Block(b) => self.block(b)?,
            Message::FileEnd {
                file,
                blocks,
                source_level,
                digest,
            } => {
                let Some(f) = self.files.get_mut(&file) else {
                    return Ok(());
                };
                f.ended = Some(blocks);
                f.whole.theirs = digest;
                f.source_level = Some(wire_level(source_level));
                if f.checking == 0 {
                    self.end(file)?;
                }
            }
            Message::DeleteStart {
                dry_run,
                base,
                scopes,
                rules,
            } => {
                let p = Pending::start(
                    dry_run,
                    base,
                    scopes,
                    rules,
                    self.opts.max_delete_paths,
                    self.shares.memory.clone(),
                );
                self.pending_delete = Some(self.refuse_unless(p)?);
            }
            Message::DeleteKeep { paths } => {
                let Some(p) = self.pending_delete.as_mut() else {
                    return Err(ProtoError::Unexpected {
                        got: "DeleteKeep",
                        wanted: "DeleteStart first",
                    }
                    .into());
                };
                let r = p.keep(paths);
                self.refuse_unless(r)?;
            }
            Message::DeleteRun => {
                let Some(p) = self.pending_delete.take() else {
                    return Err(ProtoError::Unexpected {
                        got: "DeleteRun",
                        wanted: "DeleteStart first",
                    }
                    .into());
                };
                let dry_run = p.dry_run;
                let report = p.run(self.root, self.out)?;
                if !dry_run {
                    self.summary.deleted += report.deleted.len() as u64;
                }
            }
            Message::Waiting => {
                // The sender blocks until it hears back: commit the group
                // now, so small files share one syncfs and their results go.
                self.commit()?;
            }
            other => {
                return Err(ProtoError::Unexpected {
                    got: other.name(),
                    wanted: "Entry, Block, FileEnd or Bye",
                }
                .into())
            }
        }
        Ok(())
    }

    /// A `--delete` request the server will not carry out: the sender is
    /// told why and the session ends (nothing was removed).
    fn refuse_unless<T>(&mut self, r: Result<T, String>) -> Result<T, TransferError> {
        match r {
            Ok(v) => Ok(v),
            Err(reason) => {
                self.pending_delete = None;
                self.out.send(Message::Refused {
                    reason: reason.clone(),
                })?;
                Err(TransferError::Remote(reason))
            }
        }
    }

    fn bye(&mut self) -> Result<(), TransferError> {
        // Blocks still at the verifier are abandoned with their files (the
        // sender says Bye only when every file has its result).
        self.commit()?;
        for (path, mode, mtime) in self.dirs.iter().rev() {
            // A directory whose entry succeeded but whose final metadata
            // cannot be set is only logged by the sender's report of the
            // entry; the data inside is safe. Only a directory this
            // session created is touched (checked again on the open
            // directory itself).
            let _ = self
                .dest
                .finish_created_dir(path, *mode, *mtime, &self.created);
        }
        self.out.send(Message::Bye)?;
        Ok(())
    }

    fn commit(&mut self) -> Result<(), TransferError> {
        commit_ready(
            self.out,
            self.dest,
            self.journal,
            self.ready,
            &mut self.summary,
            &self.opts.working,
        )
    }

    /// Fails a file alone (the destination or the journal failed it): what
    /// verified stays journaled for a later attempt; the session goes on.
    fn fail_file(&mut self, file: u64, why: &str) -> Result<(), TransferError> {
        let mut path = format!("file {file}");
        if let Some(mut f) = self.files.remove(&file) {
            let _ = f.journal(self.journal);
            path = f.entry.path.to_string();
        }
        self.summary.fail(&path, why);
        self.out.put(failed(file, why))?;
        Ok(())
    }

    fn block(&mut self, mut b: intact_proto::Block) -> Result<(), TransferError> {
        let Some(f) = self.files.get_mut(&b.file) else {
            // A file that already failed: drop its blocks.
            return Ok(());
        };
        if f.partial.is_none() {
            // Held whole, but the sender's copy differs: it sends every
            // block, and the file is written anew under a partial name.
            if let Err(e) = start_anew(f, self.dest, self.journal, self.opts) {
                return self.fail_file(b.file, &e.to_string());
            }
        }
        let accepted = accept_block(f, &mut b, self.opts);
        let verdict = match accepted {
            Ok(v) => v,
            Err(e @ (TransferError::Destination { .. } | TransferError::Journal(_))) => {
                return self.fail_file(b.file, &e.to_string());
            }
            Err(e) => return Err(e),
        };
        self.summary.bytes += b.data.len() as u64;
        match verdict {
            Verdict::Check(check) => {
                f.checking += 1;
                *self.at_verifier.entry(b.file).or_insert(0) += 1;
                self.jobs.send(check).map_err(|_| ProtoError::Closed)?;
                Ok(())
            }
            Verdict::Done(ok) => {
                let digest = Digest::from_bytes(defaults::BLOCK_ALGORITHM, &b.digest);
                let level = arrival_level(f.mode).min(wire_level(b.source_level));
                self.block_done(b.file, b.index, ok, digest, level)
            }
        }
    }

    /// A block's verification is over: journal it, and answer.
    fn block_done(
        &mut self,
        file: u64,
        index: u64,
        ok: bool,
        digest: Option<Digest>,
        level: VerifyLevel,
    ) -> Result<(), TransferError> {
        let Some(f) = self.files.get_mut(&file) else {
            return Ok(());
        };
        if ok && f.mode != VerifyMode::None {
            if let Some(d) = digest {
                f.unjournaled.push(BlockRecord {
                    index,
                    digest: d.as_bytes().to_vec(),
                    verified: VerifiedAt::now(f.mode, level),
                });
                f.unjournaled_bytes += u64::from(f.entry.block_size);
                if f.unjournaled_bytes >= JOURNAL_BATCH {
                    if let Err(e) = f.journal(self.journal) {
                        return self.fail_file(file, &e.to_string());
                    }
                }
            }
        }
        self.summary.blocks_rejected += u64::from(!ok);
        self.out.put(Message::BlockResult { file, index, ok })?;
        Ok(())
    }

    /// The verifier's verdict on a riva block.
    fn checked(&mut self, c: Checked) -> Result<(), TransferError> {
        if let Some(n) = self.at_verifier.get_mut(&c.id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.at_verifier.remove(&c.id);
            }
        }
        let Some(f) = self.files.get_mut(&c.id) else {
            return Ok(());
        };
        f.checking = f.checking.saturating_sub(1);
        let ok = match c.ok {
            Ok(ok) => ok,
            Err(e) => {
                let why = format!("{}: re-reading block {}: {e}", f.entry.path, c.index);
                return self.fail_file(c.id, &why);
            }
        };
        if let Some(r) = f.riva.as_mut() {
            r.stats.add(&c.outcome);
            r.check += c.took;
        }
        if ok {
            f.verified.set(c.index as usize, Some(c.digest));
        }
        let level = reread_level(&c.outcome).min(c.source_level);
        self.block_done(c.id, c.index, ok, Some(c.digest), level)?;
        let end = self
            .files
            .get(&c.id)
            .is_some_and(|f| f.checking == 0 && f.ended.is_some());
        if end {
            self.end(c.id)?;
        }
        Ok(())
    }

    /// The sender ended the file and no block is at the verifier.
    fn end(&mut self, file: u64) -> Result<(), TransferError> {
        let Some(mut f) = self.files.remove(&file) else {
            return Ok(());
        };
        let blocks = f.ended.take().expect("called once ended");
        if let Some(held) = f.whole.held.filter(|_| f.partial.is_none()) {
            return self.end_held(file, f, held, blocks);
        }
        if blocks != f.verified.len() as u64 {
            // Abandoned (the source changed or failed) or inconsistent:
            // keep what verified for a later attempt, name nothing.
            f.journal(self.journal)?;
            let why = "the sender abandoned the file";
            self.summary.fail(&f.entry.path.to_string(), why);
            self.out.put(failed(file, why))?;
            return Ok(());
        }
        let ended = {
            let _working = self.opts.working.now();
            end_file(&mut f, &mut self.buf)
        };
        match ended {
            Ok(bad) if !bad.is_empty() && f.rounds < MAX_ROUNDS => {
                f.rounds += 1;
                for index in bad {
                    f.verified.set(index as usize, None);
                    self.summary.blocks_rejected += 1;
                    self.out.put(Message::BlockResult {
                        file,
                        index,
                        ok: false,
                    })?;
                }
                self.files.insert(file, f);
            }
            Ok(bad) if !bad.is_empty() => {
                let why = format!("block {} never verified", bad[0]);
                self.summary.fail(&f.entry.path.to_string(), &why);
                self.out.put(failed(file, &why))?;
            }
            Ok(_) => {
                if let Err(why) = whole_digest_matches(&mut f, &mut self.buf) {
                    let _ = f.journal(self.journal);
                    self.summary.fail(&f.entry.path.to_string(), &why);
                    self.out.put(failed(file, &why))?;
                    return Ok(());
                }
                let reached = f.reached();
                if reached.level < VerifyLevel::Device && f.entry.flags & Entry::REQUIRE_DEVICE != 0
                {
                    let _ = f.journal(self.journal);
                    let msg = below_required(&reached);
                    self.summary.fail(&f.entry.path.to_string(), &msg);
                    self.out.put(failed(file, &msg))?;
                    return Ok(());
                }
                self.ready.push((file, f));
                if self.ready.len() >= GROUP_COMMIT_FILES {
                    self.commit()?;
                }
            }
            Err(e) => {
                self.summary.fail(&f.entry.path.to_string(), &e.to_string());
                self.out.put(failed(file, &e.to_string()))?;
            }
        }
        Ok(())
    }
}

impl Session<'_> {
    /// FileEnd of a file held whole under its final name, to which the
    /// sender sent no block: it is unchanged only if the sender's digest of
    /// its source equals the digest held (recorded at its commit, or
    /// computed now from a re-read in place).
    fn end_held(
        &mut self,
        file: u64,
        mut f: Incoming,
        held: HeldWhole,
        blocks: u64,
    ) -> Result<(), TransferError> {
        let path = f.entry.path.to_string();
        let checked = if blocks != f.verified.len() as u64 {
            Err("the sender abandoned the file".to_string())
        } else {
            f.whole.confirm(held.digest).map_err(|_| {
                "the sender's digest differs from the file held, and it sent no block: \
                 nothing changed, the file is not reported unchanged"
                    .to_string()
            })
        };
        // A trusted answer goes now; a re-verified file is checked again
        // right before its record is written (at commit).
        let checked = match held.trusted {
            Some(_) => checked.and_then(|()| still_held(self.dest, &f.entry.path, &held)),
            None => checked,
        };
        if let Err(why) = checked {
            self.summary.fail(&path, &why);
            self.out.put(failed(file, &why))?;
            return Ok(());
        }
        let Some(v) = held.trusted else {
            // Re-verified in place now: recorded anew, at this run's level.
            self.ready.push((file, f));
            if self.ready.len() >= GROUP_COMMIT_FILES {
                self.commit()?;
            }
            return Ok(());
        };
        // Trusted at the level its record says, no higher; nothing to record.
        self.summary.verified += 1;
        self.out.put(Message::FileResult(FileResult {
            unchanged: true,
            trusted: f.entry.size,
            trusted_level: v.level.wire_id(),
            trusted_at: v.at,
            ..verified(file, v.level, "")
        }))?;
        Ok(())
    }
}

/// Why a file held whole is not answered or recorded: the version that was
/// checked is no longer the one under its name.
const CHANGED_MEANWHILE: &str = "the file at the destination changed while it was being \
     checked (another transfer committed it, or it was written in place): \
     nothing is reported unchanged; send it again";

/// Whether the final file is still the version `held` was checked on.
fn still_held(dest: &Destination, path: &WirePath, held: &HeldWhole) -> Result<(), String> {
    match dest.stat_final(path).map(|st| Stamp::of_stat(&st)) {
        Some(now) if now == held.stamp => Ok(()),
        _ => Err(CHANGED_MEANWHILE.to_string()),
    }
}

/// Every block verified: the BLAKE3 of the bytes held (the parts of the
/// blocks written and re-read, or a read of the partial file) must equal
/// the sender's. Err: why the file is not committed.
fn whole_digest_matches(f: &mut Incoming, buf: &mut AlignedBuf) -> Result<(), String> {
    let Some(partial) = &f.partial else {
        return Err("no partial file to compare".into());
    };
    let ours = f
        .whole
        .of_file(partial.file(), f.entry.size, buf)
        .map_err(|e| format!("{}: reading it for its digest: {e}", f.entry.path))?;
    f.whole
        .confirm(ours)
        .map_err(|why| format!("{}: {why}", f.entry.path))
}

/// Commits the ready files as one group and sends their results. A file
/// held whole under its final name needs no rename: only its new record.
fn commit_ready(
    out: &mut dyn Outbound,
    dest: &Destination,
    journal: &Journal,
    ready: &mut Vec<(u64, Incoming)>,
    summary: &mut SessionSummary,
    working: &Working,
) -> Result<(), TransferError> {
    if ready.is_empty() {
        return Ok(());
    }
    let mut meta = Vec::with_capacity(ready.len());
    let mut batch = Vec::with_capacity(ready.len());
    let mut in_place = Vec::new();
    for (id, mut f) in ready.drain(..) {
        let mtime = Mtime {
            sec: f.entry.mtime_sec,
            nsec: f.entry.mtime_nsec,
        };
        let reached = f.reached();
        let mut result = FileResult {
            unchanged: f.partial.is_none(),
            reverified: f.held.reverified_bytes(),
            trusted: f.held.trusted_bytes(),
            trusted_level: f.held.trusted_level().map_or(0, VerifyLevel::wire_id),
            trusted_at: f.held.trusted_at().unwrap_or(0),
            ..verified(id, reached.level, reached.note.as_deref().unwrap_or(""))
        };
        if let Some(r) = &f.riva {
            result.resident = r.stats.resident;
            result.evict_micros = r.stats.evict.as_micros() as u64;
            result.check_micros = r.check.as_micros() as u64;
        }
        let Some(digest) = f.whole.confirmed else {
            // Only a file whose digest was compared is ever made ready.
            let why = "the whole-file digest was not compared: not committed";
            summary.fail(&f.entry.path.to_string(), why);
            out.put(failed(id, why))?;
            continue;
        };
        let record = DoneFile {
            row: f.row,
            blocks: std::mem::take(&mut f.unjournaled),
            verified: f.verified_at(reached.level),
            digest,
        };
        match f.partial.take() {
            Some(partial) => {
                meta.push((id, f.entry.path.to_string(), record, result));
                batch.push((partial, f.entry.mode, mtime));
            }
            None => in_place.push((id, f.entry.path.clone(), f.whole.held, record, result)),
        }
    }
    // A file answered from what it held is recorded only if it is still
    // the version that was checked (another transfer may have committed
    // over it meanwhile).
    let (in_place, moved): (Vec<_>, Vec<_>) =
        in_place.into_iter().partition(|(_, path, held, _, _)| {
            held.as_ref()
                .is_some_and(|h| still_held(dest, path, h).is_ok())
        });
    for (id, path, _, _, _) in moved {
        summary.fail(&path.to_string(), CHANGED_MEANWHILE);
        out.put(failed(id, CHANGED_MEANWHILE))?;
    }
    let in_place: Vec<_> = in_place
        .into_iter()
        .map(|(id, _, _, record, result)| (id, record, result))
        .collect();
    let results = {
        let _working = working.now();
        dest.commit_batch(batch)
    };
    let mut done: Vec<DoneFile> = meta
        .iter()
        .zip(&results)
        .filter(|(_, r)| r.is_ok())
        .map(|((_, _, record, _), _)| record.clone())
        .collect();
    done.extend(in_place.iter().map(|(_, record, _)| record.clone()));
    // A journal failure does not undo a durable, verified file; it only
    // means a later send may move it again.
    let _ = journal.done_batch(&done);
    let outcomes = meta.into_iter().zip(results).chain(
        in_place
            .into_iter()
            .map(|(id, record, result)| ((id, String::new(), record, result), Ok(()))),
    );
    for ((id, path, _, result), r) in outcomes {
        let msg = match r {
            Ok(()) => {
                summary.verified += 1;
                Message::FileResult(result)
            }
            Err(e) => {
                summary.fail(&path, &e.to_string());
                failed(id, &e.to_string())
            }
        };
        out.put(msg)?;
    }
    Ok(())
}

/// Why a file below `--require-level device` fails.
fn below_required(reached: &Reached) -> String {
    format!(
        "reached level {}, but --require-level device was asked for: {}",
        reached.level,
        reached.note.as_deref().unwrap_or("")
    )
}

/// A verified result at `level` with `note`.
fn verified(file: u64, level: VerifyLevel, note: &str) -> FileResult {
    FileResult {
        file,
        status: FileStatus::Verified,
        level: level.wire_id(),
        message: note.to_string(),
        resident: 0,
        evict_micros: 0,
        check_micros: 0,
        unchanged: false,
        reverified: 0,
        trusted: 0,
        trusted_level: 0,
        trusted_at: 0,
    }
}

fn verified_because(file: u64, level: u8, why: &str) -> Message {
    let level = VerifyLevel::from_wire_id(level).unwrap_or(VerifyLevel::None);
    Message::FileResult(verified(file, level, why))
}

fn failed(file: u64, why: &str) -> Message {
    Message::FileResult(FileResult {
        status: FileStatus::Failed,
        ..verified(file, VerifyLevel::None, why)
    })
}

/// What an Entry begins: a reply to send, or a directory for the session.
enum Begun {
    Reply(Message),
    Dir(Entry),
}

/// Handles an Entry: the FileResult of a symlink or a file already held
/// whole, the Status of a file whose blocks must come, or a directory
/// (left to [`Session::dir`]).
fn begin(
    dest: &Destination,
    journal: &Journal,
    opts: &ReceiveOptions,
    e: Entry,
    files: &mut HashMap<u64, Incoming>,
    buf: &mut AlignedBuf,
) -> Begun {
    let id = e.file;
    let result = |r: Result<(), TransferError>| match r {
        Ok(()) => verified_because(id, 0, ""),
        Err(err) => failed(id, &err.to_string()),
    };
    let mtime = Mtime {
        sec: e.mtime_sec,
        nsec: e.mtime_nsec,
    };
    Begun::Reply(match &e.kind {
        EntryKind::Dir => return Begun::Dir(e),
        EntryKind::Symlink(target) => result(dest.make_symlink(&e.path, target, mtime)),
        EntryKind::File => match begin_file(dest, journal, opts, e, files, buf) {
            Ok(m) => m,
            Err(err) => failed(id, &err.to_string()),
        },
    })
}

fn begin_file(
    dest: &Destination,
    journal: &Journal,
    opts: &ReceiveOptions,
    e: Entry,
    files: &mut HashMap<u64, Incoming>,
    buf: &mut AlignedBuf,
) -> Result<Message, TransferError> {
    let id = e.file;
    let Some(mode) = VerifyMode::from_wire_id(e.verify) else {
        return Err(TransferError::Verification {
            path: e.path.to_string(),
            what: format!("unknown verification mode id {}", e.verify),
        });
    };
    if e.algorithm != defaults::BLOCK_ALGORITHM.wire_id() || e.block_size == 0 {
        return Err(TransferError::Verification {
            path: e.path.to_string(),
            what: "unsupported block algorithm or block size".into(),
        });
    }
    let require_device = e.flags & Entry::REQUIRE_DEVICE != 0;
    let same = |r: &crate::journal::FileRow| {
        r.size == e.size
            && r.mtime_sec == e.mtime_sec
            && r.mtime_nsec == e.mtime_nsec
            && r.block_size == e.block_size
    };
    let row = journal.lookup(e.path.as_bytes())?.filter(same);
    // Held whole, with the digest its commit compared (older rows have
    // none, and are received anew): the quick check. The sender compares
    // that digest with its source's own; size and mtime only pick the
    // candidate.
    if let Some((r, digest)) = row
        .as_ref()
        .filter(|r| r.done)
        .and_then(|r| Some((r, r.digest?)))
    {
        if let Some(file) = dest.open_final(&e.path).filter(|f| unchanged_since(f, &e)) {
            // Taken before any read: the answer holds only for this version.
            let stamp = Stamp::of(&file).map_err(|err| TransferError::Destination {
                path: e.path.to_string(),
                source: err,
            })?;
            let reverify = e.flags & Entry::REVERIFY != 0;
            if !reverify && r.verified.level >= mode.level() {
                // Trusted at the level its record says, no higher.
                let level = r.verified.level;
                if require_device && level < VerifyLevel::Device {
                    return Err(TransferError::Verification {
                        path: e.path.to_string(),
                        what: format!("--require-level device: held at level {level}"),
                    });
                }
                let mut inc = Incoming::fresh(e.clone(), mode, None, r.id);
                inc.whole.held = Some(HeldWhole {
                    digest,
                    trusted: Some(r.verified),
                    stamp,
                });
                files.insert(id, inc);
                return Ok(Message::Status {
                    file: id,
                    holding: Holding::Whole {
                        digest: digest.to_vec(),
                    },
                });
            }
            if mode != VerifyMode::None {
                let inc = Incoming::fresh(e.clone(), mode, None, r.id);
                if let Some(inc) = reverify_whole(inc, journal, &file, opts, buf, &digest, stamp)? {
                    files.insert(id, inc);
                    return Ok(Message::Status {
                        file: id,
                        holding: Holding::Whole {
                            digest: digest.to_vec(),
                        },
                    });
                }
            }
        }
    }
    let partial = dest.partial(&e.path, e.size)?;
    let resumed = row.filter(|r| !r.done);
    // This session holds the partial's lock now: the journal says so
    // (start, or reopen below, records it).
    let session = opts.session.map(|s| s.0);
    let row_id = match &resumed {
        Some(r) => r.id,
        None => journal.start(
            e.path.as_bytes(),
            e.size,
            (e.mtime_sec, e.mtime_nsec),
            e.block_size,
            session,
        )?,
    };
    let mut inc = Incoming::fresh(e, mode, Some(partial), row_id);
    inc.riva = open_verifier(&inc, opts)?;
    let resumed_id = resumed.as_ref().map(|r| r.id);
    let holding = match resumed {
        Some(r) => {
            let list = reverify_held(&mut inc, journal.blocks(r.id)?, buf)?;
            if list.is_empty() {
                Holding::Nothing
            } else {
                Holding::Blocks(list)
            }
        }
        None => Holding::Nothing,
    };
    if resumed_id.is_some() {
        journal.reopen(row_id, session)?;
    }
    files.insert(id, inc);
    Ok(Message::Status { file: id, holding })
}

/// Whether the final file still has the size and mtime the entry announces.
fn unchanged_since(file: &File, e: &Entry) -> bool {
    use std::os::unix::fs::MetadataExt;
    file.metadata().is_ok_and(|m| {
        m.len() == e.size && m.mtime() == e.mtime_sec && m.mtime_nsec() as u32 == e.mtime_nsec
    })
}

impl Incoming {
    /// A file with nothing verified yet.
    fn fresh(entry: Entry, mode: VerifyMode, partial: Option<PartialFile>, row: i64) -> Incoming {
        let blocks = entry.size.div_ceil(u64::from(entry.block_size)) as usize;
        Incoming {
            whole: WholeDigest::new(entry.size, entry.block_size),
            verified: BlockDigests::new(blocks),
            entry,
            mode,
            partial,
            riva: None,
            checking: 0,
            ended: None,
            rounds: 0,
            row,
            unjournaled: Vec::new(),
            unjournaled_bytes: 0,
            held: Held::default(),
            source_level: None,
            slot: None,
        }
    }

    /// A held block re-verified in place at `level`: verified, counted,
    /// and recorded anew; returns its (index, digest) for the Status.
    fn reverified_in_place(
        &mut self,
        index: u64,
        len: usize,
        d: Digest,
        level: VerifyLevel,
    ) -> (u64, Vec<u8>) {
        self.verified.set(index as usize, Some(d));
        self.held.reverified(index, len as u64);
        self.unjournaled.push(BlockRecord {
            index,
            digest: d.as_bytes().to_vec(),
            verified: VerifiedAt::now(self.mode, level),
        });
        (index, d.as_bytes().to_vec())
    }

    /// Turns an I/O error on this file into a destination error.
    fn path_err(&self) -> impl Fn(std::io::Error) -> TransferError + '_ {
        |err| TransferError::Destination {
            path: self.entry.path.to_string(),
            source: err,
        }
    }
}

/// The verifier's reader of the partial file (riva: from the device;
/// block: through the cache); None in the other modes.
fn open_verifier(inc: &Incoming, opts: &ReceiveOptions) -> Result<Option<RivaIn>, TransferError> {
    match &inc.partial {
        Some(p) => open_reader(inc, p.file(), opts),
        None => Ok(None),
    }
}

/// The verifier's reader of `file`, by the mode's means; with
/// `--require-level device` a file system without a device fails here.
fn open_reader(
    inc: &Incoming,
    file: &File,
    opts: &ReceiveOptions,
) -> Result<Option<RivaIn>, TransferError> {
    let mode = inc.mode;
    if !matches!(mode, VerifyMode::Riva | VerifyMode::Block) {
        return Ok(None);
    }
    let path = if mode == VerifyMode::Block || opts.reread_through_cache() {
        ReadPath::Cached
    } else if inc.entry.flags & Entry::DIRECT != 0 {
        ReadPath::Direct
    } else {
        ReadPath::Evict
    };
    let r = RivaIn::open(file, path).map_err(inc.path_err())?;
    if mode == VerifyMode::Riva && inc.entry.flags & Entry::REQUIRE_DEVICE != 0 {
        if let Some(why) = r.no_device_reason() {
            return Err(TransferError::Verification {
                path: inc.entry.path.to_string(),
                what: format!("--require-level device: the destination is on {why}"),
            });
        }
    }
    Ok(Some(r))
}

/// A held file whose sender's copy differs: forget what was held and
/// receive every block into a new partial file.
fn start_anew(
    f: &mut Incoming,
    dest: &Destination,
    journal: &Journal,
    opts: &ReceiveOptions,
) -> Result<(), TransferError> {
    let e = f.entry.clone();
    let partial = dest.partial(&e.path, e.size)?;
    let row = journal.start(
        e.path.as_bytes(),
        e.size,
        (e.mtime_sec, e.mtime_nsec),
        e.block_size,
        opts.session.map(|s| s.0),
    )?;
    let mut inc = Incoming::fresh(e, f.mode, Some(partial), row);
    inc.riva = open_verifier(&inc, opts)?;
    inc.slot = f.slot.take();
    *f = inc;
    Ok(())
}

/// Blocks and their digests, as a Status lists them.
type BlockList = Vec<(u64, Vec<u8>)>;

/// A journaled block still inside the file: (index, offset, length, digest).
type HeldBlock = (u64, u64, usize, Digest);

fn usable_record(e: &Entry, rec: &BlockRecord) -> Option<HeldBlock> {
    let bs = u64::from(e.block_size);
    let offset = rec.index.checked_mul(bs).filter(|&o| o < e.size)?;
    let d = Digest::from_bytes(defaults::BLOCK_ALGORITHM, &rec.digest)?;
    Some((rec.index, offset, (e.size - offset).min(bs) as usize, d))
}

/// Re-reads the blocks `items` of `file` by the mode's own means (riva:
/// evicted and read from the device, counted in the file's device
/// statistics); returns per block whether it matched and the level its
/// read reached.
fn reread_in_place(
    inc: &mut Incoming,
    file: &File,
    items: &[HeldBlock],
    buf: &mut AlignedBuf,
) -> Result<Vec<(bool, VerifyLevel)>, TransferError> {
    let mut out = Vec::with_capacity(items.len());
    let reader = inc.riva.as_ref().map(|r| Arc::clone(&r.reader));
    for chunk in batches(items) {
        // Each block's part of the whole-file digest, from this very read
        // (a block that does not match is not held, and its part is
        // replaced when it is received).
        let whole = &mut inc.whole;
        let seen = |i: usize, bytes: &[u8]| whole.add(chunk[i].0, bytes);
        let rechecks: Vec<Recheck<'_>> = chunk
            .iter()
            .map(|(_, offset, len, digest)| Recheck {
                file,
                reader: reader.as_deref(),
                offset: *offset,
                len: *len,
                digest,
            })
            .collect();
        for r in recheck_batch_seen(&rechecks, buf, seen) {
            let ok = r.ok.map_err(inc.path_err())?;
            let level = match inc.riva.as_mut() {
                Some(riva) => {
                    riva.stats.add(&r.outcome);
                    riva.check += r.took;
                    reread_level(&r.outcome)
                }
                None => VerifyLevel::Cache,
            };
            out.push((ok, level));
        }
    }
    Ok(out)
}

/// Splits `items` into batches of about [`BATCH_BYTES`].
fn batches(items: &[HeldBlock]) -> Vec<&[HeldBlock]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, (_, _, len, _)) in items.iter().enumerate() {
        if bytes > 0 && bytes + len > BATCH_BYTES {
            out.push(&items[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += len;
    }
    if start < items.len() {
        out.push(&items[start..]);
    }
    out
}

/// A resume: the journaled blocks of the partial file. A block recorded at
/// the mode's aim or above is trusted (after a check through the cache
/// that it is still there); a block recorded below it is re-verified in
/// place by the mode's own means. Returns the blocks held, with digests.
fn reverify_held(
    inc: &mut Incoming,
    records: Vec<BlockRecord>,
    buf: &mut AlignedBuf,
) -> Result<BlockList, TransferError> {
    let file = inc
        .partial
        .as_ref()
        .expect("a resume has a partial file")
        .file()
        .try_clone()
        .map_err(inc.path_err())?;
    let aim = inc.mode.level();
    let mut again = Vec::new();
    let mut held = Vec::new();
    for rec in &records {
        let Some(item) = usable_record(&inc.entry, rec) else {
            continue;
        };
        if rec.verified.level < aim {
            again.push(item);
            continue;
        }
        let (index, offset, len, d) = item;
        if inc.verified.get(index as usize).is_none() {
            continue;
        }
        if reread_matches(&file, offset, len, &d, buf).unwrap_or(false) {
            inc.whole.add(index, &buf[..len]);
            inc.verified.set(index as usize, Some(d));
            inc.held.trust(index, len as u64, rec.verified);
            held.push((index, d.as_bytes().to_vec()));
        }
    }
    let results = reread_in_place(inc, &file, &again, buf)?;
    for ((index, _, len, d), (ok, level)) in again.into_iter().zip(results) {
        if ok {
            held.push(inc.reverified_in_place(index, len, d, level));
        }
    }
    held.sort_unstable_by_key(|(i, _)| *i);
    // One Status lists at most MAX_STATUS_BLOCKS blocks: hold only those,
    // so that every other block is sent and counted once.
    for (index, _) in held.iter().skip(MAX_STATUS_BLOCKS) {
        inc.verified.set(*index as usize, None);
        inc.held.forget(*index);
    }
    held.truncate(MAX_STATUS_BLOCKS);
    Ok(held)
}

/// A file held whole under its final name, below the mode's aim or with
/// `--reverify`: every block is re-verified in place by the mode's own
/// means, and the BLAKE3 of the bytes those reads found must equal the
/// digest `recorded` at its commit. Returns the file, holding that digest
/// (it ends without data if the sender's source has the same), or None if
/// a block is missing from the journal or no longer matches, or the whole
/// differs (the file is then received anew).
fn reverify_whole(
    mut inc: Incoming,
    journal: &Journal,
    file: &File,
    opts: &ReceiveOptions,
    buf: &mut AlignedBuf,
    recorded: &[u8; crate::net::whole_digest::LEN],
    stamp: Stamp,
) -> Result<Option<Incoming>, TransferError> {
    let items: Vec<HeldBlock> = journal
        .blocks(inc.row)?
        .iter()
        .filter_map(|r| usable_record(&inc.entry, r))
        .collect();
    let complete = items.len() == inc.verified.len()
        && items.iter().enumerate().all(|(i, it)| it.0 == i as u64);
    if !complete {
        return Ok(None);
    }
    inc.riva = open_reader(&inc, file, opts)?;
    let results = reread_in_place(&mut inc, file, &items, buf)?;
    if results.iter().any(|(ok, _)| !ok) {
        return Ok(None);
    }
    let now = inc
        .whole
        .of_file(file, inc.entry.size, buf)
        .map_err(inc.path_err())?;
    if blake3::Hash::from_bytes(now) != blake3::Hash::from_bytes(*recorded) {
        return Ok(None);
    }
    for ((index, _, len, d), (_, level)) in items.into_iter().zip(results) {
        inc.reverified_in_place(index, len, d, level);
    }
    inc.whole.held = Some(HeldWhole {
        digest: now,
        trusted: None,
        stamp,
    });
    Ok(Some(inc))
}

/// Where a received block stands.
enum Verdict {
    /// Verified (or not) already.
    Done(bool),
    /// Written; the verifier must re-read it from the device.
    Check(Check),
}

/// Checks and writes one block, and hands it to the verifier (block and
/// riva modes) or marks it verified. A block for a slot already held from
/// an earlier run replaces it (the sender's copy differs), unless it is
/// the same block again.
fn accept_block(
    f: &mut Incoming,
    b: &mut intact_proto::Block,
    opts: &ReceiveOptions,
) -> Result<Verdict, TransferError> {
    let index = b.index;
    let bs = u64::from(f.entry.block_size);
    let Some(slot) = f.verified.get(index as usize).map(|d| d.copied()) else {
        return Err(ProtoError::Malformed {
            message: "Block",
            detail: "block index past the end of the file",
        }
        .into());
    };
    let offset = index * bs;
    let want_len = (f.entry.size - offset).min(bs) as usize;
    if b.data.len() != want_len {
        return Err(ProtoError::Malformed {
            message: "Block",
            detail: "block length does not match the file",
        }
        .into());
    }
    let digest = Digest::from_bytes(defaults::BLOCK_ALGORITHM, &b.digest);
    if let Some(held) = slot {
        if digest.is_some_and(|d| d.ct_eq(&held)) {
            return Ok(Verdict::Done(true));
        }
        f.verified.set(index as usize, None);
        f.held.forget(index);
    }
    let expected = match f.mode {
        VerifyMode::None => None,
        _ => match digest {
            Some(d) => Some(d),
            None => return Ok(Verdict::Done(false)),
        },
    };
    let data = &mut b.data[..];
    if let Some(d) = &expected {
        if !hash(defaults::BLOCK_ALGORITHM, data).ct_eq(d) {
            return Ok(Verdict::Done(false));
        }
    }
    if let Some(hook) = opts.after_check() {
        hook(&f.entry.path.to_string(), index, data);
    }
    let path = f.entry.path.to_string();
    let dest_err = |e| TransferError::Destination {
        path: path.clone(),
        source: e,
    };
    let partial = f.partial.as_ref().expect("blocks go to a partial file");
    partial
        .file()
        .write_all_at(data, offset)
        .map_err(dest_err)?;
    if let Some(hook) = opts.after_write() {
        hook(partial.file(), &path, index, offset, want_len);
    }
    // The bytes written are the block's part of the whole-file digest.
    f.whole.add(index, data);
    // Block and riva: the verifier re-reads it.
    if let (Some(d), Some(r)) = (&expected, &f.riva) {
        return Ok(Verdict::Check(Check {
            id: f.entry.file,
            index,
            source_level: wire_level(b.source_level),
            offset,
            len: want_len,
            digest: *d,
            file: Arc::clone(&r.file),
            reader: Arc::clone(&r.reader),
        }));
    }
    // In none mode there is no digest; record the data's own so the slot
    // reads as done.
    f.verified.set(
        index as usize,
        Some(expected.unwrap_or_else(|| hash(Algorithm::Crc32c, &[]))),
    );
    Ok(Verdict::Done(true))
}

fn reread_matches(
    file: &std::fs::File,
    offset: u64,
    len: usize,
    want: &Digest,
    buf: &mut AlignedBuf,
) -> std::io::Result<bool> {
    if buf.len() < len {
        *buf = AlignedBuf::new(len);
    }
    file.read_exact_at(&mut buf[..len], offset)?;
    Ok(hash(defaults::BLOCK_ALGORITHM, &buf[..len]).ct_eq(want))
}

/// At FileEnd: every block must have verified; sequential and file modes
/// re-read the whole file. Returns the blocks that must be sent again.
fn end_file(f: &mut Incoming, buf: &mut AlignedBuf) -> Result<Vec<u64>, TransferError> {
    let missing: Vec<u64> = (0..f.verified.len() as u64)
        .filter(|&i| f.verified.get(i as usize) == Some(None))
        .collect();
    let Some(partial) = &f.partial else {
        // Held whole: every block was re-verified in place already.
        return Ok(missing);
    };
    if !missing.is_empty() || !matches!(f.mode, VerifyMode::Sequential | VerifyMode::File) {
        return Ok(missing);
    }
    let bs = u64::from(f.entry.block_size);
    let path = f.entry.path.to_string();
    let mut bad = Vec::new();
    for (i, d) in f.verified.iter().enumerate() {
        let offset = i as u64 * bs;
        let len = (f.entry.size - offset).min(bs) as usize;
        let d = d.expect("all verified");
        let ok = reread_matches(partial.file(), offset, len, d, buf).map_err(|e| {
            TransferError::Destination {
                path: path.clone(),
                source: e,
            }
        })?;
        if !ok {
            bad.push(i as u64);
        }
    }
    Ok(bad)
}
