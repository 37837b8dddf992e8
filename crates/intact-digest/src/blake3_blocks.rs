//! A file's BLAKE3 assembled from its blocks, in any order, each block
//! replaceable: BLAKE3 is a tree, and a block of a power-of-two size at a
//! multiple of that size is a whole subtree whose chaining value can be
//! computed alone and merged later (blake3's `hazmat`). A sender that
//! resends one block of a large file then needs to hash that block again,
//! not the file.

use blake3::hazmat::{
    left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode,
};

/// BLAKE3's chunk size: the smallest subtree, in bytes.
const CHUNK: u64 = 1024;

/// Per-block parts of one file's BLAKE3.
#[derive(Debug, Clone)]
pub struct Blake3Blocks {
    len: u64,
    block: u64,
    /// Blocks of the file.
    count: usize,
    /// The first block with a part: 0, or a range's first block.
    first: usize,
    /// Per block set so far (from block `first` up to the highest one
    /// set): its chaining value (the file's root hash when the file is a
    /// single block). Grown as blocks are set, so an announced size costs
    /// nothing.
    parts: Vec<Option<[u8; 32]>>,
}

impl Blake3Blocks {
    /// Parts for a file of `len` bytes cut into blocks of `block` bytes;
    /// None unless `block` is a power of two of at least 1 KiB (only then is
    /// every block a BLAKE3 subtree).
    pub fn new(len: u64, block: u64) -> Option<Blake3Blocks> {
        if !block.is_power_of_two() || block < CHUNK {
            return None;
        }
        Some(Blake3Blocks {
            len,
            block,
            count: len.div_ceil(block) as usize,
            first: 0,
            parts: Vec::new(),
        })
    }

    /// As [`Blake3Blocks::new`], keeping parts for blocks from `first`
    /// on only (one range of a split file): blocks before it are ignored,
    /// and so the file's BLAKE3 is never complete; [`Blake3Blocks::range_cvs`]
    /// gives the range's chaining values.
    pub fn new_from(len: u64, block: u64, first: u64) -> Option<Blake3Blocks> {
        let mut b = Blake3Blocks::new(len, block)?;
        b.first = usize::try_from(first).ok()?;
        Some(b)
    }

    /// Sets (or replaces) block `index` to `bytes`.
    pub fn set(&mut self, index: u64, bytes: &[u8]) {
        let index = index as usize;
        if index >= self.count || index < self.first {
            return;
        }
        let part = if self.count == 1 {
            *blake3::hash(bytes).as_bytes()
        } else {
            let mut h = blake3::Hasher::new();
            h.set_input_offset(index as u64 * self.block);
            h.update(bytes);
            h.finalize_non_root()
        };
        let at = index - self.first;
        if at >= self.parts.len() {
            self.parts.resize(at + 1, None);
        }
        self.parts[at] = Some(part);
    }

    /// The chaining values of blocks `first..end`, once each is set; None
    /// otherwise, and for a file of one block (whose part is its root
    /// hash, not a chaining value) or a range past the file's end. A split
    /// file's range digest is made from these (see
    /// `intact_proto::range_digest`).
    pub fn range_cvs(&self, first: u64, end: u64) -> Option<Vec<[u8; 32]>> {
        if self.count < 2 || first >= end || end > self.count as u64 {
            return None;
        }
        (first..end).map(|i| self.part(i as usize)).collect()
    }

    /// Parts for a file of `len` bytes in blocks of `block` bytes, given
    /// every block's chaining value in order (as [`Blake3Blocks::range_cvs`]
    /// gives them, ranges joined): the file's BLAKE3 composes from them
    /// ([`Blake3Blocks::finalize`]) without reading it. None unless there
    /// are two or more blocks and exactly one value per block.
    pub fn from_cvs(len: u64, block: u64, cvs: Vec<[u8; 32]>) -> Option<Blake3Blocks> {
        let mut b = Blake3Blocks::new(len, block)?;
        if b.count < 2 || cvs.len() != b.count {
            return None;
        }
        b.parts = cvs.into_iter().map(Some).collect();
        Some(b)
    }

    /// The file's BLAKE3, once every block is set.
    pub fn finalize(&self) -> Option<blake3::Hash> {
        match self.count {
            0 => Some(blake3::hash(&[])),
            1 => self.part(0).map(blake3::Hash::from_bytes),
            _ => {
                let (left, right) = self.split(0, self.len)?;
                Some(merge_subtrees_root(&left, &right, Mode::Hash))
            }
        }
    }

    /// The chaining values of the two halves of `start..end` (more than one
    /// block), split where BLAKE3 splits it.
    fn split(&self, start: u64, end: u64) -> Option<(ChainingValue, ChainingValue)> {
        let mid = start + left_subtree_len(end - start);
        Some((self.node(start, mid)?, self.node(mid, end)?))
    }

    fn node(&self, start: u64, end: u64) -> Option<ChainingValue> {
        if end - start <= self.block {
            return self.part((start / self.block) as usize);
        }
        let (left, right) = self.split(start, end)?;
        Some(merge_subtrees_non_root(&left, &right, Mode::Hash))
    }

    fn part(&self, index: usize) -> Option<[u8; 32]> {
        self.parts
            .get(index.checked_sub(self.first)?)
            .copied()
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equals_blake3_at_boundary_sizes_in_any_order() {
        let data: Vec<u8> = (0..70_000u32).map(|i| (i * 31 % 251) as u8).collect();
        for block in [1024u64, 4096, 16384] {
            for len in [
                0, 1, 1023, 1024, 1025, 4095, 4096, 4097, 16384, 40_000, 70_000,
            ] {
                let bytes = &data[..len as usize];
                let mut b = Blake3Blocks::new(len, block).unwrap();
                let n = len.div_ceil(block);
                // Last block first, and block 0 set twice (a resend).
                for i in (0..n).rev() {
                    let s = (i * block) as usize;
                    let e = (s + block as usize).min(len as usize);
                    if i == 0 && n > 1 {
                        assert!(b.finalize().is_none(), "a block is missing");
                        b.set(0, &vec![0xAA; e - s]);
                    }
                    b.set(i, &bytes[s..e]);
                }
                assert_eq!(b.finalize(), Some(blake3::hash(bytes)), "{len} {block}");
            }
        }
    }

    #[test]
    fn ranges_of_chaining_values_compose_the_files_blake3() {
        let data: Vec<u8> = (0..70_000u32).map(|i| (i * 13 % 241) as u8).collect();
        for (len, block) in [
            (2048u64, 1024u64),
            (40_000, 4096),
            (70_000, 1024),
            (65_536, 16384),
        ] {
            let bytes = &data[..len as usize];
            let n = len.div_ceil(block);
            // Two senders, each holding only its range.
            let cut = n / 2;
            let mut cvs = Vec::new();
            for (first, end) in [(0, cut), (cut, n)] {
                let mut b = Blake3Blocks::new(len, block).unwrap();
                for i in first..end {
                    let s = (i * block) as usize;
                    let e = (s + block as usize).min(len as usize);
                    assert!(b.range_cvs(first, end).is_none() || i > first);
                    b.set(i, &bytes[s..e]);
                }
                assert!(b.range_cvs(0, n).is_none() || (first, end) == (0, n));
                cvs.extend(b.range_cvs(first, end).expect("its range is set"));
            }
            let whole = Blake3Blocks::from_cvs(len, block, cvs).unwrap();
            assert_eq!(whole.finalize(), Some(blake3::hash(bytes)), "{len} {block}");
        }
        let one = Blake3Blocks::new(1000, 1024).unwrap();
        assert!(
            one.range_cvs(0, 1).is_none(),
            "one block has no chaining value"
        );
        assert!(Blake3Blocks::from_cvs(3000, 1024, vec![[0; 32]; 2]).is_none());
    }

    #[test]
    fn parts_grow_with_the_blocks_set_not_the_size_announced() {
        let mut b = Blake3Blocks::new(4 << 40, 4 << 20).unwrap();
        assert_eq!(b.parts.capacity(), 0);
        b.set(2, &[1; 4096]);
        assert!(b.parts.len() <= 3 && b.finalize().is_none());
        b.set(1 << 30, &[1; 10]);
        assert!(b.parts.len() <= 3, "a block past the end is ignored");
    }

    #[test]
    fn a_range_keeps_parts_from_its_first_block() {
        let mut b = Blake3Blocks::new_from(4 << 40, 4 << 20, (1 << 20) - 2).unwrap();
        b.set((1 << 20) - 1, &[1; 4096]);
        b.set(3, &[1; 4096]);
        assert!(b.parts.len() <= 2, "{}", b.parts.len());
        assert!(b.range_cvs((1 << 20) - 2, 1 << 20).is_none());
        b.set((1 << 20) - 2, &[2; 4096]);
        assert_eq!(b.range_cvs((1 << 20) - 2, 1 << 20).unwrap().len(), 2);
        assert!(b.range_cvs(0, 4).is_none(), "before the range");
    }

    #[test]
    fn only_power_of_two_blocks_of_a_chunk_or_more() {
        assert!(Blake3Blocks::new(10, 3 << 12).is_none());
        assert!(Blake3Blocks::new(10, 512).is_none());
        assert!(Blake3Blocks::new(10, 4 << 20).is_some());
    }
}
