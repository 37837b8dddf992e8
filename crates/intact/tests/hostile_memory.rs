//! Memory and open files a client could make the server hold outside
//! every budget (issue 11, review findings A1–A3 on the first budgets).
//! Each test performs the attack with a hand-written keyless loopback
//! client against a real `intact serve` (`INTACT_BIN`, else this build's
//! binary), reads the server's memory from /proc or counts the answers it
//! gave, and ends with an honest send. Before the fixes: A1 peaked at
//! 2.28 GB, A2 at 1.27 GB (for a 256 MiB budget), and in A3 one stream
//! held every open-file slot and the honest send failed "server busy".

mod common;

use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

use common::wire::*;
use common::Server;
use intact_proto::{Message, SessionSecret};
use intact_transfer::VerifyMode;

/// Stop attacking past this RSS (kB): the machine is shared.
const SAFETY_KB: u64 = 5 << 20;

fn server(root: &std::path::Path, args: &[&str]) -> Server {
    let bin = std::env::var("INTACT_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_intact").into());
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--root"])
        .arg(root)
        .args(args);
    Server::spawn(cmd)
}

/// One plain DeleteKeep frame of `n` distinct 4-byte paths (tagged by
/// `tag` so frames differ), built by hand: 8 wire bytes a path.
fn keep_frame(tag: u32, n: u32) -> Vec<u8> {
    let mut probe = Vec::new();
    Message::DeleteKeep { paths: vec![] }.encode(&mut probe);
    let kind = probe[4];
    let body_len = 1 + 4 + n as usize * 8;
    let mut f = Vec::with_capacity(4 + body_len);
    f.extend_from_slice(&(body_len as u32).to_be_bytes());
    f.push(kind);
    f.extend_from_slice(&n.to_be_bytes());
    for i in 0..n {
        f.extend_from_slice(&4u32.to_be_bytes());
        // distinct within the stream: tag in the top byte
        f.extend_from_slice(&((tag << 24) | i).to_be_bytes());
    }
    f
}

fn delete_start() -> Message {
    Message::DeleteStart {
        dry_run: true,
        base: vec![],
        scopes: vec![],
        rules: vec![],
    }
}

/// Watches VmRSS until it stops growing for 3 s (or `max`), returns VmHWM.
fn settle(pid: u32, max: Duration) -> u64 {
    let t0 = Instant::now();
    let mut last = 0;
    let mut still = Instant::now();
    while t0.elapsed() < max {
        let now = proc_kb(pid, "VmRSS:");
        if now > last + 4096 {
            last = now;
            still = Instant::now();
        } else if still.elapsed() > Duration::from_secs(3) {
            break;
        }
        if now > SAFETY_KB {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    proc_kb(pid, "VmHWM:")
}

/// A1: `send --delete`'s keep list was bounded per stream (10M paths,
/// 1 GiB of path bytes) and counted by no budget. Three streams of one
/// session each send DeleteStart and 5 DeleteKeep frames of 2M distinct
/// 4-byte paths (80 MB on the wire per stream). The keep list is now a
/// set of hashes charged to the session's share of `--frame-memory`
/// (256 MiB here): peak RSS stays near the budget.
#[test]
fn keep_lists_are_charged_to_the_session_share() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let mut server = server(&root, &["--frame-memory", "256MiB", "--max-sessions", "3"]);
    let pid = server.child.id();
    let rss_before = proc_kb(pid, "VmRSS:");
    let secret = SessionSecret::random().unwrap();
    let streams = 3u32;
    let t0 = Instant::now();
    let writers: Vec<_> = (0..streams)
        .map(|s| {
            let mut conn = stream_of(&server, &secret);
            std::thread::spawn(move || {
                conn.send(&delete_start()).unwrap();
                let mut raw = conn.get_ref().try_clone().unwrap();
                raw.set_write_timeout(Some(Duration::from_secs(120)))
                    .unwrap();
                for f in 0..5u32 {
                    let frame = keep_frame(s * 8 + f, 2_000_000);
                    if raw.write_all(&frame).is_err() {
                        break;
                    }
                }
                conn
            })
        })
        .collect();
    let conns: Vec<Conn> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    let hwm = settle(pid, Duration::from_secs(120));
    let rss = proc_kb(pid, "VmRSS:");
    eprintln!(
        "A1: {streams} streams x 5 DeleteKeep frames sent in {:.1} s; server VmRSS {rss_before} kB at start, {rss} kB now, peak {hwm} kB (frame budget 262144 kB)",
        t0.elapsed().as_secs_f64()
    );
    alive(&mut server);
    honest_send_works(&server, dir.path(), &root, "other");
    drop(conns);
    assert!(
        hwm < rss_before + 320 * 1024,
        "peak RSS {hwm} kB (from {rss_before} kB) for a 256 MiB frame budget"
    );
}

/// A2: the frame budget counted a large frame's wire bytes, but a
/// non-Block message is decoded into fresh allocations held, with the
/// grant, for as long as the message waits; now what its lists decode
/// into is paid for before decoding. Each stream first announces
/// a file whose path another session holds, so its session thread waits
/// (5 s, the partial-file lock wait) while its reader decodes DeleteKeep
/// frames of 2M 4-byte paths (16 MiB on the wire, ~112 MB decoded:
/// 2M Vec<u8> of 24 + 32 bytes). Frame budget 256 MiB.
#[test]
fn decoded_lists_are_charged_before_they_are_decoded() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let mut server = server(&root, &["--frame-memory", "256MiB", "--max-sessions", "3"]);
    let pid = server.child.id();
    let rss_before = proc_kb(pid, "VmRSS:");
    let e = file_entry(1, "held", 1 << 30, 16 << 20, VerifyMode::None);
    let a = hold_path(&server, &e);
    let attacker = SessionSecret::random().unwrap();
    let streams = 4u32;
    let t0 = Instant::now();
    let writers: Vec<_> = (0..streams)
        .map(|s| {
            let mut conn = stream_of(&server, &attacker);
            let entry = Message::Entry(e.clone());
            std::thread::spawn(move || {
                conn.send(&entry).unwrap();
                let mut raw = conn.get_ref().try_clone().unwrap();
                raw.set_write_timeout(Some(Duration::from_secs(60)))
                    .unwrap();
                for f in 0..6u32 {
                    if raw.write_all(&keep_frame(s * 8 + f, 2_000_000)).is_err() {
                        break;
                    }
                }
                conn
            })
        })
        .collect();
    let conns: Vec<Conn> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    eprintln!("A2: writers done after {:.1} s", t0.elapsed().as_secs_f64());
    let hwm = settle(pid, Duration::from_secs(30));
    eprintln!(
        "A2: {streams} stalled streams x DeleteKeep frames; server VmRSS {rss_before} kB at start, peak {hwm} kB (frame budget 262144 kB)"
    );
    alive(&mut server);
    let t = Instant::now();
    honest_send_works(&server, dir.path(), &root, "other");
    eprintln!(
        "A2: the honest send took {:.1} s",
        t.elapsed().as_secs_f64()
    );
    drop((conns, a));
    assert!(
        hwm < rss_before + 320 * 1024,
        "peak RSS {hwm} kB (from {rss_before} kB) for a 256 MiB frame budget"
    );
}

/// A3: the server-wide count of open files (`max_files`, from the
/// descriptor limit) was first come, first served. With the server's
/// open-file limit at 2560 (max_files = (2560 - 768) / 4 = 448: 768 kept
/// for the server itself and a background scrub's 512) and the
/// default 16 sessions, one session's single stream announces 460
/// one-block files and leaves them open: it may hold half and its share
/// (224 + 14), no more, and an honest `intact send` then succeeds.
#[test]
fn one_client_cannot_take_every_open_file_slot() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let bin = std::env::var("INTACT_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_intact").into());
    let mut cmd = Command::new(bin);
    // Files beyond the share wait 2 s for a place (not the default 30):
    // this client never gives its places back.
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admit-wait",
        "2",
        "--root",
    ])
    .arg(&root);
    common::with_nofile(&mut cmd, 2560);
    let mut server = Server::spawn(cmd);
    let secret = SessionSecret::random().unwrap();
    let mut conn = stream_of(&server, &secret);
    let (mut open, mut refused) = (0u64, Vec::new());
    for id in 0..460u64 {
        let e = file_entry(id, &format!("squat/{id}"), 1, 4096, VerifyMode::None);
        conn.send(&Message::Entry(e)).unwrap();
    }
    // Every Entry is answered: a Status (open) or a FileResult (refused).
    let mut answered = 0;
    while answered < 460 {
        match conn.read_message().unwrap().expect("answered") {
            Message::Status { .. } => {
                open += 1;
                answered += 1;
            }
            Message::FileResult(r) => {
                refused.push(r.message);
                answered += 1;
            }
            _ => {}
        }
    }
    eprintln!(
        "A3: the attacker's one stream holds {open} files open; {} refused, first: {:?}",
        refused.len(),
        refused.first()
    );
    let src = dir.path().join("honest");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f.bin"), b"honest bytes").unwrap();
    let out = common::send(&[common::s(&src), &format!("{}:/other", server.addr())]);
    eprintln!(
        "A3: honest send exit {:?}; stderr: {}",
        out.status.code(),
        common::stderr(&out)
    );
    alive(&mut server);
    drop(conn);
    assert!(
        out.status.success(),
        "the honest send failed while another client held {open} file slots"
    );
    assert_eq!(
        open,
        224 + 14,
        "one session held more than half and its share"
    );
    assert!(
        refused.iter().all(|r| r.contains("guaranteed 14")),
        "{refused:?}"
    );
}
