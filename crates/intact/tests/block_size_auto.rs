//! `--block-size auto`: what it probes, what it reports, and that the
//! transfer runs at the size it chose (the file's block count), with the
//! bytes arriving whole and the probe leaving nothing behind.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

mod common;
use common::{listing, s, Server};

const MIB: u64 = 1 << 20;

/// `intact copy --json ARGS…` with its own state directory: its report.
fn copy_json(state: &Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_intact"))
        .args(["copy", "--json"])
        .args(args)
        .env("XDG_STATE_HOME", state)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A file of `size` bytes at `path`: `head` bytes of data, then a hole
/// (what every candidate cuts alike; the probe reads the head). Its
/// BLAKE3.
fn big_file(path: &Path, size: u64, head: usize) -> String {
    let f = fs::File::create(path).unwrap();
    f.write_all_at(&intact_sample::bytes(head, 7), 0).unwrap();
    f.write_all_at(b"end", size - 3).unwrap();
    blake3_of(path)
}

fn blake3_of(path: &Path) -> String {
    let mut h = blake3::Hasher::new();
    h.update_reader(fs::File::open(path).unwrap()).unwrap();
    h.finalize().to_hex().to_string()
}

/// The report's row of the file named `name`.
fn row<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"].as_str().unwrap().ends_with(name))
        .unwrap()
}

#[test]
fn a_large_file_is_probed_predicted_and_cut_at_the_size_chosen() {
    // On a real disk (the target directory), not a tmpfs.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (src, dst, state) = (
        dir.path().join("src"),
        dir.path().join("dst"),
        dir.path().join("state"),
    );
    fs::create_dir_all(&src).unwrap();
    let size = 1024 * MIB + 12345;
    let digest = big_file(&src.join("big.dat"), size, 64 << 20);
    fs::create_dir_all(&dst).unwrap();
    let r = copy_json(
        &state,
        &["--block-size", "auto", s(&src.join("big.dat")), s(&dst)],
    );
    let b = &r["block_size"];
    let chosen = b["chosen"].as_u64().unwrap();
    let candidates: Vec<u64> = b["predicted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["block"].as_u64().unwrap())
        .collect();
    assert_eq!(candidates, [1, 2, 4, 8, 16].map(|m| m * MIB), "{b}");
    assert!(candidates.contains(&chosen), "{b}");
    for p in b["predicted"].as_array().unwrap() {
        assert!(p["seconds"].as_f64().unwrap() > 0.0, "{b}");
    }
    let measured = b["measured"].to_string();
    assert!(measured.contains("source: read from its device"), "{b}");
    assert!(measured.contains("destination: write"), "{b}");
    assert!(b["probe_seconds"].as_f64().unwrap() > 0.0, "{b}");
    // The file went in blocks of the chosen size, and arrived whole.
    let f = row(&r, "big.dat");
    assert_eq!(f["blocks"].as_u64().unwrap(), size.div_ceil(chosen), "{f}");
    assert_eq!(f["level"], "device", "{f}");
    assert_eq!(blake3_of(&dst.join("big.dat")), digest);
    // The probe's blocks went to an unnamed file: nothing else is there.
    assert_eq!(listing(&dst), ["big.dat"]);
}

#[test]
fn small_files_keep_the_default_unprobed() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst, state) = (
        dir.path().join("src"),
        dir.path().join("dst"),
        dir.path().join("state"),
    );
    fs::create_dir_all(&src).unwrap();
    for i in 0..20 {
        fs::write(src.join(format!("f{i}")), intact_sample::bytes(64 << 10, i)).unwrap();
    }
    fs::write(src.join("two.dat"), intact_sample::bytes(2 << 20, 99)).unwrap();
    let r = copy_json(&state, &["--block-size", "auto", s(&src), s(&dst)]);
    let b = &r["block_size"];
    assert_eq!(b["chosen"], 4 * MIB, "{b}");
    assert!(b["why"].as_str().unwrap().contains("unprobed"), "{b}");
    assert!(b["predicted"].as_array().unwrap().is_empty(), "{b}");
    assert_eq!(b["probe_seconds"], 0.0, "{b}");
    assert!(b["stages"].is_null(), "{b}");
    // A fixed size has no such section.
    let r = copy_json(
        &state,
        &["--block-size", "1MiB", "--reverify", s(&src), s(&dst)],
    );
    assert!(r.get("block_size").is_none(), "{r}");
}

#[test]
fn a_send_says_the_server_was_not_probed() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let size = 1024 * MIB;
    let digest = big_file(&src.join("big.dat"), size, 16 << 20);
    let recv = dir.path().join("recv");
    let server = Server::start(&recv);
    let (status, report) = common::send_json(
        &["--block-size", "auto"],
        &src.join("big.dat"),
        &server.addr(),
        None,
    );
    assert!(status.success());
    let r = report.unwrap();
    let b = &r["block_size"];
    let measured = b["measured"].to_string();
    assert!(measured.contains("server: its device is not probed"), "{b}");
    // Loopback: the network is not modelled.
    assert!(measured.contains("not modelled"), "{b}");
    let chosen = b["chosen"].as_u64().unwrap();
    assert_eq!(
        row(&r, "big.dat")["blocks"].as_u64().unwrap(),
        size.div_ceil(chosen)
    );
    assert_eq!(blake3_of(&recv.join("big.dat")), digest);
}

#[test]
fn help_and_errors_name_auto() {
    let out = common::intact(&["copy", "--help"]);
    let help = common::stdout(&out);
    assert!(help.contains("SIZE|auto"), "{help}");
    let out = common::intact(&["copy", "--block-size", "automatic", "a", "b"]);
    assert_eq!(out.status.code(), Some(2));
}
