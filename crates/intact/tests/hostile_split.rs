//! Split files (issue 18) against the real `intact serve`, spoken frame by
//! frame: ranges of one file sent by several sessions meet in one partial
//! file and are committed once every range verified; claims never
//! overlap; a block outside its claim ends only its connection; another
//! split, a wrong range digest or a gap never gets a file committed; a
//! client killed mid-range frees its claim; a range of a committed file
//! is unchanged only by its digest. Each test reads what is on disk (the
//! final name, its bytes, the journal after the server stopped) and ends
//! with an honest send the same server still serves.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::wire::*;
use common::Server;
use intact_digest::Blake3Blocks;
use intact_proto::{range_digest, Entry, EntryRange, FileResult, FileStatus, Holding, Message};
use intact_transfer::{Journal, VerifyMode};

const BS: u32 = 4096;
const SIZE: u64 = 4 * BS as u64 - 100;
const PATH: &str = "big.bin";

fn data(seed: u64) -> Vec<u8> {
    intact_sample::bytes(SIZE as usize, seed)
}

fn blocks_of(data: &[u8]) -> Vec<&[u8]> {
    data.chunks(BS as usize).collect()
}

fn range_entry(id: u64, split: [u8; 16], first: u64, end: u64, mode: VerifyMode) -> Entry {
    Entry {
        range: Some(EntryRange { split, first, end }),
        ..file_entry(id, PATH, SIZE, BS, mode)
    }
}

/// The range digest of blocks `first..end` of `data`, as a sender makes it.
fn digest_of(data: &[u8], first: u64, end: u64) -> Vec<u8> {
    let mut t = Blake3Blocks::new(data.len() as u64, u64::from(BS)).unwrap();
    for (i, b) in blocks_of(data).iter().enumerate() {
        t.set(i as u64, b);
    }
    let cvs = t.range_cvs(first, end).unwrap();
    range_digest(data.len() as u64, u64::from(BS), first, end, &cvs).to_vec()
}

fn range_end(id: u64, first: u64, end: u64, digest: Vec<u8>) -> Message {
    Message::FileEnd {
        file: id,
        blocks: end - first,
        source_level: SOURCE_LEVEL,
        digest,
    }
}

/// What an honest sender's reads of its source reach, `device` (so that the
/// receiver's level is its own).
const SOURCE_LEVEL: u8 = 3;

/// Block `index` of `data`, read at [`SOURCE_LEVEL`].
fn block_at(id: u64, index: u64, data: &[u8]) -> Message {
    match block(id, index, data) {
        Message::Block(b) => Message::Block(intact_proto::Block {
            source_level: SOURCE_LEVEL,
            ..b
        }),
        _ => unreachable!(),
    }
}

/// Sends range `first..end` of `data` as file `id` on `conn`, whole.
fn send_range(conn: &mut Conn, id: u64, split: [u8; 16], data: &[u8], first: u64, end: u64) {
    conn.send(&Message::Entry(range_entry(
        id,
        split,
        first,
        end,
        VerifyMode::Block,
    )))
    .unwrap();
    status_of(conn, id);
    let blocks = blocks_of(data);
    for i in first..end {
        conn.send(&block_at(id, i, blocks[i as usize])).unwrap();
    }
    conn.send(&range_end(id, first, end, digest_of(data, first, end)))
        .unwrap();
}

fn fresh(server: &Server) -> Conn {
    stream_of(server, &intact_proto::SessionSecret::random().unwrap())
}

fn assert_verified(r: &FileResult, split: u8) {
    assert_eq!(r.status, FileStatus::Verified, "{}", r.message);
    assert_eq!(r.split, split, "{}", r.message);
}

/// The journal's record of the file, read after the server stopped.
fn recorded(root: &Path) -> intact_transfer::FileRow {
    Journal::open(root)
        .unwrap()
        .lookup(PATH.as_bytes())
        .unwrap()
        .expect("a row")
}

#[test]
fn two_sessions_send_the_ranges_and_the_file_is_committed_once_with_its_blake3() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let mut server = Server::start(&root);
    let d = data(1);
    let split = [7; 16];
    let mut a = fresh(&server);
    let mut b = fresh(&server);
    send_range(&mut a, 1, split, &d, 0, 2);
    assert_verified(&result_of(&mut a, 1), FileResult::SPLIT_WAITING);
    assert!(
        !root.join(PATH).exists(),
        "committed with half of its ranges"
    );
    send_range(&mut b, 1, split, &d, 2, 4);
    let r = result_of(&mut b, 1);
    assert_verified(&r, FileResult::SPLIT_COMMITTED);
    assert!(r.message.contains("committed at level"), "{}", r.message);
    assert!(fs::read(root.join(PATH)).unwrap() == d, "bytes differ");
    bye(a);
    bye(b);
    honest_send_works(&server, dir.path(), &root, "honest");
    alive(&mut server);
    drop(server);
    let row = recorded(&root);
    assert!(row.done);
    assert_eq!(row.digest, Some(*blake3::hash(&d).as_bytes()));
    assert_eq!(row.split, Some(split));
}

#[test]
fn overlapping_claims_and_blocks_outside_a_claim_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let mut server = Server::start(&root);
    let d = data(2);
    let split = [8; 16];
    let mut a = fresh(&server);
    a.send(&Message::Entry(range_entry(
        1,
        split,
        0,
        3,
        VerifyMode::Block,
    )))
    .unwrap();
    status_of(&mut a, 1);
    // Overlapping a live claim.
    let mut b = fresh(&server);
    b.send(&Message::Entry(range_entry(
        1,
        split,
        2,
        4,
        VerifyMode::Block,
    )))
    .unwrap();
    let r = result_of(&mut b, 1);
    assert_eq!(r.status, FileStatus::Failed);
    assert!(
        r.message
            .contains("blocks 0..3 are being received by another session"),
        "{}",
        r.message
    );
    // A block outside its own claim ends that connection only.
    b.send(&Message::Entry(range_entry(
        2,
        split,
        3,
        4,
        VerifyMode::Block,
    )))
    .unwrap();
    status_of(&mut b, 2);
    b.send(&block(2, 0, blocks_of(&d)[0])).unwrap();
    while next(&mut b).is_some() {}
    // The first claim goes on; its blocks are its own.
    let blocks = blocks_of(&d);
    for i in 0..3 {
        a.send(&block(1, i, blocks[i as usize])).unwrap();
    }
    a.send(&range_end(1, 0, 3, digest_of(&d, 0, 3))).unwrap();
    assert_verified(&result_of(&mut a, 1), FileResult::SPLIT_WAITING);
    // The dropped connection's claim is free again.
    let mut c = fresh(&server);
    send_range(&mut c, 1, split, &d, 3, 4);
    assert_verified(&result_of(&mut c, 1), FileResult::SPLIT_COMMITTED);
    assert!(fs::read(root.join(PATH)).unwrap() == d, "bytes differ");
    alive(&mut server);
    honest_send_works(&server, dir.path(), &root, "honest");
}

#[test]
fn another_split_or_a_wrong_digest_or_a_gap_never_commits_wrong_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let mut server = Server::start(&root);
    let (x, y) = (data(3), data(4));
    let mut a = fresh(&server);
    a.send(&Message::Entry(range_entry(
        1,
        [1; 16],
        0,
        2,
        VerifyMode::Block,
    )))
    .unwrap();
    status_of(&mut a, 1);
    // Another split of the path while the first has a live claim.
    let mut b = fresh(&server);
    b.send(&Message::Entry(range_entry(
        1,
        [2; 16],
        2,
        4,
        VerifyMode::Block,
    )))
    .unwrap();
    let r = result_of(&mut b, 1);
    assert_eq!(r.status, FileStatus::Failed);
    assert!(r.message.contains("another split"), "{}", r.message);
    // A wrong range digest (the bytes of another file): not confirmed.
    let blocks = blocks_of(&x);
    a.send(&block(1, 0, blocks[0])).unwrap();
    a.send(&block(1, 1, blocks[1])).unwrap();
    a.send(&range_end(1, 0, 2, digest_of(&y, 0, 2))).unwrap();
    let r = result_of(&mut a, 1);
    assert_eq!(r.status, FileStatus::Failed, "{}", r.message);
    // The other half verifies, but blocks 0..2 have no confirmed range.
    send_range(&mut b, 2, [1; 16], &x, 2, 4);
    let r = result_of(&mut b, 2);
    assert_verified(&r, FileResult::SPLIT_WAITING);
    assert!(r.message.contains("blocks 0..2"), "{}", r.message);
    assert!(!root.join(PATH).exists(), "committed with a gap");
    // Sent again right, the file is whole and committed.
    send_range(&mut a, 2, [1; 16], &x, 0, 2);
    assert_verified(&result_of(&mut a, 2), FileResult::SPLIT_COMMITTED);
    assert!(fs::read(root.join(PATH)).unwrap() == x, "bytes differ");
    alive(&mut server);
    honest_send_works(&server, dir.path(), &root, "honest");
}

#[test]
fn a_client_killed_mid_range_frees_its_claim_and_a_restart_keeps_what_was_confirmed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let mut server = Server::start(&root);
    let d = data(5);
    let split = [9; 16];
    let mut a = fresh(&server);
    send_range(&mut a, 1, split, &d, 2, 4);
    assert_verified(&result_of(&mut a, 1), FileResult::SPLIT_WAITING);
    bye(a);
    // Killed mid-range: one block written, then the connection drops.
    let mut k = fresh(&server);
    k.send(&Message::Entry(range_entry(
        1,
        split,
        0,
        2,
        VerifyMode::Block,
    )))
    .unwrap();
    status_of(&mut k, 1);
    k.send(&block(1, 0, blocks_of(&d)[0])).unwrap();
    drop(k);
    let t = Instant::now();
    let mut b = loop {
        let mut b = fresh(&server);
        b.send(&Message::Entry(range_entry(
            1,
            split,
            0,
            2,
            VerifyMode::Block,
        )))
        .unwrap();
        match next(&mut b) {
            Some(Message::Status { .. }) => break b,
            Some(Message::FileResult(r)) if t.elapsed() < Duration::from_secs(10) => {
                assert!(r.message.contains("another session"), "{}", r.message);
                std::thread::sleep(Duration::from_millis(100));
            }
            other => panic!("the killed client's claim was not freed: {other:?}"),
        }
    };
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    bye_abandoned(&mut b);
    // A restart between ranges: the confirmed range 2..4 stands.
    alive(&mut server);
    drop(server);
    let server = Server::start(&root);
    let mut c = fresh(&server);
    send_range(&mut c, 1, split, &d, 0, 2);
    assert_verified(&result_of(&mut c, 1), FileResult::SPLIT_COMMITTED);
    assert!(fs::read(root.join(PATH)).unwrap() == d, "bytes differ");
    bye(c);
    drop(server);
    assert_eq!(recorded(&root).digest, Some(*blake3::hash(&d).as_bytes()));
}

/// Ends file 1 on `b` unsent (abandoned), then the connection.
fn bye_abandoned(b: &mut Conn) {
    b.send(&Message::FileEnd {
        file: 1,
        blocks: intact_proto::FileEnd::ABANDON,
        source_level: 0,
        digest: Vec::new(),
    })
    .unwrap();
    let r = result_of(b, 1);
    assert_eq!(r.status, FileStatus::Failed);
}

#[test]
fn a_range_of_a_committed_file_is_unchanged_only_by_its_digest() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let mut server = Server::start(&root);
    let d = data(6);
    let split = [3; 16];
    let mut a = fresh(&server);
    send_range(&mut a, 1, split, &d, 0, 2);
    assert_verified(&result_of(&mut a, 1), FileResult::SPLIT_WAITING);
    send_range(&mut a, 2, split, &d, 2, 4);
    assert_verified(&result_of(&mut a, 2), FileResult::SPLIT_COMMITTED);
    // Again: the blocks held are listed, nothing is sent, and the range
    // digest of the bytes read from the final file decides.
    a.send(&Message::Entry(range_entry(
        3,
        split,
        0,
        2,
        VerifyMode::Block,
    )))
    .unwrap();
    let holding = loop {
        match next(&mut a) {
            Some(Message::Status {
                file: 3, holding, ..
            }) => break holding,
            Some(Message::FileResult(r)) if r.file == 3 => panic!("{}", r.message),
            Some(_) => {}
            None => panic!("closed"),
        }
    };
    let Holding::Blocks(list) = holding else {
        panic!("{holding:?}")
    };
    assert_eq!(list.iter().map(|(i, _)| *i).collect::<Vec<_>>(), [0, 1]);
    a.send(&range_end(3, 0, 2, digest_of(&d, 0, 2))).unwrap();
    let r = result_of(&mut a, 3);
    assert_verified(&r, FileResult::SPLIT_HELD);
    assert!(r.unchanged);
    assert_eq!(
        r.trusted,
        2 * u64::from(BS),
        "trusted at its record's level"
    );
    assert_eq!(r.level, intact_transfer::VerifyLevel::Cache.wire_id());
    // A source whose blocks differ: never unchanged.
    let other = data(7);
    a.send(&Message::Entry(range_entry(
        4,
        split,
        2,
        4,
        VerifyMode::Block,
    )))
    .unwrap();
    status_of(&mut a, 4);
    a.send(&range_end(4, 2, 4, digest_of(&other, 2, 4)))
        .unwrap();
    let r = result_of(&mut a, 4);
    assert_eq!(r.status, FileStatus::Failed, "{}", r.message);
    a.send(&Message::Entry(range_entry(
        5,
        split,
        2,
        4,
        VerifyMode::Block,
    )))
    .unwrap();
    status_of(&mut a, 5);
    a.send(&block(5, 2, blocks_of(&other)[2])).unwrap();
    let r = result_of(&mut a, 5);
    assert_eq!(r.status, FileStatus::Failed);
    assert!(
        r.message.contains("differs from the source"),
        "{}",
        r.message
    );
    assert!(fs::read(root.join(PATH)).unwrap() == d, "the file changed");
    alive(&mut server);
    honest_send_works(&server, dir.path(), &root, "honest");
}

#[test]
fn ranges_a_server_cannot_verify_or_place_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let mut server = Server::start(&root);
    let mut a = fresh(&server);
    let refused: Vec<(Entry, &str)> = vec![
        (
            range_entry(1, [1; 16], 0, 2, VerifyMode::File),
            "cannot verify one range",
        ),
        (
            range_entry(2, [1; 16], 0, 2, VerifyMode::Flash),
            "cannot verify one range",
        ),
        (
            Entry {
                block_size: 3 * 4096,
                ..range_entry(3, [1; 16], 0, 1, VerifyMode::Block)
            },
            "power-of-two block size",
        ),
        (
            range_entry(4, [1; 16], 3, 9, VerifyMode::Block),
            "not inside the file's 4 blocks",
        ),
        (
            Entry {
                size: 100,
                ..range_entry(5, [1; 16], 0, 1, VerifyMode::Block)
            },
            "2 or more",
        ),
    ];
    for (e, why) in refused {
        let id = e.file;
        a.send(&Message::Entry(e)).unwrap();
        let r = result_of(&mut a, id);
        assert_eq!(r.status, FileStatus::Failed);
        assert!(r.message.contains(why), "{why:?} not in {:?}", r.message);
    }
    assert!(contents(&root).is_empty(), "{:?}", contents(&root).keys());
    alive(&mut server);
    honest_send_works(&server, dir.path(), &root, "honest");
}

#[test]
fn two_last_ranges_ending_at_once_commit_the_file_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let mut server = Server::start(&root);
    let d = data(8);
    let blocks = blocks_of(&d);
    for round in 0..40u64 {
        let path = format!("race{round}.bin");
        let entry = |first: u64, end: u64| Entry {
            path: intact_proto::WirePath::parse(path.as_bytes()).unwrap(),
            ..range_entry(1, [round as u8; 16], first, end, VerifyMode::Block)
        };
        let (mut a, mut b) = (fresh(&server), fresh(&server));
        for (c, first, end) in [(&mut a, 0, 2), (&mut b, 2, 4)] {
            c.send(&Message::Entry(entry(first, end))).unwrap();
            status_of(c, 1);
            for i in first..end {
                c.send(&block_at(1, i, blocks[i as usize])).unwrap();
            }
        }
        // Both ends at once, each from its own thread.
        let ends: Vec<_> = [(a, 0, 2), (b, 2, 4)]
            .into_iter()
            .map(|(mut c, first, end)| {
                let digest = digest_of(&d, first, end);
                std::thread::spawn(move || {
                    c.send(&range_end(1, first, end, digest)).unwrap();
                    let r = result_of(&mut c, 1);
                    (c, r)
                })
            })
            .collect();
        let results: Vec<FileResult> = ends
            .into_iter()
            .map(|t| {
                let (c, r) = t.join().unwrap();
                bye(c);
                r
            })
            .collect();
        let mut splits: Vec<u8> = results
            .iter()
            .map(|r| {
                assert_eq!(r.status, FileStatus::Verified, "{}", r.message);
                r.split
            })
            .collect();
        splits.sort();
        assert_eq!(
            splits,
            [FileResult::SPLIT_WAITING, FileResult::SPLIT_COMMITTED],
            "round {round}"
        );
        assert!(fs::read(root.join(&path)).unwrap() == d, "round {round}");
    }
    alive(&mut server);
    honest_send_works(&server, dir.path(), &root, "honest");
}

/// The partial file of `PATH` under `root`.
fn partial_of(root: &Path) -> std::path::PathBuf {
    root.join(intact_transfer::partial_name(std::ffi::OsStr::new(PATH)))
}

#[test]
fn a_confirmed_range_whose_bytes_changed_meanwhile_is_received_again() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let mut server = Server::start(&root);
    let d = data(9);
    let split = [4; 16];
    let mut a = fresh(&server);
    send_range(&mut a, 1, split, &d, 0, 2);
    assert_verified(&result_of(&mut a, 1), FileResult::SPLIT_WAITING);
    bye(a);
    // Once its writes settled, a refused entry opens the file's record,
    // which leaves a stamp the server would trust while it is unchanged.
    std::thread::sleep(Duration::from_millis(3500));
    let mut c = fresh(&server);
    c.send(&Message::Entry(range_entry(
        1,
        split,
        1,
        3,
        VerifyMode::Block,
    )))
    .unwrap();
    let r = result_of(&mut c, 1);
    assert!(
        r.message.contains("confirmed as another range"),
        "{}",
        r.message
    );
    bye(c);
    // No range is being received: the partial file is written in place
    // (same inode) by someone else, as a file made anew would be.
    let partial = partial_of(&root);
    let ino = fs::metadata(&partial).unwrap().ino();
    let f = fs::OpenOptions::new().write(true).open(&partial).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[0u8; 100], 10).unwrap();
    drop(f);
    assert_eq!(fs::metadata(&partial).unwrap().ino(), ino);
    // The other range: the first is no longer confirmed, nothing commits.
    let mut b = fresh(&server);
    send_range(&mut b, 1, split, &d, 2, 4);
    let r = result_of(&mut b, 1);
    assert_verified(&r, FileResult::SPLIT_WAITING);
    assert!(r.message.contains("blocks 0..2"), "{}", r.message);
    assert!(!root.join(PATH).exists(), "committed over changed bytes");
    // Sent again, the file is whole and right.
    send_range(&mut b, 2, split, &d, 0, 2);
    assert_verified(&result_of(&mut b, 2), FileResult::SPLIT_COMMITTED);
    assert!(fs::read(root.join(PATH)).unwrap() == d, "bytes differ");
    alive(&mut server);
    honest_send_works(&server, dir.path(), &root, "honest");
}

#[test]
fn a_committed_split_file_removed_since_is_received_again() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let mut server = Server::start(&root);
    let d = data(10);
    let split = [5; 16];
    let mut a = fresh(&server);
    send_range(&mut a, 1, split, &d, 0, 2);
    assert_verified(&result_of(&mut a, 1), FileResult::SPLIT_WAITING);
    send_range(&mut a, 2, split, &d, 2, 4);
    assert_verified(&result_of(&mut a, 2), FileResult::SPLIT_COMMITTED);
    fs::remove_file(root.join(PATH)).unwrap();
    // Not answered from a file that is gone: received anew, and only
    // committed again when both ranges verified again.
    send_range(&mut a, 3, split, &d, 0, 2);
    assert_verified(&result_of(&mut a, 3), FileResult::SPLIT_WAITING);
    assert!(!root.join(PATH).exists());
    send_range(&mut a, 4, split, &d, 2, 4);
    assert_verified(&result_of(&mut a, 4), FileResult::SPLIT_COMMITTED);
    assert!(fs::read(root.join(PATH)).unwrap() == d, "bytes differ");
    alive(&mut server);
    honest_send_works(&server, dir.path(), &root, "honest");
}

/// /proc/PID/io's `rchar`: bytes the process read.
fn rchar(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/io"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn refused_ranges_do_not_make_the_server_read_the_confirmed_ones_again() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let mut server = Server::start(&root);
    let pid = server.child.id();
    // 64 blocks of 64 KiB; blocks 0..63 confirmed (about 4 MiB).
    let bs: u32 = 64 << 10;
    let size = 64 * u64::from(bs);
    let d = intact_sample::bytes(size as usize, 12);
    let entry = |id: u64, first: u64, end: u64| Entry {
        range: Some(EntryRange {
            split: [6; 16],
            first,
            end,
        }),
        ..file_entry(id, "wide.bin", size, bs, VerifyMode::Block)
    };
    let mut a = fresh(&server);
    a.send(&Message::Entry(entry(1, 0, 63))).unwrap();
    status_of(&mut a, 1);
    let mut t = Blake3Blocks::new(size, u64::from(bs)).unwrap();
    for (i, b) in d.chunks(bs as usize).enumerate() {
        t.set(i as u64, b);
        if i < 63 {
            a.send(&block_at(1, i as u64, b)).unwrap();
        }
    }
    let cvs = t.range_cvs(0, 63).unwrap();
    a.send(&range_end(
        1,
        0,
        63,
        range_digest(size, u64::from(bs), 0, 63, &cvs).to_vec(),
    ))
    .unwrap();
    assert_verified(&result_of(&mut a, 1), FileResult::SPLIT_WAITING);
    bye(a);
    // Past the time a change time needs to be told from the next write's
    // (on coarse-time file systems a stamp taken sooner is not trusted).
    std::thread::sleep(Duration::from_millis(3500));
    // 20 entries, each refused (it overlaps the confirmed range), each
    // opening the file's record anew: the confirmed ranges (4 MiB) are
    // read back at most once, not 20 times.
    let before = rchar(pid);
    let mut b = fresh(&server);
    for id in 0..20 {
        b.send(&Message::Entry(entry(id, 62, 64))).unwrap();
        let r = result_of(&mut b, id);
        assert_eq!(r.status, FileStatus::Failed);
        assert!(
            r.message.contains("confirmed as another range"),
            "{}",
            r.message
        );
    }
    let read = rchar(pid) - before;
    assert!(
        read < 8 << 20,
        "the server read {read} bytes for 20 refused entries"
    );
    // Still right: the last range commits the file.
    b.send(&Message::Entry(entry(30, 63, 64))).unwrap();
    status_of(&mut b, 30);
    b.send(&block_at(30, 63, &d[63 * bs as usize..])).unwrap();
    let cvs = t.range_cvs(63, 64).unwrap();
    b.send(&range_end(
        30,
        63,
        64,
        range_digest(size, u64::from(bs), 63, 64, &cvs).to_vec(),
    ))
    .unwrap();
    assert_verified(&result_of(&mut b, 30), FileResult::SPLIT_COMMITTED);
    assert!(fs::read(root.join("wide.bin")).unwrap() == d);
    alive(&mut server);
}
