//! `intact serve` as users meet it: a root checked and locked before it
//! listens, clients counted as clients, a daemon that outlives any one
//! session's failure, and a log of one line per session.

use std::fs;
use std::io::Write;
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use intact_proto::{client_handshake, Connection};

mod common;
use common::Server;

fn intact(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_intact"))
        .args(args)
        .output()
        .unwrap()
}

/// `intact serve` that must exit by itself (it refuses to start): its
/// output, or a failure if it is still running after 20 s (it listened).
fn serve_refused(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_intact"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "serve {args:?} did not refuse to start: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A small source tree: `n` files of 1,000 bytes in `data/`.
fn source(dir: &Path, n: usize) -> PathBuf {
    let src = dir.join("data");
    fs::create_dir_all(&src).unwrap();
    for i in 0..n {
        fs::write(
            src.join(format!("f{i}")),
            intact_sample::bytes(1000, i as u64),
        )
        .unwrap();
    }
    src
}

/// Every file of `src` is in `dst` with the same bytes.
fn delivered(src: &Path, dst: &Path) -> bool {
    fs::read_dir(src).unwrap().all(|e| {
        let e = e.unwrap();
        fs::read(dst.join(e.file_name())).ok() == Some(fs::read(e.path()).unwrap())
    })
}

/// Names in `root` other than intact's own state.
fn user_entries(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(root)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n != ".intact")
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The server's log lines until one contains `want` (panics after 20 s).
fn log_until(server: &Server, want: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match server.log.recv_timeout(left) {
            Ok(l) => {
                let done = l.contains(want);
                lines.push(l);
                if done {
                    return lines;
                }
            }
            Err(_) => panic!("no log line with {want:?}; got {lines:?}"),
        }
    }
}

/// The log lines that arrive within `wait`.
fn log_for(server: &Server, wait: Duration) -> Vec<String> {
    let deadline = Instant::now() + wait;
    let mut lines = Vec::new();
    while let Ok(l) = server
        .log
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
    {
        lines.push(l);
    }
    lines
}

#[test]
fn a_second_server_on_the_same_root_refuses_to_start_and_names_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("recv");
    let src = source(dir.path(), 3);
    let mut first = Server::start(&root);
    let pid = first.child.id();

    let out = serve_refused(&["--root", root.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("in use by another intact serve (PID {pid})"))
            && err.contains("another --root"),
        "{err}"
    );
    assert!(
        !text(&out.stdout).contains("listening"),
        "it must not listen"
    );

    // The first server was not disturbed and serves a normal send.
    let out = intact(&["send", src.to_str().unwrap(), &first.addr()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(delivered(&src, &root.join("data")));

    // However the first one ends, its lock goes with it.
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let again = Server::start(&root);
    let out = intact(&["send", "--reverify", src.to_str().unwrap(), &again.addr()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn a_port_in_use_is_refused_and_leaves_the_root_untouched() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("recv");
    let out = Command::new(env!("CARGO_BIN_EXE_intact"))
        .args(["serve", "--listen", &addr, "--root"])
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.starts_with(&format!("intact serve: cannot listen on {addr}")),
        "{err}"
    );
    assert!(!root.exists(), "nothing made for a server that never ran");
}

#[test]
fn a_root_that_cannot_be_a_directory_is_refused_before_listening() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    fs::write(&file, b"keep me").unwrap();
    let out = serve_refused(&["--root", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("not a directory") && err.contains("give --root a directory"),
        "{err}"
    );
    assert!(!text(&out.stdout).contains("listening"));
    assert_eq!(fs::read(&file).unwrap(), b"keep me");

    // Below a file: cannot be created.
    let below = file.join("sub");
    let out = serve_refused(&["--root", below.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("give --root a directory"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(fs::read(&file).unwrap(), b"keep me");
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "nothing made");

    // A missing root is created, as the help says.
    let fresh = dir.path().join("new/root");
    let server = Server::start(&fresh);
    let src = source(dir.path(), 1);
    let out = intact(&["send", src.to_str().unwrap(), &server.addr()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(delivered(&src, &fresh.join("data")));
}

#[test]
fn max_sessions_counts_clients_not_streams() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("recv");
    let src = source(dir.path(), 8);
    // The old flag name still works, and now means clients.
    let server = Server::start_with(&root, &["--max-connections", "1"], &[]);

    // A default send opens 4 streams: one client.
    let out = intact(&[
        "send",
        src.to_str().unwrap(),
        &format!("{}:/one", server.addr()),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(delivered(&src, &root.join("one/data")));
    log_until(&server, " received in ");

    // While another client holds the only place, a send is refused with
    // the reason, fails as a whole (exit 1) and writes nothing.
    let mut holder = Connection::new(TcpStream::connect(server.addr()).unwrap());
    client_handshake(&mut holder, None).unwrap();
    let out = intact(&[
        "send",
        src.to_str().unwrap(),
        &format!("{}:/two", server.addr()),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("busy: already serving 1 client") && err.contains("try again later"),
        "{err}"
    );
    assert_eq!(
        user_entries(&root),
        ["one"],
        "the refused send wrote nothing"
    );
    drop(holder);
    log_until(&server, " received in ");

    // Its place freed, the next client is served.
    let out = intact(&[
        "send",
        src.to_str().unwrap(),
        &format!("{}:/two", server.addr()),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(delivered(&src, &root.join("two/data")));
}

#[test]
fn streams_per_client_are_bounded_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("recv");
    let src = source(dir.path(), 4);
    let server = Server::start_with(&root, &["--max-streams-per-session", "2"], &[]);
    let out = intact(&[
        "send",
        "--streams",
        "3",
        src.to_str().unwrap(),
        &server.addr(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("at most 2 streams per client") && err.contains("--streams 2 or fewer"),
        "{err}"
    );
    assert!(user_entries(&root).is_empty(), "nothing was written");
    let out = intact(&[
        "send",
        "--streams",
        "2",
        src.to_str().unwrap(),
        &server.addr(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(delivered(&src, &root.join("data")));
    let out = intact(&["serve", "--root", "x", "--max-sessions", "0"]);
    assert_eq!(out.status.code(), Some(2), "a usage error");
}

#[test]
fn a_wrong_key_is_told_the_server_holds_another() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("recv");
    let src = source(dir.path(), 2);
    let key = |name: &str, secret: &str| {
        let p = dir.path().join(name);
        fs::write(&p, secret).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        p
    };
    let good = key("good", "the secret the server holds");
    let bad = key("bad", "a different secret, long enough");
    let server = Server::start_with(&root, &["--key-file", good.to_str().unwrap()], &[]);
    let out = intact(&[
        "send",
        "--key-file",
        bad.to_str().unwrap(),
        src.to_str().unwrap(),
        &server.addr(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("authentication failed") && err.contains("different key at the server?"),
        "{err}"
    );
    assert!(user_entries(&root).is_empty(), "nothing was written");
    let log = log_until(&server, "refused");
    assert!(
        log.last().unwrap().contains("different key?"),
        "the server's log says the same: {log:?}"
    );
    let out = intact(&[
        "send",
        "--key-file",
        good.to_str().unwrap(),
        src.to_str().unwrap(),
        &server.addr(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn the_log_has_one_line_per_session_and_v_adds_one_per_stream_and_the_stages() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(dir.path(), 10);
    for verbose in [false, true] {
        let root = dir.path().join(format!("recv-{verbose}"));
        let args: &[&str] = if verbose { &["-v"] } else { &[] };
        let server = Server::start_with(&root, args, &[]);
        let out = intact(&["send", src.to_str().unwrap(), &server.addr()]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let mut log = log_until(&server, " received in ");
        log.extend(log_for(&server, Duration::from_millis(300)));
        let totals: Vec<_> = log.iter().filter(|l| l.contains(" received in ")).collect();
        assert_eq!(totals.len(), 1, "{log:?}");
        assert!(
            totals[0].contains("10 files verified, 0 failed")
                && totals[0].contains("9.8 KiB received")
                && totals[0].contains("over 4 streams"),
            "{log:?}"
        );
        let streams = log
            .iter()
            .filter(|l| l.contains("stream of session"))
            .count();
        assert_eq!(streams, if verbose { 4 } else { 0 }, "{log:?}");
        // -v: the session's receiver stages too, which count the 10 files
        // this test sent (one partial file created for each).
        let stages: Vec<_> = log
            .iter()
            .filter(|l| l.contains("receiver stages"))
            .collect();
        assert_eq!(stages.len(), usize::from(verbose), "{log:?}");
        if verbose {
            let create = stages[0]
                .split(", ")
                .find(|p| p.contains("create "))
                .unwrap_or("");
            assert!(create.ends_with("(10 calls)"), "{log:?}");
        }
        assert_eq!(
            log.len(),
            1 + streams + stages.len(),
            "nothing else: {log:?}"
        );
        assert!(delivered(&src, &root.join("data")));
    }
}

#[test]
fn an_error_inside_one_session_never_ends_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("recv");
    let src = source(dir.path(), 3);
    let mut server = Server::start(&root);

    // A client that authenticates, then sends a frame no message has.
    let mut bad = Connection::new(TcpStream::connect(server.addr()).unwrap());
    client_handshake(&mut bad, None).unwrap();
    bad.get_ref().write_all(&[0, 0, 0, 1, 200]).unwrap();
    let log = log_until(&server, " received in ");
    assert!(
        log.iter()
            .any(|l| l.contains("ended: unknown message type 200")),
        "the failure is logged: {log:?}"
    );
    assert!(
        log.last().unwrap().contains("1 of them ended early"),
        "{log:?}"
    );
    // A peer that connects and leaves says nothing worth a line.
    drop(TcpStream::connect(server.addr()).unwrap());

    assert!(server.child.try_wait().unwrap().is_none(), "still running");
    let out = intact(&["send", src.to_str().unwrap(), &server.addr()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(delivered(&src, &root.join("data")));
    assert_eq!(user_entries(&root), ["data"]);
    let log = log_until(&server, " received in ");
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(log[0].contains("3 files verified"), "{log:?}");
}

/// A file that fails at the server gets a log line of its own, naming it
/// and saying why (item 15), besides the session's totals.
#[test]
fn a_failed_file_gets_a_log_line_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(dir.path(), 3);
    let root = dir.path().join("recv");
    // A directory where the file f1 must go: that file cannot be committed.
    fs::create_dir_all(root.join("data/f1/inside")).unwrap();
    let server = Server::start(&root);
    let out = intact(&["send", src.to_str().unwrap(), &server.addr()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let mut log = log_until(&server, " received in ");
    log.extend(log_for(&server, Duration::from_millis(300)));
    let failed: Vec<_> = log.iter().filter(|l| l.contains(": failed ")).collect();
    assert_eq!(failed.len(), 1, "{log:?}");
    assert!(failed[0].contains("\"data/f1\""), "{log:?}");
    let totals: Vec<_> = log.iter().filter(|l| l.contains(" received in ")).collect();
    assert!(totals[0].contains("2 files verified, 1 failed"), "{log:?}");
    // The directory in the way is untouched; the other files arrived.
    assert!(root.join("data/f1/inside").is_dir());
    assert_eq!(
        fs::read(root.join("data/f0")).unwrap(),
        fs::read(src.join("f0")).unwrap()
    );
}

/// A repeated send whose files the server holds whole and trusts counts
/// them as verified in the session's log line (nothing received).
#[test]
fn files_held_whole_count_as_verified_in_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let src = source(dir.path(), 3);
    let root = dir.path().join("recv");
    let server = Server::start(&root);
    for round in 0..2 {
        let out = intact(&["send", src.to_str().unwrap(), &server.addr()]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let log = log_until(&server, " received in ");
        let totals = log.last().unwrap();
        assert!(
            totals.contains("3 files verified, 0 failed"),
            "round {round}: {log:?}"
        );
        if round == 1 {
            assert!(totals.contains(" 0 B received"), "{log:?}");
        }
    }
}
