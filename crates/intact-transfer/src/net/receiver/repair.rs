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
    /// When the sender was asked for it again.
    asked_source: Option<Instant>,
}

/// One file's repairs.
#[derive(Default)]
pub(super) struct Repairs {
    open: HashMap<u64, Repairable>,
    /// Blocks repaired from a cache.
    pub(super) from_cache: u64,
    /// Microseconds spent asking caches.
    pub(super) cache_micros: u64,
}

impl Repairs {
    /// A block came (from the sender or a cache): remember what a repair
    /// needs, and time a resend the sender was asked for.
    pub(super) fn arrived(&mut self, b: &Block) -> Option<std::time::Duration> {
        let waited = self
            .open
            .get_mut(&b.index)
            .and_then(|r| r.asked_source.take())
            .map(|t| t.elapsed());
        if b.patch.is_empty() {
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
                        asked_source: None,
                    },
                );
            }
        }
        waited
    }

    /// The block verified: nothing more to remember.
    pub(super) fn settled(&mut self, index: u64) {
        self.open.remove(&index);
    }

    /// The sender is asked for the block again.
    pub(super) fn asked_source(&mut self, index: u64) {
        if let Some(r) = self.open.get_mut(&index) {
            r.asked_source = Some(Instant::now());
        }
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
        let got = {
            let _working = self.opts.working.now();
            caches.fetch(&r.strong, len)
        };
        let took = t.elapsed().as_micros() as u64;
        f.repairs.cache_micros += took;
        self.summary.cache_micros += took;
        match got {
            Ok(rec) => {
                f.repairs.from_cache += 1;
                self.summary.cache_repairs += 1;
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
                self.take_block(b, true)?;
                Ok(true)
            }
            Err(_) => {
                self.summary.cache_misses += 1;
                Ok(false)
            }
        }
    }
}
