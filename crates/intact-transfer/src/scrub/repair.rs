//! Repair from a replica: the rotten pages a scrub found are fetched from
//! a replica (a directory or an intact server, see [`Replica`]) and held
//! against the catalog before they are written: each page against its
//! CRC-32C, then its block (the fetched pages in this file's other bytes
//! of the block) against the block's XXH3-128; a file the catalog knows
//! only whole is fetched twice, checked against its BLAKE3 and chunk by
//! chunk against the first fetch. One block is held in memory at a time.
//! The writes go only into the inode the scrub read, still with its
//! cataloged size and mtime (checked just before the first write); they
//! are synced, the cataloged mtime is put back (also when the repair
//! fails after writing, so the next scrub calls the file rotten, never
//! changed), and what was written is re-read the way the scrub reads
//! (evict or direct; the whole file where block records leave bytes to
//! the whole-file digest): the file is called repaired only if that
//! re-read holds, and at that re-read's level.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::fs::FileExt;

use intact_digest::{defaults, hash, page_crc_blob, AlignedBuf};
use intact_proto::WirePath;
use rustix::fs::{self as rfs, Timespec, Timestamps};
use serde::Serialize;

use super::{check_file, FileScrub, Throttle};
use crate::journal::{BlockRecord, CatalogFile, ScrubState};
use crate::verify::VerifyLevel;
use crate::{Destination, Replica};

/// What a repair did.
#[derive(Debug, Clone, Serialize)]
pub struct Repair {
    /// The replica.
    pub from: String,
    /// Bytes written over rotten ones.
    pub bytes: u64,
    /// The level of the re-read that found the repaired bytes good.
    pub level: VerifyLevel,
    /// Why the file is not repaired. If `bytes` is not 0, bytes were
    /// written that the re-read did not confirm.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Bytes fetched at once for a file the catalog knows only whole.
const WHOLE_CHUNK: u64 = 4 << 20;

/// Repairs the rot `fs` names in the file `wire` (read by the scrub as
/// `read`) from `replica`.
#[allow(clippy::too_many_arguments)]
pub(super) fn repair(
    dest: &Destination,
    read: &File,
    wire: &WirePath,
    cf: &CatalogFile,
    records: &[BlockRecord],
    fs: &FileScrub,
    replica: &mut Replica,
    direct: bool,
    buf: &mut AlignedBuf,
    throttle: &Throttle,
) -> Repair {
    let mut r = Repair {
        from: replica.name().to_string(),
        bytes: 0,
        level: VerifyLevel::None,
        error: None,
    };
    let Some(file) = dest.open_final_rw(wire) else {
        r.error = Some("it cannot be opened for writing".into());
        return r;
    };
    let target = Target {
        file: &file,
        read,
        cf,
        checked: false,
        throttle,
    };
    let bs = u64::from(cf.block_size.max(1));
    let covered = records.len() as u64 == cf.size.div_ceil(bs)
        && records.iter().enumerate().all(|(i, r)| r.index == i as u64);
    let whole = fs.rot.iter().any(|x| x.failed.contains(&"blake3"));
    let mut target = target;
    let written = if whole {
        whole_file(&mut target, wire, replica, &mut r.bytes)
    } else {
        pages(&mut target, wire, records, fs, replica, &mut r.bytes)
    };
    // Bytes the catalog's block records do not cover are checked only by
    // the whole-file digest: then the whole file is re-read.
    let done = written.and_then(|blocks| {
        settle(&file, cf)?;
        // Without a whole-file digest the block records are all there is
        // to re-read against: those blocks, never the whole.
        let only = (!whole && (covered || cf.digest.is_none())).then_some(blocks);
        reread(&file, cf, records, fs, direct, only, buf, throttle)
    });
    match done {
        Ok(level) => r.level = level,
        Err(e) => {
            if r.bytes > 0 {
                // Whatever was written, the mtime goes back: the file is
                // then scrubbed again as rot, never called changed.
                let _ = settle(&file, cf);
            }
            r.error = Some(e);
        }
    }
    r
}

/// The file a repair writes: checked, just before its first write, to be
/// the inode the scrub read, with its cataloged size and mtime, and one
/// whose mtime can be set back.
struct Target<'a> {
    file: &'a File,
    read: &'a File,
    cf: &'a CatalogFile,
    checked: bool,
    /// The scrub's rate: what a repair reads (the rotten blocks, the
    /// replica's bytes, which a local replica reads from a disk too) and
    /// re-reads counts against it as the scrub's own reads do.
    throttle: &'a Throttle,
}

impl Target<'_> {
    fn write(&mut self, data: &[u8], at: u64, written: &mut u64) -> Result<(), String> {
        if !self.checked {
            if !same_file(self.read, self.file, self.cf) {
                return Err(
                    "it was replaced or changed since the scrub read it: not written".into(),
                );
            }
            // Setting the cataloged mtime it still has changes nothing,
            // and proves it can be set back after the writes.
            rfs::futimens(self.file, &cataloged_mtime(self.cf)).map_err(|e| {
                format!("its mtime could not be set back after a repair ({e}): not written")
            })?;
            self.checked = true;
        }
        write(self.file, data, at, written)
    }
}

/// Whether `now` (opened for writing) is the inode the scrub read, still
/// with the cataloged size and mtime: a transfer that renamed a new
/// version over the name meanwhile is never written into.
fn same_file(read: &File, now: &File, cf: &CatalogFile) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (read.metadata(), now.metadata()) {
        (Ok(a), Ok(b)) => {
            (a.dev(), a.ino()) == (b.dev(), b.ino())
                && cf.is_as_cataloged(b.len(), (b.mtime(), b.mtime_nsec() as u32))
        }
        _ => false,
    }
}

/// Fetches the rotten pages (or blocks, where the catalog has no page
/// CRCs) block by block; each block's fetched pages are checked against
/// their CRCs, put into this file's other bytes of the block, and the
/// whole block checked against its XXH3-128 before any of them is
/// written. Returns the blocks written.
fn pages(
    target: &mut Target<'_>,
    wire: &WirePath,
    records: &[BlockRecord],
    fs: &FileScrub,
    replica: &mut Replica,
    written: &mut u64,
) -> Result<BTreeSet<u64>, String> {
    let cf = target.cf;
    let bs = u64::from(cf.block_size.max(1));
    let mut pieces: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    for range in &fs.rot {
        let end = range.offset + range.len;
        let mut at = range.offset;
        while at < end {
            let index = at / bs;
            let to = end.min(((index + 1) * bs).min(cf.size));
            pieces.entry(index).or_default().push((at, to));
            at = to;
        }
    }
    for (&index, ranges) in &pieces {
        let (b0, b_end) = (index * bs, ((index + 1) * bs).min(cf.size));
        let rec = records
            .iter()
            .find(|r| r.index == index)
            .ok_or_else(|| format!("block {index} has no record in the catalog"))?;
        let mut block = vec![0u8; (b_end - b0) as usize];
        target.throttle.spend(block.len() as u64);
        target
            .file
            .read_exact_at(&mut block, b0)
            .map_err(|e| format!("reading block {index}: {e}"))?;
        for &(at, to) in ranges {
            target.throttle.spend(to - at);
            let data = replica.fetch(wire, at, to - at)?;
            check_pages(rec, cf.page_size, b0, b_end, at, &data)?;
            block[(at - b0) as usize..(to - b0) as usize].copy_from_slice(&data);
        }
        if hash(defaults::BLOCK_ALGORITHM, &block).as_bytes() != rec.digest.as_slice() {
            return Err(format!(
                "block {index} with the replica's pages does not match the catalog (xxh3-128): not written"
            ));
        }
        for &(at, to) in ranges {
            target.write(&block[(at - b0) as usize..(to - b0) as usize], at, written)?;
        }
    }
    Ok(pieces.into_keys().collect())
}

/// Holds bytes `at..` of block `rec` (bytes `b0..b_end` of the file)
/// fetched from the replica against the catalog's page CRCs; without
/// them, only a whole block can be checked (by the caller's digest).
fn check_pages(
    rec: &BlockRecord,
    page: usize,
    b0: u64,
    b_end: u64,
    at: u64,
    data: &[u8],
) -> Result<(), String> {
    let end = at + data.len() as u64;
    let page = page.max(1) as u64;
    match &rec.pages {
        Some(p) if p.len() as u64 == (b_end - b0).div_ceil(page) * 4 => {
            if !(at - b0).is_multiple_of(page) || (end != b_end && !(end - b0).is_multiple_of(page))
            {
                return Err(format!("{at}..{end} is not a range of whole pages"));
            }
            let first = ((at - b0) / page) as usize * 4;
            let now = page_crc_blob(data, page as usize);
            if p.get(first..first + now.len()) != Some(now.as_slice()) {
                return Err(format!(
                    "the replica's bytes {at}..{end} do not match the catalog either (crc32c)"
                ));
            }
            Ok(())
        }
        _ if at == b0 && end == b_end => Ok(()),
        _ => Err(format!(
            "{at}..{end} is part of a block without page CRCs in the catalog"
        )),
    }
}

/// A file the catalog knows only by its whole BLAKE3: the replica's copy
/// is read once to check it (keeping each chunk's BLAKE3), then again to
/// write it, each chunk checked against the first reading before it is
/// written: nothing unchecked is written.
fn whole_file(
    target: &mut Target<'_>,
    wire: &WirePath,
    replica: &mut Replica,
    written: &mut u64,
) -> Result<BTreeSet<u64>, String> {
    let cf = target.cf;
    let want = cf
        .digest
        .map(blake3::Hash::from_bytes)
        .ok_or("no whole-file digest in the catalog")?;
    let mut whole = blake3::Hasher::new();
    let mut chunks = Vec::new();
    let mut at = 0;
    while at < cf.size {
        let len = (cf.size - at).min(WHOLE_CHUNK);
        target.throttle.spend(len);
        let data = replica.fetch(wire, at, len)?;
        whole.update(&data);
        chunks.push(blake3::hash(&data));
        at += len;
    }
    if whole.finalize() != want {
        return Err("the replica's copy does not match the catalog either (blake3)".into());
    }
    let mut at = 0;
    for good in chunks {
        let len = (cf.size - at).min(WHOLE_CHUNK);
        target.throttle.spend(len);
        let data = replica.fetch(wire, at, len)?;
        if blake3::hash(&data) != good {
            return Err(format!(
                "the replica's copy changed while it was fetched (bytes {at}..{})",
                at + len
            ));
        }
        target.write(&data, at, written)?;
        at += len;
    }
    Ok(BTreeSet::new())
}

fn cataloged_mtime(cf: &CatalogFile) -> Timestamps {
    Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: rfs::UTIME_OMIT,
        },
        last_modification: Timespec {
            tv_sec: cf.mtime.0,
            tv_nsec: cf.mtime.1.into(),
        },
    }
}

/// Syncs the written bytes and puts the cataloged mtime back.
fn settle(file: &File, cf: &CatalogFile) -> Result<(), String> {
    file.sync_data().map_err(|e| format!("sync: {e}"))?;
    rfs::futimens(file, &cataloged_mtime(cf))
        .map_err(|e| format!("setting its mtime back: {e}"))?;
    file.sync_all().map_err(|e| format!("sync: {e}"))
}

fn write(file: &File, data: &[u8], at: u64, written: &mut u64) -> Result<(), String> {
    file.write_all_at(data, at)
        .map_err(|e| format!("writing {} bytes at {at}: {e}", data.len()))?;
    *written += data.len() as u64;
    Ok(())
}

/// Re-reads what was repaired (`only` those blocks; None: all of it) the
/// way the scrub reads; returns the level of that re-read if it holds.
#[allow(clippy::too_many_arguments)]
fn reread(
    file: &File,
    cf: &CatalogFile,
    records: &[BlockRecord],
    fs: &FileScrub,
    direct: bool,
    only: Option<BTreeSet<u64>>,
    buf: &mut AlignedBuf,
    throttle: &Throttle,
) -> Result<VerifyLevel, String> {
    let mut after = FileScrub {
        rot: Vec::new(),
        bytes: 0,
        note: None,
        repair: None,
        ..fs.clone()
    };
    let meta = file
        .metadata()
        .map_err(|e| format!("re-reading after the repair: {e}"))?;
    let unchecked = check_file(
        records,
        cf,
        file,
        super::Opened::from(&meta),
        &super::ScrubOptions {
            direct,
            ..super::ScrubOptions::default()
        },
        None,
        only.as_ref(),
        buf,
        throttle,
        &mut after,
    )
    .map_err(|e| format!("re-reading after the repair: {e}"))?;
    if after.state == ScrubState::Changed.name() {
        return Err("it was changed by another program while it was re-read".into());
    }
    if let Some(bad) = after.rot.first() {
        return Err(format!(
            "the re-read after the repair still finds bytes {}..{} wrong ({})",
            bad.offset,
            bad.offset + bad.len,
            bad.failed.join(", ")
        ));
    }
    if unchecked > 0 {
        return Err(format!(
            "{unchecked} bytes have no checksum to re-read against"
        ));
    }
    Ok(after.level)
}
