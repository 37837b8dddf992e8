//! What `intact send` says at the end: a rate of bytes really sent, a
//! resumed run's "already verified at the destination", and for a failed
//! or interrupted run what was done and the command that resumes it.

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

mod common;
use common::{send, Server};
use intact_faults::{FlipProxy, ProxyFault, Victim};

const MIB: usize = 1 << 20;

/// `intact send --verify fiver --block-size 64KiB <src> <addr>`.
fn send_fiver(src: &str, addr: &str) -> Output {
    send(&["--verify", "fiver", "--block-size", "64KiB", src, addr])
}

/// The big file of `dataset`.
fn big() -> Vec<u8> {
    intact_sample::bytes(4 * MIB, 1)
}

/// The big file stands whole under its final name in `recv`.
fn assert_big_arrived(recv: &Path) {
    assert_eq!(fs::read(recv.join("data/big.dat")).unwrap(), big());
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn dataset(root: &Path) -> std::path::PathBuf {
    let src = root.join("data");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("big.dat"), big()).unwrap();
    fs::write(src.join("small.dat"), intact_sample::bytes(1000, 2)).unwrap();
    src
}

#[test]
fn a_repeated_send_says_what_was_already_verified_and_no_rate() {
    let dir = tempfile::tempdir().unwrap();
    let src = dataset(dir.path());
    let recv = dir.path().join("recv");
    let server = Server::start(&recv);
    let args = [
        "--verify",
        "fiver",
        "--block-size",
        "64KiB",
        src.to_str().unwrap(),
    ];
    let addr = server.addr();
    let first = send(&[&args[..], &[addr.as_str()]].concat());
    assert!(first.status.success(), "{}", text(&first.stderr));
    let out = text(&first.stdout);
    assert!(out.contains("MiB/s sent"), "{out}");
    assert!(!out.contains("resumed:"), "{out}");

    let again = send(&[&args[..], &[addr.as_str()]].concat());
    assert!(again.status.success(), "{}", text(&again.stderr));
    let out = text(&again.stdout);
    assert!(
        out.contains("resumed: 4.0 MiB already verified at the destination (")
            && out.contains("trusted from its journal at level network or above), 0 B sent"),
        "{out}"
    );
    assert!(!out.contains("MiB/s"), "no rate for bytes not sent: {out}");

    // -q silences the summary and the resumed line alike.
    let quiet = send(&[&["-q"], &args[..], &[addr.as_str()]].concat());
    assert!(quiet.status.success(), "{}", text(&quiet.stderr));
    assert!(quiet.stdout.is_empty(), "{}", text(&quiet.stdout));
    assert!(quiet.stderr.is_empty(), "{}", text(&quiet.stderr));
    assert_big_arrived(&recv);
}

#[test]
fn a_failed_send_says_what_was_done_and_how_to_resume() {
    let dir = tempfile::tempdir().unwrap();
    let src = dataset(dir.path());
    let recv = dir.path().join("recv");
    // The server dies once 1 MiB has reached it (killed by a proxy).
    let mut server = Server::start(&recv);
    let victim = Victim::new();
    victim.set(server.child.id());
    let proxy = FlipProxy::start(
        server.addr(),
        ProxyFault::KillAfter(MIB as u64, victim.clone()),
    )
    .unwrap();
    let s = src.to_str().unwrap();
    let out = send_fiver(s, &proxy.addr());
    assert!(victim.killed(), "the proxy killed the server");
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("incomplete:") && err.contains("to resume, run:") && err.contains(s),
        "{err}"
    );
    assert!(
        !text(&out.stdout).contains("MiB/s"),
        "{}",
        text(&out.stdout)
    );
    let _ = server.child.wait();
    // Nothing unverified carries its final name.
    if let Ok(b) = fs::read(recv.join("data/big.dat")) {
        assert_eq!(b, big());
    }
    // The resume command works.
    let server = Server::start(&recv);
    let out = send_fiver(s, &server.addr());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_big_arrived(&recv);
}

#[test]
fn sigterm_ends_a_send_with_what_was_done_and_a_json_report() {
    let dir = tempfile::tempdir().unwrap();
    let src = dataset(dir.path());
    let recv = dir.path().join("recv");
    let server = Server::start(&recv);
    let s = src.to_str().unwrap();
    // Slow enough (1 MiB/s for 4 MiB) to be caught in the middle.
    let child = Command::new(env!("CARGO_BIN_EXE_intact"))
        .args([
            "send",
            "--json",
            "--verify",
            "fiver",
            "--block-size",
            "64KiB",
            "--bwlimit",
            "1M",
            s,
        ])
        .arg(server.addr())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGTERM),
        "dies by the signal"
    );
    let err = text(&out.stderr);
    assert!(
        err.contains("interrupted by SIGTERM")
            && err.contains("to resume, run:")
            && err.contains(s),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["interrupted"], "SIGTERM");
    assert_eq!(v["complete"], false);
    let sent = v["bytes_sent"].as_u64().unwrap();
    assert!(sent > 0 && sent < 4 * MIB as u64, "{v}");
    // Nothing wrong carries its final name; the same command finishes it.
    if let Ok(b) = fs::read(recv.join("data/big.dat")) {
        assert_eq!(b, big());
    }
    let out = send_fiver(s, &server.addr());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_big_arrived(&recv);
}
