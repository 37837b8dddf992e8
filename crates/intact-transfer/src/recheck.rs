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
}

/// What re-reading one block found.
pub(crate) struct Rechecked {
    /// Whether it matched its digest (or why it could not be read).
    pub ok: std::io::Result<bool>,
    /// What the read did.
    pub outcome: ReadOutcome,
    /// Time spent reading and hashing, eviction excluded.
    pub took: Duration,
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
                    let ok = hash(defaults::BLOCK_ALGORITHM, &buf[..c.len]).ct_eq(c.digest);
                    let took = t.elapsed();
                    seen(i, &buf[..c.len]);
                    Rechecked {
                        ok: Ok(ok),
                        outcome,
                        took,
                    }
                }
                Err(e) => Rechecked {
                    ok: Err(e),
                    outcome: ReadOutcome::default(),
                    took: t.elapsed(),
                },
            }
        })
        .collect()
}
