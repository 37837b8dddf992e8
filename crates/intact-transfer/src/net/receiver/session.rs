//! A receiver session's event loop: the other half's messages and the
//! verifier's verdicts, in the order they come, on one thread.

use std::collections::HashMap;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use intact_digest::{defaults, AlignedBuf, Digest};
use intact_proto::{Message, ProtoError, WirePath};

use super::accept::{accept_block, end_file, Verdict};
use super::begin::start_anew;
use super::commit::{below_required, commit_ready, failed, whole_digest_matches};
use super::data_clock::DataClock;
use super::{
    admit, wire_level, Checked, Event, Incoming, Job, ReceiveOptions, SessionSummary,
    GROUP_COMMIT_FILES, JOURNAL_BATCH, MAX_ROUNDS,
};
use crate::credits::CreditGiver;
use crate::dest::{CreatedDirs, Destination, Mtime};
use crate::journal::{BlockRecord, Journal, VerifiedAt};
use crate::link::Outbound;
use crate::net::bounds::{self, InUse, Shares};
use crate::net::delete::Pending;
use crate::profile::Stage;
use crate::stage::verify::reread_level;
use crate::verify::VerifyLevel;
use crate::TransferError;

pub(super) struct Session<'a> {
    pub(super) out: &'a mut dyn Outbound,
    pub(super) dest: &'a Destination,
    pub(super) root: &'a std::path::Path,
    pub(super) pending_delete: Option<Pending>,
    pub(super) journal: &'a Journal,
    pub(super) opts: &'a ReceiveOptions,
    pub(super) jobs: mpsc::SyncSender<Job>,
    /// `flash` blocks sent to the verifier and not yet back.
    pub(super) deferred_out: u64,
    /// The sender said Waiting and has sent nothing since: it blocks on
    /// results, so deferred checks are drained at once.
    pub(super) sender_waiting: bool,
    pub(super) files: &'a mut HashMap<u64, Incoming>,
    pub(super) ready: &'a mut Vec<(u64, Incoming)>,
    /// Directories this session created, to finish at the end, and the
    /// bytes of their paths.
    pub(super) dirs: Vec<(WirePath, u32, Mtime)>,
    pub(super) dir_bytes: usize,
    /// What `dirs` holds of the client's memory share.
    pub(super) dir_held: Option<intact_proto::Held>,
    /// Every directory the session (all its streams) created.
    pub(super) created: Arc<CreatedDirs>,
    /// What this stream's open files hold of its limits.
    pub(super) in_use: InUse,
    /// Its session's places in the server's budgets.
    pub(super) shares: Shares,
    /// Blocks at the verifier now, per file id (also of files that
    /// failed meanwhile): an id is not reused until they are back.
    pub(super) at_verifier: HashMap<u64, u32>,
    pub(super) summary: SessionSummary,
    pub(super) buf: AlignedBuf,
    /// Entries waiting for a place in the session's share (in order).
    pub(super) deferred: std::collections::VecDeque<admit::Deferred>,
    /// Written blocks of small files held back for one `syncfs` before
    /// their re-reads ([`Job::Synced`]): counted at the verifier already.
    pub(super) at_sync: Vec<super::Check>,
    /// When the first of them was held back.
    pub(super) at_sync_since: Option<Instant>,
}

/// Small files a session holds back at most before it hands them to the
/// verifier behind one `syncfs`, and their bytes at most.
const SYNC_GROUP: usize = 256;
const SYNC_GROUP_BYTES: usize = 8 << 20;

/// Fewer small files than this are handed over one by one (each flushed
/// alone, as larger files' blocks are) rather than behind a `syncfs`.
const MIN_SYNC_GROUP: usize = 16;

/// How long a session holding small files back waits for another event
/// before it hands them over. The sender cannot tell it that it waits for
/// their results (it says `Waiting` only once every file it has out has
/// all its block results, which a held file has not), so a pause in what
/// arrives is the sign.
const SYNC_IDLE: Duration = Duration::from_millis(2);

/// How long a small file is held back, however busy the stream is
/// meanwhile (the blocks of a large file arriving back to back): checked
/// between events, so a commit or a full verifier queue on the session
/// thread can make it longer.
const SYNC_MAX_AGE: Duration = Duration::from_millis(100);

impl Session<'_> {
    pub(super) fn run(
        &mut self,
        events: &mpsc::Receiver<Event>,
        giver: &CreditGiver,
    ) -> Result<SessionSummary, TransferError> {
        self.dest.record_created_dirs(Arc::clone(&self.created));
        let mut data = DataClock::new(self.opts.data_timeout);
        loop {
            self.admit_deferred()?;
            if self
                .at_sync_since
                .is_some_and(|t| t.elapsed() >= SYNC_MAX_AGE)
            {
                self.hand_over_synced()?;
            }
            let ev = match events.try_recv() {
                Ok(ev) => ev,
                Err(_) => {
                    // Nothing more to do without waiting: send the replies.
                    self.out.flush()?;
                    // Small files held back wait only a moment more for
                    // company: the sender may be waiting for their results.
                    let holding = !self.at_sync.is_empty();
                    let tick = match holding {
                        true => SYNC_IDLE.min(self.tick(data.tick())),
                        false => self.tick(data.tick()),
                    };
                    let t = Instant::now();
                    let got = events.recv_timeout(tick);
                    data.waited(t.elapsed());
                    match got {
                        Ok(ev) => ev,
                        Err(mpsc::RecvTimeoutError::Timeout) if holding => {
                            self.hand_over_synced()?;
                            continue;
                        }
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
                    giver.give_back();
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
        self.sender_waiting = matches!(msg, Message::Waiting);
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
            Message::Fetch { path, offset, len } => {
                if !self.opts.allow_fetch {
                    self.refuse_unless::<()>(Err(
                        "this server does not serve ranges of its files (start it with `intact serve --allow-fetch` to let clients repair from it)".into(),
                    ))?;
                }
                let (reply, _held) = super::fetch::answer(
                    self.dest,
                    self.shares.memory.as_ref(),
                    &path,
                    offset,
                    len,
                )?;
                self.out.send(reply)?;
                // The reply's memory was budgeted only until it was sent.
                self.out.trim();
            }
            Message::Waiting => {
                // The sender blocks until it hears back: commit the group
                // now, so small files share one syncfs and their results go;
                // `flash` blocks waiting for their window are pushed past it.
                if self.deferred_out > 0 {
                    self.jobs.send(Job::Drain).map_err(|_| ProtoError::Closed)?;
                }
                self.commit()?;
            }
            other => {
                return Err(ProtoError::Unexpected {
                    got: other.name(),
                    wanted: "Entry, Block, FileEnd, Fetch or Bye",
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

    /// Hands the small files held back to the verifier, to be flushed
    /// together and re-read.
    fn hand_over_synced(&mut self) -> Result<(), TransferError> {
        if self.at_sync.is_empty() {
            return Ok(());
        }
        let group = std::mem::take(&mut self.at_sync);
        self.at_sync_since = None;
        let closed = |_| TransferError::from(ProtoError::Closed);
        if group.len() < MIN_SYNC_GROUP {
            // A trickle of small files: a syncfs (which flushes the whole
            // file system) for each few would cost more than it merges.
            for c in group {
                self.jobs.send(Job::Check(c)).map_err(closed)?;
            }
            return Ok(());
        }
        self.jobs.send(Job::Synced(group)).map_err(closed)
    }

    pub(super) fn commit(&mut self) -> Result<(), TransferError> {
        commit_ready(
            self.out,
            self.dest,
            self.journal,
            self.ready,
            &mut self.summary,
            &self.opts.working,
            &self.opts.profile,
            self.opts.before_journal(),
        )
    }

    /// Fails a file alone (the destination or the journal failed it): what
    /// verified stays journaled for a later attempt; the session goes on.
    fn fail_file(&mut self, file: u64, why: &str) -> Result<(), TransferError> {
        let mut path = format!("file {file}");
        if let Some(mut f) = self.files.remove(&file) {
            let _ = f.journal(self.journal, &self.opts.profile);
            path = f.entry.path.to_string();
        }
        self.summary.fail(&path, why);
        self.out.put(failed(file, why))?;
        Ok(())
    }

    fn block(&mut self, b: intact_proto::Block) -> Result<(), TransferError> {
        self.take_block(b, false)
    }

    /// A block from the sender, or (`from_cache`) a recovery cache's copy
    /// of one that failed.
    pub(super) fn take_block(
        &mut self,
        mut b: intact_proto::Block,
        from_cache: bool,
    ) -> Result<(), TransferError> {
        let Some(f) = self.files.get_mut(&b.file) else {
            // A file that already failed: drop its blocks.
            return Ok(());
        };
        if self.opts.recovery.is_some() {
            f.repairs.arrived(&b);
        }
        if f.partial.is_none() && f.range.is_some() {
            let why = format!(
                "the file held (committed from its ranges) differs from the source in block {}: \
                 send the file whole with --reverify (intact send --spread never --reverify), or \
                 make a new plan",
                b.index
            );
            return self.fail_file(b.file, &why);
        }
        if f.partial.is_none() {
            // Held whole, but the sender's copy differs: it sends every
            // block, and the file is written anew under a partial name.
            if let Err(e) = start_anew(f, self.dest, self.journal, self.opts) {
                return self.fail_file(b.file, &e.to_string());
            }
        }
        // The bytes that came (a patch grows to its whole block).
        let came = if from_cache { 0 } else { b.data.len() as u64 };
        let accepted = accept_block(f, &mut b, self.opts, self.journal.page_size());
        let verdict = match accepted {
            Ok(v) => v,
            Err(e @ (TransferError::Destination { .. } | TransferError::Journal(_))) => {
                return self.fail_file(b.file, &e.to_string());
            }
            Err(e) => return Err(e),
        };
        self.summary.bytes += came;
        match verdict {
            Verdict::Check(check) => {
                f.checking += 1;
                *self.at_verifier.entry(b.file).or_insert(0) += 1;
                self.deferred_out += u64::from(check.deferred);
                if check.sync_first {
                    self.at_sync_since.get_or_insert_with(Instant::now);
                    self.at_sync.push(check);
                    let bytes: usize = self.at_sync.iter().map(|c| c.len).sum();
                    if self.at_sync.len() >= SYNC_GROUP || bytes >= SYNC_GROUP_BYTES {
                        self.hand_over_synced()?;
                    }
                    return Ok(());
                }
                self.jobs
                    .send(Job::Check(check))
                    .map_err(|_| ProtoError::Closed)?;
                Ok(())
            }
            Verdict::Done(ok, pages, bad) => {
                let digest = Digest::from_bytes(defaults::BLOCK_ALGORITHM, &b.digest);
                let level = f.arrival_level().min(wire_level(b.source_level));
                self.block_done(b.file, b.index, (ok, bad), digest, level, pages)
            }
        }
    }

    /// A block's verification is over: journal it, and answer (a failed
    /// one with its bad pages, where they are known: only they come again).
    fn block_done(
        &mut self,
        file: u64,
        index: u64,
        (ok, bad): (bool, Vec<u32>),
        digest: Option<Digest>,
        level: VerifyLevel,
        pages: Option<Vec<u8>>,
    ) -> Result<(), TransferError> {
        let Some(f) = self.files.get_mut(&file) else {
            return Ok(());
        };
        // `none` has no digests to record.
        if ok && f.verify.checks_arrival() {
            if let Some(d) = digest {
                f.unjournaled.push(BlockRecord {
                    index,
                    digest: d.as_bytes().to_vec(),
                    verified: VerifiedAt::now(f.mode, level),
                    pages,
                });
                f.unjournaled_bytes += u64::from(f.entry.block_size);
                if f.unjournaled_bytes >= JOURNAL_BATCH {
                    if let Err(e) = f.journal(self.journal, &self.opts.profile) {
                        return self.fail_file(file, &e.to_string());
                    }
                }
            }
        }
        self.summary.blocks_rejected += u64::from(!ok);
        if ok {
            let r = &f.repairs;
            let before = (r.from_cache, r.cache_micros, r.from_source, r.source_micros);
            f.repairs.settled(index);
            let (r, s) = (&f.repairs, &mut self.summary);
            s.cache_repairs += r.from_cache - before.0;
            s.cache_micros += r.cache_micros - before.1;
            s.source_repairs += r.from_source - before.2;
            s.source_micros += r.source_micros - before.3;
        } else {
            f.repairs.failed(index);
            if self.repair_from_cache(file, index)? {
                return Ok(());
            }
        }
        let Some(f) = self.files.get_mut(&file) else {
            return Ok(());
        };
        if !ok {
            f.repairs.asked_source(index);
        }
        let pages = if ok { Vec::new() } else { bad };
        if !pages.is_empty() {
            f.awaiting_pages.insert(index);
        }
        self.out.put(Message::BlockResult {
            file,
            index,
            ok,
            pages,
        })?;
        Ok(())
    }

    /// The verifier's verdict on a re-read block.
    fn checked(&mut self, c: Checked) -> Result<(), TransferError> {
        if let Some(n) = self.at_verifier.get_mut(&c.id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.at_verifier.remove(&c.id);
            }
        }
        if c.deferred {
            self.deferred_out = self.deferred_out.saturating_sub(1);
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
        if let Some(r) = f.verify.block_reread_mut() {
            r.count(&c.outcome, c.took);
        }
        if let Some(w) = &c.window {
            f.verify.windowed(w);
        }
        if ok {
            f.verified.set(c.index as usize, Some(c.digest));
        }
        let mut level = reread_level(&c.outcome);
        if level == VerifyLevel::Device && c.window.as_ref().is_some_and(|w| w.passed) {
            level = VerifyLevel::Media;
        }
        let level = level.min(c.source_level.as_source_cap());
        let answer = (ok, c.bad_pages);
        self.block_done(c.id, c.index, answer, Some(c.digest), level, c.pages)?;
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
        if let Some(held) = f
            .whole
            .held
            .filter(|_| f.partial.is_none() && f.range.is_none())
        {
            return self.end_held(file, f, held, blocks);
        }
        if blocks != f.expected_blocks() {
            // Abandoned (the source changed or failed) or inconsistent:
            // keep what verified for a later attempt, name nothing.
            f.journal(self.journal, &self.opts.profile)?;
            let why = "the sender abandoned the file";
            self.summary.fail(&f.entry.path.to_string(), why);
            self.out.put(failed(file, why))?;
            return Ok(());
        }
        let ended = {
            let _working = self.opts.working.now();
            end_file(&mut f, &mut self.buf, &self.opts.profile)
        };
        match ended {
            Ok(bad) if !bad.is_empty() && f.rounds < MAX_ROUNDS => {
                f.rounds += 1;
                for index in bad {
                    f.verified.set(index as usize, None);
                    self.summary.blocks_rejected += 1;
                    f.awaiting_pages.remove(&index);
                    self.out.put(Message::BlockResult {
                        file,
                        index,
                        ok: false,
                        pages: Vec::new(),
                    })?;
                }
                self.files.insert(file, f);
            }
            Ok(bad) if !bad.is_empty() => {
                let why = format!("block {} never verified", bad[0]);
                self.summary.fail(&f.entry.path.to_string(), &why);
                self.out.put(failed(file, &why))?;
            }
            Ok(_) if f.range.is_some() => self.end_range(file, f)?,
            Ok(_) => {
                let matched = self
                    .opts
                    .profile
                    .time(Stage::Whole, || whole_digest_matches(&mut f, &mut self.buf));
                if let Err(why) = matched {
                    let _ = f.journal(self.journal, &self.opts.profile);
                    self.summary.fail(&f.entry.path.to_string(), &why);
                    self.out.put(failed(file, &why))?;
                    return Ok(());
                }
                let reached = f.reached();
                let required = super::required_level(f.entry.flags);
                if let Some(want) = required.filter(|want| reached.level < *want) {
                    let _ = f.journal(self.journal, &self.opts.profile);
                    let msg = below_required(&reached, want);
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
