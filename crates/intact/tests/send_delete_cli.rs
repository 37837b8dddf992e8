//! `intact send --delete`: the server removes what the source no longer
//! has, only after a send that succeeded, inside its root (or the
//! subdirectory), never through a symlink; `--dry-run` asks and changes
//! nothing; a hostile request is refused without the server dying.

use std::fs;
use std::net::TcpStream;
use std::path::Path;

use intact_proto::{client_handshake, Connection, Message};

mod common;
use common::{blocked, data, intact, s, stale, stderr, stdout, Server};

/// Every path under `root` but intact's own state, relative, sorted.
fn listing(root: &Path) -> Vec<String> {
    let mut v = common::listing(root);
    v.retain(|p| !p.starts_with(".intact"));
    v
}

/// `intact send <opts> --delete --exclude '*.tmp' <src> <addr>`, which
/// must succeed; what it printed.
fn send_delete_but_tmp(opts: &[&str], src: &Path, addr: &str) -> String {
    let tail = ["--delete", "--exclude", "*.tmp", s(src), addr];
    let out = intact(&[&["send"], opts, &tail[..]].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

#[test]
fn send_delete_removes_what_the_source_lacks_after_a_dry_run_that_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let src = data(dir.path());
    let recv = dir.path().join("recv");
    let outside = stale(dir.path(), &recv);
    let server = Server::start(&recv);
    let before = listing(&recv);

    let text = send_delete_but_tmp(&["-n"], &src, &server.addr());
    assert!(
        text.contains("delete                data/old.dat"),
        "{text}"
    );
    assert!(text.contains("delete                data/gone/"), "{text}");
    assert!(text.contains("delete                data/link"), "{text}");
    assert!(!text.contains("keep.tmp"), "{text}");
    assert!(text.contains(", 5 would be deleted;"), "{text}");
    assert_eq!(
        listing(&recv),
        before,
        "a dry run sends and removes nothing"
    );

    let text = send_delete_but_tmp(&["--verify", "fiver"], &src, &server.addr());
    assert!(text.contains("deleted data/old.dat"), "{text}");
    assert!(text.contains("deleted data/link"), "{text}");
    assert_eq!(
        listing(&recv),
        [
            "beside.dat",
            "data",
            "data/a.bin",
            "data/keep.tmp",
            "data/sub",
            "data/sub/x.dat"
        ]
    );
    assert!(recv.join(".intact").is_dir(), "intact's state is kept");
    assert_eq!(
        fs::read(outside.join("precious")).unwrap(),
        b"p",
        "a link is removed as a link, never followed"
    );

    // -q silences the lines; nothing is left to delete anyway.
    fs::write(recv.join("data/again.dat"), b"again").unwrap();
    let text = send_delete_but_tmp(&["-q", "--verify", "fiver"], &src, &server.addr());
    assert!(!text.contains("deleted"), "{text}");
    assert!(!recv.join("data/again.dat").exists());
}

#[test]
fn send_delete_waits_for_a_send_that_succeeded() {
    let dir = tempfile::tempdir().unwrap();
    let src = data(dir.path());
    let recv = dir.path().join("recv");
    blocked(&recv);
    let server = Server::start(&recv);
    let out = intact(&[
        "send",
        "--verify",
        "fiver",
        "--delete",
        s(&src),
        &server.addr(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("--delete: nothing was deleted, because"),
        "{err}"
    );
    assert_eq!(fs::read(recv.join("data/old.dat")).unwrap(), b"old");
}

#[test]
fn a_subdirectory_target_confines_send_delete_and_json_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let src = data(dir.path());
    let recv = dir.path().join("recv");
    for d in ["box/data", "other/data", "data"] {
        fs::create_dir_all(recv.join(d)).unwrap();
        fs::write(recv.join(d).join("old.dat"), b"old").unwrap();
    }
    let server = Server::start(&recv);
    let target = format!("{}:/box", server.addr());
    let out = intact(&[
        "send",
        "--verify",
        "fiver",
        "--delete",
        "--json",
        s(&src),
        &target,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["deleted"]["deleted"],
        serde_json::json!(["data/old.dat"]),
        "{v:#}"
    );
    assert!(!recv.join("box/data/old.dat").exists());
    assert!(recv.join("box/data/sub/x.dat").exists());
    assert!(recv.join("other/data/old.dat").exists());
    assert!(recv.join("data/old.dat").exists());
}

/// A hand-written client: handshake, then `msgs`; the server's answer.
fn ask(addr: &str, msgs: &[Message]) -> Message {
    let mut conn = Connection::new(TcpStream::connect(addr).unwrap());
    client_handshake(&mut conn, None).unwrap();
    for m in msgs {
        conn.write_message(m).unwrap();
    }
    conn.flush().unwrap();
    conn.expect_message().unwrap()
}

fn start(scope: &[u8], base: &[u8]) -> Message {
    Message::DeleteStart {
        dry_run: false,
        base: base.to_vec(),
        scopes: vec![scope.to_vec()],
        rules: vec![],
    }
}

#[test]
fn hostile_delete_requests_are_refused_and_the_server_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let src = data(dir.path());
    let recv = dir.path().join("recv");
    fs::create_dir_all(recv.join("data")).unwrap();
    fs::write(recv.join("data/old.dat"), b"old").unwrap();
    fs::write(dir.path().join("victim"), b"v").unwrap();
    let server = Server::start_with(&recv, &["--max-delete-paths", "10"], &[]);
    let addr = server.addr();

    // A keep list over the server's cap, in two chunks.
    let many = |n: usize| Message::DeleteKeep {
        paths: (0..n).map(|i| format!("data/{i}").into_bytes()).collect(),
    };
    match ask(
        &addr,
        &[start(b"data", b""), many(6), many(6), Message::DeleteRun],
    ) {
        Message::Refused { reason } => {
            assert!(reason.contains("more than 10 paths"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    // A scope or a subdirectory with '..', or naming intact's state.
    for (scope, base) in [
        (&b".."[..], &b""[..]),
        (b"data/../..", b""),
        (b"", b"../recv"),
        (b".intact", b""),
        (b"", b".intact"),
    ] {
        match ask(&addr, &[start(scope, base), Message::DeleteRun]) {
            Message::Refused { reason } => assert!(
                reason.contains("--delete refused"),
                "{scope:?} {base:?}: {reason}"
            ),
            other => panic!("{scope:?} {base:?}: {other:?}"),
        }
    }
    // DeleteKeep before DeleteStart ends that session only.
    let mut conn = Connection::new(TcpStream::connect(&addr).unwrap());
    client_handshake(&mut conn, None).unwrap();
    conn.send(&many(1)).unwrap();
    assert!(!matches!(
        conn.read_message(),
        Ok(Some(Message::DeleteDone))
    ));

    assert_eq!(fs::read(recv.join("data/old.dat")).unwrap(), b"old");
    assert_eq!(fs::read(dir.path().join("victim")).unwrap(), b"v");
    assert!(recv.join(".intact").is_dir());

    // The server still serves a normal send, and its --delete.
    let out = intact(&["send", "--verify", "fiver", "--delete", s(&src), &addr]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(recv.join("data/sub/x.dat").exists());
    assert!(!recv.join("data/old.dat").exists());
}
