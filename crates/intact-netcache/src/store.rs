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
//!
//! In memory ([`Store::new`]) or in a directory ([`Store::on_disk`],
//! `intact cache --store DIR`): one file per block, named by its key in
//! hex, written under a temporary name and renamed; the index (and the use
//! order) is in memory, rebuilt from the directory at start (oldest
//! modification first). A block read back from the disk is hashed again:
//! one that no longer matches its name is removed and counted, never
//! served.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// What one entry costs besides its bytes (its key, its places in the
/// two maps), counted against the bound so that many tiny blocks cannot
/// outgrow it.
pub const ENTRY_COST: u64 = 128;

/// A block's key: the BLAKE3 of its bytes.
pub type Key = [u8; 32];

/// Where a block's bytes are.
#[derive(Clone)]
enum Body {
    Memory(Arc<[u8]>),
    /// In the store's directory, this many bytes.
    Disk(u64),
}

impl Body {
    fn len(&self) -> u64 {
        match self {
            Body::Memory(d) => d.len() as u64,
            Body::Disk(n) => *n,
        }
    }
}

/// (bytes, last use, holds, generation).
type Entry = (Body, u64, u32, u64);

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
    bad_on_disk: u64,
}

/// A bounded, content-addressed block store shared by the capture (or
/// relay) and the service that answers receivers.
pub struct Store {
    bound: u64,
    inner: Mutex<Inner>,
    dir: Option<PathBuf>,
}

/// The store's counters.
#[derive(Debug, Clone, Default, serde::Serialize, PartialEq, Eq)]
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
    /// Blocks read back from the disk that no longer matched their key
    /// (removed, not served).
    pub bad_on_disk: u64,
    /// The directory blocks are kept in (None: memory).
    pub dir: Option<PathBuf>,
}

impl Store {
    /// An empty store holding at most `bound` bytes in memory.
    pub fn new(bound: u64) -> Store {
        Store {
            bound,
            inner: Mutex::new(Inner::default()),
            dir: None,
        }
    }

    /// A store of at most `bound` bytes in the directory `dir` (made if
    /// missing, mode 700), with the blocks an earlier run left there.
    pub fn on_disk(dir: &Path, bound: u64) -> io::Result<Store> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let mut found = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(".tmp-") {
                let _ = std::fs::remove_file(e.path());
                continue;
            }
            let Some(key) = key_of(&name) else { continue };
            let m = e.metadata()?;
            if !m.is_file() || m.len() == 0 || m.len() > intact_proto::MAX_BLOCK as u64 {
                continue;
            }
            found.push((m.modified().ok(), key, m.len()));
        }
        found.sort();
        let store = Store {
            bound,
            inner: Mutex::new(Inner::default()),
            dir: Some(dir.to_path_buf()),
        };
        let mut gone = Vec::new();
        {
            let mut g = store.lock();
            for (_, key, len) in found {
                gone.extend(store.place(&mut g, key, Body::Disk(len), false));
            }
        }
        store.remove_files(gone);
        Ok(store)
    }

    fn path(&self, key: &Key) -> Option<PathBuf> {
        self.dir
            .as_ref()
            .map(|d| d.join(blake3::Hash::from_bytes(*key).to_hex().as_str()))
    }

    fn remove_files(&self, keys: Vec<Key>) {
        for k in keys {
            if let Some(p) = self.path(&k) {
                let _ = std::fs::remove_file(p);
            }
        }
    }

    /// Makes room for and records a new entry; the keys evicted (whose
    /// files the caller removes, outside the lock).
    fn place(&self, g: &mut Inner, key: Key, body: Body, hold: bool) -> Vec<Key> {
        let cost = body.len() + ENTRY_COST;
        let mut gone = Vec::new();
        while g.bytes + cost > self.bound {
            let Some((_, oldest)) = g.order.pop_first() else {
                break;
            };
            if let Some((d, _, _, _)) = g.blocks.remove(&oldest) {
                g.bytes -= d.len() + ENTRY_COST;
                g.evicted += 1;
                gone.push(oldest);
            }
        }
        g.tick += 1;
        let tick = g.tick;
        g.blocks.insert(key, (body, tick, u32::from(hold), tick));
        g.order.insert(tick, key);
        g.bytes += cost;
        gone
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `data` under `key` (the caller checked that `key` is its
    /// BLAKE3), with one more hold if `hold`. The entry's generation (for
    /// [`Store::release`]), or None if it can never fit (or, on disk, could
    /// not be written).
    pub fn insert(&self, key: Key, data: Arc<[u8]>, hold: bool) -> Option<u64> {
        let cost = data.len() as u64 + ENTRY_COST;
        if cost > self.bound {
            return None;
        }
        {
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
        }
        let body = match self.path(&key) {
            None => Body::Memory(data),
            Some(path) => {
                // Whole or not at all: a temporary name, then the key's.
                let tmp = path.with_file_name(format!(
                    ".tmp-{}-{}",
                    std::process::id(),
                    blake3::Hash::from_bytes(key).to_hex()
                ));
                let written =
                    std::fs::write(&tmp, &data).and_then(|()| std::fs::rename(&tmp, &path));
                if written.is_err() {
                    let _ = std::fs::remove_file(&tmp);
                    return None;
                }
                Body::Disk(data.len() as u64)
            }
        };
        let (gen, gone) = {
            let mut g = self.lock();
            let g = &mut *g;
            if let Some((_, _, holders, gen)) = g.blocks.get_mut(&key) {
                // Another insert of the same bytes came first.
                *holders = holders.saturating_add(u32::from(hold));
                (*gen, Vec::new())
            } else {
                let gone = self.place(g, key, body, hold);
                (g.tick, gone)
            }
        };
        self.remove_files(gone);
        Some(gen)
    }

    /// The block under `key`, now the most recently used. On disk, read
    /// back and hashed again: a block that no longer matches its key is
    /// removed and counted, not returned.
    pub fn get(&self, key: &Key) -> Option<Arc<[u8]>> {
        let (body, gen) = {
            let mut g = self.lock();
            let g = &mut *g;
            g.tick += 1;
            let tick = g.tick;
            let (body, used, _, gen) = g.blocks.get_mut(key)?;
            let was = std::mem::replace(used, tick);
            let out = (body.clone(), *gen);
            g.order.remove(&was);
            g.order.insert(tick, *key);
            out
        };
        let len = match body {
            Body::Memory(d) => return Some(d),
            Body::Disk(len) => len,
        };
        let path = self.path(key)?;
        match std::fs::read(&path) {
            Ok(d) if d.len() as u64 == len && blake3::hash(&d).as_bytes() == key => Some(d.into()),
            _ => {
                let mut g = self.lock();
                if g.blocks.get(key).is_some_and(|e| e.3 == gen) {
                    if let Some((b, tick, _, _)) = g.blocks.remove(key) {
                        g.order.remove(&tick);
                        g.bytes -= b.len() + ENTRY_COST;
                    }
                    g.bad_on_disk += 1;
                    drop(g);
                    let _ = std::fs::remove_file(&path);
                }
                None
            }
        }
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
                g.bytes -= d.len() + ENTRY_COST;
                g.dropped += 1;
                if matches!(d, Body::Disk(_)) {
                    if let Some(p) = self.path(key) {
                        let _ = std::fs::remove_file(p);
                    }
                }
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
            bad_on_disk: g.bad_on_disk,
            dir: self.dir.clone(),
        }
    }
}

/// The key a file of the store is named by (64 hex digits), if it is one.
fn key_of(name: &str) -> Option<Key> {
    if name.len() != 64 {
        return None;
    }
    blake3::Hash::from_hex(name).ok().map(|h| *h.as_bytes())
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
    fn on_disk_blocks_survive_a_restart_and_a_rotten_one_is_never_served() {
        let dir = tempfile::tempdir().unwrap();
        let b: Vec<_> = (0..3).map(|n| block(n, 5000)).collect();
        {
            let s = Store::on_disk(dir.path(), 1 << 20).unwrap();
            for (k, d) in &b {
                assert!(s.insert(*k, d.clone(), true).is_some());
            }
            assert_eq!(s.get(&b[1].0).as_deref(), Some(&b[1].1[..]));
        }
        // A half-written block of a run that died, and a flipped bit.
        std::fs::write(dir.path().join(".tmp-1-x"), b"half").unwrap();
        let rotten = dir
            .path()
            .join(blake3::Hash::from_bytes(b[2].0).to_hex().as_str());
        let mut bytes = std::fs::read(&rotten).unwrap();
        bytes[77] ^= 1;
        std::fs::write(&rotten, bytes).unwrap();
        let s = Store::on_disk(dir.path(), 1 << 20).unwrap();
        assert_eq!(s.stats().blocks, 3, "the blocks another run kept");
        assert!(!dir.path().join(".tmp-1-x").exists());
        assert_eq!(s.get(&b[0].0).as_deref(), Some(&b[0].1[..]));
        assert!(
            s.get(&b[2].0).is_none(),
            "a block that no longer matches its key"
        );
        assert_eq!(s.stats().bad_on_disk, 1);
        assert!(!rotten.exists());
    }

    #[test]
    fn on_disk_the_bound_holds_and_dropped_blocks_leave_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::on_disk(dir.path(), 2 * (5000 + ENTRY_COST)).unwrap();
        let mut gens = Vec::new();
        for n in 0..5 {
            let (k, d) = block(n, 5000);
            gens.push((k, s.insert(k, d, true).unwrap()));
        }
        let files = || std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!((s.stats().blocks, files()), (2, 2));
        let (k, gen) = gens[4];
        s.release(&k, gen, true);
        assert_eq!((s.stats().blocks, files()), (1, 1));
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
