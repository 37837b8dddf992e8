//! Re-reading written blocks in batches, for the receiver's verifier
//! thread (`copy`'s and a server's) and its re-verification in place.
//!
//! A batch's writebacks are started together, then each block is evicted
//! and its read-back from the device requested, then each is read and
//! hashed: a batch of small files costs about one device round trip, not
//! two per file. Blocks without a device reader (block mode) are re-read
//! through the cache. The reads and checks of a batch are shared among the
//! receiver's verifier threads ([`Verifiers`], `--verifiers N`), blocks of
//! one file among them.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use intact_cache::{DeviceReader, Prepared, ReadOutcome};
use intact_digest::{defaults, hash, AlignedBuf, Digest};
use intact_proto::WIRE_PAGE;
use rayon::prelude::*;

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

/// Re-reads a batch of blocks and compares each with its digest, the
/// reads and checks shared among `verifiers`.
pub(crate) fn recheck_batch(
    items: &[Recheck<'_>],
    buf: &mut AlignedBuf,
    verifiers: &Verifiers,
) -> Vec<Rechecked> {
    let prepared = prepare(items);
    match verifiers.pool() {
        Some(pool) if items.len() > 1 => pool.install(|| {
            items
                .par_iter()
                .zip(prepared)
                .map_init(
                    || AlignedBuf::new(0),
                    |buf, (c, p)| {
                        if rayon::current_thread_index().is_some() {
                            verifiers.on_pool.fetch_add(1, Ordering::Relaxed);
                        }
                        finish_one(c, p, buf, |_| {})
                    },
                )
                .collect()
        }),
        _ => items
            .iter()
            .zip(prepared)
            .map(|(c, p)| finish_one(c, p, buf, |_| {}))
            .collect(),
    }
}

/// As [`recheck_batch`] on the calling thread, showing `seen` the bytes
/// each read returned (item number, bytes), so that a caller can hash
/// what this very read found.
pub(crate) fn recheck_batch_seen(
    items: &[Recheck<'_>],
    buf: &mut AlignedBuf,
    mut seen: impl FnMut(usize, &[u8]),
) -> Vec<Rechecked> {
    let prepared = prepare(items);
    items
        .iter()
        .zip(prepared)
        .enumerate()
        .map(|(i, (c, p))| finish_one(c, p, buf, |bytes| seen(i, bytes)))
        .collect()
}

/// Steps 1 and 2 for the whole batch: every writeback started, then each
/// block evicted and its read from the device requested.
fn prepare(items: &[Recheck<'_>]) -> Vec<Option<std::io::Result<Prepared>>> {
    for c in items {
        if let Some(r) = c.reader {
            lock(r).begin(c.file, c.offset, c.len);
        }
    }
    items
        .iter()
        .map(|c| {
            c.reader
                .map(|r| lock(r).evict_then_prefetch(c.file, c.offset, c.len))
        })
        .collect()
}

/// Step 3 for one block: the read (without its reader's lock where the
/// reader is not needed, so that blocks of one file are read at once on
/// several verifiers), the digest, and on a mismatch the bad pages.
fn finish_one(
    c: &Recheck<'_>,
    p: Option<std::io::Result<Prepared>>,
    buf: &mut AlignedBuf,
    seen: impl FnOnce(&[u8]),
) -> Rechecked {
    if buf.len() < c.len {
        *buf = AlignedBuf::new(c.len);
    }
    let t = Instant::now();
    let read = match (c.reader, p) {
        (Some(r), Some(p)) => p.and_then(|p| match p.read(c.file, c.offset, c.len, buf) {
            Ok(read) => read,
            Err(p) => lock(r).finish(c.file, c.offset, c.len, buf, p),
        }),
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
            seen(bytes);
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
}

/// The verifier threads a receiver's re-reads share (`--verifiers N`): one
/// pool for every session of a server or a copy, started on first use.
/// With one thread, batches are read on the session's own verifier thread.
#[derive(Clone)]
pub struct Verifiers {
    threads: usize,
    pool: Arc<OnceLock<Option<rayon::ThreadPool>>>,
    /// Blocks re-read on a thread of the pool.
    on_pool: Arc<AtomicU64>,
}

impl Verifiers {
    /// `threads` verifiers (at least 1).
    pub fn new(threads: usize) -> Verifiers {
        Verifiers {
            threads: threads.max(1),
            pool: Arc::default(),
            on_pool: Arc::default(),
        }
    }

    /// Blocks re-read so far on a thread of the pool (rayon's own word
    /// that the thread is one of its workers).
    pub fn reads_on_pool(&self) -> u64 {
        self.on_pool.load(Ordering::Relaxed)
    }

    /// How many verifiers re-read at once.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The pool, where there is more than one verifier (None also where
    /// the threads could not be started: the batch is then read on the
    /// calling thread, which is slower but the same check).
    fn pool(&self) -> Option<&rayon::ThreadPool> {
        if self.threads <= 1 {
            return None;
        }
        self.pool
            .get_or_init(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(self.threads)
                    .thread_name(|i| format!("intact-verify-{i}"))
                    .build()
                    .ok()
            })
            .as_ref()
    }
}

impl Default for Verifiers {
    /// One verifier per core.
    fn default() -> Verifiers {
        Verifiers::new(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

impl std::fmt::Debug for Verifiers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifiers")
            .field("threads", &self.threads)
            .finish()
    }
}
