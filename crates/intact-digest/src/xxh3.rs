//! XXH3 (64- and 128-bit) with the implementation chosen by input size.
//!
//! twox-hash picks AVX2 at run time: on its first input over 240 bytes it
//! asks std (`is_x86_feature_detected!`), and std runs every `cpuid` leaf
//! once. Under a hypervisor each `cpuid` traps (8.4 µs each on the
//! benchmark host; the first detection took 63–73 µs), which is a sizeable
//! part of a whole `intact sum` of one small file (~1 ms). Inputs known to
//! be small are therefore hashed by xxhash-rust, whose SIMD path is fixed
//! at compile time (SSE2 on x86_64 unless the build enables more) and
//! never detects anything. Both compute the same function; which one ran
//! never shows in a digest (tested against each other and against
//! reference vectors).

use std::hash::Hasher as _;

use std::sync::atomic::{AtomicU64, Ordering};

/// How many bytes a process hashes without CPU feature detection, in
/// total: inputs whose length is known in advance take the fixed-SIMD
/// path while they fit in what is left of this budget; everything else
/// (unknown lengths, larger inputs, every input after the budget is
/// spent) takes the detected one.
///
/// So the fixed path can cost at most what SSE2 loses to AVX2 on this many
/// bytes, once per process, against one detection saved. Chosen by
/// whole-process CPU time of `intact sum --algo xxh3 --jobs 1` per file
/// size, builds with budgets of 0, 1 MiB and 64 MiB, 100–200 interleaved
/// runs each (README, "intact sum on files of 1 MiB and less"): the fixed
/// path saved 0.06–0.08 ms from 4 KiB to 1 MiB, was level at 4 MiB and
/// 0.18 ms slower at 16 MiB.
pub const FIXED_SIMD_MAX_LEN: u64 = 1 << 20;

/// What is left of [`FIXED_SIMD_MAX_LEN`] in this process.
static FIXED_SIMD_LEFT: AtomicU64 = AtomicU64::new(FIXED_SIMD_MAX_LEN);

/// Incremental XXH3-64 state.
#[derive(Clone)]
pub(crate) enum Xxh3_64 {
    /// twox-hash: AVX2 when the CPU has it (detected on first use).
    Detected(Box<twox_hash::XxHash3_64>),
    /// xxhash-rust: SIMD fixed at compile time.
    Fixed(Box<xxhash_rust::xxh3::Xxh3Default>),
}

impl Xxh3_64 {
    /// A fresh state for an input of `expected_len` bytes, if known.
    pub(crate) fn new(expected_len: Option<u64>) -> Xxh3_64 {
        if fixed_simd(expected_len) {
            Xxh3_64::Fixed(Box::default())
        } else {
            Xxh3_64::Detected(Box::default())
        }
    }

    /// Feeds `data`.
    pub(crate) fn update(&mut self, data: &[u8]) {
        match self {
            Xxh3_64::Detected(h) => h.write(data),
            Xxh3_64::Fixed(h) => h.update(data),
        }
    }

    /// The digest of everything fed.
    pub(crate) fn finish(&self) -> u64 {
        match self {
            Xxh3_64::Detected(h) => h.finish(),
            Xxh3_64::Fixed(h) => h.digest(),
        }
    }
}

/// Incremental XXH3-128 state.
#[derive(Clone)]
pub(crate) enum Xxh3_128 {
    /// twox-hash: AVX2 when the CPU has it (detected on first use).
    Detected(Box<twox_hash::XxHash3_128>),
    /// xxhash-rust: SIMD fixed at compile time.
    Fixed(Box<xxhash_rust::xxh3::Xxh3Default>),
}

impl Xxh3_128 {
    /// A fresh state for an input of `expected_len` bytes, if known.
    pub(crate) fn new(expected_len: Option<u64>) -> Xxh3_128 {
        if fixed_simd(expected_len) {
            Xxh3_128::Fixed(Box::default())
        } else {
            Xxh3_128::Detected(Box::default())
        }
    }

    /// Feeds `data`.
    pub(crate) fn update(&mut self, data: &[u8]) {
        match self {
            Xxh3_128::Detected(h) => h.write(data),
            Xxh3_128::Fixed(h) => h.update(data),
        }
    }

    /// The digest of everything fed.
    pub(crate) fn finish(&self) -> u128 {
        match self {
            Xxh3_128::Detected(h) => h.finish_128(),
            Xxh3_128::Fixed(h) => h.digest128(),
        }
    }
}

/// Whether an input of `expected_len` bytes is hashed without detection
/// (and if so, takes its length from the budget).
fn fixed_simd(expected_len: Option<u64>) -> bool {
    expected_len.is_some_and(|n| take(&FIXED_SIMD_LEFT, n))
}

/// Takes `n` from `budget` if that much is left.
fn take(budget: &AtomicU64, n: u64) -> bool {
    budget
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
            left.checked_sub(n)
        })
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic bytes that are not a pattern the hash could be blind to.
    fn bytes(n: usize) -> Vec<u8> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    /// Lengths around every boundary of XXH3: 0, the 16/128/240-byte short
    /// paths, the 64-byte stripe, the 256-byte streaming buffer, the
    /// 1024-byte block of the default secret, 4 KiB and 1 MiB ± 1.
    const SIZES: &[usize] = &[
        0, 1, 3, 4, 8, 9, 16, 17, 63, 64, 65, 127, 128, 129, 239, 240, 241, 255, 256, 257, 1023,
        1024, 1025, 2048, 4095, 4096, 4097, 65536, 1048575, 1048576, 1048577,
    ];

    /// Feeds `data` to both states in pieces of `piece` bytes.
    fn both(data: &[u8], piece: usize) -> ((Xxh3_64, Xxh3_64), (Xxh3_128, Xxh3_128)) {
        let mut s64 = (
            Xxh3_64::Fixed(Box::default()),
            Xxh3_64::Detected(Box::default()),
        );
        let mut s128 = (
            Xxh3_128::Fixed(Box::default()),
            Xxh3_128::Detected(Box::default()),
        );
        for p in data.chunks(piece.max(1)) {
            s64.0.update(p);
            s64.1.update(p);
            s128.0.update(p);
            s128.1.update(p);
        }
        (s64, s128)
    }

    #[test]
    fn fixed_and_detected_give_the_same_digests() {
        let data = bytes(1 << 20 | 1);
        let mut seen = std::collections::HashSet::new();
        for &n in SIZES {
            let input = &data[..n];
            let one_shot_64 = xxhash_rust::xxh3::xxh3_64(input);
            let one_shot_128 = xxhash_rust::xxh3::xxh3_128(input);
            assert_eq!(one_shot_64, twox_hash::XxHash3_64::oneshot(input), "{n}");
            assert_eq!(one_shot_128, twox_hash::XxHash3_128::oneshot(input), "{n}");
            for piece in [usize::MAX, 1, 7, 64, 100, 256, 1024, 4096] {
                if piece < 64 && n > 8192 {
                    continue; // byte-wise feeding of a MiB is slow and adds nothing
                }
                let ((f64_, d64), (f128, d128)) = both(input, piece.min(n.max(1)));
                assert_eq!(f64_.finish(), one_shot_64, "fixed 64, {n} bytes by {piece}");
                assert_eq!(
                    d64.finish(),
                    one_shot_64,
                    "detected 64, {n} bytes by {piece}"
                );
                assert_eq!(
                    f128.finish(),
                    one_shot_128,
                    "fixed 128, {n} bytes by {piece}"
                );
                assert_eq!(
                    d128.finish(),
                    one_shot_128,
                    "detected 128, {n} bytes by {piece}"
                );
            }
            // The inputs differ, so must their digests: the comparison
            // above is not between two constants.
            assert!(seen.insert(one_shot_64), "{n}: digest seen before");
        }
        // Published vectors (xxhsum -H3 / -H2 of an empty file).
        assert_eq!(xxhash_rust::xxh3::xxh3_64(b""), 0x2d06_8005_38d3_94c2);
        assert_eq!(
            xxhash_rust::xxh3::xxh3_128(b""),
            0x99aa_06d3_0147_98d8_6001_c324_468d_497f
        );
    }

    #[test]
    fn budget_is_spent_once() {
        let budget = AtomicU64::new(100);
        assert!(take(&budget, 60));
        assert!(!take(&budget, 41), "only 40 left");
        assert!(take(&budget, 40));
        assert!(!take(&budget, 1));
        assert!(take(&budget, 0));
        assert_eq!(budget.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn unknown_lengths_detect() {
        assert!(matches!(Xxh3_64::new(None), Xxh3_64::Detected(_)));
        assert!(matches!(Xxh3_128::new(None), Xxh3_128::Detected(_)));
        assert!(matches!(
            Xxh3_64::new(Some(FIXED_SIMD_MAX_LEN + 1)),
            Xxh3_64::Detected(_)
        ));
    }
}
