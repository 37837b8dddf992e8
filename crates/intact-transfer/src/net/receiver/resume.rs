//! What an earlier run left of a file: journaled blocks of a partial file
//! (a resume) and a file held whole (a repeated transfer), trusted at the
//! level their records say or re-verified in place by the mode's own
//! means.

use std::fs::File;
use std::sync::Arc;

use intact_digest::{defaults, AlignedBuf, Digest};
use intact_proto::{Entry, MAX_STATUS_BLOCKS};

use super::begin::open_stage;
use super::{Incoming, ReceiveOptions};
use crate::journal::{BlockRecord, Journal};
use crate::net::whole_digest::{HeldWhole, Stamp};
use crate::recheck::{recheck_batch_seen, Recheck, BATCH_BYTES};
use crate::stage::verify::RereadFile;
use crate::stage::verify::{reread_level, reread_matches};
use crate::verify::VerifyLevel;
use crate::TransferError;

/// Blocks and their digests, as a Status lists them.
pub(super) type BlockList = Vec<(u64, Vec<u8>)>;

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
    let reader = inc.verify.block_reread().map(|r| Arc::clone(&r.reader));
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
                crcs: None,
            })
            .collect();
        for r in recheck_batch_seen(&rechecks, buf, seen) {
            let ok = r.ok.map_err(inc.path_err())?;
            let level = match inc.verify.block_reread_mut() {
                Some(reread) => {
                    reread.count(&r.outcome, r.took);
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
pub(super) fn reverify_held(
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
pub(super) fn reverify_whole(
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
    let target = RereadFile::of(file).map_err(inc.path_err())?;
    inc.verify = open_stage(&inc, Some(target), opts)?;
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
