//! Re-reading written blocks in batches, for the receiver's verifier
//! thread (`copy`'s and a server's) and its re-verification in place.
//!
//! A batch's writebacks are started together, then each block is evicted
//! and its read-back from the device requested, then each is read and
//! hashed: a batch of small files costs about one device round trip, not
//! two per file. Blocks without a device reader (block mode) are re-read
//! through the cache.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use intact_cache::{DeviceReader, ReadOutcome};
use intact_digest::{defaults, hash, AlignedBuf, Digest};
use intact_proto::WIRE_PAGE;

/// Bytes of blocks a verifier takes as one batch at most.
pub(crate) const BATCH_BYTES: usize = 8 << 20;

/// One written block to re-read.
pub(crate) struct Recheck<'a> {
    pub file: &'a File,
    /// Device-level modes: how to reach the device.
    pub reader: Option<&'a Mutex<DeviceReader>>,
    pub offset: u64,
    pub len: usize,
    pub digest: &'a Digest,
    /// The CRC-32C of each 4 KiB page the block should hold, if known: a
    /// failed re-read then names the pages that differ.
    pub crcs: Option<&'a [u8]>,
}

/// What re-reading one block found.
pub(crate) struct Rechecked {
    /// Whether it matched its digest (or why it could not be read).
    pub ok: std::io::Result<bool>,
    /// What the read did.
    pub outcome: ReadOutcome,
    /// Time spent reading and hashing, eviction excluded.
    pub took: Duration,
    /// A block that did not match, with page CRCs to compare: the pages
    /// whose CRC-32C differs (empty otherwise).
    pub bad_pages: Vec<u32>,
}

/// The pages (4 bytes of CRC each) where `ours` and `theirs` differ.
pub(crate) fn differing_pages(ours: &[u8], theirs: &[u8]) -> Vec<u32> {
    ours.chunks(4)
        .zip(theirs.chunks(4))
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .map(|(i, _)| i as u32)
        .collect()
}

fn lock(r: &Mutex<DeviceReader>) -> std::sync::MutexGuard<'_, DeviceReader> {
    r.lock().expect("no panics hold it")
}

/// Re-reads a batch of blocks and compares each with its digest.
pub(crate) fn recheck_batch(items: &[Recheck<'_>], buf: &mut AlignedBuf) -> Vec<Rechecked> {
    recheck_batch_seen(items, buf, |_, _| {})
}

/// [`recheck_batch`], showing `seen` the bytes each read returned (item
/// number, bytes), so that a caller can hash what this very read found.
pub(crate) fn recheck_batch_seen(
    items: &[Recheck<'_>],
    buf: &mut AlignedBuf,
    mut seen: impl FnMut(usize, &[u8]),
) -> Vec<Rechecked> {
    for c in items {
        if let Some(r) = c.reader {
            lock(r).begin(c.file, c.offset, c.len);
        }
    }
    let prepared: Vec<_> = items
        .iter()
        .map(|c| {
            c.reader
                .map(|r| lock(r).evict_then_prefetch(c.file, c.offset, c.len))
        })
        .collect();
    items
        .iter()
        .zip(prepared)
        .enumerate()
        .map(|(i, (c, p))| {
            if buf.len() < c.len {
                *buf = AlignedBuf::new(c.len);
            }
            let t = Instant::now();
            let read = match (c.reader, p) {
                (Some(r), Some(p)) => {
                    p.and_then(|p| lock(r).finish(c.file, c.offset, c.len, buf, p))
                }
                _ => c
                    .file
                    .read_exact_at(&mut buf[..c.len], c.offset)
                    .map(|()| ReadOutcome::default()),
            };
            match read {
                Ok(outcome) => {
                    let bytes = &buf[..c.len];
                    let ok = hash(defaults::BLOCK_ALGORITHM, bytes).ct_eq(c.digest);
                    let bad_pages = match c.crcs {
                        Some(theirs) if !ok => {
                            let ours = intact_digest::page_crc_blob(bytes, WIRE_PAGE);
                            differing_pages(&ours, theirs)
                        }
                        _ => Vec::new(),
                    };
                    let took = t.elapsed();
                    seen(i, bytes);
                    Rechecked {
                        ok: Ok(ok),
                        outcome,
                        took,
                        bad_pages,
                    }
                }
                Err(e) => Rechecked {
                    ok: Err(e),
                    outcome: ReadOutcome::default(),
                    took: t.elapsed(),
                    bad_pages: Vec::new(),
                },
            }
        })
        .collect()
}
