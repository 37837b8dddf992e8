//! Issue 11, the review's findings F2 and F3, against the real `intact
//! serve`: one client (one session, several streams) takes as much of the
//! server's block budget and frame memory as it can, and another client
//! must still be served, with the server's memory bounded. Each test
//! performs the attack with a hand-written client and reads what the
//! server process holds from /proc.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::wire::*;
use common::Server;
use intact_proto::{FileStatus, Message, SessionSecret};
use intact_transfer::VerifyMode;

/// F2: one session, two streams, announces files of 2^20 blocks until the
/// server refuses; before the fix its two streams took the whole server's
/// 2^22 blocks and every other client's files failed with "server busy".
/// Now the session stops at half the budget plus its own share, another
/// client is served in full, and the announced blocks cost no memory
/// until they arrive.
#[test]
fn one_client_cannot_take_the_blocks_another_client_is_guaranteed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let mut server = Server::start_with(&root, &["--admit-wait", "2"], &[]);
    let pid = server.child.id();
    let rss_before = proc_kb(pid, "VmRSS:");
    let secret = SessionSecret::random().unwrap();
    let mut streams = [stream_of(&server, &secret), stream_of(&server, &secret)];
    // 4 GiB in 4 KiB blocks: 2^20 blocks, the most one file may have.
    let (mut admitted, mut refused) = (0, Vec::new());
    for id in 0..4u64 {
        let conn = &mut streams[id as usize % 2];
        let e = file_entry(id, &format!("max{id}"), 4 << 30, 4096, VerifyMode::Riva);
        conn.send(&Message::Entry(e)).unwrap();
        loop {
            match conn.read_message().unwrap().expect("answered") {
                Message::Status { file, .. } if file == id => {
                    admitted += 1;
                    break;
                }
                Message::FileResult(r) if r.file == id => {
                    assert_eq!(r.status, FileStatus::Failed);
                    refused.push(r.message);
                    break;
                }
                _ => {}
            }
        }
    }
    // 16 sessions at most (the default): 2^17 blocks guaranteed to each,
    // so one session holds at most 2^21 + 2^17: two of these files.
    assert_eq!(admitted, 2, "refused: {refused:?}");
    assert!(
        refused.iter().all(|m| m.contains("guaranteed")),
        "{refused:?}"
    );
    let rss_held = proc_kb(pid, "VmRSS:");
    eprintln!("VmRSS {rss_before} kB at start, {rss_held} kB holding 2^21 blocks announced");
    assert!(
        rss_held < rss_before + 32 * 1024,
        "announced blocks took memory: RSS {rss_before} kB -> {rss_held} kB"
    );
    // Another client, while the first holds all it could take.
    honest_send_works(&server, dir.path(), &root, "other");
    alive(&mut server);
    drop(streams);
}

/// F3: a session's 16 streams each announce a file whose path another
/// session holds (so each stream's session thread waits for it) and
/// stream 16 MiB Blocks behind it. Before the fix every stream's reader
/// held up to 5 of them (1.3 GB here by arithmetic; not run); now frames are paid for from the
/// session's share of `--frame-memory` before they are read, the server's
/// peak RSS stays within that budget, and another client is served
/// meanwhile.
#[test]
fn stalled_streams_hold_no_more_frame_memory_than_the_server_allows() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let mut server = Server::start_with(
        &root,
        &[
            "--frame-memory",
            "256MiB",
            "--max-sessions",
            "3",
            "--admit-wait",
            "2",
        ],
        &[],
    );
    let pid = server.child.id();
    let rss_before = proc_kb(pid, "VmRSS:");
    let bs: u32 = 16 << 20;
    // Session A holds the path open.
    let e = file_entry(1, "held", 1 << 30, bs, VerifyMode::None);
    let a = hold_path(&server, &e);
    // Session B: 16 streams, each an Entry on that path, then 6 Blocks of
    // 16 MiB (one frame, encoded once, written six times).
    let mut frame = Vec::new();
    let data = vec![0x5a; bs as usize];
    block(1, 0, &data).encode(&mut frame);
    let frame = std::sync::Arc::new(frame);
    let attacker = SessionSecret::random().unwrap();
    let started = Instant::now();
    let writers: Vec<_> = (0..16)
        .map(|_| {
            let mut conn = stream_of(&server, &attacker);
            let entry = Message::Entry(e.clone());
            let frame = std::sync::Arc::clone(&frame);
            std::thread::spawn(move || {
                conn.send(&entry).unwrap();
                let mut raw = conn.get_ref().try_clone().unwrap();
                raw.set_write_timeout(Some(Duration::from_secs(60)))
                    .unwrap();
                for _ in 0..6 {
                    if raw.write_all(&frame).is_err() {
                        break;
                    }
                }
                conn
            })
        })
        .collect();
    // While B's streams wait on the path, another client is served.
    std::thread::sleep(Duration::from_secs(1));
    honest_send_works(&server, dir.path(), &root, "other");
    let during = started.elapsed();
    let conns: Vec<Conn> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    alive(&mut server);
    let hwm = proc_kb(pid, "VmHWM:");
    eprintln!(
        "VmRSS {rss_before} kB at start; peak {hwm} kB; the other client was served {:.1} s into the attack",
        during.as_secs_f64()
    );
    // 256 MiB of frames at most, plus the server's own memory.
    assert!(
        hwm < rss_before + 320 * 1024,
        "peak RSS {hwm} kB (from {rss_before} kB) for a 256 MiB frame budget"
    );
    drop((conns, a));
}

/// The review's F2 kept its hold with a Dir entry every 1.5 s: the
/// watchdog counts an answered message as progress. A stream that holds
/// open files must now send data for them (a Block or a FileEnd) within
/// the idle timeout, or it ends and gives back its places. Here a stream
/// holds one 2^20-block file and sends a Dir entry every second, reading
/// each answer; with `--idle-timeout 3` the server ends it, says why, and
/// the file is free again for another client.
#[test]
fn files_held_without_data_are_given_back_however_chatty_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    // 2 sessions: 2^20 blocks guaranteed to each, at most 2^21 + 2^20 to one.
    let mut server = Server::start_with(
        &root,
        &[
            "--idle-timeout",
            "3",
            "--max-sessions",
            "2",
            "--admit-wait",
            "2",
        ],
        &[],
    );
    let big = |id: u64| file_entry(id, &format!("big{id}"), 4 << 30, 4096, VerifyMode::Riva);
    let secret = SessionSecret::random().unwrap();
    let mut hog = stream_of(&server, &secret);
    hog.send(&Message::Entry(big(1))).unwrap();
    status_of(&mut hog, 1);
    let t0 = Instant::now();
    let mut dirs = 0u64;
    let ended = loop {
        std::thread::sleep(Duration::from_secs(1));
        let sent = hog.send(&Message::Entry(dir_entry(
            100 + dirs,
            &format!("d{dirs}"),
            0o755,
        )));
        if sent.is_err() {
            break true;
        }
        match hog.read_message() {
            Ok(Some(Message::FileResult(r))) if r.file == 100 + dirs => dirs += 1,
            _ => break true,
        }
        if t0.elapsed() > Duration::from_secs(40) {
            break false;
        }
    };
    eprintln!(
        "the chatty stream ended: {ended} after {:.1} s and {dirs} answered Dir entries",
        t0.elapsed().as_secs_f64()
    );
    assert!(
        ended,
        "a stream holding a file kept it for 40 s on Dir entries alone"
    );
    assert!(
        dirs >= 2,
        "the Dir entries were answered ({dirs}) before the end"
    );
    let why = (0..200)
        .filter_map(|_| server.log.recv_timeout(Duration::from_millis(100)).ok())
        .find(|l| l.contains("no data sent"));
    assert!(
        why.is_some(),
        "the server did not say why it ended the stream"
    );
    // Its file is given back: another client announcing the same path
    // gets it at once (a path still held would make it wait 5 s and fail
    // "being received by another session").
    let mut other = stream_of(&server, &SessionSecret::random().unwrap());
    let t = Instant::now();
    other.send(&Message::Entry(big(1))).unwrap();
    status_of(&mut other, 1);
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    alive(&mut server);
}
