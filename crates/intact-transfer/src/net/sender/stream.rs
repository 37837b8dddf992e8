//! A sender stream: it begins entries as its window allows, sends what
//! each file needs, and takes the receiver's answers as they come.

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::{Instant, SystemTime};

use intact_digest::{defaults, Blake3Blocks};
use intact_proto::{Block, Entry, EntryKind, EntryRange, Message, ProtoError};

use super::link::TcpEnd;
use super::{
    entry_flags, Ctx, SenderLink, FLUSH_EVERY, MAX_BYTES_IN_FLIGHT, MAX_BYTES_IN_FLIGHT_FLASH,
    MAX_FILES_IN_FLIGHT, MAX_SENT_UNACKED,
};
use crate::link::{Arrival, Outbound};
use crate::profile::Stage;
use crate::report::{simple_report, FileReport};
use crate::source::SourceKind;
use crate::source_cache::{CacheReader, SourceCache, SourceKey};
use crate::stage::source::{Buffers, SourceFile};
use crate::verify::VerifyLevel;

/// A file or link sent and not yet acknowledged.
pub(super) struct Outgoing {
    /// A file's source, read as its mode says (None: a link or directory).
    pub(super) source: Option<SourceFile>,
    pub(super) pending: u64,
    /// The file's bytes until the receiver's Status says which blocks to
    /// send (then they are sent at once): counted in the stream's
    /// [`Stream::unsent`].
    pub(super) unsent: u64,
    pub(super) attempts: HashMap<u64, u32>,
    pub(super) gave_up: Option<u64>,
    pub(super) ended: bool,
    pub(super) report: FileReport,
    pub(super) started: Instant,
    /// The whole-file BLAKE3 assembled per block (power-of-two block
    /// sizes): a resent block replaces its own part, so the digest is of
    /// the bytes finally accepted without reading the file again.
    pub(super) tree: Option<Blake3Blocks>,
    /// A block was sent again while the digest is streamed (other block
    /// sizes): it is computed again from the source before FileEnd.
    pub(super) stale_digest: bool,
    /// Other block sizes: the whole-file BLAKE3 streamed as every block
    /// was sent in order.
    pub(super) streamed: Option<[u8; 32]>,
    /// The digest sent in FileEnd.
    pub(super) digest: Option<[u8; 32]>,
    /// The source's cache key when it was opened, and when.
    pub(super) key: Option<SourceKey>,
    /// The source-digest cache's digest for that key (and when it was
    /// recorded), looked up when the file was begun.
    pub(super) cached: Option<([u8; 32], i64)>,
    pub(super) opened_at: SystemTime,
    /// The receiver asked for each block's BLAKE3 (it has a recovery
    /// cache) and `--cache-exclude` does not keep this file out.
    pub(super) strong: bool,
}

pub(super) struct Stream<'a> {
    pub(super) ctx: &'a Ctx<'a>,
    pub(super) conn: Box<dyn Outbound + Send + 'a>,
    pub(super) events: mpsc::Receiver<Arrival>,
    pub(super) tcp: Option<TcpEnd>,
    pub(super) out: HashMap<u64, Outgoing>,
    pub(super) in_flight: u64,
    /// Bytes of files begun whose blocks are not yet sent. In `flash`,
    /// where a file's result waits for the device's write cache to turn
    /// over, this (not [`Stream::in_flight`]) keeps a stream from taking
    /// more files than it is about to send, so that the other streams get
    /// theirs.
    pub(super) unsent: u64,
    pub(super) bufs: Buffers,
    pub(super) broken: Option<String>,
    /// This stream's lookups in the source-digest cache.
    cache: Option<CacheReader<'a>>,
    /// The receiver's last Status on this stream asked for blocks (rather
    /// than holding the file whole): sources the source-digest cache knows
    /// are then prefetched too, as they will be read after all.
    pub(super) receiver_needs: bool,
}

impl<'a> Stream<'a> {
    pub(super) fn new(link: SenderLink<'a>, ctx: &'a Ctx<'a>) -> Stream<'a> {
        let SenderLink { out, events, tcp } = link;
        Stream {
            ctx,
            conn: out,
            events,
            tcp,
            out: HashMap::new(),
            in_flight: 0,
            unsent: 0,
            bufs: Buffers::new(ctx.opts.block_size, ctx.opts.verify),
            broken: None,
            cache: ctx.cache.map(SourceCache::reader),
            receiver_needs: false,
        }
    }

    /// Sends every entry `next` yields and waits for all their results.
    pub(super) fn run(&mut self, mut next: impl FnMut() -> Option<usize>) {
        let mut exhausted = false;
        let mut begun = 0usize;
        let flash = self.ctx.opts.verify == crate::VerifyMode::Flash;
        let max_bytes = if flash {
            MAX_BYTES_IN_FLIGHT_FLASH
        } else {
            MAX_BYTES_IN_FLIGHT
        };
        loop {
            while self.broken.is_none()
                && !exhausted
                && self.out.len() < MAX_FILES_IN_FLIGHT
                && (self.in_flight < max_bytes || self.next_range_may_begin(flash))
                && self.unsent < MAX_BYTES_IN_FLIGHT
            {
                match next() {
                    Some(i) => self.begin(i),
                    None => exhausted = true,
                }
                begun += 1;
                if begun.is_multiple_of(FLUSH_EVERY) {
                    if let Err(e) = self.ctx.profile.time(Stage::Handoff, || self.conn.flush()) {
                        self.broken = Some(e.to_string());
                    }
                }
                self.drain(false);
            }
            if self.out.is_empty() && (exhausted || self.broken.is_some()) {
                break;
            }
            if self.broken.is_some() {
                self.fail_all();
                break;
            }
            self.drain(true);
        }
    }

    /// Past [`MAX_BYTES_IN_FLIGHT`], whether the next entry may begin
    /// anyway: when every file this stream holds is a range of a spread
    /// file whose blocks have all left (the receiver answers a range as
    /// soon as it is verified, without waiting for a group commit), up to
    /// [`MAX_SENT_UNACKED`] unacknowledged. The stream then does not idle
    /// a round trip and more per range for its verdict, and its TCP window
    /// stays open. Not in `flash`, whose verdicts wait for the device.
    fn next_range_may_begin(&self, flash: bool) -> bool {
        !flash
            && self.unsent == 0
            && self.in_flight < MAX_SENT_UNACKED
            && self
                .out
                .keys()
                .all(|id| self.ctx.entries[*id as usize].range.is_some())
    }

    /// Handles pending events; with `wait`, sends what is queued and
    /// blocks for at least one.
    fn drain(&mut self, wait: bool) {
        if wait {
            // Blocking with every outstanding file ended: nothing moves
            // until the receiver commits its group of verified files, so
            // say so. (While files await their Status or block results, the
            // receiver answers those anyway; a Waiting then would only
            // shrink its group.) In `flash` the receiver holds block
            // results until the device's write cache has turned over, so
            // files whose blocks are all out count as ended: told, it
            // pushes them past the window with filler.
            let profile = self.ctx.profile;
            let t = Instant::now();
            let mut handed = Ok(());
            let flash = self.ctx.opts.verify == crate::VerifyMode::Flash;
            if self
                .out
                .values()
                .all(|o| o.ended || (flash && o.pending > 0))
            {
                handed = self.conn.put(Message::Waiting);
            }
            let handed = handed.and_then(|()| self.conn.flush());
            profile.add(Stage::Handoff, t.elapsed());
            if let Err(e) = handed {
                self.broken = Some(e.to_string());
                return;
            }
        }
        let mut next = if wait {
            if let Some(c) = self.cache.as_mut() {
                c.pause();
            }
            let t = Instant::now();
            let arrival = self.events.recv().unwrap_or(Arrival::Closed);
            self.ctx.profile.add(Stage::Wait, t.elapsed());
            Some(arrival)
        } else {
            self.events.try_recv().ok()
        };
        while let Some(arrival) = next {
            match arrival.messages() {
                Ok(Some(msgs)) => {
                    for msg in msgs {
                        self.handle(msg);
                    }
                }
                Ok(None) => {
                    self.broken = Some(ProtoError::Closed.to_string());
                    return;
                }
                Err(e) => {
                    self.broken = Some(e.to_string());
                    return;
                }
            }
            next = self.events.try_recv().ok();
        }
    }

    pub(super) fn report_done(&self, id: u64, report: FileReport) {
        self.ctx.reports.lock().expect("no panics hold it")[id as usize] = Some(report);
    }

    fn begin(&mut self, i: usize) {
        let e = &self.ctx.entries[i];
        let opts = self.ctx.opts;
        let id = i as u64;
        let report = simple_report(e, opts.verify, None);
        let (kind, source) = match &e.kind {
            SourceKind::Dir => (EntryKind::Dir, None),
            SourceKind::Symlink(t) => (EntryKind::Symlink(t.clone()), None),
            SourceKind::File => match self.ctx.profile.time(Stage::Open, || {
                SourceFile::open(
                    e,
                    opts.verify,
                    opts.block_size,
                    opts.read_path,
                    opts.require_level >= Some(VerifyLevel::Device),
                )
            }) {
                Ok(f) => (EntryKind::File, Some(f)),
                Err(err) => {
                    let mut r = report;
                    r.level = None;
                    r.error = Some(err.to_string());
                    self.report_done(id, r);
                    return;
                }
            },
        };
        let entry = Entry {
            file: id,
            path: e.rel.clone(),
            kind,
            mode: e.mode,
            mtime_sec: e.mtime.sec,
            mtime_nsec: e.mtime.nsec,
            size: e.size,
            block_size: opts.block_size as u32,
            algorithm: defaults::BLOCK_ALGORITHM.wire_id(),
            verify: opts.verify.wire_id(),
            flags: entry_flags(opts),
            origin: crate::source::origin(&e.abs),
            range: e.range.map(|r| EntryRange {
                split: r.split,
                first: r.first,
                end: r.end,
            }),
        };
        if e.range
            .is_some_and(|r| r.block_size != opts.block_size as u64)
        {
            let mut r = report;
            r.level = None;
            r.error = Some(format!(
                "{}: its ranges were cut at another block size than this run's --block-size",
                e.rel
            ));
            self.report_done(id, r);
            return;
        }
        if let Err(err) = self
            .ctx
            .profile
            .time(Stage::Handoff, || self.conn.put(Message::Entry(entry)))
        {
            self.broken = Some(err.to_string());
            return;
        }
        // A file holds its whole size against the stream's window until its
        // result arrives, so admission is bounded by bytes even while its
        // blocks wait for the receiver's Status.
        self.in_flight += e.bytes();
        let unsent = if source.is_some() { e.bytes() } else { 0 };
        self.unsent += unsent;
        let mut report = report;
        report.read_path = source.as_ref().and_then(SourceFile::read_path);
        let key = source.as_ref().map(SourceFile::key);
        // The source-digest cache's answer, looked up once; a file it can
        // answer for may never be read (the receiver may hold it whole),
        // so it is prefetched only while the receiver's answers ask for
        // blocks (a new destination: it will be read after all). Without
        // that prefetch every small file's read waits for the device in
        // turn: 13% of a 20,000-file send's time on the disk. `--reverify`
        // in riva reads a held file from the device after an eviction: a
        // prefetch would only be read twice.
        // A range is never answered whole: no whole-file digest is wanted.
        let key = key.filter(|_| e.range.is_none());
        let cached = match (self.cache.as_mut(), &key) {
            (Some(c), Some(k)) if !opts.reverify => self.ctx.profile.time(Stage::Open, || c.get(k)),
            _ => None,
        };
        let mut source = source;
        let reread_anyway = opts.reverify && opts.verify.reads_device();
        let likely_read = cached.is_none() || self.receiver_needs;
        if let (Some(f), true, false) = (source.as_mut(), likely_read, reread_anyway) {
            self.ctx.profile.time(Stage::Open, || f.prefetch());
        }
        let mut o = Outgoing {
            streamed: None,
            digest: None,
            key,
            cached,
            opened_at: SystemTime::now(),
            pending: 0,
            unsent,
            attempts: HashMap::new(),
            gave_up: None,
            ended: source.is_none(),

            report,
            started: Instant::now(),
            source,
            tree: None,
            stale_digest: false,
            strong: false,
        };
        if o.source.is_some() {
            o.report.blocks = match e.range {
                Some(r) => r.end - r.first,
                None => e.size.div_ceil(opts.block_size as u64),
            };
            // Blocks go out once the receiver says what it already holds.
            o.ended = false;
        }
        self.out.insert(id, o);
    }

    fn handle(&mut self, msg: Message) {
        match msg {
            Message::BlockResult {
                file,
                index,
                ok,
                pages,
            } => {
                let Some(mut o) = self.out.remove(&file) else {
                    return;
                };
                let first = self.ctx.entries[file as usize].range.map_or(0, |r| r.first);
                if o.source.is_none() || !(first..first + o.report.blocks).contains(&index) {
                    self.out.insert(file, o);
                    self.broken = Some(format!(
                        "the server answered block {index} of entry {file}, which has no such block"
                    ));
                    return;
                }
                let size = self.ctx.entries[file as usize].size;
                let bs = self.ctx.opts.block_size as u64;
                let len = (size - index * bs).min(bs) as usize;
                if pages
                    .last()
                    .is_some_and(|&p| p as usize >= Block::pages_of(len))
                {
                    self.out.insert(file, o);
                    self.broken = Some(format!(
                        "the server named a page past the end of block {index} of entry {file}"
                    ));
                    return;
                }
                if o.pending > 0 {
                    o.pending -= 1;
                }
                if !ok {
                    o.ended = false;
                    let n = o.attempts.entry(index).or_insert(0);
                    *n += 1;
                    if *n > self.ctx.opts.retries {
                        o.gave_up.get_or_insert(index);
                    } else {
                        o.report.blocks_resent += 1;
                        let sent = self.send_block(&mut o, file, index, None, true, &pages);
                        if let Err(err) = sent {
                            o.report.error = Some(err.to_string());
                            o.gave_up.get_or_insert(index);
                        }
                    }
                }
                if o.pending == 0 && !o.ended {
                    self.end_file(file, &mut o);
                }
                self.out.insert(file, o);
            }
            Message::Status {
                file,
                holding,
                strong,
            } => {
                let Some(mut o) = self.out.remove(&file) else {
                    return;
                };
                let rel = self.ctx.entries[file as usize].rel.as_bytes();
                o.strong = strong && self.ctx.opts.cache_filter.takes(rel, false);
                if o.source.is_none() {
                    self.out.insert(file, o);
                    self.broken = Some(format!(
                        "the server asked for the blocks of entry {file}, which is not a file"
                    ));
                    return;
                }
                self.sent(&mut o);
                self.send_missing(file, &mut o, holding);
                self.out.insert(file, o);
            }
            Message::FileResult(r) => {
                let Some(mut o) = self.out.remove(&r.file) else {
                    return;
                };
                self.release(r.file);
                self.sent(&mut o);
                let id = r.file;
                self.file_result(&mut o, r);
                self.report_done(id, o.report);
            }
            Message::Refused { reason } => self.broken = Some(format!("server refused: {reason}")),
            other => self.broken = Some(format!("unexpected {} from the server", other.name())),
        }
    }

    /// The receiver said which of `o`'s blocks to send (or answered it
    /// whole): its bytes are no longer waiting to be sent.
    fn sent(&mut self, o: &mut Outgoing) {
        self.unsent -= o.unsent.min(self.unsent);
        o.unsent = 0;
    }

    /// Gives back a finished file's share of the window.
    pub(super) fn release(&mut self, id: u64) {
        let size = self.ctx.entries[id as usize].bytes();
        self.in_flight -= size.min(self.in_flight);
    }

    pub(super) fn fail_all(&mut self) {
        let why = self.broken.clone().unwrap_or_default();
        for (id, mut o) in std::mem::take(&mut self.out) {
            o.report.level = None;
            o.report.error = Some(format!("{}: connection lost: {why}", o.report.path));
            self.report_done(id, o.report);
        }
    }

    /// Says Bye and waits for the server's Bye, so its last writes are done.
    pub(super) fn finish(mut self) {
        if self.broken.is_none() && self.conn.send(Message::Bye).is_ok() {
            while let Ok(Ok(Some(mut msgs))) = self.events.recv().map(Arrival::messages) {
                if msgs.any(|m| m == Message::Bye) {
                    break;
                }
            }
        }
        drop(self.tcp.take());
    }
}
