//! The streaming hasher behind every digest intact computes.

use md5::Digest as _;
use rayon::prelude::*;

use crate::xxh3::{Xxh3_128, Xxh3_64};
use crate::{Algorithm, Digest};

/// Inputs shorter than this are hashed on one thread even when parallelism
/// is allowed: below it, waking threads costs more than it saves.
pub const MIN_PARALLEL_LEN: usize = 1 << 20;

/// Incremental state of one digest computation.
///
/// Feeding the same bytes in any split through [`Hasher::update`] or
/// [`Hasher::update_parallel`] gives the same [`Digest`] as [`hash`].
#[derive(Clone)]
pub struct Hasher {
    algorithm: Algorithm,
    state: State,
}

#[derive(Clone)]
enum State {
    Crc32c(u32),
    Adler32(u32),
    Xxh3_64(Xxh3_64),
    Xxh3_128(Xxh3_128),
    Blake3(Box<blake3::Hasher>),
    Sha256(sha2::Sha256),
    Sha512(Box<sha2::Sha512>),
    Sha1(sha1::Sha1),
    Md5(md5::Md5),
}

impl Hasher {
    /// A fresh hasher for `algorithm`.
    pub fn new(algorithm: Algorithm) -> Hasher {
        Hasher::with_state(algorithm, None)
    }

    /// A fresh hasher for `algorithm` that will be fed about `len` bytes.
    ///
    /// The length only picks the implementation (XXH3 of small inputs
    /// skips CPU feature detection, see [`crate::FIXED_SIMD_MAX_LEN`]); feeding
    /// more or fewer bytes still gives the right digest.
    pub fn expecting(algorithm: Algorithm, len: u64) -> Hasher {
        Hasher::with_state(algorithm, Some(len))
    }

    fn with_state(algorithm: Algorithm, expected_len: Option<u64>) -> Hasher {
        let state = match algorithm {
            Algorithm::Crc32c => State::Crc32c(0),
            Algorithm::Adler32 => State::Adler32(1),
            Algorithm::Xxh3_64 => State::Xxh3_64(Xxh3_64::new(expected_len)),
            Algorithm::Xxh3_128 => State::Xxh3_128(Xxh3_128::new(expected_len)),
            Algorithm::Blake3 => State::Blake3(Box::new(blake3::Hasher::new())),
            Algorithm::Sha256 => State::Sha256(sha2::Sha256::new()),
            Algorithm::Sha512 => State::Sha512(Box::default()),
            Algorithm::Sha1 => State::Sha1(sha1::Sha1::new()),
            Algorithm::Md5 => State::Md5(md5::Md5::new()),
        };
        Hasher { algorithm, state }
    }

    /// The algorithm this hasher computes.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Feeds `data` on the calling thread.
    pub fn update(&mut self, data: &[u8]) {
        match &mut self.state {
            State::Crc32c(c) => *c = crc32c::crc32c_append(*c, data),
            State::Adler32(a) => *a = adler32_append(*a, data),
            State::Xxh3_64(h) => h.update(data),
            State::Xxh3_128(h) => h.update(data),
            State::Blake3(h) => {
                h.update(data);
            }
            State::Sha256(h) => h.update(data),
            State::Sha512(h) => h.update(data),
            State::Sha1(h) => h.update(data),
            State::Md5(h) => h.update(data),
        }
    }

    /// Feeds `data`, using the current rayon pool's threads where the
    /// algorithm can split one input (see [`Algorithm::splits_within_file`]).
    pub fn update_parallel(&mut self, data: &[u8]) {
        if data.len() < MIN_PARALLEL_LEN || !self.algorithm.splits_within_file() {
            return self.update(data);
        }
        match &mut self.state {
            State::Blake3(h) => {
                h.update_rayon(data);
            }
            State::Crc32c(c) => {
                *c = parallel_fold(data, *c, crc32c::crc32c, |acc, piece_crc, len| {
                    crc32c::crc32c_combine(acc, piece_crc, len)
                })
            }
            State::Adler32(a) => {
                *a = parallel_fold(data, *a, |p| adler32_append(1, p), adler32_combine)
            }
            _ => unreachable!("algorithm claims to split but has no parallel path"),
        }
    }

    /// Ends the computation.
    pub fn finalize(self) -> Digest {
        let alg = self.algorithm;
        match self.state {
            State::Crc32c(c) => Digest::from_raw(alg, &c.to_be_bytes()),
            State::Adler32(a) => Digest::from_raw(alg, &a.to_be_bytes()),
            State::Xxh3_64(h) => Digest::from_raw(alg, &h.finish().to_be_bytes()),
            State::Xxh3_128(h) => Digest::from_raw(alg, &h.finish().to_be_bytes()),
            State::Blake3(h) => Digest::from_raw(alg, h.finalize().as_bytes()),
            State::Sha256(h) => Digest::from_raw(alg, &h.finalize()),
            State::Sha512(h) => Digest::from_raw(alg, &h.finalize()),
            State::Sha1(h) => Digest::from_raw(alg, &h.finalize()),
            State::Md5(h) => Digest::from_raw(alg, &h.finalize()),
        }
    }
}

/// One-shot digest of `data` on the calling thread.
pub fn hash(algorithm: Algorithm, data: &[u8]) -> Digest {
    let mut h = Hasher::new(algorithm);
    h.update(data);
    h.finalize()
}

/// One-shot digest of `data` using the current rayon pool where possible.
pub fn hash_parallel(algorithm: Algorithm, data: &[u8]) -> Digest {
    let mut h = Hasher::new(algorithm);
    h.update_parallel(data);
    h.finalize()
}

/// Splits `data` into one piece per thread, checksums the pieces in
/// parallel and folds them into `acc` with `combine(acc, piece, piece_len)`.
fn parallel_fold(
    data: &[u8],
    acc: u32,
    piece: impl Fn(&[u8]) -> u32 + Sync,
    combine: impl Fn(u32, u32, usize) -> u32,
) -> u32 {
    let threads = rayon::current_num_threads().max(1);
    let piece_len = data.len().div_ceil(threads).max(MIN_PARALLEL_LEN / 4);
    let sums: Vec<(u32, usize)> = data
        .par_chunks(piece_len)
        .map(|p| (piece(p), p.len()))
        .collect();
    sums.into_iter()
        .fold(acc, |acc, (sum, len)| combine(acc, sum, len))
}

const ADLER_MOD: u64 = 65521;

fn adler32_append(adler: u32, data: &[u8]) -> u32 {
    let mut h = simd_adler32::Adler32::from_checksum(adler);
    h.write(data);
    h.finish()
}

/// The Adler-32 of `a ‖ b` from the Adler-32 of `a`, of `b` and `b`'s
/// length (zlib's `adler32_combine`, done in 64-bit so nothing overflows).
pub(crate) fn adler32_combine(adler_a: u32, adler_b: u32, len_b: usize) -> u32 {
    let rem = len_b as u64 % ADLER_MOD;
    let a1 = u64::from(adler_a & 0xffff);
    let b1 = u64::from(adler_a >> 16);
    let a2 = u64::from(adler_b & 0xffff);
    let b2 = u64::from(adler_b >> 16);
    // A = A1 + A2 - 1, B = B1 + B2 + rem*(A1 - 1), everything mod 65521.
    let sum1 = (a1 + a2 + ADLER_MOD - 1) % ADLER_MOD;
    let sum2 = (b1 + b2 + rem * a1 + ADLER_MOD - rem) % ADLER_MOD;
    (sum1 | (sum2 << 16)) as u32
}
