//! The receiving side of one connection.
//!
//! Every Entry gets exactly one FileResult. A file's blocks are checked
//! against the digests that travel with them, written, and (block mode)
//! re-read; each Block gets a BlockResult, and a failed one is resent by
//! the sender. At FileEnd the file is re-read if the mode says so, bad
//! blocks are asked for again, and only a fully verified file is fsynced
//! and renamed to its final name.
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
};

use crate::copy::WriteHook;
use crate::dest::{Destination, Mtime, PartialFile};
use crate::journal::Journal;
use crate::recheck::{recheck_batch, Recheck, BATCH_BYTES};
use crate::verify::{DeviceStats, VerifyLevel, VerifyMode};
use crate::TransferError;

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

/// Verified-but-unjournaled data after which the partial file is
/// fdatasynced and its blocks recorded, in bytes: what a server crash can
/// cost a file in resent data, against one fdatasync per batch.
const JOURNAL_BATCH: u64 = 8 << 20;

/// What one session did, for the server's log.
#[derive(Debug, Default, Clone, Copy)]
pub struct SessionSummary {
    /// Files verified and committed.
    pub verified: u64,
    /// Entries that failed.
    pub failed: u64,
    /// Blocks that failed verification and were asked for again.
    pub blocks_rejected: u64,
    /// Bytes of block payload received.
    pub bytes: u64,
}

struct Incoming {
    entry: Entry,
    mode: VerifyMode,
    partial: PartialFile,
    /// Riva: the file shared with the verifier, its device reader, and
    /// what its reads did.
    riva: Option<RivaIn>,
    /// Blocks at the verifier now.
    checking: u32,
    /// The sender's FileEnd, held while blocks are still at the verifier.
    ended: Option<u64>,
    /// Per block: the digest it verified against, once it has.
    verified: Vec<Option<Digest>>,
    rounds: u32,
    /// The file's journal row.
    row: i64,
    /// Verified blocks not yet in the journal, and their bytes.
    unjournaled: Vec<(u64, Vec<u8>)>,
    unjournaled_bytes: u64,
}

impl Incoming {
    /// Makes the verified data durable, then records it.
    fn journal(&mut self, journal: &Journal) -> Result<(), TransferError> {
        if self.unjournaled.is_empty() {
            return Ok(());
        }
        self.partial
            .file()
            .sync_data()
            .map_err(|e| TransferError::Destination {
                path: self.entry.path.to_string(),
                source: e,
            })?;
        journal.add_blocks(self.row, &self.unjournaled)?;
        self.unjournaled.clear();
        self.unjournaled_bytes = 0;
        Ok(())
    }
}

struct RivaIn {
    file: Arc<File>,
    reader: Arc<Mutex<DeviceReader>>,
    stats: DeviceStats,
    check: Duration,
}

impl RivaIn {
    fn open(partial: &PartialFile, path: ReadPath) -> std::io::Result<RivaIn> {
        let file = Arc::new(partial.file().try_clone()?);
        let reader = DeviceReader::new(&file, path)?;
        Ok(RivaIn {
            file,
            reader: Arc::new(Mutex::new(reader)),
            stats: DeviceStats::default(),
            check: Duration::ZERO,
        })
    }

    /// The level the destination's reads reached, and why not `device`.
    fn level(&self) -> (VerifyLevel, String) {
        let b = self.reader.lock().expect("no panics hold it").backing();
        let (level, why) = self.stats.level_at("destination", b);
        (level, why.unwrap_or_default())
    }
}

/// Work for the verifier thread: re-read a written block from the device.
struct Check {
    id: u64,
    index: u64,
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
    digest: Digest,
    ok: Result<bool, std::io::Error>,
    outcome: intact_cache::ReadOutcome,
    took: Duration,
}

/// What the session thread waits for.
enum Event {
    /// The next message from the socket (None: closed cleanly).
    Msg(Result<Option<Message>, ProtoError>),
    /// A verifier's verdict.
    Checked(Checked),
}

/// The verifier thread of a session: it takes the blocks queued so far as
/// one batch (see [`crate::recheck`]) and sends a verdict for each.
fn verifier(jobs: mpsc::Receiver<Check>, events: mpsc::Sender<Event>, block_size: usize) {
    let mut buf = AlignedBuf::new(block_size);
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

/// The algorithm id of intact's block digest on the wire.
pub(crate) fn block_algorithm_id() -> u8 {
    Algorithm::ALL
        .iter()
        .position(|a| *a == defaults::BLOCK_ALGORITHM)
        .expect("the block algorithm is in ALL") as u8
}

/// How a receiver works, beyond what each Entry asks for.
#[derive(Clone, Default)]
pub struct ReceiveOptions {
    /// Called after each block is written, before it is verified (tests
    /// and the fault lab only).
    pub after_write: Option<WriteHook>,
    /// Called on each received block's bytes after their digest was
    /// checked and before they are written: a memory fault in the window
    /// the Z²FS paper calls t0–t1 (tests and the fault lab only).
    pub after_check: Option<crate::copy::LinkFault>,
    /// Negative control for the fault lab: `riva` re-reads through the
    /// page cache instead of after eviction (as a broken riva would), so
    /// the lab can prove its device-write cells are able to fail.
    pub reread_through_cache: bool,
}

/// Runs the receiving side of a session that passed its handshake.
/// Returns when the sender says Bye or goes away; a protocol violation
/// ends the session with an error (partial files stay for resume).
pub fn receive(
    conn: Connection<TcpStream>,
    dest: &Destination,
    journal: &Journal,
    opts: &ReceiveOptions,
) -> Result<SessionSummary, TransferError> {
    let clone = |s: &TcpStream| s.try_clone().map_err(|e| TransferError::Path(e.into()));
    let stream = clone(conn.get_ref())?;
    let mut out = Connection::new(clone(&stream)?);
    let (tx, events) = mpsc::channel::<Event>();
    // The reader takes a credit before it hands over a message and the
    // session thread gives one back as it takes the message: at most
    // READ_AHEAD messages wait in memory.
    let (credit_tx, credits) = mpsc::sync_channel::<()>(READ_AHEAD);
    let reader_tx = tx.clone();
    let reader = std::thread::spawn(move || {
        let mut conn = conn;
        loop {
            let m = conn.read_message();
            let stop = !matches!(m, Ok(Some(_)));
            if credit_tx.send(()).is_err() || reader_tx.send(Event::Msg(m)).is_err() || stop {
                return;
            }
        }
    });
    let (jobs, jobs_rx) = mpsc::sync_channel::<Check>(VERIFY_QUEUE);
    let verifier_tx = tx;
    let checker = std::thread::spawn(move || verifier(jobs_rx, verifier_tx, defaults::BLOCK_BYTES));
    let mut files: HashMap<u64, Incoming> = HashMap::new();
    let mut ready: Vec<(u64, Incoming)> = Vec::new();
    let mut sess = Session {
        out: &mut out,
        dest,
        journal,
        opts,
        jobs,
        files: &mut files,
        ready: &mut ready,
        dirs: Vec::new(),
        summary: SessionSummary::default(),
        buf: AlignedBuf::new(0),
    };
    let result = sess.run(&events, &credits);
    drop(sess);
    // Stop the helpers: the reader is unblocked by the shutdown (or by
    // the credits going away), the verifier by its queue closing.
    let _ = stream.shutdown(std::net::Shutdown::Both);
    drop(credits);
    drop(events);
    let _ = reader.join();
    let _ = checker.join();
    // However the session ended, keep what verified for the next attempt
    // (files still waiting for the group commit included: they stay
    // partial, every block journaled, and the next send only ends them).
    files.extend(ready);
    for f in files.values_mut() {
        let _ = f.journal(journal);
    }
    result
}

struct Session<'a> {
    out: &'a mut Connection<TcpStream>,
    dest: &'a Destination,
    journal: &'a Journal,
    opts: &'a ReceiveOptions,
    jobs: mpsc::SyncSender<Check>,
    files: &'a mut HashMap<u64, Incoming>,
    ready: &'a mut Vec<(u64, Incoming)>,
    dirs: Vec<(WirePath, u32, Mtime)>,
    summary: SessionSummary,
    buf: AlignedBuf,
}

impl Session<'_> {
    fn run(
        &mut self,
        events: &mpsc::Receiver<Event>,
        credits: &mpsc::Receiver<()>,
    ) -> Result<SessionSummary, TransferError> {
        loop {
            let ev = match events.try_recv() {
                Ok(ev) => ev,
                Err(_) => {
                    // Nothing more to do without waiting: send the replies.
                    self.out.flush()?;
                    events.recv().map_err(|_| ProtoError::Closed)?
                }
            };
            match ev {
                Event::Checked(c) => self.checked(c)?,
                Event::Msg(m) => {
                    let _ = credits.try_recv();
                    let Some(msg) = m? else {
                        return Ok(self.summary);
                    };
                    if msg == Message::Bye {
                        self.bye()?;
                        return Ok(self.summary);
                    }
                    self.message(msg)?;
                }
            }
        }
    }

    fn message(&mut self, msg: Message) -> Result<(), TransferError> {
        match msg {
            Message::Entry(e) => {
                let reply = begin(
                    self.dest,
                    self.journal,
                    self.opts,
                    e,
                    self.files,
                    &mut self.dirs,
                    &mut self.buf,
                );
                if let Message::FileResult(r) = &reply {
                    match r.status {
                        FileStatus::Failed => self.summary.failed += 1,
                        FileStatus::Verified => {
                            self.summary.verified += u64::from(!r.message.is_empty())
                        }
                    }
                }
                self.out.write_message(&reply)?;
            }
            Message::Block(b) => self.block(b)?,
            Message::FileEnd { file, blocks, .. } => {
                let Some(f) = self.files.get_mut(&file) else {
                    return Ok(());
                };
                f.ended = Some(blocks);
                if f.checking == 0 {
                    self.end(file)?;
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

    fn bye(&mut self) -> Result<(), TransferError> {
        // Blocks still at the verifier are abandoned with their files (the
        // sender says Bye only when every file has its result).
        self.commit()?;
        for (path, mode, mtime) in self.dirs.iter().rev() {
            // A directory whose entry succeeded but whose final metadata
            // cannot be set is only logged by the sender's report of the
            // entry; the data inside is safe.
            let _ = self.dest.finish_dir(path, *mode, *mtime);
        }
        self.out.send(&Message::Bye)?;
        Ok(())
    }

    fn commit(&mut self) -> Result<(), TransferError> {
        commit_ready(
            self.out,
            self.dest,
            self.journal,
            self.ready,
            &mut self.summary,
        )
    }

    /// Fails a file alone (the destination or the journal failed it): what
    /// verified stays journaled for a later attempt; the session goes on.
    fn fail_file(&mut self, file: u64, why: &str) -> Result<(), TransferError> {
        if let Some(mut f) = self.files.remove(&file) {
            let _ = f.journal(self.journal);
        }
        self.summary.failed += 1;
        self.out.write_message(&failed(file, why))?;
        Ok(())
    }

    fn block(&mut self, mut b: intact_proto::Block) -> Result<(), TransferError> {
        let Some(f) = self.files.get_mut(&b.file) else {
            // A file that already failed: drop its blocks.
            return Ok(());
        };
        let accepted = accept_block(f, b.index, &b.digest, &mut b.data, self.opts);
        let verdict = match accepted {
            Ok(v) => v,
            Err(e @ (TransferError::Destination { .. } | TransferError::Journal(_))) => {
                return self.fail_file(b.file, &e.to_string());
            }
            Err(e) => return Err(e),
        };
        self.summary.bytes += b.data.len() as u64;
        crate::fault::maybe_kill(self.summary.bytes);
        match verdict {
            Verdict::Check(check) => {
                f.checking += 1;
                self.jobs.send(check).map_err(|_| ProtoError::Closed)?;
                Ok(())
            }
            Verdict::Done(ok) => {
                let digest = Digest::from_bytes(defaults::BLOCK_ALGORITHM, &b.digest);
                self.block_done(b.file, b.index, ok, digest)
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
    ) -> Result<(), TransferError> {
        let Some(f) = self.files.get_mut(&file) else {
            return Ok(());
        };
        if ok && f.mode != VerifyMode::None {
            if let Some(d) = digest {
                f.unjournaled.push((index, d.as_bytes().to_vec()));
                f.unjournaled_bytes += u64::from(f.entry.block_size);
                if f.unjournaled_bytes >= JOURNAL_BATCH {
                    if let Err(e) = f.journal(self.journal) {
                        return self.fail_file(file, &e.to_string());
                    }
                }
            }
        }
        self.summary.blocks_rejected += u64::from(!ok);
        self.out
            .write_message(&Message::BlockResult { file, index, ok })?;
        Ok(())
    }

    /// The verifier's verdict on a riva block.
    fn checked(&mut self, c: Checked) -> Result<(), TransferError> {
        let Some(f) = self.files.get_mut(&c.id) else {
            return Ok(());
        };
        f.checking -= 1;
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
            f.verified[c.index as usize] = Some(c.digest);
        }
        self.block_done(c.id, c.index, ok, Some(c.digest))?;
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
        if blocks != f.verified.len() as u64 {
            // Abandoned (the source changed or failed) or inconsistent:
            // keep what verified for a later attempt, name nothing.
            f.journal(self.journal)?;
            self.summary.failed += 1;
            self.out
                .write_message(&failed(file, "the sender abandoned the file"))?;
            return Ok(());
        }
        match end_file(&mut f, &mut self.buf) {
            Ok(bad) if !bad.is_empty() && f.rounds < MAX_ROUNDS => {
                f.rounds += 1;
                for index in bad {
                    f.verified[index as usize] = None;
                    self.summary.blocks_rejected += 1;
                    self.out.write_message(&Message::BlockResult {
                        file,
                        index,
                        ok: false,
                    })?;
                }
                self.files.insert(file, f);
            }
            Ok(bad) if !bad.is_empty() => {
                self.summary.failed += 1;
                self.out
                    .write_message(&failed(file, &format!("block {} never verified", bad[0])))?;
            }
            Ok(_) => {
                let riva = f.riva.as_ref().filter(|_| f.mode == VerifyMode::Riva);
                if let Some((level, why)) = riva.map(RivaIn::level) {
                    if level < VerifyLevel::Device && f.entry.flags & Entry::REQUIRE_DEVICE != 0 {
                        let _ = f.journal(self.journal);
                        self.summary.failed += 1;
                        let msg = format!("reached level {level}, but --require-level device was asked for: {why}");
                        self.out.write_message(&failed(file, &msg))?;
                        return Ok(());
                    }
                }
                self.ready.push((file, f));
                if self.ready.len() >= GROUP_COMMIT_FILES {
                    self.commit()?;
                }
            }
            Err(e) => {
                self.summary.failed += 1;
                self.out.write_message(&failed(file, &e.to_string()))?;
            }
        }
        Ok(())
    }
}

/// Commits the ready files as one group and sends their results.
fn commit_ready<S: std::io::Read + std::io::Write>(
    conn: &mut Connection<S>,
    dest: &Destination,
    journal: &Journal,
    ready: &mut Vec<(u64, Incoming)>,
    summary: &mut SessionSummary,
) -> Result<(), TransferError> {
    if ready.is_empty() {
        return Ok(());
    }
    let mut meta = Vec::with_capacity(ready.len());
    let mut batch = Vec::with_capacity(ready.len());
    for (id, mut f) in ready.drain(..) {
        let mtime = Mtime {
            sec: f.entry.mtime_sec,
            nsec: f.entry.mtime_nsec,
        };
        let (level, note) = match (&f.riva, f.mode) {
            (Some(r), VerifyMode::Riva) => r.level(),
            _ => (f.mode.level(), String::new()),
        };
        let mut result = verified_because(id, level.wire_id(), &note);
        if let (Some(r), Message::FileResult(fr)) = (&f.riva, &mut result) {
            fr.resident = r.stats.resident;
            fr.evict_micros = r.stats.evict.as_micros() as u64;
            fr.check_micros = r.check.as_micros() as u64;
        }
        meta.push((id, f.row, std::mem::take(&mut f.unjournaled), level, result));
        batch.push((f.partial, f.entry.mode, mtime));
    }
    let results = dest.commit_batch(batch);
    let done: Vec<(i64, crate::journal::BlockDigests, u8)> = meta
        .iter()
        .zip(&results)
        .filter(|(_, r)| r.is_ok())
        .map(|((_, row, blocks, level, _), _)| (*row, blocks.clone(), level.wire_id()))
        .collect();
    // A journal failure does not undo a durable, verified file; it only
    // means a later send may move it again.
    let _ = journal.done_batch(&done);
    for ((id, _, _, _, msg), r) in meta.into_iter().zip(results) {
        let msg = match r {
            Ok(()) => {
                summary.verified += 1;
                msg
            }
            Err(e) => {
                summary.failed += 1;
                failed(id, &e.to_string())
            }
        };
        conn.write_message(&msg)?;
    }
    Ok(())
}

fn verified_because(file: u64, level: u8, why: &str) -> Message {
    Message::FileResult(FileResult {
        file,
        status: FileStatus::Verified,
        level,
        message: why.to_string(),
        resident: 0,
        evict_micros: 0,
        check_micros: 0,
    })
}

fn failed(file: u64, why: &str) -> Message {
    Message::FileResult(FileResult {
        file,
        status: FileStatus::Failed,
        level: 0,
        message: why.to_string(),
        resident: 0,
        evict_micros: 0,
        check_micros: 0,
    })
}

/// Handles an Entry: the FileResult of a directory, a symlink or a file
/// already held whole, or the Status of a file whose blocks must come.
fn begin(
    dest: &Destination,
    journal: &Journal,
    opts: &ReceiveOptions,
    e: Entry,
    files: &mut HashMap<u64, Incoming>,
    dirs: &mut Vec<(WirePath, u32, Mtime)>,
    buf: &mut AlignedBuf,
) -> Message {
    let id = e.file;
    let result = |r: Result<(), TransferError>| match r {
        Ok(()) => verified_because(id, 0, ""),
        Err(err) => failed(id, &err.to_string()),
    };
    let mtime = Mtime {
        sec: e.mtime_sec,
        nsec: e.mtime_nsec,
    };
    match &e.kind {
        EntryKind::Dir => {
            let r = dest.make_dir(&e.path);
            if r.is_ok() {
                dirs.push((e.path.clone(), e.mode, mtime));
            }
            result(r)
        }
        EntryKind::Symlink(target) => result(dest.make_symlink(&e.path, target, mtime)),
        EntryKind::File => match begin_file(dest, journal, opts, e, files, buf) {
            Ok(m) => m,
            Err(err) => failed(id, &err.to_string()),
        },
    }
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
    if e.algorithm != block_algorithm_id() || e.block_size == 0 {
        return Err(TransferError::Verification {
            path: e.path.to_string(),
            what: "unsupported block algorithm or block size".into(),
        });
    }
    let blocks = e.size.div_ceil(u64::from(e.block_size)) as usize;
    let same = |r: &crate::journal::FileRow| {
        r.size == e.size
            && r.mtime_sec == e.mtime_sec
            && r.mtime_nsec == e.mtime_nsec
            && r.block_size == e.block_size
    };
    let row = journal.lookup(e.path.as_bytes())?.filter(same);
    // Held whole, unchanged since: the quick check (re-read on --reverify).
    if let Some(r) = row.as_ref().filter(|r| r.done) {
        if let Some(file) = dest.open_final(&e.path) {
            let meta = file.metadata().ok();
            let unchanged = meta.is_some_and(|m| {
                use std::os::unix::fs::MetadataExt;
                m.len() == e.size
                    && m.mtime() == e.mtime_sec
                    && m.mtime_nsec() as u32 == e.mtime_nsec
            });
            if unchanged && e.flags & Entry::REVERIFY == 0 {
                return Ok(verified_because(id, r.level, "unchanged"));
            }
            if unchanged && mode != VerifyMode::None {
                let good = recorded_blocks_that_match(journal, r.id, &file, &e, buf)?;
                if good.len() == blocks {
                    return Ok(verified_because(
                        id,
                        VerifyLevel::Cache.wire_id(),
                        "reverified",
                    ));
                }
            }
        }
    }
    let partial = dest.partial(&e.path, e.size)?;
    // Block and riva blocks are re-read on the verifier thread, riva's
    // from the device, block's through the cache.
    let riva = match mode {
        VerifyMode::Riva | VerifyMode::Block => {
            let path = if mode == VerifyMode::Block || opts.reread_through_cache {
                ReadPath::Cached
            } else if e.flags & Entry::DIRECT != 0 {
                ReadPath::Direct
            } else {
                ReadPath::Evict
            };
            let r = RivaIn::open(&partial, path).map_err(|err| TransferError::Destination {
                path: e.path.to_string(),
                source: err,
            })?;
            let (level, why) = r.level();
            if mode == VerifyMode::Riva
                && e.flags & Entry::REQUIRE_DEVICE != 0
                && level < VerifyLevel::Device
            {
                return Err(TransferError::Verification {
                    path: e.path.to_string(),
                    what: format!("--require-level device: {why}"),
                });
            }
            Some(r)
        }
        _ => None,
    };
    let mut verified = vec![None; blocks];
    let (row_id, holding) = match row.filter(|r| !r.done) {
        Some(r) => {
            let good = recorded_blocks_that_match(journal, r.id, partial.file(), &e, buf)?;
            for (i, d) in &good {
                verified[*i as usize] = Some(*d);
            }
            let list: Vec<(u64, Vec<u8>)> = good
                .iter()
                .map(|(i, d)| (*i, d.as_bytes().to_vec()))
                .collect();
            (
                r.id,
                if list.is_empty() {
                    Holding::Nothing
                } else {
                    Holding::Blocks(list)
                },
            )
        }
        None => {
            let row = journal.start(
                e.path.as_bytes(),
                e.size,
                (e.mtime_sec, e.mtime_nsec),
                e.block_size,
            )?;
            (row, Holding::Nothing)
        }
    };
    journal.reopen(row_id)?;
    files.insert(
        id,
        Incoming {
            verified,
            entry: e,
            mode,
            partial,
            riva,
            checking: 0,
            ended: None,
            rounds: 0,
            row: row_id,
            unjournaled: Vec::new(),
            unjournaled_bytes: 0,
        },
    );
    Ok(Message::Status { file: id, holding })
}

/// The journaled blocks of row `id` whose bytes in `file` still hash to
/// their recorded digest.
fn recorded_blocks_that_match(
    journal: &Journal,
    id: i64,
    file: &std::fs::File,
    e: &Entry,
    buf: &mut AlignedBuf,
) -> Result<Vec<(u64, Digest)>, TransferError> {
    let bs = u64::from(e.block_size);
    let mut good = Vec::new();
    for (idx, raw) in journal.blocks(id)? {
        let offset = idx * bs;
        let Some(d) = Digest::from_bytes(defaults::BLOCK_ALGORITHM, &raw) else {
            continue;
        };
        if offset >= e.size {
            continue;
        }
        let len = (e.size - offset).min(bs) as usize;
        if reread_matches(file, offset, len, &d, buf).unwrap_or(false) {
            good.push((idx, d));
        }
    }
    Ok(good)
}

/// Where a received block stands.
enum Verdict {
    /// Verified (or not) already.
    Done(bool),
    /// Written; the verifier must re-read it from the device.
    Check(Check),
}

/// Checks and writes one block, and hands it to the verifier (block and
/// riva modes) or marks it verified.
fn accept_block(
    f: &mut Incoming,
    index: u64,
    digest: &[u8],
    data: &mut [u8],
    opts: &ReceiveOptions,
) -> Result<Verdict, TransferError> {
    let bs = u64::from(f.entry.block_size);
    let Some(slot) = f.verified.get(index as usize) else {
        return Err(ProtoError::Malformed {
            message: "Block",
            detail: "block index past the end of the file",
        }
        .into());
    };
    let offset = index * bs;
    let want_len = (f.entry.size - offset).min(bs) as usize;
    if data.len() != want_len {
        return Err(ProtoError::Malformed {
            message: "Block",
            detail: "block length does not match the file",
        }
        .into());
    }
    if slot.is_some() {
        return Ok(Verdict::Done(true));
    }
    let expected = match f.mode {
        VerifyMode::None => None,
        _ => match Digest::from_bytes(defaults::BLOCK_ALGORITHM, digest) {
            Some(d) => Some(d),
            None => return Ok(Verdict::Done(false)),
        },
    };
    if let Some(d) = &expected {
        if !hash(defaults::BLOCK_ALGORITHM, data).ct_eq(d) {
            return Ok(Verdict::Done(false));
        }
    }
    if let Some(hook) = &opts.after_check {
        hook(&f.entry.path.to_string(), index, data);
    }
    let path = f.entry.path.to_string();
    let dest_err = |e| TransferError::Destination {
        path: path.clone(),
        source: e,
    };
    f.partial
        .file()
        .write_all_at(data, offset)
        .map_err(dest_err)?;
    if let Some(hook) = &opts.after_write {
        hook(f.partial.file(), &path, index, offset, want_len);
    }
    // Block and riva: the verifier re-reads it.
    if let (Some(d), Some(r)) = (&expected, &f.riva) {
        return Ok(Verdict::Check(Check {
            id: f.entry.file,
            index,
            offset,
            len: want_len,
            digest: *d,
            file: Arc::clone(&r.file),
            reader: Arc::clone(&r.reader),
        }));
    }
    // In none mode there is no digest; record the data's own so the slot
    // reads as done.
    f.verified[index as usize] = Some(expected.unwrap_or_else(|| hash(Algorithm::Crc32c, &[])));
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
        .filter(|&i| f.verified[i as usize].is_none())
        .collect();
    if !missing.is_empty() || !matches!(f.mode, VerifyMode::Sequential | VerifyMode::File) {
        return Ok(missing);
    }
    let bs = u64::from(f.entry.block_size);
    let path = f.entry.path.to_string();
    let mut bad = Vec::new();
    for (i, d) in f.verified.iter().enumerate() {
        let offset = i as u64 * bs;
        let len = (f.entry.size - offset).min(bs) as usize;
        let d = d.as_ref().expect("all verified");
        let ok = reread_matches(f.partial.file(), offset, len, d, buf).map_err(|e| {
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
