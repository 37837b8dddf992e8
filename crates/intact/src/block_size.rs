//! The transfer block size a command line may ask for.
//!
//! Every block is read, written, evicted and re-read in whole pages, and
//! travels in one frame, so a block size is a whole number of 4 KiB pages
//! and no larger than the largest block the protocol carries. A tiny block
//! would not be an error of the pipeline but of the user: `--block-size 3`
//! once cut 100 KB into 33,336 blocks, took 11 s and could not reach the
//! device.

use crate::args::parse_size;

/// `--block-size`: a fixed size, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockSize {
    /// Chosen per transfer from the RIVA model (Eq. 1) and a short probe.
    Auto,
    /// This many bytes.
    Fixed(usize),
}

impl BlockSize {
    /// The size to cut at unless `auto` chooses another: the fixed one,
    /// or the default.
    pub fn bytes(self) -> usize {
        match self {
            BlockSize::Auto => intact_digest::defaults::BLOCK_BYTES,
            BlockSize::Fixed(n) => n,
        }
    }

    /// Whether the transfer chooses.
    pub fn auto(self) -> bool {
        self == BlockSize::Auto
    }
}

/// Parses `--block-size`: `auto`, or a size as [`parse_block_size`].
pub fn parse_block_size_or_auto(s: &str) -> Result<BlockSize, String> {
    if s == "auto" {
        return Ok(BlockSize::Auto);
    }
    parse_block_size(s).map(BlockSize::Fixed)
}

/// The smallest block, and the unit every block size is a multiple of.
pub const MIN: usize = 4 << 10;

/// The largest block: the largest one a protocol frame carries.
pub const MAX: usize = intact_proto::MAX_BLOCK;

/// Parses `--block-size`: a size (as [`parse_size`] reads it) that is a
/// multiple of 4 KiB between 4 KiB and 16 MiB.
pub fn parse_block_size(s: &str) -> Result<usize, String> {
    let n = parse_size(s)?;
    let range = format!(
        "a multiple of 4KiB from 4KiB to {}MiB (e.g. 64KiB, 1MiB, 4MiB, the default)",
        MAX >> 20
    );
    if n < MIN {
        return Err(format!("{s} is too small: the block size must be {range}"));
    }
    if n > MAX {
        return Err(format!("{s} is too large: the block size must be {range}"));
    }
    if n % MIN != 0 {
        return Err(format!(
            "{s} ({n} bytes) is not a whole number of 4KiB pages: the block size must be {range}"
        ));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_are_whole_pages_within_bounds() {
        assert_eq!(parse_block_size("4KiB"), Ok(4096));
        assert_eq!(parse_block_size("4MiB"), Ok(4 << 20));
        assert_eq!(parse_block_size("16MiB"), Ok(16 << 20));
        for bad in ["3", "4095", "6KiB", "17MiB", "1G", "0"] {
            assert!(parse_block_size(bad).is_err(), "{bad}");
            assert!(parse_block_size_or_auto(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_block_size_or_auto("auto"), Ok(BlockSize::Auto));
        assert_eq!(
            parse_block_size_or_auto("1MiB"),
            Ok(BlockSize::Fixed(1 << 20))
        );
        assert!(parse_block_size_or_auto("Auto").is_err());
    }
}
