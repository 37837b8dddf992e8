//! Whole, per-block and per-page digests of one stream, in one pass.

use rayon::prelude::*;

use crate::{Algorithm, Digest, DigestError, Hasher};

/// Page size of per-page checksums, in bytes (4 KiB, as XRootD's page reads
/// and the Kim et al. verifier use).
pub const PAGE_SIZE: usize = 4096;

/// Per-block digests of `data` under `algorithm`, blocks of `block_size`
/// bytes (the last one may be shorter; empty input has no blocks), computed
/// across the current rayon pool.
pub fn block_digests(
    algorithm: Algorithm,
    data: &[u8],
    block_size: usize,
) -> Result<Vec<Digest>, DigestError> {
    if block_size == 0 {
        return Err(DigestError::ZeroBlockSize);
    }
    let mut out = Vec::new();
    BlockDigest(algorithm).extend_whole(data, block_size, true, &mut out);
    Ok(out)
}

/// CRC-32C of every 4 KiB page of `data` (the last page may be shorter),
/// computed across the current rayon pool.
pub fn page_crcs(data: &[u8]) -> Vec<u32> {
    let mut out = Vec::new();
    PageCrc.extend_whole(data, PAGE_SIZE, true, &mut out);
    out
}

/// CRC-32C of every `page`-byte page of `data` (the last may be short),
/// in order, as little-endian bytes (4 per page): the form a catalog
/// stores beside a block's digest. Sequential: one block at a time, on
/// the caller's thread. A `page` of 0 is read as [`PAGE_SIZE`].
pub fn page_crc_blob(data: &[u8], page: usize) -> Vec<u8> {
    let page = if page == 0 { PAGE_SIZE } else { page };
    data.chunks(page)
        .flat_map(|p| page_crc(p).to_le_bytes())
        .collect()
}

/// CRC-32C of one page. crc-fast folds with carry-less multiplies
/// (VPCLMULQDQ on AVX-512 machines, PCLMULQDQ otherwise), 1.5-1.75x the
/// crc32c crate's SSE4.2 loop on 4 KiB pages on the benchmark host; both
/// compute the same function (tested against each other and against the
/// reference vector).
pub fn page_crc(page: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(page)
}

/// Bytes of a block [`hash_with_page_crcs`] checksums at a time: small
/// enough to stay in the CPU's cache between its two sums.
const FUSED_RUN: usize = 64 << 10;

/// The digest of `data` under `algorithm` and its [`page_crc_blob`], in
/// one pass over memory: each run of pages is CRC'd, then hashed, while
/// it is in the CPU's cache (two separate passes read a large block from
/// memory twice). The same values as the two calls; each run's CRCs are
/// computed before its bytes are hashed.
pub fn hash_with_page_crcs(algorithm: Algorithm, data: &[u8], page: usize) -> (Digest, Vec<u8>) {
    let page = if page == 0 { PAGE_SIZE } else { page };
    // A multiple of the page (both are powers of two, or the run is the
    // page itself), so pages never straddle runs.
    let run = if page.is_power_of_two() {
        page.max(FUSED_RUN)
    } else {
        page
    };
    let mut h = Hasher::new(algorithm);
    let mut blob = Vec::with_capacity(data.len().div_ceil(page) * 4);
    for chunk in data.chunks(run) {
        blob.extend(chunk.chunks(page).flat_map(|p| page_crc(p).to_le_bytes()));
        h.update(chunk);
    }
    (h.finalize(), blob)
}

/// Smallest page size a catalog may use, in bytes.
pub const MIN_PAGE_SIZE: usize = 512;
/// Largest page size a catalog may use, in bytes (1 MiB).
pub const MAX_PAGE_SIZE: usize = 1 << 20;

/// Whether `page` is a page size a catalog may use: a power of two from
/// [`MIN_PAGE_SIZE`] to [`MAX_PAGE_SIZE`].
pub fn valid_page_size(page: u64) -> bool {
    page.is_power_of_two() && (MIN_PAGE_SIZE as u64..=MAX_PAGE_SIZE as u64).contains(&page)
}

/// How to checksum one fixed-size piece of a stream.
trait PieceSum: Sync {
    type State: Send;
    type Out: Send;
    fn start(&self) -> Self::State;
    fn feed(&self, state: &mut Self::State, data: &[u8]);
    fn finish(&self, state: Self::State) -> Self::Out;

    fn one(&self, data: &[u8]) -> Self::Out {
        let mut s = self.start();
        self.feed(&mut s, data);
        self.finish(s)
    }

    /// Appends the sums of `data` cut in pieces of `size` (last may be short).
    fn extend_whole(&self, data: &[u8], size: usize, parallel: bool, out: &mut Vec<Self::Out>) {
        if parallel && data.len() >= crate::MIN_PARALLEL_LEN {
            // Aim for ≥ 256 KiB of work per rayon task.
            let min = (256 * 1024 / size).max(1);
            let sums: Vec<Self::Out> = data
                .par_chunks(size)
                .with_min_len(min)
                .map(|p| self.one(p))
                .collect();
            out.extend(sums);
        } else {
            out.extend(data.chunks(size).map(|p| self.one(p)));
        }
    }
}

struct BlockDigest(Algorithm);

impl PieceSum for BlockDigest {
    type State = Hasher;
    type Out = Digest;
    fn start(&self) -> Hasher {
        Hasher::new(self.0)
    }
    fn feed(&self, state: &mut Hasher, data: &[u8]) {
        state.update(data)
    }
    fn finish(&self, state: Hasher) -> Digest {
        state.finalize()
    }
}

struct PageCrc;

impl PieceSum for PageCrc {
    type State = u32;
    type Out = u32;
    fn start(&self) -> u32 {
        0
    }
    fn feed(&self, state: &mut u32, data: &[u8]) {
        *state = crc32c::crc32c_append(*state, data);
    }
    fn finish(&self, state: u32) -> u32 {
        state
    }
}

/// Cuts a stream, fed in arbitrary slices, into fixed-size pieces.
struct Splitter<P: PieceSum> {
    sum: P,
    size: usize,
    partial: Option<(P::State, usize)>,
    out: Vec<P::Out>,
}

impl<P: PieceSum> Splitter<P> {
    fn new(sum: P, size: usize) -> Self {
        Splitter {
            sum,
            size,
            partial: None,
            out: Vec::new(),
        }
    }

    fn update(&mut self, mut data: &[u8], parallel: bool) {
        if let Some((mut state, filled)) = self.partial.take() {
            let n = (self.size - filled).min(data.len());
            self.sum.feed(&mut state, &data[..n]);
            data = &data[n..];
            if filled + n == self.size {
                self.out.push(self.sum.finish(state));
            } else {
                self.partial = Some((state, filled + n));
                return;
            }
        }
        let whole = data.len() / self.size * self.size;
        self.sum
            .extend_whole(&data[..whole], self.size, parallel, &mut self.out);
        let rest = &data[whole..];
        if !rest.is_empty() {
            let mut state = self.sum.start();
            self.sum.feed(&mut state, rest);
            self.partial = Some((state, rest.len()));
        }
    }

    fn finish(mut self) -> Vec<P::Out> {
        if let Some((state, _)) = self.partial.take() {
            self.out.push(self.sum.finish(state));
        }
        self.out
    }
}

/// Everything [`Granular`] computed for one stream.
#[derive(Debug, Clone)]
pub struct GranularDigests {
    /// Digest of the whole stream.
    pub whole: Digest,
    /// Block size used for `blocks`, if blocks were asked for.
    pub block_size: Option<usize>,
    /// Per-block digests, same algorithm as `whole`.
    pub blocks: Vec<Digest>,
    /// Per-4 KiB-page CRC-32C values, if pages were asked for.
    pub pages: Option<Vec<u32>>,
    /// Bytes fed.
    pub len: u64,
}

/// Computes whole, per-block and per-page digests of a stream in one pass.
pub struct Granular {
    whole: Hasher,
    blocks: Option<Splitter<BlockDigest>>,
    pages: Option<Splitter<PageCrc>>,
    parallel: bool,
    len: u64,
}

impl Granular {
    /// Whole digest only; add granularities with the `with_` methods.
    /// `parallel` lets every `update` use the current rayon pool.
    pub fn new(algorithm: Algorithm, parallel: bool) -> Granular {
        Granular {
            whole: Hasher::new(algorithm),
            blocks: None,
            pages: None,
            parallel,
            len: 0,
        }
    }

    /// Tells the whole-stream hasher that about `len` bytes will follow
    /// (see [`Hasher::expecting`]); no effect once bytes have been fed.
    pub fn expecting(mut self, len: u64) -> Granular {
        if self.len == 0 {
            self.whole = Hasher::expecting(self.whole.algorithm(), len);
        }
        self
    }

    /// Also computes per-block digests with blocks of `block_size` bytes.
    pub fn with_blocks(mut self, block_size: usize) -> Result<Granular, DigestError> {
        if block_size == 0 {
            return Err(DigestError::ZeroBlockSize);
        }
        self.blocks = Some(Splitter::new(
            BlockDigest(self.whole.algorithm()),
            block_size,
        ));
        Ok(self)
    }

    /// Also computes per-4 KiB-page CRC-32C values.
    pub fn with_pages(mut self) -> Granular {
        self.pages = Some(Splitter::new(PageCrc, PAGE_SIZE));
        self
    }

    /// Feeds the next bytes of the stream.
    pub fn update(&mut self, data: &[u8]) {
        self.len += data.len() as u64;
        if self.parallel {
            self.whole.update_parallel(data);
        } else {
            self.whole.update(data);
        }
        if let Some(b) = &mut self.blocks {
            b.update(data, self.parallel);
        }
        if let Some(p) = &mut self.pages {
            p.update(data, self.parallel);
        }
    }

    /// Ends the stream.
    pub fn finish(self) -> GranularDigests {
        GranularDigests {
            whole: self.whole.finalize(),
            block_size: self.blocks.as_ref().map(|b| b.size),
            blocks: self.blocks.map(Splitter::finish).unwrap_or_default(),
            pages: self.pages.map(Splitter::finish),
            len: self.len,
        }
    }
}

#[cfg(test)]
mod blob_tests {
    use super::*;

    #[test]
    fn the_page_blob_holds_each_pages_crc_in_order() {
        let data: Vec<u8> = (0..3 * PAGE_SIZE + 100).map(|i| (i * 7) as u8).collect();
        let blob = page_crc_blob(&data, PAGE_SIZE);
        assert_eq!(blob.len(), 4 * 4, "three whole pages and a short one");
        let want: Vec<u8> = page_crcs(&data)
            .into_iter()
            .flat_map(u32::to_le_bytes)
            .collect();
        assert_eq!(blob, want);
        assert_eq!(
            &blob[12..16],
            &crc32c::crc32c(&data[3 * PAGE_SIZE..]).to_le_bytes()
        );
        assert!(page_crc_blob(&[], PAGE_SIZE).is_empty());
        let big = page_crc_blob(&data, 8192);
        assert_eq!(big.len(), 2 * 4, "one 8 KiB page and a short one");
        assert_eq!(&big[..4], &crc32c::crc32c(&data[..8192]).to_le_bytes());
    }

    #[test]
    fn the_page_crc_is_crc32c() {
        assert_eq!(page_crc(b"123456789"), 0xe306_9283, "CRC-32C check value");
        assert_eq!(page_crc(b""), 0);
        // Every length up to two folds of the widest SIMD path, and pages,
        // at every alignment the buffer allows, against the crc32c crate.
        let data: Vec<u8> = (0..3 * PAGE_SIZE + 64)
            .map(|i| (i * 131 + (i >> 5)) as u8)
            .collect();
        for start in 0..8 {
            for len in (0..1100).chain([4095, 4096, 4097, 8192, 3 * PAGE_SIZE]) {
                let piece = &data[start..start + len];
                assert_eq!(page_crc(piece), crc32c::crc32c(piece), "{start}+{len}");
            }
        }
    }

    #[test]
    fn page_sizes_are_powers_of_two_in_bounds() {
        assert!(valid_page_size(4096) && valid_page_size(65536) && valid_page_size(512));
        assert!(!valid_page_size(0) && !valid_page_size(256) && !valid_page_size(3000));
        assert!(!valid_page_size(2 << 20));
    }
}
