//! Block digests fed from the program's own buffers.
//!
//! The catalog keeps each block's digest beside its page CRCs. A block a
//! program changed gets its new digest at fsync or close; computing it
//! means reading the block back from the file and hashing it. A program
//! that writes a block in order from its start (a sequential writer, or
//! `fio --bs=4m` at 4 MiB offsets, which FUSE hands over as four 1 MiB
//! writes in order) has already passed every byte of the block through
//! the mount: each write feeds the block's running hash, and a block whose
//! hash covers all of it at commit needs no read-back.
//!
//! A stream holds only bytes that are still the file's: it is fed only
//! after a write succeeded, only with the bytes that continue it exactly
//! where it stopped, and it is dropped when any other change reaches the
//! block (a write that does not continue it, a failed write, a truncate
//! below its end). Its digest is taken only when it covers the whole block
//! as the file now is. The page CRCs recorded with it come from the same
//! buffers, computed before the bytes were written (chaining); nothing
//! re-reads the file to compare, so a page changed beneath the mount
//! between the write and the commit is found by the next read of it or
//! the next scrub, not at the commit.

use std::collections::BTreeMap;

use intact_digest::{defaults, Digest, Hasher};
use intact_transfer::Layout;

/// Streams kept per file at most: blocks written past this many without a
/// commit are read back at commit as before (memory: one XXH3 state,
/// about 600 bytes, per stream).
pub const MAX_STREAMS: usize = 256;

/// The running hash of one block, from its start.
#[derive(Clone)]
struct Stream {
    /// Bytes of the block hashed so far, from its start.
    at: u64,
    hasher: Hasher,
}

/// The running block hashes of one file.
#[derive(Clone, Default)]
pub struct BlockStreams {
    map: BTreeMap<u64, Stream>,
}

impl std::fmt::Debug for BlockStreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.map.iter().map(|(b, s)| (b, s.at)))
            .finish()
    }
}

impl BlockStreams {
    /// After `data` was written at `offset` (successfully) with the file
    /// laid out as `layout`: continues each block's stream the write
    /// continues, starts one for each block the write begins at its start,
    /// and drops the stream of every other block it touched.
    pub fn wrote(&mut self, layout: &Layout, offset: u64, data: &[u8]) {
        let end = offset + data.len() as u64;
        if data.is_empty() || layout.block == 0 {
            return;
        }
        let (first, last) = (offset / layout.block, (end - 1) / layout.block);
        for b in first..=last {
            let start = b * layout.block;
            let lo = offset.max(start);
            let hi = end.min(start + layout.block);
            let piece = &data[(lo - offset) as usize..(hi - offset) as usize];
            match self.map.get_mut(&b) {
                Some(s) if s.at == lo - start => {
                    s.hasher.update(piece);
                    s.at = hi - start;
                }
                _ if lo == start => {
                    if self.map.len() >= MAX_STREAMS && !self.map.contains_key(&b) {
                        continue;
                    }
                    let mut hasher = Hasher::new(defaults::BLOCK_ALGORITHM);
                    hasher.update(piece);
                    self.map.insert(
                        b,
                        Stream {
                            at: hi - start,
                            hasher,
                        },
                    );
                }
                _ => {
                    self.map.remove(&b);
                }
            }
        }
    }

    /// Drops the streams of blocks `first..=last` (a change the streams
    /// did not see, such as a write that failed part way).
    pub fn forget(&mut self, first: u64, last: u64) {
        self.map.retain(|&b, _| b < first || b > last);
    }

    /// The file was cut or grown to `size`: drops every stream that
    /// hashed bytes at or past it. (A stream of a block grown with zeros
    /// no longer covers the whole block, so it gives no digest unless
    /// writes continue it over those zeros.)
    pub fn resized(&mut self, block: u64, size: u64) {
        self.map.retain(|&b, s| b * block + s.at <= size);
    }

    /// The digest of block `b` if its stream covers all of it as `layout`
    /// has it.
    pub fn digest(&self, layout: &Layout, b: u64) -> Option<Digest> {
        let s = self.map.get(&b)?;
        let len = layout.block_len(b);
        (len > 0 && s.at == len).then(|| s.hasher.clone().finalize())
    }

    /// After a commit: keeps only the stream of the file's last block
    /// (which a writer appending to the file continues); the others'
    /// blocks are in the catalog now.
    pub fn committed(&mut self, layout: &Layout) {
        let last = layout.blocks().checked_sub(1);
        self.map.retain(|&b, _| Some(b) == last);
    }

    /// How many streams are kept.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether none is kept.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use intact_digest::hash;

    fn layout(size: u64) -> Layout {
        Layout {
            size,
            block: 8192,
            page: 4096,
        }
    }

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    }

    #[test]
    fn in_order_writes_give_each_block_the_digest_of_its_bytes() {
        let data = bytes(20_000, 1);
        let mut s = BlockStreams::default();
        // Three writes, cut across block boundaries.
        for (a, b) in [(0, 5_000), (5_000, 12_000), (12_000, 20_000)] {
            s.wrote(&layout(b as u64), a as u64, &data[a..b]);
        }
        let l = layout(20_000);
        for b in 0..3u64 {
            let (lo, hi) = (b as usize * 8192, ((b as usize + 1) * 8192).min(20_000));
            let want = hash(defaults::BLOCK_ALGORITHM, &data[lo..hi]);
            assert_eq!(s.digest(&l, b), Some(want), "block {b}");
        }
    }

    #[test]
    fn a_write_that_does_not_continue_a_stream_drops_it() {
        let data = bytes(8192, 2);
        let mut s = BlockStreams::default();
        s.wrote(&layout(4096), 0, &data[..4096]);
        // Rewrites a byte already hashed.
        s.wrote(&layout(4096), 100, &data[100..200]);
        s.wrote(&layout(8192), 4096, &data[4096..]);
        assert_eq!(s.digest(&layout(8192), 0), None);
        // Leaves a gap.
        let mut s = BlockStreams::default();
        s.wrote(&layout(4096), 0, &data[..4096]);
        s.wrote(&layout(8192), 4097, &data[4097..]);
        assert_eq!(s.digest(&layout(8192), 0), None);
    }

    #[test]
    fn a_block_not_covered_whole_has_no_digest() {
        let data = bytes(8192, 3);
        let mut s = BlockStreams::default();
        s.wrote(&layout(8192), 0, &data[..4096]);
        // The file is longer than what the stream hashed.
        assert_eq!(s.digest(&layout(8192), 0), None);
        // A write that starts mid-block starts no stream.
        let mut s = BlockStreams::default();
        s.wrote(&layout(8192), 10, &data[10..]);
        assert_eq!(s.digest(&layout(8192), 0), None);
    }

    #[test]
    fn a_cut_below_a_stream_drops_it_and_growth_leaves_it_short() {
        let data = bytes(8192, 4);
        let mut s = BlockStreams::default();
        s.wrote(&layout(8192), 0, &data);
        s.resized(8192, 8000);
        assert!(s.is_empty());
        let mut s = BlockStreams::default();
        s.wrote(&layout(6000), 0, &data[..6000]);
        s.resized(8192, 8192);
        assert_eq!(s.digest(&layout(8192), 0), None, "grown with zeros");
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn streams_are_bounded() {
        let mut s = BlockStreams::default();
        let page = bytes(4096, 5);
        let n = MAX_STREAMS as u64 + 10;
        for b in 0..n {
            s.wrote(&layout((b + 1) * 8192), b * 8192, &page);
        }
        assert_eq!(s.len(), MAX_STREAMS);
    }
}
