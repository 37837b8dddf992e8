//! Frames whose lists decode into more than their own bytes pay for
//! that from the connection's budget before they are decoded (review
//! finding A2). Its own test binary: buffer_growth.rs reads this
//! process's RSS, which these tests' allocations would disturb.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use intact_proto::{
    decoded_extra, Block, Budget, Connection, Message, ProtoError, LARGEST_FRAME, LIST_ITEM_COST,
    SMALL_FRAME,
};

fn block_frame(len: usize) -> Vec<u8> {
    let msg = Message::Block(Block {
        file: 7,
        index: 3,
        source_level: 0,
        digest: vec![9; 16],
        crcs: Vec::new(),
        patch: Vec::new(),
        strong: Vec::new(),
        data: vec![1; len],
    });
    let mut out = Vec::new();
    msg.encode(&mut out);
    out
}

/// A DeleteKeep of `n` 4-byte paths, and its frame.
fn keep_frame(n: u32) -> (Message, Vec<u8>) {
    let msg = Message::DeleteKeep {
        paths: (0..n).map(|i| i.to_be_bytes().to_vec()).collect(),
    };
    let mut out = Vec::new();
    msg.encode(&mut out);
    (msg, out)
}

/// Attack (review finding A2): a list frame decodes into one allocation
/// per item, ~7 times its wire size for 4-byte paths; the budget must
/// count that, for small frames (read through the buffer) and large ones,
/// before decoding.
#[test]
fn list_frames_pay_for_what_they_decode_into_before_they_are_decoded() {
    let budget = Budget::new(64 * LARGEST_FRAME as u64, 2);
    let (mut a, b) = UnixStream::pair().unwrap();
    let mut conn = Connection::new(b);
    conn.set_budget(budget.party(), Duration::from_secs(5));
    let (small, small_bytes) = keep_frame(1000);
    let (large, large_bytes) = keep_frame(200_000);
    assert!(small_bytes.len() < SMALL_FRAME && large_bytes.len() > SMALL_FRAME);
    let all = [&small_bytes[..], &large_bytes].concat();
    let writer = std::thread::spawn(move || a.write_all(&all));
    assert_eq!(conn.read_message().unwrap(), Some(small));
    let held = conn.take_held().expect("a small list frame is paid for");
    assert_eq!(held.amount(), 1000 * LIST_ITEM_COST);
    assert_eq!(conn.read_message().unwrap(), Some(large));
    let held2 = conn.take_held().expect("a large list frame is paid for");
    assert_eq!(
        held2.amount(),
        large_bytes.len() as u64 + 200_000 * LIST_ITEM_COST
    );
    assert_eq!(budget.held(), held.amount() + held2.amount());
    drop((held, held2));
    assert_eq!(budget.held(), 0);
    writer.join().unwrap().unwrap();

    // A budget that holds the frame's wire bytes (1.6 MB) but not what it
    // decodes into (14 MB): the read fails, waiting no longer than asked.
    let budget = Budget::new(8 << 20, 1);
    let (mut a, b) = UnixStream::pair().unwrap();
    let mut conn = Connection::new(b);
    conn.set_budget(budget.party(), Duration::from_millis(300));
    let writer = std::thread::spawn(move || {
        let _ = a.write_all(&large_bytes);
    });
    let r = conn.read_message();
    assert!(matches!(r, Err(ProtoError::Busy(_))), "{r:?}");
    drop(conn);
    assert_eq!(budget.held(), 0, "the wire bytes' grant was given back");
    writer.join().unwrap();
}

#[test]
fn a_frame_count_beyond_its_length_is_believed_only_as_far_as_the_length() {
    // Four bytes of body claiming 2^32 - 1 paths.
    let body = [13u8, 0xFF, 0xFF, 0xFF, 0xFF];
    let (_, real) = keep_frame(3);
    assert_eq!(real[4], body[0], "13 is DeleteKeep's type");
    assert_eq!(decoded_extra(&body), LIST_ITEM_COST);
    assert_eq!(decoded_extra(&real[4..]), 3 * LIST_ITEM_COST);
    let block = block_frame(100);
    assert_eq!(decoded_extra(&block[4..]), 0, "a Block decodes in place");
}
