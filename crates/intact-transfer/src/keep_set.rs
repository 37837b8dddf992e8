//! The paths a `--delete` keeps, as a server holds them for a client:
//! each path's XXH3-128, not its bytes, so what one path costs the server
//! does not depend on how long the client made it.
//!
//! Two different paths with one hash would keep an entry the source no
//! longer has (never remove one it has): the safe way to be wrong, and at
//! 10 million paths a chance of about 10^-25. The set itself hashes with
//! std's keyed SipHash, so a client cannot choose paths that collide in
//! its buckets.

use std::collections::HashSet;

/// Heap bytes one kept path may take: 16 for its hash and 1 of control in
/// a table at most 7/8 full, doubled for a table just grown (and its old
/// table while it grows). What a server charges to the client's share of
/// its memory for each path (see [`crate::net::Shares`]).
pub const KEEP_PATH_COST: u64 = 40;

/// A set of relative paths, by hash.
#[derive(Debug, Default)]
pub struct KeepSet(HashSet<u128>);

impl KeepSet {
    /// Adds `path`.
    pub fn insert(&mut self, path: &[u8]) {
        self.0.insert(hash(path));
    }

    /// Paths held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no path is held.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn hash(path: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(path)
}

/// What [`crate::prune`] asks of a keep list: whether the source has a
/// path.
pub trait Keeps {
    /// Whether `path` (relative, '/'-separated) is kept.
    fn keeps(&self, path: &[u8]) -> bool;
}

impl Keeps for KeepSet {
    fn keeps(&self, path: &[u8]) -> bool {
        self.0.contains(&hash(path))
    }
}

impl Keeps for HashSet<Vec<u8>> {
    fn keeps(&self, path: &[u8]) -> bool {
        self.contains(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_paths_are_found_and_others_are_not() {
        let mut k = KeepSet::default();
        for p in [&b"a"[..], b"d/x.bin", b"", b"d"] {
            k.insert(p);
        }
        k.insert(b"a");
        assert_eq!(k.len(), 4);
        assert!(k.keeps(b"d/x.bin") && k.keeps(b"") && k.keeps(b"d"));
        assert!(!k.keeps(b"d/y.bin") && !k.keeps(b"A") && !k.keeps(b"d/"));
    }
}
