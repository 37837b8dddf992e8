//! A block's way through the receiver: the check on arrival, the write,
//! and the hand-over to the file's verify stage; and the file's end.

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use intact_digest::{defaults, hash, Algorithm, AlignedBuf, Digest};
use intact_proto::ProtoError;

use super::{wire_level, Check, Incoming, ReceiveOptions};
use crate::profile::{Profile, Stage};
use crate::TransferError;

/// Where a received block stands.
pub(super) enum Verdict {
    /// Verified (or not) already, as far as its stage goes; with the
    /// CRC-32C of each page of the bytes received, where kept.
    Done(bool, Option<Vec<u8>>),
    /// Written; the verifier must re-read it.
    Check(Check),
}

/// Checks and writes one block, then hands it to the verifier (a stage
/// that re-reads every block) or marks it verified. A block for a slot
/// already held from an earlier run replaces it (the sender's copy
/// differs), unless it is the same block again.
pub(super) fn accept_block(
    f: &mut Incoming,
    b: &mut intact_proto::Block,
    opts: &ReceiveOptions,
    page_size: usize,
) -> Result<Verdict, TransferError> {
    let index = b.index;
    let bs = u64::from(f.entry.block_size);
    let Some(slot) = f.verified.get(index as usize).map(|d| d.copied()) else {
        return Err(ProtoError::Malformed {
            message: "Block",
            detail: "block index past the end of the file",
        }
        .into());
    };
    let offset = index * bs;
    let want_len = (f.entry.size - offset).min(bs) as usize;
    if b.data.len() != want_len {
        return Err(ProtoError::Malformed {
            message: "Block",
            detail: "block length does not match the file",
        }
        .into());
    }
    let digest = Digest::from_bytes(defaults::BLOCK_ALGORITHM, &b.digest);
    if let Some(held) = slot {
        if digest.is_some_and(|d| d.ct_eq(&held)) {
            return Ok(Verdict::Done(true, None));
        }
        f.verified.set(index as usize, None);
        f.held.forget(index);
    }
    // Check: the digest that came with the block against its bytes.
    let expected = if f.verify.checks_arrival() {
        match digest {
            Some(d) => Some(d),
            None => return Ok(Verdict::Done(false, None)),
        }
    } else {
        None
    };
    let data = &mut b.data[..];
    let profile = &*opts.profile;
    // The catalog's page CRCs come from these bytes *before* their digest
    // is checked (checksum chaining, see journal/catalog.rs): a flip after
    // the check then shows as a page that no longer matches, at rest. One
    // timed check: the profile counts one per block.
    let pages = match &expected {
        Some(d) => {
            let (pages, ok) = profile.time(Stage::Check, || {
                if opts.without_page_crcs() {
                    return (None, hash(defaults::BLOCK_ALGORITHM, data).ct_eq(d));
                }
                let (digest, pages) =
                    intact_digest::hash_with_page_crcs(defaults::BLOCK_ALGORITHM, data, page_size);
                (Some(pages), digest.ct_eq(d))
            });
            if !ok {
                return Ok(Verdict::Done(false, None));
            }
            pages
        }
        None => None,
    };
    if let Some(hook) = opts.after_check() {
        hook(&f.entry.path.to_string(), index, data);
    }
    // Write.
    let partial = f.partial.as_ref().expect("blocks go to a partial file");
    profile
        .time(Stage::Write, || partial.file().write_all_at(data, offset))
        .map_err(f.path_err())?;
    if let Some(hook) = opts.after_write() {
        hook(
            partial.file(),
            &f.entry.path.to_string(),
            index,
            offset,
            want_len,
        );
    }
    // The bytes written are the block's part of the whole-file digest.
    profile.time(Stage::Whole, || f.whole.add(index, data));
    // Verify: a stage that re-reads every block queues it.
    if let (Some(d), Some(r)) = (&expected, f.verify.block_reread()) {
        return Ok(Verdict::Check(Check {
            id: f.entry.file,
            index,
            source_level: wire_level(b.source_level),
            offset,
            len: want_len,
            digest: *d,
            file: Arc::clone(&r.file),
            reader: Arc::clone(&r.reader),
            pages,
            deferred: f.verify.defers(),
        }));
    }
    // Unchecked (`none`): no digest; the data's own marks the slot done.
    f.verified.set(
        index as usize,
        Some(expected.unwrap_or_else(|| hash(Algorithm::Crc32c, &[]))),
    );
    Ok(Verdict::Done(true, pages))
}

/// At FileEnd: every block must have verified, and the file's verify
/// stage has its say (`sequential`, `file`: a whole-file re-read).
/// Returns the blocks that must be sent again.
pub(super) fn end_file(
    f: &mut Incoming,
    buf: &mut AlignedBuf,
    profile: &Profile,
) -> Result<Vec<u64>, TransferError> {
    let missing: Vec<u64> = (0..f.verified.len() as u64)
        .filter(|&i| f.verified.get(i as usize) == Some(None))
        .collect();
    let Some(partial) = &f.partial else {
        // Held whole: every block was re-verified in place already.
        return Ok(missing);
    };
    if !missing.is_empty() {
        return Ok(missing);
    }
    let bs = u64::from(f.entry.block_size);
    let path_err = |e| TransferError::Destination {
        path: f.entry.path.to_string(),
        source: e,
    };
    let _timed = f
        .verify
        .rereads_at_end()
        .then(|| profile.timer(Stage::Verify));
    f.verify
        .at_end(partial.file(), f.entry.size, bs, f.verified.slots(), buf)
        .map_err(path_err)
}
