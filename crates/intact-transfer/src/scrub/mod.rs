//! `intact scrub`: every cataloged file re-read from the device and held
//! against the checksums its arrival left in the catalog (see
//! `journal/catalog.rs`), so that rot at rest is found, and named by file
//! and byte range, while a replica still has the good bytes.
//!
//! A file's reads go through [`DeviceReader`] (evict-then-read with a
//! residency count, or a proven `O_DIRECT` read): the level a scrub
//! reports for a file is `device` only if every one of its reads came from
//! the device, else `cache` (tmpfs, or a page that would not leave).

use std::collections::BTreeSet;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use intact_cache::{DeviceReader, ReadOutcome, ReadPath};
use intact_digest::{defaults, hash, hash_with_page_crcs, AlignedBuf};
use intact_proto::WirePath;
use serde::Serialize;

use crate::journal::{BlockRecord, CatalogFile, Journal, ScrubMark, ScrubState};
use crate::Replica;
use read::{groups, open_ahead, Ahead, Opened};

mod read;
mod repair;
use crate::verify::VerifyLevel;
use crate::{Destination, TransferError};
pub use repair::Repair;

/// How a scrub runs.
#[derive(Debug, Clone, Default)]
pub struct ScrubOptions {
    /// Only files last scrubbed before this many seconds ago (never
    /// scrubbed counts as due).
    pub older_than: Option<Duration>,
    /// At most this many bytes read per second.
    pub rate: Option<u64>,
    /// Start a new pass even if the last one was interrupted.
    pub restart: bool,
    /// Read with `O_DIRECT` (proven by residency counts) instead of
    /// evict-then-read.
    pub direct: bool,
    /// Stop (between files, the pass left open to go on) once this is set.
    pub stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// Called after each block is read (tests; only in a build with the
    /// `fault-hooks` feature, never in the `intact` binary).
    #[cfg(feature = "fault-hooks")]
    pub after_read: Option<crate::ScrubReadHook>,
}

impl ScrubOptions {
    /// Whether a stop was asked for.
    fn stopped(&self) -> bool {
        self.stop
            .as_ref()
            .is_some_and(|s| s.load(std::sync::atomic::Ordering::SeqCst))
    }
}

/// A byte range of a file that no longer matches the catalog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RotRange {
    /// First byte.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Which checksums failed over it (`crc32c` per page,
    /// `xxh3-128` per block, `blake3` for the whole file).
    pub failed: Vec<&'static str>,
}

/// What the scrub found of one file.
#[derive(Debug, Clone, Serialize)]
pub struct FileScrub {
    /// Path under the root.
    pub path: String,
    /// The verdict.
    pub state: &'static str,
    /// The level of this scrub's reads of it (none: nothing was read).
    pub level: VerifyLevel,
    /// Bytes read.
    pub bytes: u64,
    /// The ranges found rotten.
    pub rot: Vec<RotRange>,
    /// Why it was missing, changed or unreadable, or what limited the
    /// check (e.g. blocks without page checksums).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// How it was verified at arrival.
    pub arrival_level: VerifyLevel,
    /// What a repair from a replica did (only with one, only of rot).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repair: Option<Repair>,
    /// Where its sender said it came from (`host:/path`; a claim, kept
    /// as received), where the catalog names it: a replica to repair from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// A whole scrub's report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ScrubReport {
    /// Where the catalog was.
    pub catalog: String,
    /// The scrub went on from an interrupted pass (after this many files
    /// of it were done).
    pub resumed: bool,
    /// Files read.
    pub files: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Files per verdict.
    pub clean: u64,
    /// Files with rot (not repaired).
    pub rotten: u64,
    /// Files with rot repaired from the replica in this run (re-read and
    /// found clean after the repair).
    pub repaired: u64,
    /// Bytes written by those repairs.
    pub repaired_bytes: u64,
    /// Bytes fetched from the replica.
    pub fetched_bytes: u64,
    /// The replica repairs came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// The scrub was stopped before its pass ended (it goes on next time).
    pub stopped: bool,
    /// Files a transfer replaced while they were scrubbed: not judged.
    pub replaced: u64,
    /// Files changed by another program (not rot).
    pub changed: u64,
    /// Files missing.
    pub missing: u64,
    /// Files that could not be read.
    pub unreadable: u64,
    /// Files whose every read came from the device.
    pub at_device: u64,
    /// Files read (some part) through the page cache only.
    pub below_device: u64,
    /// Every file other than the clean ones, and every clean one too when
    /// the caller asked for all.
    pub reports: Vec<FileScrub>,
    /// Seconds taken.
    pub seconds: f64,
}

impl ScrubReport {
    /// Whether anything is wrong (rot, missing, unreadable). A changed file
    /// is reported, not counted as damage.
    pub fn damaged(&self) -> bool {
        self.rotten + self.missing + self.unreadable > 0
    }
}

/// Progress of a scrub, for a progress bar.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScrubProgress {
    /// Files done in this run.
    pub files: u64,
    /// Files due in this run.
    pub files_total: u64,
    /// Bytes read in this run.
    pub bytes: u64,
    /// Bytes due in this run.
    pub bytes_total: u64,
}

/// The catalog of `root`: a server's (`root/.intact`), else the one
/// `intact copy` keeps for copies into `root`. Nothing is created.
pub fn open_catalog(root: &Path) -> Result<(Journal, PathBuf), TransferError> {
    let served = root.join(crate::journal::STATE_DIR);
    let (journal, dir) = if served.join("journal.sqlite").is_file() {
        (Journal::open(root)?, served)
    } else if let Some(dir) = crate::copy::existing_copy_state(root) {
        (Journal::open_in(&dir)?, dir)
    } else {
        return Err(TransferError::Usage(format!(
            "{}: no catalog there: nothing was received into it by `intact serve`, `intact copy` or `intact mount`",
            root.display()
        )));
    };
    // What a mount that did not end cleanly left in its intent log.
    crate::journal::recover_intents(&journal, &dir, root)?;
    Ok((journal, dir))
}

/// [`open_catalog`], refused at once (instead of after SQLite's wait) when
/// another process holds the root: a running `intact serve`, `copy` or
/// `mount` keeps the catalog to itself.
pub fn open_catalog_if_free(root: &Path) -> Result<(Journal, PathBuf), TransferError> {
    let served = root.join(crate::journal::STATE_DIR);
    let dir = if served.join("journal.sqlite").is_file() {
        Some(served)
    } else {
        crate::copy::existing_copy_state(root)
    };
    if let Some(pid) = dir.as_deref().and_then(crate::net::lock_holder) {
        return Err(TransferError::InUse {
            root: root.to_path_buf(),
            pid,
        });
    }
    open_catalog(root)
}

/// The nearest directory at or above `path` that has a catalog (see
/// [`open_catalog`]).
pub fn catalog_root_of(path: &Path) -> Option<PathBuf> {
    // The parent is resolved, not a symlink at the name itself.
    let real = match (path.parent(), path.file_name()) {
        (Some(p), Some(name)) if !p.as_os_str().is_empty() => {
            std::fs::canonicalize(p).ok()?.join(name)
        }
        (_, Some(name)) => std::env::current_dir().ok()?.join(name),
        _ => std::fs::canonicalize(path).ok()?,
    };
    real.ancestors()
        .find(|d| {
            d.join(crate::journal::STATE_DIR)
                .join("journal.sqlite")
                .is_file()
                || crate::copy::existing_copy_state(d).is_some()
        })
        .map(Path::to_path_buf)
}

/// The catalog of `root` as [`open_catalog`] finds it, else a new one
/// in `root/.intact` (as a server keeps).
pub fn open_or_create_catalog(root: &Path) -> Result<(Journal, PathBuf), TransferError> {
    match open_catalog(root) {
        Err(TransferError::Usage(_)) => {
            let dir = root.join(crate::journal::STATE_DIR);
            Ok((Journal::open(root)?, dir))
        }
        other => other,
    }
}

/// Files between commits of scrub marks.
const MARK_BATCH: u64 = 256;

/// Scrubs every cataloged file of `root` that is due; `progress` is
/// called after each file. `keep_clean` keeps clean files' reports too.
pub fn scrub(
    root: &Path,
    opts: &ScrubOptions,
    replica: Option<&mut Replica>,
    keep_clean: bool,
    progress: &mut dyn FnMut(ScrubProgress),
) -> Result<ScrubReport, TransferError> {
    let (journal, dir) = open_catalog_if_free(root)?;
    let dest = Destination::open(root)?;
    let name = dir.join("journal.sqlite").display().to_string();
    scrub_catalog(&dest, &journal, name, opts, replica, keep_clean, progress)
}

/// Scrubs the files `journal` catalogs under `dest` (a server's own
/// journal and destination, shared with its sessions; `catalog` names it
/// in the report).
pub fn scrub_catalog(
    dest: &Destination,
    journal: &Journal,
    catalog: String,
    opts: &ScrubOptions,
    mut replica: Option<&mut Replica>,
    keep_clean: bool,
    progress: &mut dyn FnMut(ScrubProgress),
) -> Result<ScrubReport, TransferError> {
    let t0 = Instant::now();
    let mut report = ScrubReport {
        catalog,
        replica: replica.as_ref().map(|r| r.name().to_string()),
        ..ScrubReport::default()
    };
    let selection = opts.older_than.map_or(-1, |d| d.as_secs() as i64);
    let pass = match journal.open_scrub_pass(selection)? {
        Some(p) if !opts.restart => {
            report.resumed = p.last_file > 0;
            p
        }
        _ => journal.begin_scrub_pass(selection)?,
    };
    let before = match opts.older_than {
        Some(d) => crate::journal::unix_now().saturating_sub(d.as_secs() as i64),
        None => i64::MAX,
    };
    let (files_total, bytes_total) = journal.catalog_due(pass.last_file, before)?;
    let mut p = ScrubProgress {
        files_total,
        bytes_total,
        ..ScrubProgress::default()
    };
    let throttle = Throttle::new(opts.rate);
    let threads = if replica.is_some() {
        1
    } else {
        scrub_threads()
    };
    // One buffer per thread for the whole pass.
    let mut bufs: Vec<AlignedBuf> = (0..threads).map(|_| AlignedBuf::new(0)).collect();
    let mut after = pass.last_file;
    let mut flushed = Instant::now();
    let stopped = || opts.stopped();
    'pass: loop {
        let batch = journal.catalog_after(after, before, 512)?;
        if batch.is_empty() {
            break;
        }
        for chunk in chunks(&batch, threads) {
            if stopped() {
                report.stopped = true;
                break 'pass;
            }
            // Repairs are made one file at a time (one replica connection);
            // a scrub alone reads several files at once.
            let verdicts = if threads > 1 {
                scrub_parallel(dest, journal, chunk, opts, &throttle, &mut bufs)
            } else {
                chunk
                    .iter()
                    .map(|cf| {
                        (!stopped()).then(|| {
                            scrub_file(
                                dest,
                                journal,
                                cf,
                                opts,
                                replica.as_deref_mut(),
                                &mut bufs[0],
                                &throttle,
                                None,
                            )
                        })
                    })
                    .collect()
            };
            for (cf, fs) in chunk.iter().zip(verdicts) {
                // A stop leaves the files not begun for the next pass.
                let Some(fs) = fs else {
                    report.stopped = true;
                    break 'pass;
                };
                after = cf.id;
                let fs = fs?;
                let state = state_of(&fs);
                let rot_bytes = fs.rot.iter().map(|r| r.len).sum();
                let mark = ScrubMark {
                    state,
                    level: fs.level,
                    rot_bytes,
                };
                if !journal.mark_scrubbed(cf, mark, pass.id)? {
                    // A transfer replaced it while it was read: no verdict.
                    report.replaced += 1;
                    continue;
                }
                if let (ScrubState::Repaired, Some(r)) = (state, &fs.repair) {
                    journal.record_repair(&cf.path, r.bytes, &r.from)?;
                }
                p.files += 1;
                p.bytes += fs.bytes;
                // Committed often enough that a killed scrub reads again at
                // most a second's or MARK_BATCH files' worth.
                if p.files.is_multiple_of(MARK_BATCH) || flushed.elapsed() >= Duration::from_secs(1)
                {
                    journal.flush()?;
                    flushed = Instant::now();
                }
                report.files += 1;
                report.bytes += fs.bytes;
                match state {
                    ScrubState::Clean => report.clean += 1,
                    ScrubState::Rot => report.rotten += 1,
                    ScrubState::Repaired => {
                        report.repaired += 1;
                        report.repaired_bytes += fs.repair.as_ref().map_or(0, |r| r.bytes);
                    }
                    ScrubState::Changed => report.changed += 1,
                    ScrubState::Missing => report.missing += 1,
                    ScrubState::Unreadable | ScrubState::Never => report.unreadable += 1,
                }
                if matches!(
                    state,
                    ScrubState::Clean | ScrubState::Rot | ScrubState::Repaired
                ) {
                    if fs.level == VerifyLevel::Device {
                        report.at_device += 1;
                    } else {
                        report.below_device += 1;
                    }
                }
                if state != ScrubState::Clean || keep_clean {
                    report.reports.push(fs);
                }
                progress(p);
            }
        }
    }
    if report.stopped {
        journal.flush()?;
    } else {
        journal.finish_scrub_pass(pass.id)?;
    }
    report.fetched_bytes = replica.map_or(0, |r| r.fetched());
    report.seconds = t0.elapsed().as_secs_f64();
    Ok(report)
}

fn state_of(fs: &FileScrub) -> ScrubState {
    match fs.state {
        "clean" => ScrubState::Clean,
        "rot" => ScrubState::Rot,
        "repaired" => ScrubState::Repaired,
        "changed" => ScrubState::Changed,
        "missing" => ScrubState::Missing,
        _ => ScrubState::Unreadable,
    }
}

/// Largest block size a catalog row may name (a larger one is a damaged row).
const MAX_BLOCK_SIZE: u32 = intact_proto::MAX_BLOCK as u32;

/// Scrubs one file; an error is the catalog's own (the file's problems
/// are its verdict).
#[allow(clippy::too_many_arguments)]
fn scrub_file(
    dest: &Destination,
    journal: &Journal,
    cf: &CatalogFile,
    opts: &ScrubOptions,
    replica: Option<&mut Replica>,
    buf: &mut AlignedBuf,
    throttle: &Throttle,
    ahead: Option<Ahead>,
) -> Result<FileScrub, TransferError> {
    let mut fs = FileScrub {
        path: String::from_utf8_lossy(&cf.path).into_owned(),
        state: ScrubState::Unreadable.name(),
        level: VerifyLevel::None,
        bytes: 0,
        rot: Vec::new(),
        note: None,
        arrival_level: cf.arrival.level,
        repair: None,
        source: cf
            .source
            .as_ref()
            .map(|s| String::from_utf8_lossy(s).into_owned()),
    };
    let verdict = |fs: &mut FileScrub, state: ScrubState, note: String| {
        fs.state = state.name();
        fs.note = Some(note);
    };
    let Ok(wire) = WirePath::parse(&cf.path) else {
        verdict(
            &mut fs,
            ScrubState::Missing,
            "its cataloged name is not a path".into(),
        );
        return Ok(fs);
    };
    if cf.block_size == 0 || cf.block_size > MAX_BLOCK_SIZE {
        let why = format!("its catalog row is damaged (block size {})", cf.block_size);
        verdict(&mut fs, ScrubState::Unreadable, why);
        return Ok(fs);
    }
    let (opened, reader) = match ahead {
        Some(a) => (Ok((a.file, a.st)), Some(a.reader)),
        None => (dest.open_final_stat(&wire), None),
    };
    let (file, st) = match opened {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let why = "not there as a regular file".into();
            verdict(&mut fs, ScrubState::Missing, why);
            return Ok(fs);
        }
        Err(e) => {
            // Out of descriptors, permission, I/O: nothing said of the file.
            verdict(
                &mut fs,
                ScrubState::Unreadable,
                format!("could not open it: {e}"),
            );
            return Ok(fs);
        }
    };
    let seen = Opened::from(&st);
    let (size, mtime) = (st.st_size as u64, (st.st_mtime, st.st_mtime_nsec as u32));
    if !cf.is_as_cataloged(size, mtime) {
        let mut what = Vec::new();
        if size != cf.size {
            what.push(format!("size {size} (cataloged {})", cf.size));
        }
        if mtime != cf.mtime {
            what.push("mtime".to_string());
        }
        verdict(
            &mut fs,
            ScrubState::Changed,
            format!(
                "{} differ from the catalog: changed by another program, not rot",
                what.join(" and ")
            ),
        );
        return Ok(fs);
    }
    let records = journal.blocks(cf.id)?;
    let checked = check_file(
        &records, cf, &file, seen, opts, reader, None, buf, throttle, &mut fs,
    );
    if fs.state == ScrubState::Changed.name() {
        fs.level = VerifyLevel::None;
        return Ok(fs);
    }
    if let (Ok(_), Some(replica)) = (&checked, replica) {
        if !fs.rot.is_empty() {
            let r = repair::repair(
                dest,
                &file,
                &wire,
                cf,
                &records,
                &fs,
                replica,
                opts.direct,
                buf,
                throttle,
            );
            if r.error.is_none() {
                // As far as the re-read after the repair reached.
                fs.level = fs.level.min(r.level);
            }
            fs.repair = Some(r);
        }
    }
    match checked {
        Ok(0) => {
            fs.state = if fs.rot.is_empty() {
                ScrubState::Clean.name()
            } else if fs.repair.as_ref().is_some_and(|r| r.error.is_none()) {
                ScrubState::Repaired.name()
            } else {
                ScrubState::Rot.name()
            };
        }
        Ok(unchecked) if fs.rot.is_empty() => {
            let why = format!(
                "{unchecked} of its bytes have no checksum in the catalog (no block record and no whole-file digest): not checked"
            );
            verdict(&mut fs, ScrubState::Unreadable, why);
        }
        Ok(_) if fs.repair.as_ref().is_some_and(|r| r.error.is_none()) => {
            fs.state = ScrubState::Repaired.name()
        }
        Ok(_) => fs.state = ScrubState::Rot.name(),
        Err(e) => verdict(&mut fs, ScrubState::Unreadable, e.to_string()),
    }
    Ok(fs)
}

/// Reads `file` block by block and holds every page, block and the whole
/// against the catalog (`records`, its blocks); fills `fs`'s level, bytes
/// and rot. `only`: just these blocks (a repair's re-read; the whole-file
/// digest is then not computed). Returns how many bytes no checksum
/// covered.
#[allow(clippy::too_many_arguments)]
fn check_file(
    records: &[BlockRecord],
    cf: &CatalogFile,
    file: &File,
    seen: Opened,
    opts: &ScrubOptions,
    reader: Option<DeviceReader>,
    only: Option<&BTreeSet<u64>>,
    buf: &mut AlignedBuf,
    throttle: &Throttle,
    fs: &mut FileScrub,
) -> Result<u64, TransferError> {
    let name = fs.path.clone();
    let io = |e: std::io::Error| TransferError::Destination {
        path: name.clone(),
        source: e,
    };
    let bs = u64::from(cf.block_size.max(1));
    let page = cf.page_size.max(1);
    let path = if opts.direct {
        ReadPath::Direct
    } else {
        ReadPath::Evict
    };
    let reader = match reader {
        Some(r) => r,
        None => DeviceReader::on(file, seen.dev, path, cf.is_one_block())
            .map_err(|e| io(std::io::Error::other(e.to_string())))?,
    };
    // The whole-file BLAKE3 is read only where block records leave bytes
    // without a checksum of their own (e.g. `none` rows): one hash per
    // byte is enough.
    let blocks = cf.size.div_ceil(bs);
    let covered = records.len() as u64 == blocks
        && records.iter().enumerate().all(|(i, r)| r.index == i as u64);
    // A check of some blocks only (after a repair) has no whole to hash.
    let mut whole = (!covered && only.is_none() && cf.digest.is_some()).then(blake3::Hasher::new);
    let mut all_device = cf.size > 0;
    let mut without_pages = 0u64;
    let mut malformed_pages = 0u64;
    let mut unrecorded = 0u64;
    let mut records = records.iter().peekable();
    let wanted: Vec<u64> = (0..blocks)
        .filter(|i| only.is_none_or(|o| o.contains(i)))
        .collect();
    let range = |index: u64| (index * bs, (cf.size - index * bs).min(bs) as usize);
    let mut check = |index: u64, offset: u64, data: &[u8], outcome: ReadOutcome| {
        let len = data.len();
        all_device &= outcome.device;
        #[cfg(feature = "fault-hooks")]
        if let Some(h) = &opts.after_read {
            (h.0)(&fs.path, index);
        }
        fs.bytes += len as u64;
        throttle.spend(len as u64);
        if let Some(w) = &mut whole {
            w.update(data);
        }
        while records.peek().is_some_and(|r| r.index < index) {
            records.next();
        }
        let Some(rec) = records.next_if(|r| r.index == index) else {
            unrecorded += len as u64;
            return;
        };
        // Both sums in one pass over the block where there are pages.
        let pages_fit = rec
            .pages
            .as_ref()
            .is_some_and(|p| p.len() == len.div_ceil(page) * 4);
        let (digest, now) = if pages_fit {
            let (d, now) = hash_with_page_crcs(defaults::BLOCK_ALGORITHM, data, page);
            (d, Some(now))
        } else {
            (hash(defaults::BLOCK_ALGORITHM, data), None)
        };
        let block_ok = digest.as_bytes() == rec.digest;
        match (&rec.pages, now) {
            (Some(pages), Some(now)) => {
                for (p, (a, b)) in pages.chunks(4).zip(now.chunks(4)).enumerate() {
                    if a != b {
                        let start = offset + (p * page) as u64;
                        let end = (start + page as u64).min(offset + len as u64);
                        let mut failed = vec!["crc32c"];
                        if !block_ok {
                            failed.push("xxh3-128");
                        }
                        add_range(&mut fs.rot, start, end - start, failed);
                    }
                }
                if !block_ok && now == *pages {
                    // The pages hold but the block does not: name the block.
                    add_range(&mut fs.rot, offset, len as u64, vec!["xxh3-128"]);
                }
            }
            (other, _) => {
                if other.is_some() {
                    malformed_pages += 1;
                } else {
                    without_pages += 1;
                }
                if !block_ok {
                    add_range(&mut fs.rot, offset, len as u64, vec!["xxh3-128"]);
                }
            }
        }
    };
    read::read_blocks(file, reader, &wanted, &range, buf, &mut check).map_err(io)?;
    if let (Some(d), Some(w)) = (cf.digest, whole) {
        if w.finalize() != blake3::Hash::from_bytes(d) && fs.rot.is_empty() {
            add_range(&mut fs.rot, 0, cf.size, vec!["blake3"]);
        }
    }
    if without_pages > 0 {
        fs.note = Some(format!(
            "{without_pages} block(s) have no page checksums in the catalog (received by an older build): checked per block"
        ));
    }
    if malformed_pages > 0 {
        fs.note = Some(format!(
            "{malformed_pages} block(s) have malformed page checksums in the catalog: checked per block"
        ));
    }
    if cf.digest.is_none() && blocks > 0 && fs.note.is_none() {
        fs.note = Some("no whole-file digest in the catalog (an older build's record)".into());
    }
    let after = file.metadata().ok();
    if after.as_ref().map(|m| (m.ctime(), m.ctime_nsec())) != Some(seen.ctime) {
        all_device = false;
        fs.note = Some("it changed while it was read: its reads count as cache only".into());
        let kept =
            after.is_some_and(|m| cf.is_as_cataloged(m.len(), (m.mtime(), m.mtime_nsec() as u32)));
        if !kept {
            // Another program wrote it meanwhile: what was read is not
            // rot, and nothing may be repaired into it.
            fs.state = ScrubState::Changed.name();
            fs.rot.clear();
            fs.note = Some(
                "its size or mtime changed while it was read: changed by another program, not rot"
                    .into(),
            );
        }
    }
    fs.level = if all_device {
        VerifyLevel::Device
    } else {
        VerifyLevel::Cache
    };
    // Without a whole-file digest, bytes no block record covers were not
    // checked at all.
    Ok(if cf.digest.is_none() { unrecorded } else { 0 })
}

/// Adds a rotten range, merging it with the last one when they touch and
/// the same checksums failed.
fn add_range(rot: &mut Vec<RotRange>, offset: u64, len: u64, failed: Vec<&'static str>) {
    if let Some(last) = rot.last_mut() {
        if last.offset + last.len == offset && last.failed == failed {
            last.len += len;
            return;
        }
    }
    rot.push(RotRange {
        offset,
        len,
        failed,
    });
}

/// Keeps reads (of all the scrub's threads) under a byte rate.
struct Throttle {
    rate: Option<u64>,
    start: Instant,
    spent: std::sync::atomic::AtomicU64,
}

impl Throttle {
    fn new(rate: Option<u64>) -> Throttle {
        Throttle {
            rate: rate.filter(|&r| r > 0),
            start: Instant::now(),
            spent: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn spend(&self, bytes: u64) {
        let Some(rate) = self.rate else { return };
        let spent = self
            .spent
            .fetch_add(bytes, std::sync::atomic::Ordering::SeqCst)
            + bytes;
        let due = Duration::from_secs_f64(spent as f64 / rate as f64);
        if let Some(wait) = due.checked_sub(self.start.elapsed()) {
            std::thread::sleep(wait);
        }
    }
}

/// Threads that scrub files at once (without a replica to repair from):
/// four a core, as a thread of small files mostly waits for its reads
/// (each keeps a [`GROUP`]'s reads in flight), and a large file's
/// hashing fills a core anyway.
fn scrub_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() * 4).clamp(4, MAX_SCRUB_THREADS))
}

/// At most this many [`scrub_threads`].
const MAX_SCRUB_THREADS: usize = 16;

/// Descriptors one scrub holds open at most: every thread's group of
/// files, each with its own descriptor and a direct reader's. A server
/// keeps these free beside its transfers' (a background scrub runs
/// beside them).
pub(crate) const MAX_SCRUB_DESCRIPTORS: u64 = (MAX_SCRUB_THREADS * read::GROUP * 2) as u64;

/// Files handed to the threads at once at most (a stop waits for them).
const PARALLEL_CHUNK: usize = 512;
/// Bytes per thread handed to the threads at once at most.
const PARALLEL_BYTES: u64 = 64 << 20;

/// `files` cut into the groups handed to `threads` threads at once: up to
/// [`PARALLEL_CHUNK`] files and [`PARALLEL_BYTES`] a thread, but never
/// fewer files than threads (a stop waits for one group at most; a group
/// of many small files spawns the threads once).
fn chunks(files: &[CatalogFile], threads: usize) -> Vec<&[CatalogFile]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, f) in files.iter().enumerate() {
        bytes += f.size;
        let n = i + 1 - start;
        if n >= PARALLEL_CHUNK || (n >= threads && bytes >= PARALLEL_BYTES * threads as u64) {
            out.push(&files[start..=i]);
            (start, bytes) = (i + 1, 0);
        }
    }
    if start < files.len() {
        out.push(&files[start..]);
    }
    out
}

/// Scrubs `files` on a thread per buffer of `bufs`; the verdicts in
/// their order, None for the files a stop left unread. A thread takes no
/// file after a stop, so a None may come before another thread's
/// verdicts: the caller keeps the verdicts before the first None only
/// (the rest are read again by the next pass).
fn scrub_parallel(
    dest: &Destination,
    journal: &Journal,
    files: &[CatalogFile],
    opts: &ScrubOptions,
    throttle: &Throttle,
    bufs: &mut [AlignedBuf],
) -> Vec<Option<Result<FileScrub, TransferError>>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let groups = groups(files);
    let slots: Vec<std::sync::Mutex<Option<Result<FileScrub, TransferError>>>> =
        files.iter().map(|_| Default::default()).collect();
    std::thread::scope(|s| {
        for buf in bufs.iter_mut().take(groups.len()) {
            let (next, slots, groups) = (&next, &slots, &groups);
            s.spawn(move || loop {
                // Checked before a group and before each file: a file
                // begun is read to its end, and a stop waits for no more.
                if opts.stopped() {
                    break;
                }
                let Some(range) = groups.get(next.fetch_add(1, Ordering::SeqCst)) else {
                    break;
                };
                let (start, group) = (range.start, &files[range.clone()]);
                // The group's one-block files are opened and their device
                // reads asked for before the first is checked: a thread
                // keeps several reads in flight instead of one.
                let mut ahead: Vec<Option<Ahead>> =
                    group.iter().map(|cf| open_ahead(dest, cf, opts)).collect();
                for (j, cf) in group.iter().enumerate() {
                    if opts.stopped() {
                        break;
                    }
                    let r = scrub_file(
                        dest,
                        journal,
                        cf,
                        opts,
                        None,
                        buf,
                        throttle,
                        ahead[j].take(),
                    );
                    *slots[start + j].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                }
            });
        }
    });
    slots
        .into_iter()
        .map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touching_ranges_with_the_same_failures_merge() {
        let mut rot = Vec::new();
        add_range(&mut rot, 0, 4096, vec!["crc32c"]);
        add_range(&mut rot, 4096, 4096, vec!["crc32c"]);
        add_range(&mut rot, 8192, 100, vec!["crc32c", "xxh3-128"]);
        add_range(&mut rot, 16384, 10, vec!["crc32c", "xxh3-128"]);
        assert_eq!(rot.len(), 3);
        assert_eq!((rot[0].offset, rot[0].len), (0, 8192));
        assert_eq!((rot[1].offset, rot[1].len), (8192, 100));
        assert_eq!(rot[2].offset, 16384);
    }
}
