//! Where a file's catalog checksums fall: blocks of the file's block size,
//! each cut into pages of the root's page size from the block's start
//! (the last page of a block, and of the file, may be short), as the
//! receiver computes them. Shared by the mount, its crash recovery and
//! the catalog's own records.

use std::fs::File;
use std::os::unix::fs::FileExt;

use intact_digest::{defaults, hash_with_page_crcs};

use super::{BlockRecord, VerifiedAt};
use crate::verify::{VerifyLevel, VerifyMode};

/// The blocks and pages of a file of a given size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// File size in bytes.
    pub size: u64,
    /// Block size in bytes (> 0).
    pub block: u64,
    /// Page size in bytes (> 0).
    pub page: u64,
}

/// One page of a [`Layout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    /// Its block.
    pub block: u64,
    /// Its number within the block.
    pub index: usize,
    /// Its first byte in the file.
    pub offset: u64,
    /// Its length (short at a block's or the file's end).
    pub len: u64,
}

impl Layout {
    /// Blocks the file has.
    pub fn blocks(&self) -> u64 {
        self.size.div_ceil(self.block)
    }

    /// Bytes of block `b` (0 past the end).
    pub fn block_len(&self, b: u64) -> u64 {
        self.size
            .saturating_sub(b.saturating_mul(self.block))
            .min(self.block)
    }

    /// Pages of block `b`.
    pub fn pages_in_block(&self, b: u64) -> usize {
        self.block_len(b).div_ceil(self.page) as usize
    }

    /// The page holding byte `offset` (< size).
    pub fn page_at(&self, offset: u64) -> Page {
        let block = offset / self.block;
        let index = ((offset % self.block) / self.page) as usize;
        self.page(block, index)
    }

    /// Page `index` of block `b`.
    pub fn page(&self, block: u64, index: usize) -> Page {
        let start = index as u64 * self.page;
        let offset = block * self.block + start;
        let len = self.block_len(block).saturating_sub(start).min(self.page);
        Page {
            block,
            index,
            offset,
            len,
        }
    }

    /// The pages covering bytes `[offset, offset + len)` (clipped to the
    /// file), in order.
    pub fn pages(&self, offset: u64, len: u64) -> Vec<Page> {
        let end = offset.saturating_add(len).min(self.size);
        let mut out = Vec::new();
        let mut at = offset;
        while at < end {
            let p = self.page_at(at);
            at = p.offset + p.len;
            out.push(p);
        }
        out
    }
}

/// The page CRCs of a block blob (little-endian, 4 bytes each).
pub fn crcs_of_blob(blob: &[u8]) -> Vec<u32> {
    blob.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A block blob of page CRCs.
pub fn blob_of_crcs(crcs: &[u32]) -> Vec<u8> {
    crcs.iter().flat_map(|c| c.to_le_bytes()).collect()
}

/// Reads block `b` of `file` into `buf`; whether it still matches
/// `digest` (its cataloged XXH3-128).
pub fn block_matches(
    file: &File,
    layout: &Layout,
    b: u64,
    digest: &[u8],
    buf: &mut Vec<u8>,
) -> std::io::Result<bool> {
    buf.resize(layout.block_len(b) as usize, 0);
    file.read_exact_at(buf, b * layout.block)?;
    Ok(intact_digest::hash(defaults::BLOCK_ALGORITHM, buf).as_bytes() == digest)
}

/// The record of block `b` whose bytes no longer hold what `crcs` say:
/// those CRCs are kept, with a digest that matches nothing, so the damage
/// stays visible to reads and to scrub.
pub fn failing_block(b: u64, crcs: &[u32]) -> BlockRecord {
    written_block(b, vec![0; 16], crcs)
}

/// The record of block `b` whose bytes were written here (not received
/// from a source: level `none`), with its digest and page CRCs.
pub fn written_block(b: u64, digest: Vec<u8>, crcs: &[u32]) -> BlockRecord {
    BlockRecord {
        index: b,
        digest,
        verified: VerifiedAt::now(VerifyMode::None, VerifyLevel::None),
        pages: Some(blob_of_crcs(crcs)),
    }
}

/// Why a block could not be recorded again.
#[derive(Debug)]
pub enum RebuildError {
    /// Reading it failed.
    Io(std::io::Error),
    /// These pages (numbers within the block) no longer hold what their
    /// CRC says: the block's digest is not recomputed over them.
    Pages(Vec<usize>),
}

/// Reads block `b` of `file` and makes its catalog record again: each
/// page is first checked against `crcs` (the CRCs written with the
/// data: checksum chaining, so the new block digest is computed only
/// over bytes the page CRCs vouch for), then the block's XXH3-128 is
/// computed. The record says it was checked by nobody (`none`): the bytes
/// came from an application, not from a source.
pub fn rebuild_block(
    file: &File,
    layout: &Layout,
    b: u64,
    crcs: &[u32],
    buf: &mut Vec<u8>,
) -> Result<BlockRecord, RebuildError> {
    let len = layout.block_len(b) as usize;
    buf.resize(len, 0);
    file.read_exact_at(buf, b * layout.block)
        .map_err(RebuildError::Io)?;
    let (digest, blob) = hash_with_page_crcs(defaults::BLOCK_ALGORITHM, buf, layout.page as usize);
    let now = crcs_of_blob(&blob);
    let bad: Vec<usize> = (0..now.len())
        .filter(|&i| crcs.get(i) != Some(&now[i]))
        .collect();
    if !bad.is_empty() || crcs.len() != now.len() {
        return Err(RebuildError::Pages(bad));
    }
    Ok(BlockRecord {
        index: b,
        digest: digest.as_bytes().to_vec(),
        verified: VerifiedAt::now(VerifyMode::None, VerifyLevel::None),
        pages: Some(blob),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_cut_from_each_blocks_start() {
        let l = Layout {
            size: 10_000,
            block: 6_000,
            page: 4_096,
        };
        assert_eq!(l.blocks(), 2);
        assert_eq!(l.pages_in_block(0), 2);
        assert_eq!(l.pages_in_block(1), 1);
        let p = l.pages(0, 10_000);
        let cuts: Vec<(u64, u64)> = p.iter().map(|p| (p.offset, p.len)).collect();
        assert_eq!(cuts, vec![(0, 4096), (4096, 1904), (6000, 4000)]);
        assert_eq!(l.pages(4095, 2).len(), 2);
        assert_eq!(l.pages(9_999, 100).len(), 1);
        assert!(l.pages(10_000, 1).is_empty());
    }
}
