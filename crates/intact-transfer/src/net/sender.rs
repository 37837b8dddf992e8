//! `intact send`: the sending side, over several TCP streams.
//!
//! Each stream is one authenticated connection with a reader thread, so
//! results flow back while blocks flow out and nothing waits on a round
//! trip per block or per file. Entries (files and symlinks) are taken from
//! a shared queue; each stream keeps at most [`MAX_FILES_IN_FLIGHT`] files
//! and [`MAX_BYTES_IN_FLIGHT`] bytes unacknowledged, so memory stays
//! bounded whatever the dataset. Directories go last, on one stream, so
//! that their times are set after their contents.

use std::collections::HashMap;
use std::fs::File;
use std::net::TcpStream;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Instant, SystemTime};

use intact_cache::{DeviceReader, ReadPath};
use intact_digest::{defaults, hash, AlignedBuf, Blake3Blocks};
use intact_proto::{
    client_handshake_with, Block, Connection, Entry, EntryKind, FileEnd, FileResult, FileStatus,
    Holding, Key, Message, ProtoError, Security, SessionSecret, WirePath,
};

use crate::link::{Arrival, Outbound};
use crate::report::{simple_report, CopyReport, FileReport, Progress};
use crate::source::{check_unchanged, scan, source_read_error, Scan, SourceEntry, SourceKind};
use crate::source_cache::{SourceCache, SourceCacheSetting, SourceDigest, SourceKey};
use crate::verify::{DeviceStats, Reached, VerifyLevel, VerifyMode};
use crate::TransferError;

/// Files one stream keeps unacknowledged at most. The receiver commits a
/// group of files when it runs out of input, so this also bounds its group
/// commit: at 64, 20,000 small files cost ~300 syncfs calls per stream.
pub const MAX_FILES_IN_FLIGHT: usize = 1024;
/// Bytes one stream keeps unacknowledged at most (with 4 streams, 64 MiB
/// in flight: enough for 10 Gbit/s at 50 ms round trip).
pub const MAX_BYTES_IN_FLIGHT: u64 = 16 << 20;

/// Entries begun between two pushes of what is queued to the receiver
/// (else sent when the queue fills, or when the sender waits), so the
/// receiver starts on the first files while the rest are announced.
const FLUSH_EVERY: usize = 64;

/// How to send.
#[derive(Clone)]
pub struct SendOptions {
    /// Verification mode.
    pub verify: VerifyMode,
    /// Block size in bytes.
    pub block_size: usize,
    /// TCP streams.
    pub streams: usize,
    /// Resends of one block before its file fails.
    pub retries: u32,
    /// Pre-shared key.
    pub key: Option<Key>,
    /// Directory under the server's root to send into.
    pub subdir: Option<WirePath>,
    /// Re-check files the server already holds instead of trusting its journal.
    pub reverify: bool,
    /// How device-level reads reach the device (at both ends).
    pub read_path: ReadPath,
    /// A file that cannot reach this level fails instead of being committed.
    pub require_level: Option<VerifyLevel>,
    /// Where the digests of sources are cached, for the quick check of
    /// files the server holds whole (off: each such source is read).
    pub source_cache: SourceCacheSetting,
}

impl Default for SendOptions {
    /// intact's defaults: riva, 4 MiB blocks, 4 streams, 3 retries, no key.
    fn default() -> Self {
        SendOptions {
            verify: VerifyMode::DEFAULT,
            block_size: defaults::BLOCK_BYTES,
            streams: 4,
            retries: 3,
            key: None,
            subdir: None,
            reverify: false,
            read_path: ReadPath::default(),
            require_level: None,
            source_cache: SourceCacheSetting::Off,
        }
    }
}

fn conn_err(e: impl Into<ProtoError>) -> TransferError {
    TransferError::Path(e.into())
}

/// Connects and authenticates one stream of the session `secret` names
/// (one secret per run, so the server counts this run as one client
/// whatever its streams, and no one who saw its Hello can join it).
pub(crate) fn connect(
    addr: &str,
    key: Option<&Key>,
    secret: &SessionSecret,
) -> Result<(Connection<TcpStream>, Security), TransferError> {
    let stream = TcpStream::connect(addr).map_err(|e| TransferError::Connect {
        addr: addr.to_string(),
        source: e,
    })?;
    stream.set_nodelay(true).map_err(conn_err)?;
    let mut conn = Connection::new(stream);
    let security = client_handshake_with(&mut conn, key, secret, true)?;
    Ok((conn, security))
}

/// `send --delete`: asks the server at `addr` to prune what `req` does
/// not keep, under the options' subdirectory, on a connection of its own
/// (after the transfer succeeded, or instead of it in a dry run).
pub fn delete_remote(
    addr: &str,
    opts: &SendOptions,
    req: &crate::net::delete::DeleteRequest,
) -> Result<crate::PruneReport, TransferError> {
    let (mut conn, _) = connect(addr, opts.key.as_ref(), &SessionSecret::random()?)?;
    crate::net::delete::request(&mut conn, opts.subdir.as_ref(), req)
}

/// Sends `sources` to the server at `addr` (host:port), as [`scan`]
/// places them.
pub fn send(
    sources: &[PathBuf],
    addr: &str,
    opts: &SendOptions,
    progress: Progress<'_>,
) -> Result<CopyReport, TransferError> {
    send_scanned(scan(sources), addr, opts, progress)
}

/// Sends what a scan found (see [`crate::scan_with`]) to the server at
/// `addr` (host:port).
pub fn send_scanned(
    mut scanned: Scan,
    addr: &str,
    opts: &SendOptions,
    progress: Progress<'_>,
) -> Result<CopyReport, TransferError> {
    let start = Instant::now();
    crate::verify::check_reachable(opts.verify, opts.require_level)?;
    crate::raise_open_file_limit();
    if let Some(sub) = &opts.subdir {
        for e in &mut scanned.entries {
            let mut joined = sub.as_bytes().to_vec();
            joined.push(b'/');
            joined.extend_from_slice(e.rel.as_bytes());
            e.rel = WirePath::parse(&joined)?;
        }
    }
    // Every stream is connected and authenticated before any data moves,
    // so a wrong key or an unreachable server fails the whole run at once.
    let session = SessionSecret::random()?;
    let mut links = Vec::new();
    let mut security = None;
    for _ in 0..opts.streams.max(1) {
        let (conn, s) = connect(addr, opts.key.as_ref(), &session)?;
        security = Some(s);
        links.push(SenderLink::tcp(conn)?);
    }
    let mut report = run_sender(&scanned, opts, links, progress, start);
    report.frames = security.map(|s| s.to_string());
    Ok(report)
}

/// One stream's link as the sender half sees it: where it writes, the
/// queue its answers arrive on, and, over TCP, the socket and its reader
/// thread to stop at the end.
pub(crate) struct SenderLink<'a> {
    pub(crate) out: Box<dyn Outbound + Send + 'a>,
    pub(crate) events: mpsc::Receiver<Arrival>,
    tcp: Option<TcpEnd>,
}

/// A TCP link's socket and reader thread: ended (shut down, joined) when
/// dropped, also for a link never used because another stream failed to
/// connect.
struct TcpEnd {
    socket: TcpStream,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Drop for TcpEnd {
    fn drop(&mut self) {
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

impl SenderLink<'_> {
    /// A link over an authenticated TCP connection.
    fn tcp(conn: Connection<TcpStream>) -> Result<SenderLink<'static>, TransferError> {
        let socket = conn.get_ref().try_clone().map_err(conn_err)?;
        let write_half = socket.try_clone().map_err(conn_err)?;
        // Each half carries its own direction's sealing state.
        let (read_half, conn) = conn.split(write_half);
        let (tx, events) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut r = read_half;
            loop {
                let m = r.read_message();
                let stop = !matches!(m, Ok(Some(ref msg)) if *msg != Message::Bye);
                if tx.send(Arrival::Read(m)).is_err() || stop {
                    return;
                }
            }
        });
        Ok(SenderLink {
            out: Box::new(conn),
            events,
            tcp: Some(TcpEnd {
                socket,
                reader: Some(reader),
            }),
        })
    }

    /// An in-process link: `out` reaches the receiver half, whose answers
    /// arrive on `events`.
    pub(crate) fn local(
        out: Box<dyn Outbound + Send + '_>,
        events: mpsc::Receiver<Arrival>,
    ) -> SenderLink<'_> {
        SenderLink {
            out,
            events,
            tcp: None,
        }
    }
}

/// The sender half: sends every entry of `scanned` over `links` (one
/// stream each) and reports what the receiver half answered, per entry.
pub(crate) fn run_sender(
    scanned: &Scan,
    opts: &SendOptions,
    links: Vec<SenderLink<'_>>,
    progress: Progress<'_>,
    start: Instant,
) -> CopyReport {
    let entries = &scanned.entries;
    let streams = links.len();
    let (first, dirs): (Vec<usize>, Vec<usize>) =
        (0..entries.len()).partition(|&i| entries[i].kind != SourceKind::Dir);
    let next = AtomicUsize::new(0);
    let sent = AtomicU64::new(0);
    let reports = Mutex::new(vec![None; entries.len()]);
    let cache = SourceCache::from_setting(&opts.source_cache);
    let ctx = Ctx {
        cache: cache.as_ref(),
        opts,
        entries,
        sent: &sent,
        progress,
        reports: &reports,
    };

    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for (n, link) in links.into_iter().enumerate() {
            let (ctx, first, next) = (&ctx, &first, &next);
            handles.push(s.spawn(move || {
                let mut stream = Stream::new(link, ctx);
                stream.run(|| first.get(next.fetch_add(1, Ordering::Relaxed)).copied());
                // Directories once all files are in: stream 0 after the others.
                (n, stream)
            }));
        }
        let mut streams: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("stream thread panicked"))
            .collect();
        streams.sort_by_key(|(n, _)| *n);
        if let Some((_, s0)) = streams.first_mut() {
            let mut it = dirs.iter().copied();
            s0.run(|| it.next());
        }
        for (_, st) in streams {
            st.finish();
        }
    });

    let mut files: Vec<FileReport> = Vec::with_capacity(entries.len());
    for (i, r) in reports
        .into_inner()
        .expect("threads joined")
        .into_iter()
        .enumerate()
    {
        files.push(r.unwrap_or_else(|| {
            let mut r = simple_report(
                &entries[i],
                opts.verify,
                Some(TransferError::Verification {
                    path: entries[i].rel.to_string(),
                    what: "no result from the receiver (link lost)".into(),
                }),
            );
            r.level = None;
            r
        }));
    }
    CopyReport::new(
        files,
        scanned,
        sent.load(Ordering::Relaxed),
        start,
        streams.max(1),
    )
}

/// The flags of an Entry under these options.
fn entry_flags(opts: &SendOptions) -> u8 {
    let mut f = 0;
    if opts.reverify {
        f |= Entry::REVERIFY;
    }
    if opts.require_level == Some(VerifyLevel::Device) {
        f |= Entry::REQUIRE_DEVICE;
    }
    if opts.read_path == ReadPath::Direct {
        f |= Entry::DIRECT;
    }
    f
}

/// Riva: the source's device reader; with `--require-level device` a
/// source with no device fails here, before anything is sent.
fn source_device(
    f: &File,
    e: &SourceEntry,
    opts: &SendOptions,
) -> Result<Option<(DeviceReader, DeviceStats)>, TransferError> {
    if !opts.verify.reads_device() {
        return Ok(None);
    }
    let reader = DeviceReader::new(f, opts.read_path).map_err(|err| TransferError::Source {
        path: e.abs.clone(),
        source: err.into(),
    })?;
    if let (Some(VerifyLevel::Device), Some(why)) =
        (opts.require_level, reader.backing().no_device_reason())
    {
        return Err(TransferError::Verification {
            path: e.rel.to_string(),
            what: format!("--require-level device: the source is on {why}"),
        });
    }
    Ok(Some((reader, DeviceStats::default())))
}

struct Ctx<'a> {
    opts: &'a SendOptions,
    cache: Option<&'a SourceCache>,
    entries: &'a [SourceEntry],
    sent: &'a AtomicU64,
    progress: Progress<'a>,
    reports: &'a Mutex<Vec<Option<FileReport>>>,
}

/// A file or link sent and not yet acknowledged.
struct Outgoing {
    source: Option<File>,
    /// Riva: the source's device reader and what its reads did.
    device: Option<(DeviceReader, DeviceStats)>,
    pending: u64,
    attempts: HashMap<u64, u32>,
    gave_up: Option<u64>,
    ended: bool,
    report: FileReport,
    started: Instant,
    /// The whole-file BLAKE3 assembled per block (power-of-two block
    /// sizes): a resent block replaces its own part, so the digest is of
    /// the bytes finally accepted without reading the file again.
    tree: Option<Blake3Blocks>,
    /// A block was sent again while the digest is streamed (other block
    /// sizes): it is computed again from the source before FileEnd.
    stale_digest: bool,
    /// Other block sizes: the whole-file BLAKE3 streamed as every block
    /// was sent in order.
    streamed: Option<[u8; 32]>,
    /// The digest sent in FileEnd.
    digest: Option<[u8; 32]>,
    /// The source's cache key when it was opened, and when.
    key: Option<SourceKey>,
    opened_at: SystemTime,
}

struct Stream<'a> {
    ctx: &'a Ctx<'a>,
    conn: Box<dyn Outbound + Send + 'a>,
    events: mpsc::Receiver<Arrival>,
    tcp: Option<TcpEnd>,
    out: HashMap<u64, Outgoing>,
    in_flight: u64,
    buf: AlignedBuf,
    /// Riva: the device-level read of a block, for its digest.
    dev: AlignedBuf,
    /// Riva: whether the last device-level read reached the device.
    last_read_device: bool,
    broken: Option<String>,
}

impl<'a> Stream<'a> {
    fn new(link: SenderLink<'a>, ctx: &'a Ctx<'a>) -> Stream<'a> {
        let SenderLink { out, events, tcp } = link;
        Stream {
            ctx,
            conn: out,
            events,
            tcp,
            out: HashMap::new(),
            in_flight: 0,
            buf: AlignedBuf::new(ctx.opts.block_size),
            dev: AlignedBuf::new(if ctx.opts.verify.reads_device() {
                ctx.opts.block_size
            } else {
                0
            }),
            last_read_device: false,
            broken: None,
        }
    }

    /// Sends every entry `next` yields and waits for all their results.
    fn run(&mut self, mut next: impl FnMut() -> Option<usize>) {
        let mut exhausted = false;
        let mut begun = 0usize;
        loop {
            while self.broken.is_none()
                && !exhausted
                && self.out.len() < MAX_FILES_IN_FLIGHT
                && self.in_flight < MAX_BYTES_IN_FLIGHT
            {
                match next() {
                    Some(i) => self.begin(i),
                    None => exhausted = true,
                }
                begun += 1;
                if begun % FLUSH_EVERY == 0 {
                    if let Err(e) = self.conn.flush() {
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

    /// Handles pending events; with `wait`, sends what is queued and
    /// blocks for at least one.
    fn drain(&mut self, wait: bool) {
        if wait {
            // Blocking with every outstanding file ended: nothing moves
            // until the receiver commits its group of verified files, so
            // say so. (While files await their Status or block results, the
            // receiver answers those anyway; a Waiting then would only
            // shrink its group.)
            if self.out.values().all(|o| o.ended) {
                if let Err(e) = self.conn.put(Message::Waiting) {
                    self.broken = Some(e.to_string());
                    return;
                }
            }
            if let Err(e) = self.conn.flush() {
                self.broken = Some(e.to_string());
                return;
            }
        }
        let mut next = if wait {
            Some(self.events.recv().unwrap_or(Arrival::Closed))
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

    fn report_done(&self, id: u64, report: FileReport) {
        self.ctx.reports.lock().expect("no panics hold it")[id as usize] = Some(report);
    }

    fn begin(&mut self, i: usize) {
        let e = &self.ctx.entries[i];
        let opts = self.ctx.opts;
        let id = i as u64;
        let report = simple_report(e, opts.verify, None);
        let mut device = None;
        let (kind, source) = match &e.kind {
            SourceKind::Dir => (EntryKind::Dir, None),
            SourceKind::Symlink(t) => (EntryKind::Symlink(t.clone()), None),
            SourceKind::File => match File::open(&e.abs)
                .map_err(|err| TransferError::Source {
                    path: e.abs.clone(),
                    source: err,
                })
                .and_then(|f| check_unchanged(&f, e).map(|()| f))
                .and_then(|f| {
                    let dev = source_device(&f, e, opts)?;
                    Ok((f, dev))
                }) {
                Ok((f, dev)) => {
                    device = dev;
                    (EntryKind::File, Some(f))
                }
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
        };
        if let Err(err) = self.conn.put(Message::Entry(entry)) {
            self.broken = Some(err.to_string());
            return;
        }
        // A file holds its whole size against the stream's window until its
        // result arrives, so admission is bounded by bytes even while its
        // blocks wait for the receiver's Status.
        self.in_flight += e.size;
        let mut report = report;
        report.read_path = device.as_ref().map(|(r, _)| r.path());
        let key = source.as_ref().and_then(|f| SourceKey::of(f).ok());
        let mut o = Outgoing {
            streamed: None,
            digest: None,
            key,
            opened_at: SystemTime::now(),
            device,
            pending: 0,
            attempts: HashMap::new(),
            gave_up: None,
            ended: source.is_none(),

            report,
            started: Instant::now(),
            source,
            tree: None,
            stale_digest: false,
        };
        if o.source.is_some() {
            o.report.blocks = e.size.div_ceil(opts.block_size as u64);
            // Blocks go out once the receiver says what it already holds.
            o.ended = false;
        }
        self.out.insert(id, o);
    }

    /// The receiver's Status: sends every block it does not hold, and every
    /// block it holds with a digest other than the source's own (checked
    /// by reading the source here, which costs no network; in `riva` the
    /// read reaches the device). A file held whole is all or nothing: if
    /// the BLAKE3 the receiver holds is not the source's, every block is
    /// sent; if it is, none, and FileEnd carries that digest for the
    /// receiver to confirm.
    fn send_missing(&mut self, id: u64, o: &mut Outgoing, holding: Holding) {
        let held: HashMap<u64, Vec<u8>> = match holding {
            Holding::Nothing => HashMap::new(),
            Holding::Blocks(b) => b.into_iter().collect(),
            Holding::Whole { digest } => {
                match self.holds_whole(o, id, &digest) {
                    Ok(true) => {
                        // Counted as unchanged (held and trusted, or
                        // re-verified in place), not as skipped blocks.
                        self.end_file(id, o);
                        return;
                    }
                    Ok(false) => {}
                    Err(err) => {
                        o.report.error = Some(err.to_string());
                        o.gave_up.get_or_insert(0);
                        self.end_file(id, o);
                        return;
                    }
                }
                HashMap::new()
            }
        };
        let blocks = o.report.blocks;
        let bs = self.ctx.opts.block_size as u64;
        let size = self.ctx.entries[id as usize].size;
        // The whole-file BLAKE3 for FileEnd, in every mode: per block
        // (power-of-two block sizes; held blocks from the read that checks
        // them), else streamed when every block is sent in order, else
        // read again before FileEnd.
        o.report.source_digest = Some(SourceDigest::Transfer);
        o.tree = Blake3Blocks::new(size, bs);
        let mut whole = (held.is_empty() && o.tree.is_none()).then(blake3::Hasher::new);
        for index in 0..blocks {
            if let Some(theirs) = held.get(&index) {
                match self.source_block_matches(o, id, index, theirs) {
                    Ok(true) => {
                        o.report.blocks_skipped += 1;
                        o.report.bytes_skipped += (size - index * bs).min(bs);
                        continue;
                    }
                    Ok(false) => {}
                    Err(err) => {
                        o.report.error = Some(err.to_string());
                        o.gave_up.get_or_insert(index);
                        break;
                    }
                }
            }
            if let Err(err) = self.send_block(o, id, index, whole.as_mut(), false) {
                o.report.error = Some(err.to_string());
                o.gave_up.get_or_insert(index);
                break;
            }
        }
        o.streamed = whole.map(|w| *w.finalize().as_bytes());
        if o.pending == 0 {
            self.end_file(id, o);
        }
    }

    /// Whether the BLAKE3 the receiver holds for a file it holds whole
    /// (`theirs`) equals the source's own, from the source-digest cache or
    /// read now (`--reverify`: always read, in riva from the device). The
    /// report says which.
    fn holds_whole(
        &mut self,
        o: &mut Outgoing,
        id: u64,
        theirs: &[u8],
    ) -> Result<bool, TransferError> {
        let cached = match (self.ctx.cache, &o.key) {
            (Some(c), Some(k)) if !self.ctx.opts.reverify => c.get(k),
            _ => None,
        };
        let (ours, from) = match cached {
            Some((d, recorded_at)) => (d, SourceDigest::Cache { recorded_at }),
            None => {
                let start = SystemTime::now();
                let d = self.read_digest(o, id, self.ctx.opts.reverify)?;
                if let (Some(c), Some(k), Some(src)) = (self.ctx.cache, &o.key, &o.source) {
                    c.put(src, k, start, &d);
                }
                (d, SourceDigest::Read)
            }
        };
        o.report.source_digest = Some(from);
        let same = <[u8; 32]>::try_from(theirs)
            .is_ok_and(|t| blake3::Hash::from_bytes(t) == blake3::Hash::from_bytes(ours));
        if same {
            o.digest = Some(ours);
            o.report.digest = Some(blake3::Hash::from_bytes(ours).to_hex().to_string());
        }
        Ok(same)
    }

    /// Whether block `index` of the source hashes to `theirs`; in `riva`
    /// the bytes hashed come from the device.
    fn source_block_matches(
        &mut self,
        o: &mut Outgoing,
        id: u64,
        index: u64,
        theirs: &[u8],
    ) -> Result<bool, TransferError> {
        let (_, len) = self.block_range(id, index);
        let (ours, bytes) = if o.device.is_none() {
            self.read_block(o, id, index)?;
            let d = hash(defaults::BLOCK_ALGORITHM, &self.buf[..len]);
            (d.as_bytes().to_vec(), &self.buf[..len])
        } else if self.read_block_if_cold(o, id, index)? {
            let d = hash(defaults::BLOCK_ALGORITHM, &self.buf[..len]);
            (d.as_bytes().to_vec(), &self.buf[..len])
        } else {
            let d = self.read_block_from_device(o, id, index, false)?;
            (d, &self.dev[..len])
        };
        let same = ours == theirs;
        if same {
            // A block not sent: its part of the whole-file digest is of
            // the bytes this check read.
            if let Some(t) = o.tree.as_mut() {
                t.set(index, bytes);
            }
        }
        Ok(same)
    }

    /// The whole-file BLAKE3 of what the source holds now; with
    /// `device`, read the way a resend reads (riva: from the device), so
    /// that after a resend it is the digest of the bytes finally accepted,
    /// not of a first read found wrong.
    fn read_digest(
        &mut self,
        o: &mut Outgoing,
        id: u64,
        device: bool,
    ) -> Result<[u8; 32], TransferError> {
        let mut whole = blake3::Hasher::new();
        for index in 0..o.report.blocks {
            let len = if device && o.device.is_some() {
                self.read_block_from_device(o, id, index, true)?;
                self.block_range(id, index).1
            } else {
                self.read_block(o, id, index)?
            };
            whole.update(&self.buf[..len]);
        }
        Ok(*whole.finalize().as_bytes())
    }

    /// The whole-file BLAKE3 of the bytes sent (and held) for FileEnd.
    fn file_digest(&mut self, o: &mut Outgoing, id: u64) -> Result<[u8; 32], TransferError> {
        if let Some(d) = o.digest {
            return Ok(d);
        }
        if let Some(h) = o.tree.as_ref().and_then(Blake3Blocks::finalize) {
            return Ok(*h.as_bytes());
        }
        match o.streamed {
            Some(d) if !o.stale_digest => Ok(d),
            _ => self.read_digest(o, id, true),
        }
    }

    /// Reads block `index` of entry `id` from the source into the stream's
    /// buffer; returns its length.
    fn read_block(&mut self, o: &Outgoing, id: u64, index: u64) -> Result<usize, TransferError> {
        let (offset, len) = self.block_range(id, index);
        let e = &self.ctx.entries[id as usize];
        let source = o.source.as_ref().expect("files have a source");
        source
            .read_exact_at(&mut self.buf[..len], offset)
            .map_err(|err| source_read_error(e, err))?;
        Ok(len)
    }

    /// Block `index` of entry `id`: (offset, length).
    fn block_range(&self, id: u64, index: u64) -> (u64, usize) {
        let size = self.ctx.entries[id as usize].size;
        let bs = self.ctx.opts.block_size as u64;
        let offset = index * bs;
        (offset, (size - offset).min(bs) as usize)
    }

    /// Riva: reads block `index` into the transfer buffer if none of its
    /// pages is cached (so the read reaches the device); false if some is.
    fn read_block_if_cold(
        &mut self,
        o: &mut Outgoing,
        id: u64,
        index: u64,
    ) -> Result<bool, TransferError> {
        let (offset, len) = self.block_range(id, index);
        let e = &self.ctx.entries[id as usize];
        let source = o.source.as_ref().expect("files have a source");
        let (reader, stats) = o.device.as_mut().expect("riva files have a reader");
        match reader
            .read_if_cold(source, offset, len, &mut self.buf)
            .map_err(|err| source_read_error(e, err))?
        {
            Some(out) => {
                stats.add(&out);
                self.last_read_device = out.device;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Riva: reads block `index` again, from the device, into `self.dev`
    /// (or, for a resend, into the transfer buffer, in case the page cache
    /// is what held wrong bytes); returns the digest of what it read.
    fn read_block_from_device(
        &mut self,
        o: &mut Outgoing,
        id: u64,
        index: u64,
        into_transfer_buffer: bool,
    ) -> Result<Vec<u8>, TransferError> {
        let (offset, len) = self.block_range(id, index);
        let e = &self.ctx.entries[id as usize];
        let source = o.source.as_ref().expect("files have a source");
        let (reader, stats) = o.device.as_mut().expect("riva files have a reader");
        let buf = if into_transfer_buffer {
            &mut self.buf
        } else {
            &mut self.dev
        };
        let out = reader
            .read(source, offset, len, buf)
            .map_err(|err| source_read_error(e, err))?;
        stats.add(&out);
        self.last_read_device = out.device;
        Ok(hash(defaults::BLOCK_ALGORITHM, &buf[..len])
            .as_bytes()
            .to_vec())
    }

    /// Reads block `index` of entry `id` and sends it with its digest.
    /// Riva: the digest comes from a second read, from the device, so a
    /// transfer read served wrong bytes by the page cache shows up as a
    /// mismatch at the receiver; the resend then reads from the device.
    fn send_block(
        &mut self,
        o: &mut Outgoing,
        id: u64,
        index: u64,
        whole: Option<&mut blake3::Hasher>,
        resend: bool,
    ) -> Result<(), TransferError> {
        let stage = Instant::now();
        let riva = o.device.is_some();
        let (_, len) = self.block_range(id, index);
        // Riva: a device-level digest, from the transfer read itself when
        // that read reached the device (none of its pages was cached, or a
        // resend read it after eviction), else from a second read.
        let mut device_digest = None;
        if riva && resend {
            self.read_block_from_device(o, id, index, true)?;
        } else if riva && self.read_block_if_cold(o, id, index)? {
        } else {
            self.read_block(o, id, index)?;
            if riva {
                device_digest = Some(self.read_block_from_device(o, id, index, false)?);
            }
        }
        let t = Instant::now();
        let digest = match (self.ctx.opts.verify, device_digest) {
            (VerifyMode::None, _) => Vec::new(),
            (_, Some(d)) => d,
            _ => hash(defaults::BLOCK_ALGORITHM, &self.buf[..len])
                .as_bytes()
                .to_vec(),
        };
        let data = &self.buf[..len];
        if let Some(w) = whole {
            w.update(data);
        }
        if let Some(t) = o.tree.as_mut() {
            t.set(index, data);
        }
        o.report.checksum_seconds += t.elapsed().as_secs_f64();
        // The level the digest's read reached at this end.
        let source_level = match (riva, self.last_read_device) {
            (true, true) => VerifyLevel::Device,
            (true, false) => VerifyLevel::Cache,
            (false, _) => self.ctx.opts.verify.level(),
        };
        let msg = Message::Block(Block {
            file: id,
            index,
            source_level: source_level.wire_id(),
            digest,
            data: data.to_vec(),
        });
        self.conn.put(msg).map_err(TransferError::Path)?;
        o.report.transfer_stage_seconds += stage.elapsed().as_secs_f64();
        o.pending += 1;
        o.report.bytes_sent += len as u64;
        o.stale_digest |= resend;
        let total = self.ctx.sent.fetch_add(len as u64, Ordering::Relaxed) + len as u64;
        (self.ctx.progress)(total);
        Ok(())
    }

    fn end_file(&mut self, id: u64, o: &mut Outgoing) {
        let e = &self.ctx.entries[id as usize];
        if let Some(src) = &o.source {
            if let Err(err) = check_unchanged(src, e) {
                o.report.error = Some(err.to_string());
                o.gave_up = Some(u64::MAX);
            }
        }
        let mut digest = Vec::new();
        if o.gave_up.is_none() && o.report.error.is_none() {
            match self.file_digest(o, id) {
                Ok(d) => {
                    o.digest = Some(d);
                    o.report.digest = Some(blake3::Hash::from_bytes(d).to_hex().to_string());
                    digest = d.to_vec();
                }
                Err(err) => {
                    o.report.error = Some(err.to_string());
                    o.gave_up = Some(u64::MAX);
                }
            }
        }
        // A file the sender gave up on must never get its final name.
        let blocks = if o.gave_up.is_some() || o.report.error.is_some() {
            FileEnd::ABANDON
        } else {
            o.report.blocks
        };
        let msg = Message::FileEnd {
            file: id,
            blocks,
            source_level: self.source_level(o).level.wire_id(),
            digest,
        };
        if let Err(err) = self.conn.put(msg) {
            self.broken = Some(err.to_string());
        }
        o.ended = true;
    }

    fn handle(&mut self, msg: Message) {
        match msg {
            Message::BlockResult { file, index, ok } => {
                let Some(mut o) = self.out.remove(&file) else {
                    return;
                };
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
                        if let Err(err) = self.send_block(&mut o, file, index, None, true) {
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
            Message::Status { file, holding } => {
                let Some(mut o) = self.out.remove(&file) else {
                    return;
                };
                self.send_missing(file, &mut o, holding);
                self.out.insert(file, o);
            }
            Message::FileResult(r) => {
                let Some(mut o) = self.out.remove(&r.file) else {
                    return;
                };
                self.release(r.file);
                let id = r.file;
                self.file_result(&mut o, r);
                self.report_done(id, o.report);
            }
            Message::Refused { reason } => self.broken = Some(format!("server refused: {reason}")),
            other => self.broken = Some(format!("unexpected {} from the server", other.name())),
        }
    }

    /// The level this end's reads of the source support for a file: the
    /// mode's aim, lowered where a riva read did not reach the device.
    fn source_level(&self, o: &Outgoing) -> Reached {
        let mut reached = Reached::aim(self.ctx.opts.verify);
        if let Some((reader, stats)) = &o.device {
            stats.lower(&mut reached, "source", reader.backing());
        }
        reached
    }

    /// The receiver's verdict on file `id`, into its report. The level is
    /// the lower of both ends': the receiver's (its checks in this run and
    /// the recorded level of what it trusted) and the source's reads.
    fn file_result(&mut self, o: &mut Outgoing, r: FileResult) {
        o.report.unchanged = r.unchanged;
        o.report.bytes_reverified = r.reverified;
        o.report.bytes_trusted = r.trusted;
        if r.trusted > 0 {
            o.report.trusted_level = VerifyLevel::from_wire_id(r.trusted_level);
            o.report.trusted_since = (r.trusted_at > 0).then_some(r.trusted_at);
        }
        let secs = o.started.elapsed().as_secs_f64();
        o.report.transfer_seconds = (secs - o.report.checksum_seconds).max(0.0);
        o.report.checksum_seconds += r.check_micros as f64 / 1e6;
        o.report.verify_stage_seconds = r.check_micros as f64 / 1e6;
        o.report.evict_seconds += r.evict_micros as f64 / 1e6;
        o.report.pages_resident += r.resident;
        let verified = r.status == FileStatus::Verified;
        if !verified || o.gave_up.is_some() || o.report.error.is_some() {
            o.report.level = None;
            if o.report.error.is_none() {
                o.report.error = Some(match o.gave_up {
                    Some(index) => format!(
                        "{}: block {index} failed verification {} times",
                        o.report.path,
                        self.ctx.opts.retries + 1
                    ),
                    // The receiver's reasons may name the path already.
                    None if r.message.starts_with(&o.report.path) => r.message,
                    None => format!("{}: {}", o.report.path, r.message),
                });
            }
            return;
        }
        if o.source.is_none() {
            o.report.level = None;
            return;
        }
        // An unknown level id reads as the weakest.
        let mut reached = Reached {
            level: VerifyLevel::from_wire_id(r.level).unwrap_or(VerifyLevel::None),
            note: (!r.message.is_empty()).then(|| r.message.clone()),
        };
        if let Some((reader, stats)) = &o.device {
            o.report.evict_seconds += stats.evict.as_secs_f64();
            o.report.pages_resident += stats.resident;
            stats.lower(&mut reached, "source", reader.backing());
        }
        o.report.level = Some(reached.level);
        o.report.note = reached
            .note
            .filter(|_| reached.level < self.ctx.opts.verify.level());
        // The bytes the receiver holds have this run's digest of the source:
        // the next quick check can take it from the cache.
        if let (Some(c), Some(k), Some(src), Some(d), Some(SourceDigest::Transfer)) = (
            self.ctx.cache,
            &o.key,
            &o.source,
            &o.digest,
            o.report.source_digest,
        ) {
            c.put(src, k, o.opened_at, d);
        }
        if let Err(err) = crate::verify::require_level(
            self.ctx.opts.require_level,
            o.report.level,
            &o.report.path,
        ) {
            // Committed at the receiver, but below the level asked for:
            // the run must say so, resumed and unchanged files included.
            o.report.error = Some(err.to_string());
        }
        if o.report.error.is_some() {
            o.report.level = None;
        }
    }

    /// Gives back a finished file's share of the window.
    fn release(&mut self, id: u64) {
        let size = self.ctx.entries[id as usize].size;
        self.in_flight -= size.min(self.in_flight);
    }

    fn fail_all(&mut self) {
        let why = self.broken.clone().unwrap_or_default();
        for (id, mut o) in std::mem::take(&mut self.out) {
            o.report.level = None;
            o.report.error = Some(format!("{}: connection lost: {why}", o.report.path));
            self.report_done(id, o.report);
        }
    }

    /// Says Bye and waits for the server's Bye, so its last writes are done.
    fn finish(mut self) {
        if self.broken.is_none() && self.conn.send(Message::Bye).is_ok() {
            while let Ok(Ok(Some(msgs))) = self.events.recv().map(Arrival::messages) {
                if msgs.contains(&Message::Bye) {
                    break;
                }
            }
        }
        drop(self.tcp.take());
    }
}
