//! `--block-size auto`: the block size the RIVA model (the paper's Eq. 1)
//! predicts fastest for this transfer, from stage costs a short probe
//! measured on this machine just before it.
//!
//! Why: the RIVA paper saw up to 20% between block sizes, with no single
//! size best on every testbed (Sec. 5.4), and left the choice as future
//! work.
//!
//! The model: every stage costs a fixed time per block and a time per
//! byte, `t(b) = a + b·c`. Eq. 1 says a stream's blocks go at the pace of
//! the slower of the transfer stage (t_t) and the verify stage (t_c), and
//! the faster adds its time for one block, plus one eviction (t_e). For a
//! tree of files of sizes s, shared among k streams:
//!
//! ```text
//! W_x(b) = Σ_files ( ⌈s/b⌉ · a_x + s · c_x )           (x = t, c)
//! T(b)   = max(W_t(b), W_c(b)) / k + min(t_t(b'), t_c(b')) + t_e(b')
//! ```
//!
//! with b' the block of the largest file (`min(b, largest)`). Small
//! blocks pay the fixed costs more often (syscalls, messages, one
//! write-back and eviction per block, which is a device round trip on a
//! disk); large ones wait longer to fill and drain the pipeline. Which
//! wins depends on the costs, hence the probe (see [`probe`]):
//!
//! - transfer stage: reading the largest source file's first blocks from
//!   its device (evicted first) and digesting them; in `send` over a long
//!   round trip also the network, which carries at most one TCP window
//!   per round trip per stream;
//! - verify stage: in `copy`, writing blocks to an unnamed file on the
//!   destination's file system, writing them back and evicting them, and
//!   re-reading and digesting them (riva and flash; the write only for
//!   the other modes, whose re-reads are not per block from the device);
//!   the probe is not run where the file system keeps its files in
//!   memory (tmpfs: nothing is evicted there); in `send`, the server's
//!   device is not probed: its stage is modelled as this host's source
//!   read, and the report says so.
//!
//! The candidates are 1 to 16 MiB in powers of two. A prediction less than
//! [`KEEP_DEFAULT_WITHIN`] faster than the default's keeps the default:
//! the probe is not more precise than that. A stage whose larger block
//! took no longer than its smaller one is taken as all fixed cost. A
//! `copy` into a destination whose journal already holds one of the files
//! at some block size keeps that size without probing: at another size
//! its blocks would be sent again (a `send` cannot see the server's
//! journal; its resume command names the size chosen). Transfers with
//! less than [`MIN_BYTES`] in files larger than the smallest candidate keep the
//! default without a probe: every candidate cuts them about the same. One
//! file's blocks ride one stream, so k is at most the number of files
//! unless a send spreads them.
//!
//! What Eq. 1 says, and what it misses: where the network sets the pace
//! (a long round trip) the block size changes only the last block's drain,
//! a few milliseconds, and the default is kept. Where a device costs a
//! round trip per block (every block is written back and evicted on its
//! own), large blocks win. On this project's test machine the RAM-backed
//! ext4 and the disk cost some 0.1 ms per block, too little for Eq. 1 to
//! prefer another size: `auto` keeps 4 MiB there too. The differences
//! measured there between fixed sizes (up to 9%, docs/benchmarks.md) come from what a
//! probe of a few blocks on an idle device does not see: a block that fits
//! the CPU's cache, a disk's behaviour under sustained load.

pub(crate) mod auto;
pub mod probe;

use serde::Serialize;

use crate::verify::VerifyMode;
use intact_digest::defaults;

/// The sizes `auto` chooses among.
pub const CANDIDATES: [u64; 5] = [1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20];

/// Below this many bytes in files larger than the smallest candidate,
/// `auto` keeps the default without probing: the probe takes some 0.03 s
/// (a RAM-backed ext4), which on less than 1 GiB is more than the 2% a
/// choice must be predicted to win ([`KEEP_DEFAULT_WITHIN`]).
pub const MIN_BYTES: u64 = 1 << 30;

/// A candidate predicted faster than the default by less than this share
/// does not replace it: the probe is not more precise than that, and
/// another size on a later run would not find what this one left (a
/// journal row is kept only for its own block size).
pub const KEEP_DEFAULT_WITHIN: f64 = 0.05;

/// One stage's cost: `per_block + bytes · per_byte` seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Cost {
    /// Seconds per block, whatever its size.
    pub per_block: f64,
    /// Seconds per byte.
    pub per_byte: f64,
}

impl Cost {
    /// The cost of one block of `bytes`.
    pub fn of(&self, bytes: u64) -> f64 {
        self.per_block + bytes as f64 * self.per_byte
    }

    /// Both stages one after the other.
    pub fn then(self, other: Cost) -> Cost {
        Cost {
            per_block: self.per_block + other.per_block,
            per_byte: self.per_byte + other.per_byte,
        }
    }

    /// The line through two measurements, `(bytes, seconds)`: a fixed
    /// part and a part per byte, neither below zero. A larger block that
    /// took no longer than the smaller one is all fixed cost (the mean of
    /// the two), which a slightly slower one approaches too: a hair of
    /// noise either way does not flip the fit. None for times that are
    /// not usable (negative, not finite) or sizes out of order.
    pub fn fit(small: (u64, f64), large: (u64, f64)) -> Option<Cost> {
        let (b1, t1) = (small.0 as f64, small.1);
        let (b2, t2) = (large.0 as f64, large.1);
        let usable = t1.is_finite() && t2.is_finite() && t1 >= 0.0 && t2 >= 0.0;
        if b2 <= b1 || !usable {
            return None;
        }
        if t2 <= t1 {
            return Some(Cost {
                per_block: (t1 + t2) / 2.0,
                per_byte: 0.0,
            });
        }
        let per_byte = (t2 - t1) / (b2 - b1);
        Some(Cost {
            per_block: (t1 - b1 * per_byte).max(0.0),
            per_byte,
        })
    }
}

/// The stage costs Eq. 1 is fed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Stages {
    /// Transfer stage (t_t): source read and digest, and the network.
    pub transfer: Cost,
    /// Verify stage (t_c): the receiver's write and what the mode re-reads.
    pub verify: Cost,
    /// Eviction (t_e), counted once more at the end.
    pub evict: Cost,
}

impl Stages {
    /// Eq. 1 for files of `sizes` bytes shared among `streams`, in blocks
    /// of `block` bytes: predicted seconds. Unless `spread`, a file rides
    /// one stream, so the largest file's own work bounds the time from
    /// below.
    pub fn predict(&self, sizes: &[u64], streams: usize, spread: bool, block: u64) -> f64 {
        let work = |s: u64| {
            let blocks = s.div_ceil(block).max(1) as f64;
            (
                blocks * self.transfer.per_block + s as f64 * self.transfer.per_byte,
                blocks * self.verify.per_block + s as f64 * self.verify.per_byte,
            )
        };
        let (mut wt, mut wc) = (0.0, 0.0);
        for &s in sizes {
            let (t, c) = work(s);
            wt += t;
            wc += c;
        }
        let largest = sizes.iter().copied().max().unwrap_or(0);
        let k = streams.max(1) as f64;
        let mut paced = wt.max(wc) / k;
        if !spread {
            let (t, c) = work(largest);
            paced = paced.max(t.max(c));
        }
        let last = block.min(largest);
        paced + self.transfer.of(last).min(self.verify.of(last)) + self.evict.of(last)
    }
}

/// What `auto` predicted for one candidate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Predicted {
    /// Block size, bytes.
    pub block: u64,
    /// Eq. 1's seconds.
    pub seconds: f64,
}

/// `--block-size auto`: what was chosen, from what, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BlockSizeReport {
    /// The block size the transfer used, bytes.
    pub chosen: u64,
    /// Why, in a sentence.
    pub why: String,
    /// Eq. 1's prediction for each candidate (empty when nothing was
    /// probed).
    pub predicted: Vec<Predicted>,
    /// The stage costs measured (None when nothing was probed).
    pub stages: Option<Stages>,
    /// What the probe measured where, and what it could not.
    pub measured: Vec<String>,
    /// Seconds the probe took (part of the transfer's time).
    pub probe_seconds: f64,
}

/// Chooses among [`CANDIDATES`] the block size Eq. 1 predicts fastest
/// for `sizes` over `streams` with `stages`, keeping the default unless a
/// candidate is predicted at least [`KEEP_DEFAULT_WITHIN`] faster.
pub fn choose(
    stages: &Stages,
    sizes: &[u64],
    streams: usize,
    spread: bool,
) -> (u64, Vec<Predicted>, String) {
    let predicted: Vec<Predicted> = CANDIDATES
        .iter()
        .map(|&block| Predicted {
            block,
            seconds: stages.predict(sizes, streams, spread, block),
        })
        .collect();
    let default = defaults::BLOCK_BYTES as u64;
    let at_default = stages.predict(sizes, streams, spread, default);
    let best = predicted
        .iter()
        .copied()
        .min_by(|a, b| a.seconds.total_cmp(&b.seconds))
        .expect("there are candidates");
    if best.block == default {
        let why = format!(
            "Eq. 1 predicts the default, {}, fastest ({:.2} s)",
            mib(default),
            at_default
        );
        return (default, predicted, why);
    }
    if best.seconds > at_default * (1.0 - KEEP_DEFAULT_WITHIN) {
        let why = format!(
            "Eq. 1 predicts {} within {:.0}% of the best candidate ({}, {:.2} s vs {:.2} s): the default is kept",
            mib(default),
            KEEP_DEFAULT_WITHIN * 100.0,
            mib(best.block),
            at_default,
            best.seconds
        );
        return (default, predicted, why);
    }
    let why = format!(
        "Eq. 1 predicts {:.2} s at {} against {:.2} s at the default {} ({:.0}% less)",
        best.seconds,
        mib(best.block),
        at_default,
        mib(default),
        100.0 * (1.0 - best.seconds / at_default)
    );
    (best.block, predicted, why)
}

/// Bytes in files where the block size makes a difference (larger than
/// the smallest candidate).
pub fn bytes_that_matter(sizes: &[u64]) -> u64 {
    sizes.iter().filter(|&&s| s > CANDIDATES[0]).sum()
}

/// Whether the receiver writes back, evicts and re-reads each block from
/// the device (`sequential` and `file` re-read the whole file at its end,
/// not per block; `block` re-reads through the cache).
pub fn rereads_from_device(mode: VerifyMode) -> bool {
    matches!(mode, VerifyMode::Riva | VerifyMode::Flash)
}

/// `4 MiB`, `512 KiB`.
pub fn mib(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: f64 = 1e6;

    /// Costs of the shape the probe measured (docs/benchmarks.md).
    fn stages(read_block: f64, dev_block: f64) -> Stages {
        let read = Cost {
            per_block: read_block,
            per_byte: 1.0 / (1500.0 * MB),
        };
        let verify = Cost {
            per_block: dev_block,
            per_byte: 1.0 / (900.0 * MB),
        };
        let evict = Cost {
            per_block: dev_block / 2.0,
            per_byte: 1.0 / (2000.0 * MB),
        };
        Stages {
            transfer: read,
            verify: verify.then(evict),
            evict,
        }
    }

    #[test]
    fn a_line_through_two_points_splits_fixed_and_per_byte_cost() {
        let c = Cost::fit(
            (256 << 10, 0.0003 + 0.000262144),
            (4 << 20, 0.0003 + 0.004194304),
        )
        .unwrap();
        assert!((c.per_block - 0.0003).abs() < 1e-9, "{c:?}");
        assert!((c.per_byte - 1e-9).abs() < 1e-15, "{c:?}");
        // A large block no slower than the small one: all fixed cost, and
        // a hair either way gives nearly the same cost (no flip).
        let flat = Cost::fit((256 << 10, 0.001), (4 << 20, 0.00099)).unwrap();
        assert_eq!(flat.per_byte, 0.0);
        assert!((flat.per_block - 0.000995).abs() < 1e-12, "{flat:?}");
        let rising = Cost::fit((256 << 10, 0.001), (4 << 20, 0.00101)).unwrap();
        assert!(
            (rising.of(4 << 20) - flat.of(4 << 20)).abs() < 3e-5,
            "{rising:?}"
        );
        assert!(
            (rising.per_block - flat.per_block).abs() < 1e-5,
            "{rising:?}"
        );
        assert_eq!(Cost::fit((256 << 10, f64::NAN), (4 << 20, 0.001)), None);
        // A fixed part above the small block's time is not negative.
        let c = Cost::fit((256 << 10, 0.0), (4 << 20, 0.004)).unwrap();
        assert!(c.per_block >= 0.0 && c.per_byte > 0.0);
    }

    #[test]
    fn a_file_rides_one_stream_unless_spread() {
        // One 8 GiB file and three tiny ones on four streams: the big
        // file's stream carries 8 GiB whatever the others do.
        let s = stages(0.0, 0.0);
        let sizes = [8 << 30, 1, 1, 1];
        let alone = s.predict(&sizes, 4, false, 4 << 20);
        let spread = s.predict(&sizes, 4, true, 4 << 20);
        let one_stream = s.predict(&[8 << 30], 1, false, 4 << 20);
        assert!((alone - one_stream).abs() < 1e-6, "{alone} {one_stream}");
        assert!(spread < alone / 3.0, "{spread} {alone}");
    }

    #[test]
    fn a_device_with_a_round_trip_per_block_wants_large_blocks() {
        // A disk: every write-back is a device round trip of ~1 ms.
        let (b, predicted, why) = choose(&stages(50e-6, 1e-3), &[1 << 30], 4, false);
        assert_eq!(b, 16 << 20, "{why} {predicted:?}");
        // Fewer blocks, less time, down the candidates.
        for w in predicted.windows(2) {
            assert!(w[1].seconds < w[0].seconds, "{predicted:?}");
        }
    }

    #[test]
    fn a_network_bound_transfer_keeps_the_default() {
        // 25 MB/s per stream (a 4 MiB window over ~160 ms): the transfer
        // stage sets the pace whatever the block size, and what remains
        // (the last block's verify, the fixed costs of the transfer
        // stage) is a few milliseconds in ten seconds.
        let mut s = stages(50e-6, 1e-3);
        s.transfer = Cost {
            per_block: 50e-6,
            per_byte: 1.0 / (25.0 * MB),
        };
        let (b, predicted, why) = choose(&s, &[1 << 30], 4, true);
        assert_eq!(b, defaults::BLOCK_BYTES as u64, "{why}");
        let (lo, hi) = predicted.iter().fold((f64::MAX, 0.0f64), |(lo, hi), p| {
            (lo.min(p.seconds), hi.max(p.seconds))
        });
        assert!(hi / lo < 1.01, "{predicted:?}");
    }

    #[test]
    fn a_near_tie_keeps_the_default() {
        // Nothing fixed per block: the sizes differ only by the pipeline's
        // fill, far below the default's 2%.
        let s = stages(0.0, 0.0);
        let (b, _, why) = choose(&s, &[1 << 30], 4, true);
        assert_eq!(b, defaults::BLOCK_BYTES as u64, "{why}");
        assert!(why.contains("default is kept"), "{why}");
    }

    #[test]
    fn small_files_are_one_block_whatever_the_size() {
        let s = stages(50e-6, 1e-3);
        let small = vec![64 << 10; 1000];
        let at = |b| s.predict(&small, 4, false, b);
        assert_eq!(at(1 << 20), at(16 << 20));
        assert_eq!(bytes_that_matter(&small), 0);
        assert_eq!(bytes_that_matter(&[1 << 20, (1 << 20) + 1]), (1 << 20) + 1);
    }
}
