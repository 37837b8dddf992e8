//! The cache's store: blocks kept by their BLAKE3, within a byte bound,
//! the least recently used evicted first.
//!
//! A block enters only after its bytes were hashed and found equal to the
//! digest that came with them, so a key always names its bytes. Blocks of
//! the same bytes carried by several connections are one entry, held by
//! each of them: a connection whose receiver verified the file lets go of
//! its hold, and the block goes only when no connection holds it (or the
//! bound evicts it). The bound
//! counts block bytes (plus a fixed cost per entry, [`ENTRY_COST`]); a
//! block larger than the whole bound is refused rather than emptying the
//! store for it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// What one entry costs besides its bytes (its key, its places in the
/// two maps), counted against the bound so that many tiny blocks cannot
/// outgrow it.
pub const ENTRY_COST: u64 = 128;

/// A block's key: the BLAKE3 of its bytes.
pub type Key = [u8; 32];

/// (bytes, last use, holds, generation).
type Entry = (Arc<[u8]>, u64, u32, u64);

#[derive(Default)]
struct Inner {
    /// Key → (bytes, last use, connections holding it, generation: the
    /// tick the entry was made at, so that a hold on an evicted entry
    /// never counts against a newer one of the same key).
    blocks: HashMap<Key, Entry>,
    /// Use order: tick → key.
    order: BTreeMap<u64, Key>,
    tick: u64,
    bytes: u64,
    evicted: u64,
    dropped: u64,
}

/// A bounded, content-addressed block store shared by the capture (or
/// relay) and the service that answers receivers.
pub struct Store {
    bound: u64,
    inner: Mutex<Inner>,
}

/// The store's counters.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, PartialEq, Eq)]
pub struct StoreStats {
    /// Blocks held now.
    pub blocks: u64,
    /// Bytes they cost against the bound (their bytes and [`ENTRY_COST`] each).
    pub bytes: u64,
    /// The bound.
    pub bound: u64,
    /// Blocks evicted to stay within the bound.
    pub evicted: u64,
    /// Blocks dropped because the receiver said their file was verified.
    pub dropped: u64,
}

impl Store {
    /// An empty store holding at most `bound` bytes.
    pub fn new(bound: u64) -> Store {
        Store {
            bound,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `data` under `key` (the caller checked that `key` is its
    /// BLAKE3), with one more hold if `hold`. The entry's generation (for
    /// [`Store::release`]), or None if it can never fit.
    pub fn insert(&self, key: Key, data: Arc<[u8]>, hold: bool) -> Option<u64> {
        let cost = data.len() as u64 + ENTRY_COST;
        if cost > self.bound {
            return None;
        }
        let mut g = self.lock();
        let g = &mut *g;
        g.tick += 1;
        let tick = g.tick;
        if let Some((_, old, holders, gen)) = g.blocks.get_mut(&key) {
            *holders = holders.saturating_add(u32::from(hold));
            let gen = *gen;
            let was = std::mem::replace(old, tick);
            g.order.remove(&was);
            g.order.insert(tick, key);
            return Some(gen);
        }
        while g.bytes + cost > self.bound {
            let Some((_, oldest)) = g.order.pop_first() else {
                break;
            };
            if let Some((d, _, _, _)) = g.blocks.remove(&oldest) {
                g.bytes -= d.len() as u64 + ENTRY_COST;
                g.evicted += 1;
            }
        }
        g.blocks.insert(key, (data, tick, u32::from(hold), tick));
        g.order.insert(tick, key);
        g.bytes += cost;
        Some(tick)
    }

    /// The block under `key`, now the most recently used.
    pub fn get(&self, key: &Key) -> Option<Arc<[u8]>> {
        let mut g = self.lock();
        let g = &mut *g;
        g.tick += 1;
        let tick = g.tick;
        let (data, used, _, _) = g.blocks.get_mut(key)?;
        let was = std::mem::replace(used, tick);
        let data = Arc::clone(data);
        g.order.remove(&was);
        g.order.insert(tick, *key);
        Some(data)
    }

    /// Lets go of one hold on generation `gen` of the block under `key`
    /// (a connection's receiver verified its file); with `drop`, the block
    /// goes with the last hold (else it stays for eviction: a failed file
    /// may be sent again). A hold on an evicted generation does nothing.
    pub fn release(&self, key: &Key, gen: u64, drop: bool) {
        let mut g = self.lock();
        let g = &mut *g;
        let Some((_, _, holders, made)) = g.blocks.get_mut(key) else {
            return;
        };
        if *made != gen {
            return;
        }
        *holders = holders.saturating_sub(1);
        if *holders == 0 && drop {
            if let Some((d, tick, _, _)) = g.blocks.remove(key) {
                g.order.remove(&tick);
                g.bytes -= d.len() as u64 + ENTRY_COST;
                g.dropped += 1;
            }
        }
    }

    /// Counters now.
    pub fn stats(&self) -> StoreStats {
        let g = self.lock();
        StoreStats {
            blocks: g.blocks.len() as u64,
            bytes: g.bytes,
            bound: self.bound,
            evicted: g.evicted,
            dropped: g.dropped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(n: u8, len: usize) -> (Key, Arc<[u8]>) {
        let data: Arc<[u8]> = vec![n; len].into();
        (*blake3::hash(&data).as_bytes(), data)
    }

    #[test]
    fn the_least_recently_used_goes_first_and_the_bound_holds() {
        let s = Store::new(3 * (1000 + ENTRY_COST));
        let b: Vec<_> = (0..4).map(|n| block(n, 1000)).collect();
        for (k, d) in &b[..3] {
            assert!(s.insert(*k, d.clone(), true).is_some());
        }
        assert!(s.get(&b[0].0).is_some());
        assert!(s.insert(b[3].0, b[3].1.clone(), true).is_some());
        assert!(
            s.get(&b[1].0).is_none(),
            "the least recently used was evicted"
        );
        assert!(s.get(&b[0].0).is_some() && s.get(&b[2].0).is_some());
        let st = s.stats();
        assert_eq!((st.blocks, st.evicted), (3, 1));
        assert!(st.bytes <= st.bound);
        // Held twice: the first release keeps it.
        let gen = s.insert(b[0].0, b[0].1.clone(), true).unwrap();
        s.release(&b[0].0, gen, true);
        assert!(s.get(&b[0].0).is_some());
        s.release(&b[0].0, gen + 1, true);
        assert!(
            s.get(&b[0].0).is_some(),
            "another generation's hold does nothing"
        );
        s.release(&b[0].0, gen, true);
        assert_eq!(s.stats().dropped, 1);
        assert!(s.get(&b[0].0).is_none());
    }

    #[test]
    fn a_hold_on_an_evicted_block_never_drops_a_newer_copy() {
        let s = Store::new(2 * (1000 + ENTRY_COST));
        let (k, d) = block(1, 1000);
        let old = s.insert(k, d.clone(), true).unwrap();
        // Pushed out by two others, then carried again by another connection.
        for n in 2..4 {
            let (k2, d2) = block(n, 1000);
            s.insert(k2, d2, true).unwrap();
        }
        assert!(s.get(&k).is_none());
        let new = s.insert(k, d, true).unwrap();
        assert_ne!(old, new);
        s.release(&k, old, true);
        assert!(
            s.get(&k).is_some(),
            "the first connection's release is of a block gone"
        );
        s.release(&k, new, true);
        assert!(s.get(&k).is_none());
    }

    #[test]
    fn a_block_larger_than_the_bound_is_refused_and_evicts_nothing() {
        let s = Store::new(2000);
        let (k, d) = block(1, 500);
        assert!(s.insert(k, d, true).is_some());
        let (k2, d2) = block(2, 5000);
        assert!(s.insert(k2, d2, true).is_none());
        assert!(s.get(&k).is_some());
    }
}
