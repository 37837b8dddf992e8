//! Every algorithm and every code path against published vectors and
//! simple references, at the sizes where splitting goes wrong.

use std::io::Write;

use intact_digest::{
    block_digests, digest_file, hash, hash_parallel, hash_with_page_crcs, page_crcs, Algorithm,
    Digest, DigestPlan, Granular, Hasher, ReadPath, ReadStrategy, PAGE_SIZE,
};
use md5::Digest as _;
use proptest::prelude::*;

const BLOCK: usize = 1 << 20;

/// Sizes where page, block and parallel splitting have their edges.
const SIZES: [usize; 11] = [
    0,
    1,
    PAGE_SIZE - 1,
    PAGE_SIZE,
    PAGE_SIZE + 1,
    BLOCK - 1,
    BLOCK,
    BLOCK + 1,
    64 * 1024, // the mmap threshold
    3 * BLOCK + 17,
    5 * BLOCK,
];

/// Bitwise CRC-32C (reflected polynomial 0x82F63B78), as in RFC 3720.
fn crc32c_reference(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Adler-32 straight from RFC 1950.
fn adler32_reference(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &x in data {
        a = (a + u32::from(x)) % 65521;
        b = (b + a) % 65521;
    }
    (b << 16) | a
}

/// The digest each algorithm's own crate (or the reference above) gives
/// for the whole input at once, as hex.
fn reference_hex(alg: Algorithm, data: &[u8]) -> String {
    match alg {
        Algorithm::Crc32c => format!("{:08x}", crc32c_reference(data)),
        Algorithm::Adler32 => format!("{:08x}", adler32_reference(data)),
        Algorithm::Xxh3_64 => format!("{:016x}", xxhash_rust::xxh3::xxh3_64(data)),
        Algorithm::Xxh3_128 => format!("{:032x}", xxhash_rust::xxh3::xxh3_128(data)),
        Algorithm::Blake3 => blake3::hash(data).to_hex().to_string(),
        Algorithm::Sha256 => hex::encode(sha2::Sha256::digest(data)),
        Algorithm::Sha512 => hex::encode(sha2::Sha512::digest(data)),
        Algorithm::Sha1 => hex::encode(sha1::Sha1::digest(data)),
        Algorithm::Md5 => hex::encode(md5::Md5::digest(data)),
    }
}

fn data(len: usize, seed: u64) -> Vec<u8> {
    intact_sample::bytes(len, seed)
}

fn pool() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(4)
        .build()
        .unwrap()
}

#[test]
fn published_test_vectors() {
    let cases: [(Algorithm, &[u8], &str); 13] = [
        (Algorithm::Crc32c, b"123456789", "e3069283"),
        (Algorithm::Crc32c, b"", "00000000"),
        (Algorithm::Adler32, b"Wikipedia", "11e60398"),
        (Algorithm::Adler32, b"", "00000001"),
        (Algorithm::Xxh3_64, b"", "2d06800538d394c2"),
        (Algorithm::Xxh3_128, b"", "99aa06d3014798d86001c324468d497f"),
        (
            Algorithm::Blake3,
            b"",
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262",
        ),
        (
            Algorithm::Sha256,
            b"abc",
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        ),
        (
            Algorithm::Sha256,
            b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
        ),
        (
            Algorithm::Sha1,
            b"abc",
            "a9993e364706816aba3e25717850c26c9cd0d89d",
        ),
        (
            Algorithm::Sha512,
            b"abc",
            "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f",
        ),
        (Algorithm::Md5, b"", "d41d8cd98f00b204e9800998ecf8427e"),
        (Algorithm::Md5, b"abc", "900150983cd24fb0d6963f7d28e17f72"),
    ];
    for (alg, input, want) in cases {
        assert_eq!(hash(alg, input).to_hex(), want, "{alg} of {input:?}");
        assert_eq!(
            reference_hex(alg, input),
            want,
            "reference {alg} of {input:?}"
        );
    }
    // The XXH3 of "abc", as xxhsum 0.8.1 prints it (`printf abc | xxhsum -H3`).
    assert_eq!(
        hash(Algorithm::Xxh3_64, b"abc").to_hex(),
        "78af5f94892f3950"
    );
}

#[test]
fn every_path_matches_the_reference_at_boundary_sizes() {
    let pool = pool();
    let dir = tempfile::tempdir().unwrap();
    for (i, &len) in SIZES.iter().enumerate() {
        let input = data(len, i as u64);
        let path = dir.path().join(format!("f{len}"));
        std::fs::File::create(&path)
            .unwrap()
            .write_all(&input)
            .unwrap();
        for alg in Algorithm::ALL {
            let want = reference_hex(alg, &input);
            assert_eq!(hash(alg, &input).to_hex(), want, "{alg} one-shot, {len} B");
            let par = pool.install(|| hash_parallel(alg, &input));
            assert_eq!(par.to_hex(), want, "{alg} parallel, {len} B");

            let mut h = Hasher::new(alg);
            for piece in input.chunks(4093) {
                h.update(piece);
            }
            assert_eq!(h.finalize().to_hex(), want, "{alg} streamed, {len} B");

            for strategy in [ReadStrategy::Auto, ReadStrategy::Read, ReadStrategy::Mmap] {
                for parallel in [false, true] {
                    let plan = DigestPlan {
                        parallel,
                        strategy,
                        ..DigestPlan::whole(alg)
                    };
                    let got = pool.install(|| digest_file(&path, &plan)).unwrap();
                    assert_eq!(
                        got.digests.whole.to_hex(),
                        want,
                        "{alg} file {plan:?}, {len} B"
                    );
                    assert_eq!(got.digests.len, len as u64);
                    let mapped = match strategy {
                        ReadStrategy::Auto => len >= 64 * 1024,
                        ReadStrategy::Read => false,
                        ReadStrategy::Mmap => len > 0,
                    };
                    let expect = if mapped {
                        ReadPath::Mmap
                    } else {
                        ReadPath::Read
                    };
                    assert_eq!(got.read_path, expect, "{plan:?} {len} B");
                }
            }
        }
    }
}

/// A file of several mapping windows (16 MiB each) and a bit: the serial
/// mapped path maps, pre-faults and unmaps window by window, the parallel
/// one maps it whole; both must give the reference digest.
#[test]
fn files_of_several_mapping_windows_match_the_reference() {
    let pool = pool();
    let dir = tempfile::tempdir().unwrap();
    let len = 2 * 16 * 1024 * 1024 + PAGE_SIZE + 1;
    let input = data(len, 99);
    let path = dir.path().join("windows");
    std::fs::write(&path, &input).unwrap();
    for alg in [
        Algorithm::Xxh3_64,
        Algorithm::Sha256,
        Algorithm::Blake3,
        Algorithm::Crc32c,
    ] {
        let want = reference_hex(alg, &input);
        for strategy in [ReadStrategy::Auto, ReadStrategy::Read, ReadStrategy::Mmap] {
            for parallel in [false, true] {
                let plan = DigestPlan {
                    parallel,
                    strategy,
                    ..DigestPlan::whole(alg)
                };
                let got = pool.install(|| digest_file(&path, &plan)).unwrap();
                assert_eq!(got.digests.whole.to_hex(), want, "{alg} {plan:?}");
            }
        }
    }
}

#[test]
fn blocks_and_pages_match_the_reference() {
    let pool = pool();
    for (i, &len) in SIZES.iter().enumerate() {
        let input = data(len, 100 + i as u64);
        for alg in [Algorithm::Crc32c, Algorithm::Xxh3_64, Algorithm::Sha256] {
            for bs in [1, PAGE_SIZE, BLOCK - 1, BLOCK, BLOCK + 1] {
                let got = pool.install(|| block_digests(alg, &input, bs)).unwrap();
                let want: Vec<String> = input.chunks(bs).map(|c| reference_hex(alg, c)).collect();
                let got: Vec<String> = got.iter().map(Digest::to_hex).collect();
                assert_eq!(got, want, "{alg} blocks of {bs} B over {len} B");
            }
        }
        let want: Vec<u32> = input.chunks(PAGE_SIZE).map(crc32c_reference).collect();
        assert_eq!(
            pool.install(|| page_crcs(&input)),
            want,
            "pages over {len} B"
        );
    }
}

#[test]
fn one_pass_digest_and_page_crcs_match_the_reference() {
    for (i, &len) in SIZES.iter().chain(&[3 << 20, (1 << 20) + 4097]).enumerate() {
        let input = data(len, 300 + i as u64);
        for alg in [Algorithm::Xxh3_128, Algorithm::Sha256] {
            for page in [512, PAGE_SIZE, 64 << 10, 1 << 20, 1000] {
                let (digest, blob) = hash_with_page_crcs(alg, &input, page);
                assert_eq!(
                    digest.to_hex(),
                    reference_hex(alg, &input),
                    "{alg} of {len} B"
                );
                let want: Vec<u8> = input
                    .chunks(page)
                    .flat_map(|p| crc32c_reference(p).to_le_bytes())
                    .collect();
                assert!(blob == want, "pages of {page} B over {len} B");
            }
        }
    }
}

#[test]
fn zero_block_size_is_refused() {
    assert!(block_digests(Algorithm::Crc32c, b"x", 0).is_err());
    assert!(Granular::new(Algorithm::Crc32c, false)
        .with_blocks(0)
        .is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// However a stream is cut into `update` calls, and whatever the block
    /// size, the granular digests equal those of cutting the whole input.
    #[test]
    fn granular_is_independent_of_how_the_stream_is_fed(
        len in 0usize..300_000,
        block_size in 1usize..70_000,
        cuts in proptest::collection::vec(0usize..300_000, 0..8),
        parallel in any::<bool>(),
        alg_index in 0usize..Algorithm::ALL.len(),
    ) {
        let alg = Algorithm::ALL[alg_index];
        let input = data(len, len as u64);
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(len)).collect();
        cuts.push(0);
        cuts.push(len);
        cuts.sort_unstable();
        let mut g = Granular::new(alg, parallel).with_blocks(block_size).unwrap().with_pages();
        for w in cuts.windows(2) {
            g.update(&input[w[0]..w[1]]);
        }
        let got = g.finish();
        prop_assert_eq!(got.whole.to_hex(), reference_hex(alg, &input));
        let want_blocks: Vec<String> = input.chunks(block_size).map(|c| reference_hex(alg, c)).collect();
        let got_blocks: Vec<String> = got.blocks.iter().map(Digest::to_hex).collect();
        prop_assert_eq!(got_blocks, want_blocks);
        let want_pages: Vec<u32> = input.chunks(PAGE_SIZE).map(crc32c_reference).collect();
        prop_assert_eq!(got.pages.unwrap(), want_pages);
        prop_assert_eq!(got.len, len as u64);
    }
}
