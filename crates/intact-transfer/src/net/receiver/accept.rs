//! A block's way through the receiver: the check on arrival, the write,
//! and the hand-over to the file's verify stage; and the file's end.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use intact_digest::{defaults, hash, Algorithm, AlignedBuf, Digest};
use intact_proto::{Block, ProtoError, MAX_BLOCK, WIRE_PAGE};

use super::begin::one_block;
use super::{wire_level, Check, Incoming, ReceiveOptions, SYNC_MAX_FILE};
use crate::profile::{Profile, Stage};
use crate::recheck::differing_pages;
use crate::TransferError;

/// Where a received block stands.
pub(super) enum Verdict {
    /// Verified (or not) already, as far as its stage goes; with the
    /// CRC-32C of each page of the bytes received, where kept, and, for a
    /// block that failed, the pages whose CRC differed from the sender's
    /// (empty: resend it whole).
    Done(bool, Option<Vec<u8>>, Vec<u32>),
    /// Written; the verifier must re-read it.
    Check(Check),
}

fn malformed(detail: &'static str) -> TransferError {
    ProtoError::Malformed {
        message: "Block",
        detail,
    }
    .into()
}

/// Checks and writes one block, then hands it to the verifier (a stage
/// that re-reads every block) or marks it verified. A block for a slot
/// already held from an earlier run replaces it (the sender's copy
/// differs), unless it is the same block again.
///
/// A block carrying only some pages ([`Block::patch`]) is accepted only
/// where this receiver named those pages bad: they are merged with the
/// block's other pages as the partial file holds them, the whole is
/// checked like any block, and only the patched pages are written.
pub(super) fn accept_block(
    f: &mut Incoming,
    b: &mut Block,
    opts: &ReceiveOptions,
    page_size: usize,
) -> Result<Verdict, TransferError> {
    let index = b.index;
    let bs = u64::from(f.entry.block_size);
    if f.range.is_some() && !f.sends_block(index) {
        return Err(malformed("block outside the range its entry claimed"));
    }
    let Some(slot) = f.verified.get(index as usize).map(|d| d.copied()) else {
        return Err(malformed("block index past the end of the file"));
    };
    let offset = index * bs;
    let want_len = (f.entry.size - offset).min(bs) as usize;
    let asked = f.awaiting_pages.remove(&index);
    if !b.crcs.is_empty() && b.crcs.len() != 4 * Block::pages_of(want_len) {
        return Err(malformed("page CRCs do not match the block's length"));
    }
    if !b.patch.is_empty() {
        if !asked {
            return Err(malformed("pages of a block whose pages were not asked for"));
        }
        merge_patch(f, b, offset, want_len)?;
    } else if b.data.len() != want_len {
        return Err(malformed("block length does not match the file"));
    }
    let digest = Digest::from_bytes(defaults::BLOCK_ALGORITHM, &b.digest);
    if let Some(held) = slot {
        if digest.is_some_and(|d| d.ct_eq(&held)) {
            return Ok(Verdict::Done(true, None, Vec::new()));
        }
        f.verified.set(index as usize, None);
        f.held.forget(index);
    }
    // Check: the digest that came with the block against its bytes.
    let expected = if f.verify.checks_arrival() {
        match digest {
            Some(d) => Some(d),
            None => return Ok(Verdict::Done(false, None, Vec::new())),
        }
    } else {
        None
    };
    let profile = &*opts.profile;
    let partial = f.partial.as_ref().expect("blocks go to a partial file");
    let dev = partial.dev();
    // The catalog's page CRCs come from these bytes *before* their digest
    // is checked (checksum chaining, see journal/catalog.rs): a flip after
    // the check then shows as a page that no longer matches, at rest. One
    // timed check: the profile counts one per block.
    let pages = match &expected {
        Some(d) => {
            let (pages, bad) = profile.time(Stage::Check, || {
                arrival_check(&b.data, d, &b.crcs, page_size, opts.without_page_crcs())
            });
            match bad {
                Ok(()) => pages,
                Err(bad) => {
                    if !bad.is_empty() {
                        // The good pages stay where the merge will find
                        // them; only the bad ones will come again (the
                        // answer naming them marks the block as awaiting).
                        profile
                            .time(Stage::Write, || write_block(partial.file(), b, offset))
                            .map_err(f.path_err())?;
                    }
                    return Ok(Verdict::Done(false, None, bad));
                }
            }
        }
        None => None,
    };
    let pages_are_wire = pages.is_some() && page_size == WIRE_PAGE;
    if let Some(hook) = opts.after_check() {
        // A patch writes only its pages: the fault reaches only them (the
        // whole-file digest below is of the bytes as written).
        let before = (!b.patch.is_empty()).then(|| b.data.clone());
        hook(&f.entry.path.to_string(), index, &mut b.data[..]);
        if let Some(before) = before {
            keep_unpatched(b, &before);
        }
    }
    // Write.
    profile
        .time(Stage::Write, || write_block(partial.file(), b, offset))
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
    profile.time(Stage::Whole, || f.whole.add(index, &b.data));
    // The pages the re-read can name: the catalog's, where they are the
    // wire's size, else the sender's where they were checked against these
    // bytes above.
    let checked = !b.crcs.is_empty() && !opts.without_page_crcs();
    let crcs = (!pages_are_wire && checked).then(|| std::mem::take(&mut b.crcs));
    // Verify: a stage that re-reads every block queues it.
    if let (Some(d), Some(r)) = (&expected, f.verify.block_reread()) {
        let small = f.range.is_none() && one_block(&f.entry) && f.entry.size <= SYNC_MAX_FILE;
        return Ok(Verdict::Check(Check {
            sync_first: small && f.verify.syncs_first(),
            dev,
            id: f.entry.file,
            index,
            source_level: wire_level(b.source_level),
            offset,
            len: want_len,
            digest: *d,
            file: Arc::clone(&r.file),
            reader: Arc::clone(&r.reader),
            pages,
            pages_are_wire,
            crcs,
            deferred: f.verify.defers(),
        }));
    }
    // Unchecked (`none`): no digest; the data's own marks the slot done.
    f.verified.set(
        index as usize,
        Some(expected.unwrap_or_else(|| hash(Algorithm::Crc32c, &[]))),
    );
    Ok(Verdict::Done(true, pages, Vec::new()))
}

/// The check on arrival: the block's bytes against the sender's digest
/// and, where it sent them, its page CRCs. Returns the catalog's page
/// CRCs of these bytes (at `page_size`; None when switched off), and
/// whether all matched, or the pages whose CRC differed (empty: the
/// digest alone failed, or there were no page CRCs to tell).
fn arrival_check(
    data: &[u8],
    digest: &Digest,
    theirs: &[u8],
    page_size: usize,
    without_page_crcs: bool,
) -> (Option<Vec<u8>>, Result<(), Vec<u32>>) {
    if without_page_crcs {
        let ok = hash(defaults::BLOCK_ALGORITHM, data).ct_eq(digest);
        return (None, if ok { Ok(()) } else { Err(Vec::new()) });
    }
    let (ours, pages) =
        intact_digest::hash_with_page_crcs(defaults::BLOCK_ALGORITHM, data, page_size);
    let bad = if theirs.is_empty() {
        Vec::new()
    } else if page_size == WIRE_PAGE {
        differing_pages(&pages, theirs)
    } else {
        differing_pages(&intact_digest::page_crc_blob(data, WIRE_PAGE), theirs)
    };
    let ok = ours.ct_eq(digest) && bad.is_empty();
    (Some(pages), if ok { Ok(()) } else { Err(bad) })
}

/// Writes a block's bytes at `offset`: all of them, or only the pages a
/// patch carried.
fn write_block(file: &File, b: &Block, offset: u64) -> std::io::Result<()> {
    if b.patch.is_empty() {
        return file.write_all_at(&b.data, offset);
    }
    for &p in &b.patch {
        let r = Block::page_range(b.data.len(), p);
        file.write_all_at(&b.data[r.clone()], offset + r.start as u64)?;
    }
    Ok(())
}

/// Puts the pages a patch did not carry back as they were in `before`.
fn keep_unpatched(b: &mut Block, before: &[u8]) {
    let len = b.data.len();
    let mut p = 0u32;
    for &carried in b.patch.iter().chain(std::iter::once(&u32::MAX)) {
        while p < carried && (p as usize) < Block::pages_of(len) {
            let r = Block::page_range(len, p);
            b.data[r.clone()].copy_from_slice(&before[r]);
            p += 1;
        }
        p = carried.saturating_add(1);
    }
}

/// Makes a patch whole: reads the block's `len` bytes as the partial file
/// holds them and puts the patch's pages in; `b.data` then holds the whole
/// block (and `b.patch` still names the pages that came).
fn merge_patch(f: &Incoming, b: &mut Block, offset: u64, len: usize) -> Result<(), TransferError> {
    if len > MAX_BLOCK {
        return Err(malformed("a patch of a block larger than a Block can be"));
    }
    let pages = Block::pages_of(len);
    if b.patch.last().is_some_and(|&p| p as usize >= pages) {
        return Err(malformed("a patched page past the end of the block"));
    }
    let carried: usize = b
        .patch
        .iter()
        .map(|&p| Block::page_range(len, p).len())
        .sum();
    if b.data.len() != carried {
        return Err(malformed("patch length does not match its pages"));
    }
    let partial = f.partial.as_ref().expect("blocks go to a partial file");
    let mut whole = vec![0; len];
    partial
        .file()
        .read_exact_at(&mut whole, offset)
        .map_err(f.path_err())?;
    let mut at = 0;
    for &p in &b.patch {
        let r = Block::page_range(len, p);
        let n = r.len();
        whole[r].copy_from_slice(&b.data[at..at + n]);
        at += n;
    }
    b.data = whole;
    Ok(())
}

/// At FileEnd: every block must have verified, and the file's verify
/// stage has its say (`sequential`, `file`: a whole-file re-read).
/// Returns the blocks that must be sent again.
pub(super) fn end_file(
    f: &mut Incoming,
    buf: &mut AlignedBuf,
    profile: &Profile,
) -> Result<Vec<u64>, TransferError> {
    let blocks = match &f.range {
        Some(r) => r.range.first..r.range.end,
        None => 0..f.verified.len() as u64,
    };
    let missing: Vec<u64> = blocks
        .filter(|&i| f.verified.get(i as usize) == Some(None))
        .collect();
    let Some(partial) = &f.partial else {
        // Held whole: every block was re-verified in place already.
        return Ok(missing);
    };
    // A range's modes have no end-of-file re-read (split.rs refuses the
    // others), and its slots start at its first block.
    if !missing.is_empty() || f.range.is_some() {
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
