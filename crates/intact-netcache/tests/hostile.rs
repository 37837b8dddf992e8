//! Hostile bytes at every layer the cache reads: random Ethernet frames,
//! TCP segments with arbitrary sequence numbers and flags, and connection
//! byte streams that start as intact's and then lie. Nothing panics,
//! nothing is kept that does not hash to its BLAKE3, and what waits
//! behind holes stays within its budget.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use intact_netcache::follow::{Budget, Conn, Side};
use intact_netcache::tcp::{Reassembly, Segment};
use intact_netcache::{Counters, Store};
use intact_proto::{Block, Message};
use proptest::prelude::*;

fn fresh(bound: u64) -> (Arc<Store>, Arc<Counters>) {
    (Arc::new(Store::new(bound)), Arc::new(Counters::default()))
}

/// A keyless session's opening, then `blocks`.
fn session(blocks: &[Block]) -> (Vec<u8>, Vec<u8>) {
    let mut c = Vec::new();
    Message::Hello {
        version: intact_proto::VERSION,
        keyed: false,
        nonce: [1; 32],
        session: [0; 16],
        suite: 0,
        share: [0; 32],
    }
    .encode(&mut c);
    Message::Join {
        payload: vec![5; 32],
    }
    .encode(&mut c);
    for b in blocks {
        Message::Block(b.clone()).encode(&mut c);
    }
    let mut s = Vec::new();
    Message::Hello {
        version: intact_proto::VERSION,
        keyed: false,
        nonce: [2; 32],
        session: [0; 16],
        suite: 0,
        share: [0; 32],
    }
    .encode(&mut s);
    (c, s)
}

fn block(data: Vec<u8>, honest: bool) -> Block {
    let mut strong = blake3::hash(&data).as_bytes().to_vec();
    if !honest {
        strong[0] ^= 1;
    }
    Block {
        file: 1,
        index: 0,
        source_level: 0,
        digest: vec![0; 16],
        crcs: Vec::new(),
        patch: Vec::new(),
        strong,
        data,
    }
}

#[test]
fn honest_blocks_are_kept_and_lying_ones_rejected_whatever_the_chunking() {
    let blocks = vec![
        block(vec![1; 5000], true),
        block(vec![2; 7000], false),
        block(vec![3; 100], true),
    ];
    let (c, s) = session(&blocks);
    for chunk in [1, 3, 64, 4096, c.len()] {
        let (store, counters) = fresh(1 << 20);
        let mut conn = Conn::new(
            Arc::clone(&store),
            Arc::clone(&counters),
            Budget::new(64 << 20),
        );
        // The server's Hello first, as a capture may deliver it.
        conn.feed(Side::Server, &s);
        for piece in c.chunks(chunk) {
            conn.feed(Side::Client, piece);
        }
        assert_eq!(counters.cached.load(Ordering::SeqCst), 2, "chunk {chunk}");
        assert_eq!(counters.rejected.load(Ordering::SeqCst), 1, "chunk {chunk}");
        assert!(store.get(blake3::hash(&[1; 5000]).as_bytes()).is_some());
        assert!(store.get(blake3::hash(&[2; 7000]).as_bytes()).is_none());
        assert!(conn.stopped().is_none());
    }
}

#[test]
fn a_failed_files_blocks_stay_cached_but_unheld_and_the_budget_is_given_back() {
    let blocks: Vec<Block> = (0..5u8).map(|n| block(vec![n; 1000], true)).collect();
    let (c, s) = session(&blocks);
    let (store, counters) = fresh(1 << 20);
    let budget = Budget::new(1 << 20);
    let mut conn = Conn::new(
        Arc::clone(&store),
        Arc::clone(&counters),
        Arc::clone(&budget),
    );
    conn.feed(Side::Server, &s);
    conn.feed(Side::Client, &c);
    assert_eq!(counters.cached.load(Ordering::SeqCst), 5);
    let held = budget.used();
    assert!(held > 0);
    let mut failed = Vec::new();
    Message::FileResult(intact_proto::FileResult {
        file: 1,
        status: intact_proto::FileStatus::Failed,
        level: 0,
        message: String::new(),
        resident: 0,
        evict_micros: 0,
        check_micros: 0,
        unchanged: false,
        reverified: 0,
        trusted: 0,
        trusted_level: 0,
        trusted_at: 0,
        split: 0,
        cache_repairs: 0,
        cache_micros: 0,
        source_repairs: 0,
        source_micros: 0,
        digest: Vec::new(),
    })
    .encode(&mut failed);
    conn.feed(Side::Server, &failed);
    assert_eq!(budget.used(), 0, "the tracked digests were given back");
    // Kept for a second attempt at the file.
    assert_eq!(store.stats().blocks, 5);
}

#[test]
fn the_largest_blocks_are_followed_whatever_the_reads_sizes() {
    let mut big = block(vec![5; intact_proto::MAX_BLOCK], true);
    big.crcs = vec![0; 4 * intact_proto::MAX_PAGES];
    let (c, s) = session(&[big.clone(), big]);
    for read in [256 * 1024, 65_536, 1 << 20, 3_000_001] {
        let (store, counters) = fresh(64 << 20);
        let budget = Budget::new(40 << 20);
        let mut conn = Conn::new(
            Arc::clone(&store),
            Arc::clone(&counters),
            Arc::clone(&budget),
        );
        conn.feed(Side::Server, &s);
        for piece in c.chunks(read) {
            conn.feed(Side::Client, piece);
            assert!(
                budget.used() <= intact_proto::MAX_FRAME + 8192,
                "{}",
                budget.used()
            );
        }
        assert!(conn.stopped().is_none(), "{read}: {:?}", conn.stopped());
        assert_eq!(counters.cached.load(Ordering::SeqCst), 2, "{read}");
    }
}

#[test]
fn many_connections_holding_huge_frames_stay_within_one_budget() {
    let (c, s) = session(&[]);
    let (store, counters) = fresh(1 << 20);
    let limit = 4 << 20;
    let budget = Budget::new(limit);
    let mut conns = Vec::new();
    for _ in 0..64 {
        let mut conn = Conn::new(
            Arc::clone(&store),
            Arc::clone(&counters),
            Arc::clone(&budget),
        );
        conn.feed(Side::Server, &s);
        conn.feed(Side::Client, &c);
        // A frame that says it is as large as allowed, then its bytes.
        conn.feed(
            Side::Client,
            &(intact_proto::MAX_FRAME as u32).to_be_bytes(),
        );
        conn.feed(Side::Client, &vec![0u8; 1 << 20]);
        assert!(budget.used() <= limit);
        conns.push(conn);
    }
    assert!(counters.memory.load(Ordering::SeqCst) >= 60, "{counters:?}");
    drop(conns);
    assert_eq!(budget.used(), 0, "every connection gave back what it took");
}

fn addr(p: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, (p % 3) as u8 + 1], 7000 + p % 5))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_frames_never_panic(frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..2000), 0..60)) {
        let (store, counters) = fresh(1 << 20);
        let mut tcp = Reassembly::new(Budget::new(1 << 16), store, counters);
        for f in &frames {
            intact_netcache::capture::handle(f, &mut tcp);
        }
        prop_assert!(tcp.waiting() <= 1 << 16);
    }

    #[test]
    fn arbitrary_segments_stay_within_the_budget(
        segs in proptest::collection::vec(
            (any::<u16>(), any::<u16>(), any::<u32>(), any::<u8>(), proptest::collection::vec(any::<u8>(), 0..3000)),
            0..200,
        )
    ) {
        let (store, counters) = fresh(1 << 20);
        let budget = 20_000;
        let bud = Budget::new(budget);
        let mut tcp = Reassembly::new(Arc::clone(&bud), store, counters);
        for (a, b, seq, flags, payload) in &segs {
            tcp.segment(Segment {
                from: addr(*a),
                to: addr(*b),
                seq: *seq,
                syn: flags & 1 != 0,
                ack: flags & 2 != 0,
                fin: flags & 4 != 0,
                rst: flags & 8 != 0,
                payload,
            });
            prop_assert!(tcp.waiting() <= budget && bud.used() <= budget);
        }
        tcp.sweep(std::time::Instant::now() + std::time::Duration::from_secs(3600));
        prop_assert_eq!(tcp.waiting(), 0);
        prop_assert_eq!(tcp.flows(), 0);
        prop_assert_eq!(bud.used(), 0, "every connection gave back what it took");
    }

    #[test]
    fn a_session_that_goes_on_with_junk_never_panics_nor_keeps_a_lie(
        junk in proptest::collection::vec(any::<u8>(), 0..20_000),
        cut in 0usize..5000,
        server_junk in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let (c, s) = session(&[block(vec![9; 3000], true)]);
        let (store, counters) = fresh(1 << 20);
        let mut conn = Conn::new(Arc::clone(&store), Arc::clone(&counters), Budget::new(64 << 20));
        let mut bytes = c[..cut.min(c.len())].to_vec();
        bytes.extend_from_slice(&junk);
        conn.feed(Side::Client, &bytes);
        conn.feed(Side::Server, &s);
        conn.feed(Side::Server, &server_junk);
        // Whatever was kept hashes to its key.
        let st = store.stats();
        prop_assert!(st.blocks <= 1 + counters.cached.load(Ordering::SeqCst));
        if let Some(d) = store.get(blake3::hash(&[9; 3000]).as_bytes()) {
            prop_assert_eq!(&d[..], &[9u8; 3000][..]);
        }
    }
}
