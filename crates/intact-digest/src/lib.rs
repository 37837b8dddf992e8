//! intact's digest engine.
//!
//! [`Algorithm`] names a checksum; [`Hasher`] computes one incrementally and
//! [`hash`]/[`hash_parallel`] in one shot; [`Digest`] holds the result and
//! compares in constant time. [`Granular`] computes, in one pass, a file's
//! whole digest together with per-block digests (any block size) and
//! per-page CRC-32C values (4 KiB pages). [`digest_file`] reads a file by an
//! explicit [`ReadStrategy`] into 4 KiB-aligned buffers (or maps it) and
//! reports which path it really took. [`manifest`] reads and writes the
//! line formats of `sha256sum`, `b3sum` and `xxhsum`; [`defaults`] names
//! the checksums intact uses unless told otherwise.
//!
//! Contract: every path (sequential, parallel, mapped, read, any split of
//! the input) yields the same digest for the same bytes.

mod algorithm;
mod blake3_blocks;
pub mod defaults;
mod digest;
mod error;
mod file;
mod granular;
mod hasher;
pub mod manifest;
mod xxh3;

pub use algorithm::Algorithm;
pub use blake3_blocks::Blake3Blocks;
pub use digest::{Digest, MAX_DIGEST_LEN};
pub use error::{io_reason, DigestError};
pub use file::{
    digest_file, digest_reader, AlignedBuf, DigestPlan, FileDigests, ReadPath, ReadStrategy,
    BUFFER_ALIGN,
};
pub use granular::{
    block_digests, hash_with_page_crcs, page_crc, page_crc_blob, page_crcs, valid_page_size,
    Granular, GranularDigests, MAX_PAGE_SIZE, MIN_PAGE_SIZE, PAGE_SIZE,
};
pub use hasher::{hash, hash_parallel, Hasher, MIN_PARALLEL_LEN};
pub use xxh3::FIXED_SIMD_MAX_LEN;
