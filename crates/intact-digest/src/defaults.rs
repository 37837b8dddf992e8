//! intact's default checksums and block size, in one place, so that the
//! transfer engine, the at-rest catalog, `intact sum` and
//! `intact reliability` all speak of the same choice. docs/reliability.md
//! gives the reliability model's numbers behind it.

use crate::{Algorithm, PAGE_SIZE};

/// Per-4 KiB-page checksum: CRC-32C. Hardware-fast (~15 GiB/s), HD 4 at
/// 4 KiB, and what XRootD's page reads and the Kim et al. verifier use.
pub const PAGE_ALGORITHM: Algorithm = Algorithm::Crc32c;

/// Page size of [`PAGE_ALGORITHM`], in bytes.
pub const PAGE_BYTES: usize = PAGE_SIZE;

/// Per-block digest that travels with the data and is re-checked after the
/// device re-read: XXH3-128, the fastest 128-bit digest here.
pub const BLOCK_ALGORITHM: Algorithm = Algorithm::Xxh3_128;

/// Default transfer block size, in bytes (4 MiB). Provisional: the
/// transfer engine must confirm it by measurement.
pub const BLOCK_BYTES: usize = 4 << 20;

/// Whole-file digest for manifests and reports: BLAKE3, cryptographic and
/// parallel within one file.
pub const FILE_ALGORITHM: Algorithm = Algorithm::Blake3;
