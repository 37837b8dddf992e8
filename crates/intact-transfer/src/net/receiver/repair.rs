//! Repairs from recovery caches (`intact serve --recovery-cache`).
//!
//! A block that fails its check (its bytes on arrival, or the re-read of
//! what was written) is asked first of the caches, by the BLAKE3 its
//! sender sent beside it over this session's authenticated channel. A
//! cache's answer is taken only if it hashes to that BLAKE3 (checked by
//! [`intact_netcache::RecoveryCaches::fetch`]); it then goes through the
//! same path as a block from the sender, checked against its digest,
//! written and verified at the mode's level, so a repair reaches exactly
//! the level a resend would. Each block is asked of the caches once: if
//! the cache's copy fails too, or no cache holds it, the sender is asked,
//! as without a cache.
//!
//! Only blocks whose check is still open are remembered (the BLAKE3, the
//! digests and CRCs a repaired block needs), so memory follows the
//! blocks in flight, not the file. Blocks found bad only by a whole-file
//! re-read at the file's end (`--verify file`) are asked of the sender.

use std::collections::HashMap;
use std::time::Instant;

use intact_proto::{Block, STRONG_LEN};

use super::session::Session;
use crate::TransferError;

/// What a cache repair of one block needs, kept while its check is open.
pub(super) struct Repairable {
    strong: [u8; STRONG_LEN],
    digest: Vec<u8>,
    crcs: Vec<u8>,
    source_level: u8,
    /// The caches were asked already.
    tried: bool,
}

/// One file's repairs.
#[derive(Default)]
pub(super) struct Repairs {
    open: HashMap<u64, Repairable>,
    /// Blocks that failed and are not yet verified: when they first
    /// failed, and whether the copy now on its way came from a cache.
    failed: HashMap<u64, (Instant, bool)>,
    /// Blocks repaired from a cache, and microseconds from their failure
    /// to their verified repair.
    pub(super) from_cache: u64,
    pub(super) cache_micros: u64,
    /// The same for blocks repaired by the sender.
    pub(super) from_source: u64,
    pub(super) source_micros: u64,
}

impl Repairs {
    /// A block came (from the sender or a cache): remember what a cache
    /// repair of it needs (with a recovery cache only).
    pub(super) fn arrived(&mut self, b: &Block) {
        if !b.patch.is_empty() {
            return;
        }
        if let Ok(strong) = <[u8; STRONG_LEN]>::try_from(&b.strong[..]) {
            let tried = self.open.get(&b.index).is_some_and(|r| r.tried);
            self.open.insert(
                b.index,
                Repairable {
                    strong,
                    digest: b.digest.clone(),
                    crcs: b.crcs.clone(),
                    source_level: b.source_level,
                    tried,
                },
            );
        }
    }

    /// The block verified: nothing more to remember; a repair is timed
    /// from its failure and counted by where it came from.
    pub(super) fn settled(&mut self, index: u64) {
        self.open.remove(&index);
        if let Some((at, cache)) = self.failed.remove(&index) {
            let took = at.elapsed().as_micros() as u64;
            if cache {
                self.from_cache += 1;
                self.cache_micros += took;
            } else {
                self.from_source += 1;
                self.source_micros += took;
            }
        }
    }

    /// The block failed a check: its repair is timed from the first failure.
    pub(super) fn failed(&mut self, index: u64) {
        self.failed.entry(index).or_insert((Instant::now(), false));
    }

    /// Where the copy of the block now on its way comes from.
    fn coming_from_cache(&mut self, index: u64, cache: bool) {
        if let Some((_, c)) = self.failed.get_mut(&index) {
            *c = cache;
        }
    }

    /// The sender is asked for the block again.
    pub(super) fn asked_source(&mut self, index: u64) {
        self.coming_from_cache(index, false);
    }
}

impl Session<'_> {
    /// Tries the caches for block `index` of `file`, which just failed;
    /// true if a cache's copy was taken (and has gone to be checked).
    pub(super) fn repair_from_cache(
        &mut self,
        file: u64,
        index: u64,
    ) -> Result<bool, TransferError> {
        let Some(caches) = self.opts.recovery.as_ref() else {
            return Ok(false);
        };
        let Some(f) = self.files.get_mut(&file) else {
            return Ok(false);
        };
        let Some(r) = f.repairs.open.get_mut(&index).filter(|r| !r.tried) else {
            return Ok(false);
        };
        r.tried = true;
        let bs = u64::from(f.entry.block_size);
        let len = f.entry.size.saturating_sub(index * bs).min(bs) as usize;
        let t = Instant::now();
        // Bounded by the request's deadline (see `RecoveryCaches::fetch`).
        let got = caches.fetch(&r.strong, len);
        self.summary.cache_ask_micros += t.elapsed().as_micros() as u64;
        match got {
            Ok(rec) => {
                let b = Block {
                    file,
                    index,
                    source_level: r.source_level,
                    digest: r.digest.clone(),
                    crcs: r.crcs.clone(),
                    patch: Vec::new(),
                    strong: r.strong.to_vec(),
                    data: rec.data,
                };
                f.repairs.coming_from_cache(index, true);
                self.take_block(b, true)?;
                if self.sender_waiting && self.deferred_out > 0 {
                    // `flash`: the sender blocks on this repair's result,
                    // which must not wait out the idle drain.
                    self.jobs
                        .send(super::Job::Drain)
                        .map_err(|_| intact_proto::ProtoError::Closed)?;
                }
                Ok(true)
            }
            Err(_) => {
                self.summary.cache_misses += 1;
                Ok(false)
            }
        }
    }
}
