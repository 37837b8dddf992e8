//! The sender half: `intact send` over several TCP streams, and `intact
//! copy`'s sender over the in-process link.
//!
//! Each stream is one link (over TCP, an authenticated connection with a
//! reader thread), so results flow back while blocks flow out and nothing
//! waits on a round trip per block or per file. Entries (files and symlinks) are taken from
//! a shared queue; each stream keeps at most [`MAX_FILES_IN_FLIGHT`] files
//! and [`MAX_BYTES_IN_FLIGHT`] bytes unacknowledged, so memory stays
//! bounded whatever the dataset. Directories go last, on one stream, so
//! that their times are set after their contents.
//!
//! Where each step lives: [`stream`] (a stream's loop and its messages),
//! [`blocks`] (a file's blocks: what the receiver holds, sent, resent,
//! its end), [`result`] (the receiver's verdict into the report),
//! [`link`] (a stream's link); reading the source is
//! [`crate::stage::source`].

use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use intact_cache::ReadPath;
use intact_digest::defaults;
use intact_proto::{
    client_handshake_with, Connection, Entry, Key, ProtoError, Security, SessionSecret, WirePath,
};

use crate::profile::Profile;
use crate::report::{simple_report, CopyReport, FileReport, Progress};
use crate::source::{scan, Scan, SourceEntry, SourceKind};
use crate::source_cache::{SourceCache, SourceCacheSetting};
use crate::verify::{VerifyLevel, VerifyMode};
use crate::TransferError;

mod blocks;
mod link;
mod result;
mod spread;
mod stream;
mod tune;

pub(crate) use link::SenderLink;
pub use spread::{Spread, SpreadReport, AUTO_MIN_RTT, MAX_RANGE_BYTES, MIN_RANGE_BYTES};
use stream::Stream;
pub use tune::{StreamsReport, AUTO_MAX_STREAMS, AUTO_START_STREAMS};

/// Files one stream keeps unacknowledged at most. The receiver commits a
/// group of files when it runs out of input, so this also bounds its group
/// commit: at 64, 20,000 small files cost ~300 syncfs calls per stream.
pub const MAX_FILES_IN_FLIGHT: usize = 1024;
/// Bytes one stream keeps unacknowledged at most (with 4 streams, 64 MiB
/// in flight: enough for 10 Gbit/s at 50 ms round trip).
pub const MAX_BYTES_IN_FLIGHT: u64 = 16 << 20;
/// Bytes one stream keeps unacknowledged at most when every file it holds
/// is a range of a spread file whose blocks have all left: it may then
/// begin its next entry past [`MAX_BYTES_IN_FLIGHT`] instead of idling a
/// round trip and more for their verdicts. Two of the largest ranges.
pub const MAX_SENT_UNACKED: u64 = 2 * spread::MAX_RANGE_BYTES;
/// The same in `--verify flash`, where the receiver answers a block only
/// once its device's write cache window (up to 1 GiB by default) has
/// passed: less would stall each stream on every window. What it costs is
/// open files (still at most [`MAX_FILES_IN_FLIGHT`]) and digests, not data.
pub const MAX_BYTES_IN_FLIGHT_FLASH: u64 = 4 << 30;

/// Entries begun between two pushes of what is queued to the receiver
/// (else sent when the queue fills, or when the sender waits), so the
/// receiver starts on the first files while the rest are announced.
const FLUSH_EVERY: usize = 64;

/// How often the sender half checks whether its streams are done and the
/// tuner has something to say (it looks at the sockets only every
/// [`tune::interval`]).
const TUNER_TICK: Duration = Duration::from_millis(20);

/// How to send.
#[derive(Clone)]
pub struct SendOptions {
    /// Verification mode.
    pub verify: VerifyMode,
    /// Block size in bytes (with `block_auto`, what the probe falls back
    /// to: the default).
    pub block_size: usize,
    /// `--block-size auto`: choose the block size after the streams
    /// connect, from Eq. 1 and a short probe of this host's source (see
    /// the `block_size` module); the report's `block_size` says what and
    /// why.
    pub block_auto: bool,
    /// `block_auto` with these stage costs instead of the probe's (tests
    /// only, as [`crate::CopyOptions::block_stages`]).
    #[cfg(feature = "fault-hooks")]
    pub block_stages: Option<crate::Stages>,
    /// TCP streams connected before data moves.
    pub streams: usize,
    /// `send`: streams it may grow to while the sockets show their send
    /// buffers, not the link, hold them back (`--streams auto` sets
    /// [`AUTO_MAX_STREAMS`], see [`tune`]); at most `streams` (0, the
    /// default here) keeps the count fixed.
    pub max_streams: usize,
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
    /// Which files a recovery cache may keep (`--cache-include`,
    /// `--cache-exclude`; empty: all). For the others no block BLAKE3 is
    /// sent, so no cache keeps them and their repairs come from here.
    pub cache_filter: crate::select::Filter,
    /// Whether large files are spread over the streams (`send` only; a
    /// local copy never spreads).
    pub spread: Spread,
}

impl Default for SendOptions {
    /// intact's defaults: riva, 4 MiB blocks, 4 streams (fixed: the
    /// command line's `--streams auto` sets `max_streams`), 3 retries, no
    /// key.
    fn default() -> Self {
        SendOptions {
            verify: VerifyMode::DEFAULT,
            block_size: defaults::BLOCK_BYTES,
            block_auto: false,
            #[cfg(feature = "fault-hooks")]
            block_stages: None,
            streams: AUTO_START_STREAMS,
            max_streams: 0,
            retries: 3,
            key: None,
            subdir: None,
            reverify: false,
            read_path: ReadPath::default(),
            require_level: None,
            source_cache: SourceCacheSetting::Off,
            cache_filter: crate::select::Filter::default(),
            spread: Spread::default(),
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
    connect_timed(addr, key, secret, None).map(|(conn, security, _)| (conn, security))
}

/// [`connect`], and how long the TCP connect took (one round trip: SYN
/// out, SYN-ACK back), before the handshake. With `limit`, the connect
/// and each read and write of the handshake give up after it (a stream
/// added mid-send must not hold the send up for the kernel's two
/// minutes of SYN retries).
fn connect_timed(
    addr: &str,
    key: Option<&Key>,
    secret: &SessionSecret,
    limit: Option<Duration>,
) -> Result<Connected, TransferError> {
    let failed = |e: std::io::Error| TransferError::Connect {
        addr: addr.to_string(),
        source: e,
    };
    let t = Instant::now();
    let stream = match limit {
        None => TcpStream::connect(addr).map_err(failed)?,
        Some(limit) => connect_within(addr, limit).map_err(failed)?,
    };
    let rtt = t.elapsed();
    stream.set_nodelay(true).map_err(conn_err)?;
    stream.set_read_timeout(limit).map_err(conn_err)?;
    stream.set_write_timeout(limit).map_err(conn_err)?;
    let mut conn = Connection::new(stream);
    let security = client_handshake_with(&mut conn, key, secret, true)?;
    if limit.is_some() {
        conn.get_ref().set_read_timeout(None).map_err(conn_err)?;
        conn.get_ref().set_write_timeout(None).map_err(conn_err)?;
    }
    Ok((conn, security, rtt))
}

/// A TCP connect to the first of `addr`'s addresses that answers within
/// `limit` each.
fn connect_within(addr: &str, limit: Duration) -> std::io::Result<TcpStream> {
    let mut last = None;
    for a in std::net::ToSocketAddrs::to_socket_addrs(addr)? {
        match TcpStream::connect_timeout(&a, limit) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("the name resolved to no address")))
}

/// Connects, at most, that many streams at once: a server takes only so
/// many handshakes from one address at a time (16 for intact's,
/// `net/handshakes.rs`), and refuses the rest.
const PARALLEL_CONNECTS: usize = 8;

/// Connects and authenticates the options' streams of one session, all
/// at once: one after another, each connect and handshake costs its own
/// round trips, a second at 89 ms for four streams before any data moves.
/// Returns the links, the frames' security and the fastest TCP connect
/// (one round trip).
fn connect_all(
    addr: &str,
    opts: &SendOptions,
    session: &SessionSecret,
) -> Result<(Vec<SenderLink<'static>>, Option<Security>, Duration), TransferError> {
    let connected = connect_n_timed(addr, opts.key.as_ref(), session, opts.streams.max(1), None);
    let mut links = Vec::with_capacity(connected.len());
    let mut security = None;
    let mut rtt = Duration::MAX;
    for c in connected {
        let (conn, s, took) = c?;
        security = Some(s);
        rtt = rtt.min(took);
        links.push(SenderLink::tcp(conn)?);
    }
    Ok((links, security, rtt))
}

/// One authenticated stream, its frames' security and how long its TCP
/// connect took.
type Connected = (Connection<TcpStream>, Security, Duration);

/// Connects `n` streams of the session, [`PARALLEL_CONNECTS`] at a time,
/// each with how long its TCP connect took.
pub(crate) fn connect_n_timed(
    addr: &str,
    key: Option<&Key>,
    session: &SessionSecret,
    n: usize,
    limit: Option<Duration>,
) -> Vec<Result<Connected, TransferError>> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let wave = (n - out.len()).min(PARALLEL_CONNECTS);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..wave)
                .map(|_| s.spawn(|| connect_timed(addr, key, session, limit)))
                .collect();
            out.extend(
                handles
                    .into_iter()
                    .map(|h| h.join().expect("a connecting thread panicked")),
            );
        });
    }
    out
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
    if let Some(report) = CopyReport::nothing_listed(&scanned, start) {
        return Ok(report);
    }
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
    let (links, security, rtt) = connect_all(addr, opts, &session)?;
    let profile = Profile::default();
    #[cfg(feature = "fault-hooks")]
    let given = opts.block_stages;
    #[cfg(not(feature = "fault-hooks"))]
    let given = None;
    // Decided once, before the block size: every size auto chooses among
    // is a power of two that ranges take, so the decision holds for it.
    let (spreading, why) = spread::decide(
        opts.spread,
        opts.verify,
        opts.block_size,
        links.len().max(opts.max_streams),
        opts.reverify,
        rtt,
    );
    let auto = opts.block_auto.then(|| {
        crate::block_size::auto::decide(
            &scanned,
            opts.verify,
            links.len(),
            crate::block_size::auto::Receiver::Remote {
                rtt,
                spread: spreading,
            },
            given,
        )
    });
    let chosen;
    let opts = match &auto {
        Some(a) => {
            chosen = SendOptions {
                block_size: a.chosen as usize,
                ..opts.clone()
            };
            &chosen
        }
        None => opts,
    };
    // More streams only where a window can bind: the same round trip
    // from which files are spread.
    let grow = (opts.max_streams > links.len() && rtt >= AUTO_MIN_RTT).then_some(tune::Grow {
        addr,
        key: opts.key.as_ref(),
        session: &session,
        rtt,
    });
    let mut report = if spreading {
        let secret = opts
            .key
            .as_ref()
            .map_or([0; 32], |k| k.derive(spread::SPLIT_SECRET_CONTEXT));
        let (cut, groups) = spread::cut(&scanned, opts.block_size, &secret);
        let cvs = spread::RangeCvs::default();
        let mut report = run_sender(
            &cut,
            opts,
            links,
            progress,
            start,
            &profile,
            Some(&cvs),
            grow,
        );
        let ranges = groups.iter().map(|g| g.len() as u64).sum();
        let files = groups.len() as u64;
        spread::join(
            &mut report,
            &scanned,
            &groups,
            cvs,
            opts.block_size,
            opts.verify.level(),
        );
        report.spread = Some(spread::SpreadReport {
            rtt_seconds: rtt.as_secs_f64(),
            why,
            files,
            ranges,
        });
        report
    } else {
        let mut report = run_sender(&scanned, opts, links, progress, start, &profile, None, grow);
        report.spread = Some(spread::SpreadReport {
            rtt_seconds: rtt.as_secs_f64(),
            why,
            files: 0,
            ranges: 0,
        });
        report
    };
    report.stages = profile.stages();
    report.frames = security.map(|s| s.to_string());
    report.block_size = auto;
    Ok(report)
}

/// The sender half: sends every entry of `scanned` over `links` (one
/// stream each, more joining while `grow` finds them held back by their
/// send buffers) and reports what the receiver half answered, per entry.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_sender<'l>(
    scanned: &Scan,
    opts: &SendOptions,
    links: Vec<SenderLink<'l>>,
    progress: Progress<'_>,
    start: Instant,
    profile: &Profile,
    range_cvs: Option<&spread::RangeCvs>,
    grow: Option<tune::Grow<'_>>,
) -> CopyReport {
    let entries = &scanned.entries;
    let mut tuner = grow.map(|g| tune::Tuner::new(g, &links, opts.max_streams));
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
        profile,
        range_cvs,
    };

    let streams = std::thread::scope(|s| {
        let (ctx, first, next) = (&ctx, &first, &next);
        let spawn = |n: usize, link: SenderLink<'l>| {
            s.spawn(move || {
                let mut stream = Stream::new(link, ctx);
                stream.run(|| first.get(next.fetch_add(1, Ordering::Relaxed)).copied());
                // Directories once all files are in: stream 0 after the others.
                (n, stream)
            })
        };
        let mut handles: Vec<_> = links
            .into_iter()
            .enumerate()
            .map(|(n, link)| spawn(n, link))
            .collect();
        if let Some(t) = tuner.as_mut() {
            while !handles.iter().all(|h| h.is_finished()) {
                std::thread::sleep(TUNER_TICK);
                let taken = next.load(Ordering::Relaxed).min(first.len());
                for link in t.poll(first.len() - taken) {
                    handles.push(spawn(handles.len(), link));
                }
            }
        }
        let count = handles.len();
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
        count
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
    let mut report = CopyReport::new(
        files,
        scanned,
        sent.load(Ordering::Relaxed),
        start,
        streams.max(1),
    );
    report.streams = tuner.map(|t| t.report);
    report
}

/// The flags of an Entry under these options.
fn entry_flags(opts: &SendOptions) -> u8 {
    let mut f = 0;
    if opts.reverify {
        f |= Entry::REVERIFY;
    }
    if opts.require_level >= Some(VerifyLevel::Device) {
        f |= Entry::REQUIRE_DEVICE;
    }
    if opts.require_level == Some(VerifyLevel::Media) {
        f |= Entry::REQUIRE_MEDIA;
    }
    if opts.read_path == ReadPath::Direct {
        f |= Entry::DIRECT;
    }
    f
}

/// What every stream of a sender half shares.
pub(super) struct Ctx<'a> {
    pub(super) opts: &'a SendOptions,
    pub(super) cache: Option<&'a SourceCache>,
    pub(super) entries: &'a [SourceEntry],
    pub(super) sent: &'a AtomicU64,
    pub(super) progress: Progress<'a>,
    pub(super) reports: &'a Mutex<Vec<Option<FileReport>>>,
    /// Where the streams' stage times are summed.
    pub(super) profile: &'a Profile,
    /// Where the ranges of spread files leave their chaining values.
    pub(super) range_cvs: Option<&'a spread::RangeCvs>,
}
