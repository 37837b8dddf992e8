//! Many small files to one server: the sender keeps up to 1,024 files in
//! flight per stream, more than a session's share of a server's open
//! files; the receiver must wait for its own streams to give places back
//! (they commit their groups), not refuse the files as "server busy".
//! Before that wait, 5,000 × 16 KiB over 4 streams to a default server
//! lost ~1,400 files that way, on an otherwise idle server.

use std::fs;
use std::process::Command;

mod common;
use common::Server;

#[test]
fn a_session_waits_for_its_own_streams_places_instead_of_failing_files() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("many");
    for d in 0..10 {
        fs::create_dir_all(src.join(format!("d{d}"))).unwrap();
        for i in 0..150u64 {
            fs::write(
                src.join(format!("d{d}/f{i:03}")),
                intact_sample::bytes(100 + i as usize, i),
            )
            .unwrap();
        }
    }
    let root = dir.path().join("root");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_intact"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--root"])
        .arg(&root);
    // 2,048 descriptors: a server budget of a few hundred open files, of
    // which one session of the default 16 may hold about half: far fewer
    // than the 4 × 1,024 a sender keeps in flight.
    common::with_nofile(&mut cmd, 2048);
    let server = Server::spawn(cmd);
    let out = Command::new(env!("CARGO_BIN_EXE_intact"))
        .args([
            "send",
            "--verify",
            "none",
            "--streams",
            "4",
            "--no-source-cache",
        ])
        .arg(&src)
        .arg(server.addr())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("server busy"), "{stderr}");
    assert!(out.status.success(), "{stderr}");
    for d in 0..10 {
        for i in 0..150u64 {
            let rel = format!("d{d}/f{i:03}");
            assert_eq!(
                fs::read(root.join("many").join(&rel)).unwrap(),
                intact_sample::bytes(100 + i as usize, i),
                "{rel}"
            );
        }
    }
}
