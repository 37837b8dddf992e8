//! Resume: after either side is SIGKILLed mid-transfer, the same send
//! moves only what was not yet verified; a repeated send of a complete
//! dataset moves nothing; --reverify re-reads instead of trusting.

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

const MIB: u64 = 1 << 20;

mod common;
use common::{resume_dataset, same_data, Server};
use intact_faults::{FlipProxy, ProxyFault, Victim};

/// Waits until `server` has logged the end of `n` sessions (one line each,
/// with its totals, once all its streams ended), so that what those
/// sessions verified is in its journal.
fn wait_sessions_ended(server: &Server, n: usize) {
    let mut ended = 0;
    while ended < n {
        let line = server
            .log
            .recv()
            .expect("the server logs each session's end");
        ended += usize::from(line.contains(" received in "));
    }
}

fn start(root: &Path) -> Server {
    Server::start(root)
}

/// A proxy to `server` that SIGKILLs the process `victim` will name once
/// `bytes` client bytes have passed (the crash comes from outside: the
/// binary has no hook for it).
fn killing_proxy(server: &Server, bytes: u64, victim: &Victim) -> FlipProxy {
    FlipProxy::start(server.addr(), ProxyFault::KillAfter(bytes, victim.clone())).unwrap()
}

/// `intact send --json --block-size 64KiB EXTRA… SRC ADDR` (see
/// [`common::send_json`]).
fn send(
    src: &Path,
    addr: &str,
    extra: &[&str],
    victim: Option<&Victim>,
) -> (std::process::ExitStatus, Option<serde_json::Value>) {
    let mut args = vec!["--block-size", "64KiB"];
    args.extend_from_slice(extra);
    common::send_json(&args, src, addr, victim)
}

/// Every file that carries its final name is complete and correct, and
/// no hidden partial file pretends otherwise.
fn final_names_are_all_verified(src: &Path, recv: &Path) {
    for e in walkdir::WalkDir::new(recv)
        .into_iter()
        .filter_map(Result::ok)
    {
        let name = e.file_name().to_string_lossy();
        if !e.file_type().is_file()
            || name.starts_with(".intact")
            || e.path().components().any(|c| c.as_os_str() == ".intact")
        {
            continue;
        }
        let rel = e.path().strip_prefix(recv.join("data")).unwrap();
        assert_eq!(
            fs::read(e.path()).unwrap(),
            fs::read(src.join(rel)).unwrap(),
            "{rel:?} carries its final name but is wrong"
        );
    }
}

#[test]
fn resume_after_the_sender_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let (src, total) = resume_dataset(dir.path());
    let recv = dir.path().join("recv");
    let server = start(&recv);

    let victim = Victim::new();
    let proxy = killing_proxy(&server, 20 * MIB, &victim);
    let (status, _) = send(&src, &proxy.addr(), &["--streams", "2"], Some(&victim));
    assert!(victim.killed(), "the proxy killed the sender");
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "the sender died mid-transfer"
    );
    wait_sessions_ended(&server, 1);
    final_names_are_all_verified(&src, &recv);

    let (status, report) = send(&src, &server.addr(), &["--streams", "2"], None);
    assert!(status.success());
    assert_resumed(&report.unwrap(), total);
    same_data(&src, &recv.join("data"));
}

/// The resumed send moved only what was missing: every byte of the dataset
/// was either sent now, skipped as already verified, or in a file the
/// server already held whole; and something was not sent.
fn assert_resumed(r: &serde_json::Value, total: u64) {
    let files = r["files"].as_array().unwrap();
    let skipped: u64 = files
        .iter()
        .map(|f| f["bytes_skipped"].as_u64().unwrap())
        .sum();
    let held: u64 = files
        .iter()
        .filter(|f| f["unchanged"] == true)
        .map(|f| f["size"].as_u64().unwrap())
        .sum();
    let sent = r["bytes_sent"].as_u64().unwrap();
    assert_eq!(sent + skipped + held, total, "{r}");
    assert!(skipped + held > 0, "nothing was resumed: {r}");
    assert_eq!(r["failed"], 0);
}

#[test]
fn resume_after_the_server_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let (src, total) = resume_dataset(dir.path());
    let recv = dir.path().join("recv");
    // The server dies once 30 MiB have reached it over both streams: the
    // 40 MiB file's stream has journaled some of its blocks by then
    // (batches of 8 MiB), the other stream some whole files.
    let mut server = start(&recv);
    let victim = Victim::new();
    victim.set(server.child.id());
    let proxy = killing_proxy(&server, 30 * MIB, &victim);
    let (status, _) = send(&src, &proxy.addr(), &["--streams", "2"], None);
    assert!(victim.killed(), "the proxy killed the server");
    assert_eq!(
        status.code(),
        Some(1),
        "the send fails when the server dies"
    );
    let died = server.child.wait().unwrap();
    assert_eq!(died.signal(), Some(libc::SIGKILL));
    final_names_are_all_verified(&src, &recv);

    let server = start(&recv);
    let (status, report) = send(&src, &server.addr(), &["--streams", "2"], None);
    assert!(status.success());
    assert_resumed(&report.unwrap(), total);
    same_data(&src, &recv.join("data"));
}

#[test]
fn a_complete_dataset_is_not_sent_again_unless_reverified() {
    let dir = tempfile::tempdir().unwrap();
    let (src, total) = resume_dataset(dir.path());
    let recv = dir.path().join("recv");
    let server = start(&recv);
    let (status, r) = send(&src, &server.addr(), &[], None);
    assert!(status.success());
    assert_eq!(r.unwrap()["bytes_sent"], total);

    let (status, r) = send(&src, &server.addr(), &[], None);
    assert!(status.success());
    let r = r.unwrap();
    assert_eq!(r["bytes_sent"], 0, "quick check: nothing moves");
    assert!(r["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "file")
        .all(|f| f["unchanged"] == true));

    // Silent damage to a received file (same size, same mtime): the quick
    // check cannot see it, --reverify can, and resends only that file.
    let victim = recv.join("data/many/f03");
    let meta = fs::metadata(&victim).unwrap();
    let mut bytes = fs::read(&victim).unwrap();
    bytes[1000] ^= 1;
    fs::write(&victim, &bytes).unwrap();
    fs::File::options()
        .write(true)
        .open(&victim)
        .unwrap()
        .set_modified(meta.modified().unwrap())
        .unwrap();
    let (status, r) = send(&src, &server.addr(), &[], None);
    assert!(status.success());
    assert_eq!(r.unwrap()["bytes_sent"], 0);
    let (status, r) = send(&src, &server.addr(), &["--reverify"], None);
    assert!(status.success());
    let r = r.unwrap();
    let f03 = fs::metadata(src.join("many/f03")).unwrap().len();
    assert_eq!(r["bytes_sent"], f03, "only the damaged file moved: {r}");
    same_data(&src, &recv.join("data"));
}

/// `intact scrub --json` of `root` (a server's, stopped): its report.
fn scrub_root(root: &Path) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_intact"))
        .args(["scrub", "--json"])
        .arg(root)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "scrub printed no report ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The catalog stays consistent with the disk whenever the receiver is
/// killed: after each kill, at points drawn at random (the seed is
/// printed), every file the catalog holds as finished is there with its
/// cataloged size and mtime and every page matches (a scrub finds
/// nothing), and a send then completes what is missing.
#[test]
fn the_catalog_matches_the_disk_after_the_server_is_killed_at_random_points() {
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = resume_dataset(dir.path());
    let recv = dir.path().join("recv");
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    eprintln!("kill points drawn with seed {seed}");
    let mut x = seed | 1;
    let mut cataloged = Vec::new();
    for round in 0..4 {
        // xorshift: a point between 1 and 40 MiB into this send.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let point = MIB + x % (39 * MIB);
        let mut server = start(&recv);
        let victim = Victim::new();
        victim.set(server.child.id());
        let proxy = killing_proxy(&server, point, &victim);
        let _ = send(&src, &proxy.addr(), &["--streams", "2"], None);
        if !victim.killed() {
            // This send moved less than the point (earlier rounds left
            // little to send): the kill comes after it.
            let _ = server.child.kill();
        }
        let _ = server.child.wait();
        final_names_are_all_verified(&src, &recv);
        let r = scrub_root(&recv);
        for k in ["rotten", "changed", "missing", "unreadable"] {
            assert_eq!(
                r[k], 0,
                "round {round}, killed at {point} (seed {seed}): {r}"
            );
        }
        cataloged.push(r["files"].as_u64().unwrap());
    }
    eprintln!("files cataloged after each kill: {cataloged:?}");
    let server = start(&recv);
    let (status, _) = send(&src, &server.addr(), &["--streams", "2"], None);
    assert!(status.success());
    drop(server);
    same_data(&src, &recv.join("data"));
    let r = scrub_root(&recv);
    assert_eq!(
        (r["files"].as_u64(), r["clean"].as_u64()),
        (Some(25), Some(25)),
        "{r}"
    );
}
