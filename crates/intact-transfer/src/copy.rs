//! `intact copy`: the block pipeline between a local source and a local
//! destination, with every verification mode.
//!
//! Each of `streams` workers takes the next file and runs it through the
//! pipeline: read a block, digest it, pass it over the link (in-process
//! here; a fault injector can sit on it), check and write it at the
//! receiver, verify as the mode says, resend a block that fails, and
//! finally fsync and rename. A file gets its final name only after that.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use intact_cache::{DeviceReader, ReadPath};
use intact_digest::{defaults, hash, AlignedBuf, Digest, Hasher};

use crate::dest::{Destination, PartialFile};
use crate::recheck::{recheck_batch, Recheck, BATCH_BYTES};
use crate::source::{scan, Scan, SourceEntry, SourceKind};
use crate::verify::{DeviceStats, Reached, VerifyLevel, VerifyMode};
use crate::TransferError;

/// Corrupts a block on the link: (file's destination path, block index, bytes).
pub type LinkFault = Arc<dyn Fn(&str, u64, &mut [u8]) + Send + Sync>;

/// Called right after a block was written at the destination and before
/// anything verifies it: (the destination file, its path, block index,
/// offset, length). Tests and the fault lab change the device under the
/// block here.
pub type WriteHook = Arc<dyn Fn(&File, &str, u64, u64, usize) + Send + Sync>;

/// How to copy.
#[derive(Clone)]
pub struct CopyOptions {
    /// Verification mode.
    pub verify: VerifyMode,
    /// Block size in bytes.
    pub block_size: usize,
    /// Files in flight at once.
    pub streams: usize,
    /// Resends of one block before its file fails.
    pub retries: u32,
    /// How device-level reads reach the device.
    pub read_path: ReadPath,
    /// A file that cannot reach this level fails instead of being committed.
    pub require_level: Option<VerifyLevel>,
    /// Fault injection on the link (tests and the fault lab only: built
    /// with the `fault-hooks` feature, never in the `intact` binary).
    #[cfg(feature = "fault-hooks")]
    pub link_fault: Option<LinkFault>,
    /// Fault injection after a block is written (tests and the fault lab
    /// only, as `link_fault`).
    #[cfg(feature = "fault-hooks")]
    pub after_write: Option<WriteHook>,
}

impl CopyOptions {
    /// The link fault, in a build that has hooks.
    fn link_fault(&self) -> Option<&LinkFault> {
        #[cfg(feature = "fault-hooks")]
        return self.link_fault.as_ref();
        #[cfg(not(feature = "fault-hooks"))]
        None
    }

    /// The after-write hook, in a build that has hooks.
    fn after_write(&self) -> Option<&WriteHook> {
        #[cfg(feature = "fault-hooks")]
        return self.after_write.as_ref();
        #[cfg(not(feature = "fault-hooks"))]
        None
    }
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
            #[cfg(feature = "fault-hooks")]
            link_fault: None,
            #[cfg(feature = "fault-hooks")]
            after_write: None,
        }
    }
}

/// What happened to one entry.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FileReport {
    /// Destination path, relative to the root.
    pub path: String,
    /// "file", "dir" or "symlink".
    pub kind: &'static str,
    /// Bytes.
    pub size: u64,
    /// BLAKE3 of the file as read for the transfer (`copy`: not with
    /// `--verify none`; `send`: in every mode, the digest the receiver
    /// compared with the bytes it holds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// `send`: how the source's whole-file digest was obtained (this run's
    /// reads, read now to compare with a file the server held whole, or
    /// the source-digest cache and when it was recorded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_digest: Option<crate::SourceDigest>,
    /// Blocks the file was cut into.
    pub blocks: u64,
    /// Blocks sent again after failing verification.
    pub blocks_resent: u64,
    /// Blocks not sent because the receiver already held them verified
    /// (resume after an interruption).
    pub blocks_skipped: u64,
    /// Bytes in those blocks.
    pub bytes_skipped: u64,
    /// The receiver already held the file whole and unchanged; nothing was sent.
    pub unchanged: bool,
    /// Bytes of this file read and sent, resends included.
    pub bytes_sent: u64,
    /// Bytes the receiver held from an earlier run and re-verified in place
    /// in this one (not sent), at the level of this run's checks.
    pub bytes_reverified: u64,
    /// Bytes the receiver held and trusted from its journal (not sent, not
    /// re-read beyond a check through the cache): they count at the level
    /// recorded when they were verified.
    pub bytes_trusted: u64,
    /// The lowest level recorded for the trusted bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trusted_level: Option<VerifyLevel>,
    /// When the oldest trusted byte was verified, seconds since the epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trusted_since: Option<i64>,
    /// The verification mode.
    pub verify: VerifyMode,
    /// The level really reached (files only; absent when the file failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level: Option<VerifyLevel>,
    /// Seconds spent reading, sending and writing.
    pub transfer_seconds: f64,
    /// Seconds spent computing and comparing checksums.
    pub checksum_seconds: f64,
    /// Device-level modes: how verification reads reached the device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_path: Option<ReadPath>,
    /// Device-level modes: pages found still resident after eviction, at
    /// both ends (each one keeps its block at level `cache`).
    pub pages_resident: u64,
    /// Device-level modes: seconds spent flushing and evicting.
    pub evict_seconds: f64,
    /// Riva: seconds the transfer stage spent on this file's blocks (read,
    /// source re-read, digest, send, write), waits for the verifier excluded.
    pub transfer_stage_seconds: f64,
    /// Riva: seconds the destination's verifier spent re-reading and
    /// hashing this file's blocks (eviction excluded).
    pub verify_stage_seconds: f64,
    /// Why the level is below what the mode aims at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The whole copy.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CopyReport {
    /// One entry per file, directory and symlink, in scan order.
    pub files: Vec<FileReport>,
    /// Sources that could not be scanned.
    pub errors: Vec<String>,
    /// Special files skipped.
    pub skipped: Vec<String>,
    /// Bytes of regular files.
    pub bytes: u64,
    /// Bytes read and sent, resends included.
    pub bytes_sent: u64,
    /// Bytes held by the receiver and re-verified in place in this run.
    pub bytes_reverified: u64,
    /// Bytes held by the receiver and trusted from its journal, at the
    /// level recorded for them (see each file's `trusted_level`).
    pub bytes_trusted: u64,
    /// Entries that failed.
    pub failed: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Riva: the RIVA paper's execution-time model (Eq. 1) from the
    /// measured per-block stage times, beside the measured time (Eq. 2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<crate::model::RivaModel>,
    /// `send`: how the frames were protected on the wire (`encrypted,
    /// AES-256-GCM`, `authenticated, not encrypted, …`, or `plain (no
    /// key)`), as the handshake settled it; None for a local copy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frames: Option<String>,
}

/// Progress callback: bytes sent so far.
pub type Progress<'a> = &'a (dyn Fn(u64) + Sync);

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
/// `dest_root` (created if missing).
pub fn copy_scanned(
    scanned: Scan,
    dest_root: &Path,
    opts: &CopyOptions,
    progress: Progress<'_>,
) -> Result<CopyReport, TransferError> {
    let start = Instant::now();
    crate::verify::check_reachable(opts.verify, opts.require_level)?;
    let dest = Destination::open(dest_root)?;
    let sent = AtomicU64::new(0);
    let mut reports: Vec<Option<FileReport>> = vec![None; scanned.entries.len()];

    // Directories first (parents before children), then symlinks.
    for (i, e) in scanned.entries.iter().enumerate() {
        let r = match &e.kind {
            SourceKind::Dir => dest.make_dir(&e.rel),
            SourceKind::Symlink(t) => dest.make_symlink(&e.rel, t, e.mtime),
            SourceKind::File => continue,
        };
        reports[i] = Some(simple_report(e, opts.verify, r.err()));
    }

    let files: Vec<usize> = (0..scanned.entries.len())
        .filter(|&i| scanned.entries[i].kind == SourceKind::File)
        .collect();
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::new());
    let ctx = Ctx {
        dest: &dest,
        opts,
        sent: &sent,
        progress,
    };
    std::thread::scope(|s| {
        for _ in 0..opts.streams.max(1) {
            s.spawn(|| {
                let mut stream = Stream::new(&ctx, s);
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&i) = files.get(n) else { break };
                    let done = stream.file(i, &scanned.entries[i]);
                    results.lock().expect("no panics hold it").extend(done);
                }
                for (i, r) in stream.finish() {
                    results.lock().expect("no panics hold it").push((i, r));
                }
            });
        }
    });
    for (i, r) in results.into_inner().expect("threads joined") {
        reports[i] = Some(r);
    }

    // Directory modes and times last, deepest first, now that their
    // contents no longer change them.
    for (i, e) in scanned.entries.iter().enumerate().rev() {
        if e.kind == SourceKind::Dir {
            if let Err(err) = dest.finish_dir(&e.rel, e.mode, e.mtime) {
                reports[i] = Some(simple_report(e, opts.verify, Some(err)));
            }
        }
    }
    let files: Vec<FileReport> = reports
        .into_iter()
        .map(|r| r.expect("every entry reported"))
        .collect();
    Ok(CopyReport::new(
        files,
        &scanned,
        sent.load(Ordering::Relaxed),
        start,
        opts.streams,
    ))
}

impl CopyReport {
    /// The report of a run: per-entry reports in scan order, the scan's
    /// own errors and skips, bytes read and sent, and the time since `start`.
    pub(crate) fn new(
        files: Vec<FileReport>,
        scanned: &crate::source::Scan,
        bytes_sent: u64,
        start: Instant,
        streams: usize,
    ) -> CopyReport {
        let failed = files.iter().filter(|f| f.error.is_some()).count() + scanned.errors.len();
        CopyReport {
            bytes: scanned.entries.iter().map(|e| e.size).sum(),
            bytes_sent,
            bytes_reverified: files.iter().map(|f| f.bytes_reverified).sum(),
            bytes_trusted: files.iter().map(|f| f.bytes_trusted).sum(),
            failed: failed as u64,
            files,
            errors: scanned.errors.iter().map(|e| e.to_string()).collect(),
            skipped: scanned
                .skipped
                .iter()
                .map(|p| p.display().to_string())
                .collect(),
            seconds: start.elapsed().as_secs_f64(),
            model: None,
            frames: None,
        }
        .with_model(streams)
    }

    fn with_model(mut self, streams: usize) -> CopyReport {
        self.model = crate::model::RivaModel::of(&self, streams);
        self
    }
}

pub(crate) fn simple_report(
    e: &SourceEntry,
    verify: VerifyMode,
    err: Option<TransferError>,
) -> FileReport {
    FileReport {
        path: e.rel.to_string(),
        kind: match e.kind {
            SourceKind::File => "file",
            SourceKind::Dir => "dir",
            SourceKind::Symlink(_) => "symlink",
        },
        size: e.size,
        digest: None,
        source_digest: None,
        blocks: 0,
        blocks_resent: 0,
        blocks_skipped: 0,
        bytes_skipped: 0,
        unchanged: false,
        bytes_sent: 0,
        bytes_reverified: 0,
        bytes_trusted: 0,
        trusted_level: None,
        trusted_since: None,
        verify,
        level: (err.is_none() && e.kind == SourceKind::File).then_some(verify.level()),
        transfer_seconds: 0.0,
        checksum_seconds: 0.0,
        read_path: None,
        pages_resident: 0,
        evict_seconds: 0.0,
        transfer_stage_seconds: 0.0,
        verify_stage_seconds: 0.0,
        note: None,
        error: err.map(|e| e.to_string()),
    }
}

struct Ctx<'a> {
    dest: &'a Destination,
    opts: &'a CopyOptions,
    sent: &'a AtomicU64,
    progress: Progress<'a>,
}

/// A file whose blocks are all written, on its way to verification.
struct Written {
    entry_index: usize,
    entry: SourceEntry,
    partial: PartialFile,
    source: File,
    report: FileReport,
    /// Blocks the block verifier found bad (block and riva modes).
    failed_blocks: Vec<u64>,
    /// Riva: the device readers and their counts.
    riva: Option<RivaFile>,
}

/// A written block for the verifier.
struct BlockJob {
    entry: usize,
    file: Arc<File>,
    reader: Option<Arc<Mutex<DeviceReader>>>,
    index: u64,
    offset: u64,
    len: usize,
    digest: Digest,
}

/// What a stream's block verifier did for one file.
#[derive(Default)]
struct BlocksVerified {
    failed: Vec<u64>,
    device: DeviceStats,
    checksum: Duration,
}

/// Work for a stream's verifier thread.
enum Job {
    /// Block and riva modes: re-read this block of this file (riva: from
    /// the device, by its reader) and compare.
    Block(BlockJob),
    /// Block mode: report what was found for this entry's blocks.
    Barrier(usize, mpsc::Sender<BlocksVerified>),
    /// File mode: verify, repair and commit this file.
    File(Box<Written>),
}

/// One transfer stream and, for the pipelined modes, its verifier thread.
struct Stream<'a, 'ctx> {
    ctx: &'a Ctx<'ctx>,
    buf: AlignedBuf,
    /// Riva: the source's device-level read, for the digest.
    dev: Option<AlignedBuf>,
    wire: Option<AlignedBuf>,
    jobs: Option<mpsc::SyncSender<Job>>,
    done: Option<mpsc::Receiver<(usize, FileReport)>>,
    group: CommitGroup,
}

impl<'a, 'ctx> Stream<'a, 'ctx> {
    fn new<'scope>(ctx: &'a Ctx<'ctx>, s: &'scope std::thread::Scope<'scope, '_>) -> Self
    where
        'a: 'scope,
    {
        let mode = ctx.opts.verify;
        let (jobs, done) = if matches!(
            mode,
            VerifyMode::File | VerifyMode::Block | VerifyMode::Riva
        ) {
            // Bounded: the transfer runs at most a little ahead of verification.
            let depth = match mode {
                VerifyMode::File => 1,
                VerifyMode::Block => 8,
                // Room for batches of small files (jobs hold no data).
                _ => 64,
            };
            let (tx, rx) = mpsc::sync_channel::<Job>(depth);
            let (dtx, drx) = mpsc::channel();
            s.spawn(move || verifier(ctx, rx, dtx));
            (Some(tx), Some(drx))
        } else {
            (None, None)
        };
        Stream {
            ctx,
            buf: AlignedBuf::new(ctx.opts.block_size),
            dev: (mode == VerifyMode::Riva).then(|| AlignedBuf::new(ctx.opts.block_size)),
            wire: ctx
                .opts
                .link_fault()
                .map(|_| AlignedBuf::new(ctx.opts.block_size)),
            jobs,
            done,
            group: CommitGroup::default(),
        }
    }

    /// Transfers entry `i`; returns the reports that are final now (the
    /// verifier and the commit group hand over the others later).
    fn file(&mut self, i: usize, e: &SourceEntry) -> Vec<(usize, FileReport)> {
        let started = Instant::now();
        match self.transfer(i, e, started) {
            // File and riva modes finish on the verifier thread, so the
            // next file transfers meanwhile.
            Ok(w) if matches!(self.ctx.opts.verify, VerifyMode::File | VerifyMode::Riva) => {
                let jobs = self.jobs.as_ref().expect("these modes have a verifier");
                jobs.send(Job::File(Box::new(w))).expect("verifier alive");
                Vec::new()
            }
            Ok(w) => {
                let finished = finish_file(self.ctx, w, &mut self.buf);
                self.group.add(self.ctx.dest, finished)
            }
            Err((mut report, err)) => {
                report.error = Some(err.to_string());
                report.level = None;
                vec![(i, report)]
            }
        }
    }

    /// Commits what is still waiting and collects the verifier's reports.
    fn finish(mut self) -> Vec<(usize, FileReport)> {
        let mut reports = self.group.commit(self.ctx.dest);
        drop(self.jobs);
        if let Some(rx) = self.done {
            reports.extend(rx);
        }
        reports
    }

    /// Reads, checks, sends and writes every block of `e`.
    #[allow(clippy::result_large_err)]
    fn transfer(
        &mut self,
        i: usize,
        e: &SourceEntry,
        started: Instant,
    ) -> Result<Written, (FileReport, TransferError)> {
        let ctx = self.ctx;
        let opts = ctx.opts;
        let mode = opts.verify;
        let mut report = simple_report(e, opts.verify, None);
        let fail = |report: &FileReport, err: TransferError| (report.clone(), err);
        let path = e.rel.to_string();
        let dest_err = |err| TransferError::Destination {
            path: path.clone(),
            source: err,
        };
        let source = File::open(&e.abs).map_err(|err| {
            fail(
                &report,
                TransferError::Source {
                    path: e.abs.clone(),
                    source: err,
                },
            )
        })?;
        check_unchanged(&source, e).map_err(|err| fail(&report, err))?;
        let partial = ctx
            .dest
            .partial(&e.rel, e.size)
            .map_err(|err| fail(&report, err))?;
        let shared = match mode {
            VerifyMode::Block | VerifyMode::Riva => Some(Arc::new(
                partial
                    .file()
                    .try_clone()
                    .map_err(|err| fail(&report, dest_err(err)))?,
            )),
            _ => None,
        };
        let mut riva = match mode {
            VerifyMode::Riva => {
                let r = RivaFile::open(&source, partial.file(), e, opts)
                    .map_err(|err| fail(&report, err))?;
                report.read_path = Some(r.dest.lock().expect("no panics hold it").path());
                Some(r)
            }
            _ => None,
        };
        let bs = opts.block_size;
        let blocks = e.size.div_ceil(bs as u64);
        report.blocks = blocks;
        let mut whole = (mode != VerifyMode::None).then(|| Hasher::new(defaults::FILE_ALGORITHM));
        let mut checksum = Duration::ZERO;
        let stage = Instant::now();
        let mut waited = Duration::ZERO;
        for index in 0..blocks {
            let offset = index * bs as u64;
            let len = (e.size - offset).min(bs as u64) as usize;
            let mut attempts = 0;
            loop {
                // The transfer read. Riva wants a device-level digest: from
                // the transfer read itself when it reached the device (none
                // of its pages was cached, or a resend read it after
                // eviction, in case the cache is what held wrong bytes),
                // else from a second read after eviction.
                let mut second = false;
                match riva.as_mut() {
                    Some(r) if attempts > 0 => r.read_source(&source, offset, len, &mut self.buf),
                    Some(r) => r
                        .read_source_if_cold(&source, offset, len, &mut self.buf)
                        .and_then(|cold| {
                            second = !cold;
                            match cold {
                                true => Ok(()),
                                false => source.read_exact_at(&mut self.buf[..len], offset),
                            }
                        }),
                    None => source.read_exact_at(&mut self.buf[..len], offset),
                }
                .map_err(|err| fail(&report, source_read_error(e, err)))?;
                let data = &self.buf[..len];
                report.bytes_sent += len as u64;
                ctx.sent.fetch_add(len as u64, Ordering::Relaxed);
                (ctx.progress)(ctx.sent.load(Ordering::Relaxed));
                let t = Instant::now();
                let digest = match (&mut riva, &mut self.dev) {
                    (Some(r), Some(dev)) if second => {
                        r.read_source(&source, offset, len, dev)
                            .map_err(|err| fail(&report, source_read_error(e, err)))?;
                        Some(hash(defaults::BLOCK_ALGORITHM, &dev[..len]))
                    }
                    _ => (mode != VerifyMode::None).then(|| hash(defaults::BLOCK_ALGORITHM, data)),
                };
                checksum += t.elapsed();
                // The link: what the receiver gets may differ from what was sent.
                let received: &[u8] = match (opts.link_fault(), &mut self.wire) {
                    (Some(fault), Some(wire)) => {
                        wire[..len].copy_from_slice(data);
                        fault(&path, index, &mut wire[..len]);
                        &wire[..len]
                    }
                    _ => data,
                };
                let t = Instant::now();
                let ok = match (mode, &digest) {
                    (VerifyMode::Fiver | VerifyMode::Riva, Some(d)) => {
                        hash(defaults::BLOCK_ALGORITHM, received).ct_eq(d)
                    }
                    _ => true,
                };
                checksum += t.elapsed();
                if ok {
                    partial
                        .file()
                        .write_all_at(received, offset)
                        .map_err(|err| fail(&report, dest_err(err)))?;
                    if let Some(hook) = opts.after_write() {
                        hook(partial.file(), &path, index, offset, len);
                    }
                    if let Some(w) = whole.as_mut() {
                        let t = Instant::now();
                        w.update(&self.buf[..len]);
                        checksum += t.elapsed();
                    }
                    if let (Some(file), Some(jobs), Some(d)) = (&shared, &self.jobs, digest) {
                        let job = Job::Block(BlockJob {
                            entry: i,
                            file: Arc::clone(file),
                            reader: riva.as_ref().map(|r| Arc::clone(&r.dest)),
                            index,
                            offset,
                            len,
                            digest: d,
                        });
                        let t = Instant::now();
                        jobs.send(job).expect("verifier alive");
                        waited += t.elapsed();
                    }
                    break;
                }
                attempts += 1;
                report.blocks_resent += 1;
                if attempts > opts.retries {
                    let err = TransferError::BlockRetries {
                        path: path.clone(),
                        index,
                        attempts,
                    };
                    return Err(fail(&report, err));
                }
            }
        }
        report.transfer_stage_seconds = stage.elapsed().saturating_sub(waited).as_secs_f64();
        let mut failed_blocks = Vec::new();
        if let (VerifyMode::Block, Some(jobs)) = (mode, &self.jobs) {
            let (tx, rx) = mpsc::channel();
            jobs.send(Job::Barrier(i, tx)).expect("verifier alive");
            let verified = rx.recv().expect("verifier answers");
            failed_blocks = verified.failed;
            report.checksum_seconds += verified.checksum.as_secs_f64();
        }
        report.digest = whole.map(|w| w.finalize().to_hex());
        report.transfer_seconds = (started.elapsed() - checksum).as_secs_f64();
        report.checksum_seconds += checksum.as_secs_f64();
        Ok(Written {
            entry_index: i,
            entry: e.clone(),
            partial,
            source,
            report,
            failed_blocks,
            riva,
        })
    }
}

/// A riva file's device readers and what their reads did.
struct RivaFile {
    src: DeviceReader,
    dest: Arc<Mutex<DeviceReader>>,
    src_stats: DeviceStats,
    dest_stats: DeviceStats,
}

impl RivaFile {
    /// Readers of both ends; with `--require-level device`, a file whose
    /// source or destination has no device fails here, before any transfer.
    fn open(
        source: &File,
        dest: &File,
        e: &SourceEntry,
        opts: &CopyOptions,
    ) -> Result<RivaFile, TransferError> {
        let src =
            DeviceReader::new(source, opts.read_path).map_err(|err| TransferError::Source {
                path: e.abs.clone(),
                source: err.into(),
            })?;
        let dst =
            DeviceReader::new(dest, opts.read_path).map_err(|err| TransferError::Destination {
                path: e.rel.to_string(),
                source: err.into(),
            })?;
        if opts.require_level == Some(VerifyLevel::Device) {
            for (end, b) in [("source", src.backing()), ("destination", dst.backing())] {
                if let Some(why) = b.no_device_reason() {
                    return Err(TransferError::Verification {
                        path: e.rel.to_string(),
                        what: format!("--require-level device: the {end} is on {why}"),
                    });
                }
            }
        }
        Ok(RivaFile {
            src,
            dest: Arc::new(Mutex::new(dst)),
            src_stats: DeviceStats::default(),
            dest_stats: DeviceStats::default(),
        })
    }

    /// A device-level read of the source.
    fn read_source(
        &mut self,
        source: &File,
        offset: u64,
        len: usize,
        buf: &mut [u8],
    ) -> std::io::Result<()> {
        let out = self.src.read(source, offset, len, buf)?;
        self.src_stats.add(&out);
        Ok(())
    }

    /// The transfer read of a riva block if it reaches the device (none of
    /// its pages cached); false, having read nothing, if not.
    fn read_source_if_cold(
        &mut self,
        source: &File,
        offset: u64,
        len: usize,
        buf: &mut [u8],
    ) -> std::io::Result<bool> {
        match self.src.read_if_cold(source, offset, len, buf)? {
            Some(out) => {
                self.src_stats.add(&out);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// A device-level read of the destination.
    fn read_dest(
        &mut self,
        dest: &File,
        offset: u64,
        len: usize,
        buf: &mut [u8],
    ) -> std::io::Result<()> {
        let out = self
            .dest
            .lock()
            .expect("no panics hold it")
            .read(dest, offset, len, buf)?;
        self.dest_stats.add(&out);
        Ok(())
    }

    /// The level both ends' reads support, and why it is below `device`.
    fn level(&self) -> (VerifyLevel, Option<String>) {
        let dest = self.dest.lock().expect("no panics hold it").backing();
        let mut reached = Reached::aim(VerifyMode::Riva);
        self.src_stats
            .lower(&mut reached, "source", self.src.backing());
        self.dest_stats.lower(&mut reached, "destination", dest);
        (reached.level, reached.note)
    }

    fn resident(&self) -> u64 {
        self.src_stats.resident + self.dest_stats.resident
    }

    fn evict_seconds(&self) -> f64 {
        (self.src_stats.evict + self.dest_stats.evict).as_secs_f64()
    }
}

pub(crate) fn source_read_error(e: &SourceEntry, err: std::io::Error) -> TransferError {
    if err.kind() == std::io::ErrorKind::UnexpectedEof {
        TransferError::SourceChanged {
            path: e.abs.clone(),
            what: "it shrank",
        }
    } else {
        TransferError::Source {
            path: e.abs.clone(),
            source: err,
        }
    }
}

pub(crate) fn check_unchanged(source: &File, e: &SourceEntry) -> Result<(), TransferError> {
    let m = source.metadata().map_err(|err| TransferError::Source {
        path: e.abs.clone(),
        source: err,
    })?;
    if m.len() != e.size {
        return Err(TransferError::SourceChanged {
            path: e.abs.clone(),
            what: "its size changed",
        });
    }
    if m.mtime() != e.mtime.sec || m.mtime_nsec() as u32 != e.mtime.nsec {
        return Err(TransferError::SourceChanged {
            path: e.abs.clone(),
            what: "it was modified",
        });
    }
    Ok(())
}

/// The verifier thread of a stream (file, block and riva modes). Blocks
/// queued together are re-read as one batch ([`crate::recheck`]); what
/// they show is kept per file until its Barrier (block mode) or its File
/// job (riva), which come after all of that file's blocks.
fn verifier(ctx: &Ctx<'_>, jobs: mpsc::Receiver<Job>, done: mpsc::Sender<(usize, FileReport)>) {
    let mut buf = AlignedBuf::new(ctx.opts.block_size);
    let mut seen: HashMap<usize, BlocksVerified> = HashMap::new();
    let mut group = CommitGroup::default();
    let mut next: Option<Job> = None;
    loop {
        let job = match next.take() {
            Some(j) => j,
            None => match jobs.recv() {
                Ok(j) => j,
                Err(_) => break,
            },
        };
        match job {
            Job::Block(first) => {
                let mut bytes = first.len;
                let mut batch = vec![first];
                while bytes < BATCH_BYTES {
                    match jobs.try_recv() {
                        Ok(Job::Block(b)) => {
                            bytes += b.len;
                            batch.push(b);
                        }
                        Ok(other) => {
                            next = Some(other);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                let items: Vec<Recheck<'_>> = batch
                    .iter()
                    .map(|b| Recheck {
                        file: &b.file,
                        reader: b.reader.as_deref(),
                        offset: b.offset,
                        len: b.len,
                        digest: &b.digest,
                    })
                    .collect();
                let results = recheck_batch(&items, &mut buf);
                for (b, r) in batch.iter().zip(results) {
                    let s = seen.entry(b.entry).or_default();
                    if b.reader.is_some() {
                        s.device.add(&r.outcome);
                    }
                    s.checksum += r.took;
                    if !matches!(r.ok, Ok(true)) {
                        s.failed.push(b.index);
                    }
                }
            }
            Job::Barrier(entry, reply) => {
                let _ = reply.send(seen.remove(&entry).unwrap_or_default());
            }
            Job::File(mut w) => {
                if let Some(v) = seen.remove(&w.entry_index) {
                    w.failed_blocks = v.failed;
                    w.report.checksum_seconds += v.checksum.as_secs_f64();
                    w.report.verify_stage_seconds = v.checksum.as_secs_f64();
                    if let Some(r) = w.riva.as_mut() {
                        r.dest_stats.merge(&v.device);
                    }
                }
                for r in group.add(ctx.dest, finish_file(ctx, *w, &mut buf)) {
                    let _ = done.send(r);
                }
            }
        }
    }
    for r in group.commit(ctx.dest) {
        let _ = done.send(r);
    }
}

/// A verified file waiting for its group commit: (entry index, report,
/// partial file, mode bits, mtime).
type Ready = (usize, FileReport, PartialFile, u32, crate::dest::Mtime);

/// Verifies a written file as its mode says and repairs bad blocks by
/// resending them. Returns it ready to commit, or its failed report.
#[allow(clippy::result_large_err)]
fn finish_file(
    ctx: &Ctx<'_>,
    mut w: Written,
    buf: &mut AlignedBuf,
) -> Result<Ready, (usize, FileReport)> {
    let mode = ctx.opts.verify;
    let started = Instant::now();
    let result = (|| -> Result<(), TransferError> {
        let bad = match mode {
            VerifyMode::Sequential | VerifyMode::File => reverify_file(ctx, &w, buf)?,
            VerifyMode::Block | VerifyMode::Riva => std::mem::take(&mut w.failed_blocks),
            VerifyMode::None | VerifyMode::Fiver => Vec::new(),
        };
        for index in bad {
            resend_block(ctx, &mut w, index, buf)?;
        }
        check_unchanged(&w.source, &w.entry)?;
        if let Some(r) = &w.riva {
            let (level, note) = r.level();
            w.report.level = Some(level);
            w.report.note = note;
            w.report.pages_resident = r.resident();
            w.report.evict_seconds = r.evict_seconds();
        }
        require_level(ctx.opts.require_level, w.report.level, &w.report.path)
    })();
    w.report.checksum_seconds += started.elapsed().as_secs_f64();
    match result {
        Ok(()) => Ok((
            w.entry_index,
            w.report,
            w.partial,
            w.entry.mode,
            w.entry.mtime,
        )),
        Err(e) => {
            let mut report = w.report;
            report.error = Some(e.to_string());
            report.level = None;
            Err((w.entry_index, report))
        }
    }
}

/// Fails a file whose verification stopped below the level asked for.
pub(crate) fn require_level(
    required: Option<VerifyLevel>,
    reached: Option<VerifyLevel>,
    path: &str,
) -> Result<(), TransferError> {
    match (required, reached) {
        (Some(want), got) if got.unwrap_or(VerifyLevel::None) < want => {
            Err(TransferError::Verification {
                path: path.to_string(),
                what: format!(
                    "reached level {}, but --require-level {want} was asked for",
                    got.unwrap_or(VerifyLevel::None)
                ),
            })
        }
        _ => Ok(()),
    }
}

/// Files committed together at most (one syncfs, one fsync per directory).
const GROUP_COMMIT_FILES: usize = 256;

/// Verified files waiting to be committed as a group, so that many small
/// files share their fsyncs; a file's report says verified only after its
/// data, name and directory are durable.
#[derive(Default)]
struct CommitGroup {
    ready: Vec<Ready>,
}

impl CommitGroup {
    /// Adds a finished file; commits the group when it is full. Returns the
    /// reports that are final now.
    fn add(
        &mut self,
        dest: &Destination,
        finished: Result<Ready, (usize, FileReport)>,
    ) -> Vec<(usize, FileReport)> {
        match finished {
            Err(failed) => vec![failed],
            Ok(r) => {
                self.ready.push(r);
                if self.ready.len() >= GROUP_COMMIT_FILES {
                    self.commit(dest)
                } else {
                    Vec::new()
                }
            }
        }
    }

    /// Commits everything waiting; returns their reports.
    fn commit(&mut self, dest: &Destination) -> Vec<(usize, FileReport)> {
        let mut reports = Vec::with_capacity(self.ready.len());
        let mut batch = Vec::with_capacity(self.ready.len());
        for (i, report, partial, mode, mtime) in self.ready.drain(..) {
            reports.push((i, report));
            batch.push((partial, mode, mtime));
        }
        for ((_, report), result) in reports.iter_mut().zip(dest.commit_batch(batch)) {
            if let Err(e) = result {
                report.error = Some(e.to_string());
                report.level = None;
            }
        }
        reports
    }
}

/// Sequential and file modes: re-reads both copies block by block and
/// returns the blocks whose digests differ.
fn reverify_file(
    ctx: &Ctx<'_>,
    w: &Written,
    buf: &mut AlignedBuf,
) -> Result<Vec<u64>, TransferError> {
    let bs = ctx.opts.block_size as u64;
    let size = w.entry.size;
    let mut bad = Vec::new();
    for index in 0..size.div_ceil(bs) {
        let offset = index * bs;
        let len = (size - offset).min(bs) as usize;
        w.source
            .read_exact_at(&mut buf[..len], offset)
            .map_err(|e| source_read_error(&w.entry, e))?;
        let at_source = hash(defaults::BLOCK_ALGORITHM, &buf[..len]);
        w.partial
            .file()
            .read_exact_at(&mut buf[..len], offset)
            .map_err(|e| TransferError::Destination {
                path: w.report.path.clone(),
                source: e,
            })?;
        if !hash(defaults::BLOCK_ALGORITHM, &buf[..len]).ct_eq(&at_source) {
            bad.push(index);
        }
    }
    Ok(bad)
}

/// Sends block `index` again and checks it by re-reading it, up to the
/// retry limit.
fn resend_block(
    ctx: &Ctx<'_>,
    w: &mut Written,
    index: u64,
    buf: &mut AlignedBuf,
) -> Result<(), TransferError> {
    let bs = ctx.opts.block_size as u64;
    let offset = index * bs;
    let len = (w.entry.size - offset).min(bs) as usize;
    let path = w.report.path.clone();
    let dest_err = |e| TransferError::Destination {
        path: path.clone(),
        source: e,
    };
    for _ in 0..ctx.opts.retries {
        w.report.blocks_resent += 1;
        match w.riva.as_mut() {
            Some(r) => r.read_source(&w.source, offset, len, buf),
            None => w.source.read_exact_at(&mut buf[..len], offset),
        }
        .map_err(|e| source_read_error(&w.entry, e))?;
        ctx.sent.fetch_add(len as u64, Ordering::Relaxed);
        let want = hash(defaults::BLOCK_ALGORITHM, &buf[..len]);
        if let Some(fault) = ctx.opts.link_fault() {
            fault(&path, index, &mut buf[..len]);
        }
        let file = w.partial.file();
        file.write_all_at(&buf[..len], offset).map_err(dest_err)?;
        if let Some(hook) = ctx.opts.after_write() {
            hook(file, &path, index, offset, len);
        }
        match w.riva.as_mut() {
            Some(r) => r.read_dest(file, offset, len, buf),
            None => file.read_exact_at(&mut buf[..len], offset),
        }
        .map_err(dest_err)?;
        if hash(defaults::BLOCK_ALGORITHM, &buf[..len]).ct_eq(&want) {
            return Ok(());
        }
    }
    Err(TransferError::BlockRetries {
        path,
        index,
        attempts: ctx.opts.retries,
    })
}
