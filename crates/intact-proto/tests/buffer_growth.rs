//! Memory follows bytes that arrived, not lengths announced, and frames
//! larger than the small buffer are paid for from the connection's budget
//! before their body is read, for as long as their message lives.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use intact_proto::{
    Block, Budget, Connection, Message, ProtoError, LARGEST_FRAME, SMALL_FRAME, UNPAID_FRAME,
};

/// This process's resident memory, from the kernel.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

#[test]
fn an_announced_16_mib_frame_costs_what_arrived() {
    let (mut a, b) = UnixStream::pair().unwrap();
    // 16 MiB announced (within the post-handshake limit), 64 KiB sent,
    // then the sender waits while we look at the reader's memory.
    let sent = 64 * 1024;
    let mut bytes = (16u32 << 20).to_be_bytes().to_vec();
    bytes.push(5);
    bytes.resize(4 + sent, 0xAB);
    let before = rss_bytes();
    let reader = std::thread::spawn(move || Connection::new(b).read_message().map(|_| ()));
    a.write_all(&bytes).unwrap();
    // The reader has read what was sent once nothing is left in flight.
    std::thread::sleep(Duration::from_millis(300));
    let during = rss_bytes();
    drop(a);
    let r = reader.join().unwrap();
    assert!(matches!(r, Err(ProtoError::Closed)), "{r:?}");
    let grew = during.saturating_sub(before);
    assert!(
        grew < 4 << 20,
        "resident memory grew by {grew} bytes for {sent} received of 16 MiB announced"
    );
}

fn block_frame(len: usize) -> (Message, Vec<u8>) {
    let msg = Message::Block(Block {
        file: 7,
        index: 3,
        source_level: 0,
        digest: vec![9; 16],
        crcs: Vec::new(),
        patch: Vec::new(),
        strong: Vec::new(),
        data: (0..len).map(|i| i as u8).collect(),
    });
    let mut out = Vec::new();
    msg.encode(&mut out);
    (msg, out)
}

#[test]
fn a_large_frame_holds_its_budget_until_its_message_is_dropped() {
    let budget = Budget::new(64 * LARGEST_FRAME as u64, 2);
    let (mut a, b) = UnixStream::pair().unwrap();
    let mut conn = Connection::new(b);
    conn.set_budget(budget.party(), Duration::from_secs(5));
    let (small, small_bytes) = block_frame(100);
    let (large, large_bytes) = block_frame(3 << 20);
    let all = [&small_bytes[..], &large_bytes, &small_bytes].concat();
    // A socket buffer holds far less than 3 MiB: write from a thread.
    let writer = std::thread::spawn(move || a.write_all(&all));
    assert_eq!(conn.read_message().unwrap(), Some(small.clone()));
    assert!(conn.take_held().is_none(), "a small frame needs no grant");
    assert_eq!(conn.read_message().unwrap(), Some(large));
    let held = conn.take_held().expect("a large frame is paid for");
    assert_eq!(held.amount(), large_bytes.len() as u64);
    assert_eq!(budget.held(), large_bytes.len() as u64);
    assert_eq!(conn.read_message().unwrap(), Some(small));
    assert_eq!(
        budget.held(),
        large_bytes.len() as u64,
        "held by the caller"
    );
    drop(held);
    assert_eq!(budget.held(), 0);
    writer.join().unwrap().unwrap();
    assert_eq!(conn.read_message().unwrap(), None);
    assert!(large_bytes.len() > SMALL_FRAME);
}

#[test]
fn a_frame_past_the_unpaid_size_pays_even_through_the_buffer() {
    let budget = Budget::new(64 * LARGEST_FRAME as u64, 2);
    let (mut a, b) = UnixStream::pair().unwrap();
    let mut conn = Connection::new(b);
    conn.set_budget(budget.party(), Duration::from_secs(5));
    // A 16 KiB file's block: its frame is a little past UNPAID_FRAME and
    // fits the buffer.
    let (mid, mid_bytes) = block_frame(16 * 1024);
    assert!(mid_bytes.len() > UNPAID_FRAME && mid_bytes.len() <= SMALL_FRAME);
    let (small, small_bytes) = block_frame(100);
    let all = [&mid_bytes[..], &small_bytes, &mid_bytes].concat();
    let writer = std::thread::spawn(move || a.write_all(&all));
    assert_eq!(conn.read_message().unwrap(), Some(mid.clone()));
    let held = conn.take_held().expect("paid for");
    assert_eq!(held.amount(), mid_bytes.len() as u64);
    assert_eq!(conn.read_message().unwrap(), Some(small));
    assert!(conn.take_held().is_none(), "a small frame needs no grant");
    assert_eq!(conn.read_message().unwrap(), Some(mid));
    let second = conn.take_held().expect("paid for");
    assert_eq!(budget.held(), 2 * mid_bytes.len() as u64);
    drop((held, second));
    assert_eq!(budget.held(), 0);
    writer.join().unwrap().unwrap();
}

#[test]
fn a_frame_waits_for_its_budget_and_fails_when_it_stays_taken() {
    // One place: all of it may be taken by one party; a second party of
    // the same budget then cannot read a large frame.
    let budget = Budget::new(2 * LARGEST_FRAME as u64, 1);
    let hog = budget.party().try_take(2 * LARGEST_FRAME as u64).unwrap();
    let (mut a, b) = UnixStream::pair().unwrap();
    let mut conn = Connection::new(b);
    conn.set_budget(budget.party(), Duration::from_millis(300));
    let (_, bytes) = block_frame(1 << 20);
    // Unread, the frame stays in flight: the writer ends with the socket.
    let writer = std::thread::spawn(move || {
        let _ = a.write_all(&bytes);
    });
    let r = conn.read_message();
    assert!(matches!(r, Err(ProtoError::Busy(_))), "{r:?}");
    drop(hog);
    assert_eq!(budget.held(), 0);
    drop(conn);
    writer.join().unwrap();
}
