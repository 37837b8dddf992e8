//! Page-level resend (protocol 10) against the real `intact serve`, with a
//! hand-written client: the server names the bad page of a block that
//! arrived damaged, takes a resend of that page alone, and refuses pages
//! it never asked for or that do not fit their block, without a panic and
//! without touching anything but the session's own partial file.

mod common;

use std::fs;

use common::wire::*;
use common::Server;
use intact_proto::{Block, FileStatus, Message, WIRE_PAGE};
use intact_transfer::VerifyMode;

const BS: usize = 64 << 10;

/// A whole block of `data` with its digest and page CRCs, and `bad` (if
/// any) flipped after they were computed: damaged on the way.
fn damaged(file: u64, index: u64, data: &[u8], bad: Option<usize>) -> Block {
    let Message::Block(mut b) = block(file, index, data) else {
        unreachable!()
    };
    if let Some(at) = bad {
        b.data[at] ^= 1;
    }
    b
}

/// A resend of `pages` of block `index` of `data` (the digest and CRCs
/// of the whole block, as a sender sends them).
fn patch(file: u64, index: u64, data: &[u8], pages: &[u32]) -> Block {
    let mut b = damaged(file, index, data, None);
    b.patch = pages.to_vec();
    b.data = pages
        .iter()
        .flat_map(|&p| data[Block::page_range(data.len(), p)].to_vec())
        .collect();
    b
}

/// The next BlockResult: (index, ok, pages).
fn block_result(conn: &mut Conn) -> (u64, bool, Vec<u32>) {
    conn.flush().unwrap();
    loop {
        match next(conn) {
            Some(Message::BlockResult {
                index, ok, pages, ..
            }) => return (index, ok, pages),
            Some(_) => {}
            None => panic!("connection closed before a BlockResult"),
        }
    }
}

/// Whether the server ends the connection: read until it does, or until
/// the read times out (60 s, see [`connect`]), which is not an end.
fn ends(conn: &mut Conn) -> bool {
    let _ = conn.flush();
    let start = std::time::Instant::now();
    loop {
        match conn.read_message() {
            Ok(Some(_)) => {}
            Ok(None) => return true,
            // A reset is an end too; a timeout is not.
            Err(_) => return start.elapsed() < std::time::Duration::from_secs(50),
        }
    }
}

#[test]
fn a_damaged_page_is_named_resent_alone_and_only_named_pages_are_taken() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let mut server = Server::start(&root);
    let data = intact_sample::bytes(2 * BS + 5000, 11);
    let blocks: Vec<&[u8]> = data.chunks(BS).collect();
    let entry =
        |id, name: &str| file_entry(id, name, data.len() as u64, BS as u32, VerifyMode::Fiver);

    // Honest: block 0 arrives with page 3 damaged; the server names page
    // 3 alone; the page is resent alone; the file commits, exact.
    let mut conn = connect(&server);
    conn.send(&Message::Entry(entry(0, "good.bin"))).unwrap();
    status_of(&mut conn, 0);
    let at = 3 * WIRE_PAGE + 17;
    conn.write_message(&Message::Block(damaged(0, 0, blocks[0], Some(at))))
        .unwrap();
    assert_eq!(block_result(&mut conn), (0, false, vec![3]));
    conn.write_message(&Message::Block(patch(0, 0, blocks[0], &[3])))
        .unwrap();
    assert_eq!(block_result(&mut conn), (0, true, vec![]));
    // The short last block: its last page is short too.
    let last = blocks[2];
    let short_page = (last.len() - 1) / WIRE_PAGE;
    conn.write_message(&Message::Block(damaged(0, 2, last, Some(last.len() - 1))))
        .unwrap();
    assert_eq!(block_result(&mut conn), (2, false, vec![short_page as u32]));
    conn.write_message(&Message::Block(patch(0, 2, last, &[short_page as u32])))
        .unwrap();
    assert_eq!(block_result(&mut conn), (2, true, vec![]));
    conn.write_message(&block(0, 1, blocks[1])).unwrap();
    assert_eq!(block_result(&mut conn), (1, true, vec![]));
    conn.send(&file_end(0, 3, &data)).unwrap();
    let r = result_of(&mut conn, 0);
    assert_eq!(r.status, FileStatus::Verified, "{}", r.message);
    bye(conn);
    assert!(fs::read(root.join("good.bin")).unwrap() == data);

    // Hostile, each on its own connection, each refused by ending that
    // connection with its reason in the server's log: a patch of a block
    // whose pages were never named; a patch whose bytes are not its pages'
    // length; a page past the block's end; page CRCs that are not one per
    // page.
    let cases: Vec<(&str, Vec<Message>)> = vec![
        (
            "whose pages were not asked for",
            vec![Message::Block(patch(0, 1, blocks[1], &[0]))],
        ),
        ("patch length does not match its pages", {
            let mut p = patch(0, 0, blocks[0], &[3]);
            p.data.truncate(100);
            vec![
                Message::Block(damaged(0, 0, blocks[0], Some(at))),
                Message::Block(p),
            ]
        }),
        ("a patched page past the end of the block", {
            // Block 2 holds 5000 bytes: pages 0 and 1; page 2 is past it.
            let mut p = patch(0, 2, last, &[1]);
            p.patch = vec![2];
            p.data.clear();
            vec![
                Message::Block(damaged(0, 2, last, Some(0))),
                Message::Block(p),
            ]
        }),
        ("page CRCs do not match the block's length", {
            let mut b = damaged(0, 0, blocks[0], None);
            b.crcs.truncate(8);
            vec![Message::Block(b)]
        }),
    ];
    let mut seen = Vec::new();
    for (why, msgs) in cases {
        let mut conn = connect(&server);
        conn.send(&Message::Entry(entry(0, "hostile.bin"))).unwrap();
        status_of(&mut conn, 0);
        for m in &msgs {
            conn.write_message(m).unwrap();
        }
        assert!(ends(&mut conn), "{why}: the connection stayed open");
        // The server logs the session's end once it has ended.
        let mut log = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !log.iter().any(|l: &String| l.contains(why)) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match server.log.recv_timeout(left) {
                Ok(l) => log.push(l),
                Err(_) => panic!("{why}: not the reason given: {log:?}"),
            }
        }
        seen.extend(log);
    }
    alive(&mut server);
    seen.extend(server.log.try_iter());
    assert!(
        !seen.iter().any(|l| l.contains("panicked")),
        "a session panicked: {seen:?}"
    );
    // The committed file is untouched by all of it.
    assert!(fs::read(root.join("good.bin")).unwrap() == data);
    honest_send_works(&server, dir.path(), &root, "after");
}
