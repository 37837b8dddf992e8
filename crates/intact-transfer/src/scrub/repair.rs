//! Repair from a replica: the rotten pages a scrub found are fetched from
//! a replica (a directory or an intact server, see [`Replica`]), held
//! against the catalog before anything is written (each page against its
//! CRC-32C, a whole block also against its XXH3-128, a file the catalog
//! knows only whole against its BLAKE3), written in place, synced, and
//! then re-read the way the scrub reads (evict or direct): the file is
//! called repaired only if that re-read holds. The file's mtime is set
//! back to the cataloged one, so the next scrub does not call it changed.

use std::collections::BTreeSet;
use std::fs::File;
use std::os::unix::fs::FileExt;

use intact_digest::{defaults, hash, page_crc_blob, AlignedBuf, PAGE_SIZE};
use intact_proto::WirePath;
use rustix::fs::{self as rfs, Timespec, Timestamps};
use serde::Serialize;

use super::{check_file, FileScrub, Throttle};
use crate::journal::{BlockRecord, CatalogFile};
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

/// Repairs the rot `fs` names in the file `wire` from `replica`.
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
) -> Repair {
    let mut r = Repair {
        from: replica.name().to_string(),
        bytes: 0,
        level: VerifyLevel::None,
        error: None,
    };
    let done = match dest.open_final_rw(wire) {
        None => Err("it cannot be opened for writing".to_string()),
        Some(file) if !same_file(read, &file, cf) => {
            Err("it was replaced or changed since the scrub read it: not written".to_string())
        }
        Some(file) => {
            let whole = fs.rot.iter().any(|x| x.failed.contains(&"blake3"));
            let written = if whole {
                whole_file(&file, wire, cf, replica, &mut r.bytes)
            } else {
                pages(&file, wire, cf, records, fs, replica, &mut r.bytes).map(Some)
            };
            written.and_then(|only| reread(&file, cf, records, fs, direct, only, buf))
        }
    };
    match done {
        Ok(level) => r.level = level,
        Err(e) => r.error = Some(e),
    }
    r
}

/// Whether `now` (opened for writing) is the inode the scrub read, still
/// with the cataloged size and mtime: a transfer that renamed a new
/// version over the name meanwhile is never written into.
fn same_file(read: &File, now: &File, cf: &CatalogFile) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (read.metadata(), now.metadata()) {
        (Ok(a), Ok(b)) => {
            (a.dev(), a.ino()) == (b.dev(), b.ino())
                && (b.len(), b.mtime(), b.mtime_nsec() as u32) == (cf.size, cf.mtime.0, cf.mtime.1)
        }
        _ => false,
    }
}

/// Fetches, checks and writes the rotten pages (or blocks, where the
/// catalog has no page CRCs); returns the blocks touched.
fn pages(
    file: &File,
    wire: &WirePath,
    cf: &CatalogFile,
    records: &[BlockRecord],
    fs: &FileScrub,
    replica: &mut Replica,
    written: &mut u64,
) -> Result<BTreeSet<u64>, String> {
    let bs = u64::from(cf.block_size.max(1));
    let mut good = Vec::new();
    let mut blocks = BTreeSet::new();
    for range in &fs.rot {
        let end = range.offset + range.len;
        let mut at = range.offset;
        while at < end {
            let index = at / bs;
            let (b0, b_end) = (index * bs, ((index + 1) * bs).min(cf.size));
            let to = end.min(b_end);
            let rec = records
                .iter()
                .find(|r| r.index == index)
                .ok_or_else(|| format!("block {index} has no record in the catalog"))?;
            let data = replica.fetch(wire, at, to - at)?;
            check_fetched(rec, b0, b_end, at, &data)?;
            good.push((at, data));
            blocks.insert(index);
            at = to;
        }
    }
    // Nothing is written before every fetched byte held.
    for (at, data) in &good {
        write(file, data, *at, written)?;
    }
    Ok(blocks)
}

/// Holds bytes `at..` of block `rec` (bytes `b0..b_end` of the file)
/// fetched from the replica against the catalog.
fn check_fetched(
    rec: &BlockRecord,
    b0: u64,
    b_end: u64,
    at: u64,
    data: &[u8],
) -> Result<(), String> {
    let end = at + data.len() as u64;
    let differs = |what: &str| {
        format!("the replica's bytes {at}..{end} do not match the catalog either ({what})")
    };
    let whole_block = at == b0 && end == b_end;
    if whole_block && hash(defaults::BLOCK_ALGORITHM, data).as_bytes() != rec.digest.as_slice() {
        return Err(differs("xxh3-128"));
    }
    let page = PAGE_SIZE as u64;
    match &rec.pages {
        Some(p) if p.len() as u64 == (b_end - b0).div_ceil(page) * 4 => {
            if (at - b0) % page != 0 || (end != b_end && (end - b0) % page != 0) {
                return Err(format!("{at}..{end} is not a range of whole pages"));
            }
            let first = ((at - b0) / page) as usize * 4;
            let now = page_crc_blob(data);
            if p.get(first..first + now.len()) != Some(now.as_slice()) {
                return Err(differs("crc32c"));
            }
            Ok(())
        }
        _ if whole_block => Ok(()),
        _ => Err(format!(
            "{at}..{end} is part of a block without page CRCs in the catalog"
        )),
    }
}

/// A file the catalog knows only by its whole BLAKE3: the replica's copy
/// is read once to check it, then again to write it (checked again:
/// nothing unchecked is left claimed). Returns no block set: the re-read
/// is of the whole file.
fn whole_file(
    file: &File,
    wire: &WirePath,
    cf: &CatalogFile,
    replica: &mut Replica,
    written: &mut u64,
) -> Result<Option<BTreeSet<u64>>, String> {
    let want = cf
        .digest
        .map(blake3::Hash::from_bytes)
        .ok_or("no whole-file digest in the catalog")?;
    let mut pass = |write_too: bool, written: &mut u64| -> Result<blake3::Hash, String> {
        let mut h = blake3::Hasher::new();
        let mut at = 0;
        while at < cf.size {
            let len = (cf.size - at).min(WHOLE_CHUNK);
            let data = replica.fetch(wire, at, len)?;
            h.update(&data);
            if write_too {
                write(file, &data, at, written)?;
            }
            at += len;
        }
        Ok(h.finalize())
    };
    if pass(false, written)? != want {
        return Err("the replica's copy does not match the catalog either (blake3)".into());
    }
    if pass(true, written)? != want {
        return Err(
            "the replica's copy changed while it was written here: the file now holds bytes that do not match the catalog"
                .into(),
        );
    }
    Ok(None)
}

fn write(file: &File, data: &[u8], at: u64, written: &mut u64) -> Result<(), String> {
    file.write_all_at(data, at)
        .map_err(|e| format!("writing {} bytes at {at}: {e}", data.len()))?;
    *written += data.len() as u64;
    Ok(())
}

/// Syncs the repaired file, sets its cataloged mtime back, and re-reads
/// what was repaired (`only` those blocks; None: all of it) the way the
/// scrub reads; returns the level of that re-read if it holds.
fn reread(
    file: &File,
    cf: &CatalogFile,
    records: &[BlockRecord],
    fs: &FileScrub,
    direct: bool,
    only: Option<BTreeSet<u64>>,
    buf: &mut AlignedBuf,
) -> Result<VerifyLevel, String> {
    file.sync_data().map_err(|e| format!("sync: {e}"))?;
    let times = Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: rfs::UTIME_OMIT,
        },
        last_modification: Timespec {
            tv_sec: cf.mtime.0,
            tv_nsec: cf.mtime.1.into(),
        },
    };
    rfs::futimens(file, &times).map_err(|e| format!("setting its mtime back: {e}"))?;
    file.sync_all().map_err(|e| format!("sync: {e}"))?;
    let mut after = FileScrub {
        rot: Vec::new(),
        bytes: 0,
        note: None,
        repair: None,
        ..fs.clone()
    };
    let unchecked = check_file(
        records,
        cf,
        file,
        direct,
        only.as_ref(),
        buf,
        &mut Throttle::new(None),
        &mut after,
    )
    .map_err(|e| format!("re-reading after the repair: {e}"))?;
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
