//! `intact scrub` and `intact status` as a user runs them: exit statuses,
//! the lines printed, and the JSON for scripts. (Rot on a device is made
//! and found in intact-transfer's tests/scrub.rs, which needs root.)

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

/// Runs the binary with its own state directory (copies keep their
/// catalog there).
fn run(state: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_intact"))
        .args(args)
        .env("XDG_STATE_HOME", state)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn scrub_exits_0_when_clean_1_when_a_file_is_missing_and_status_counts_it() {
    let t = tempfile::tempdir().unwrap();
    let (src, dst, state) = (
        t.path().join("src"),
        t.path().join("dst"),
        t.path().join("state"),
    );
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("a"), vec![7u8; 70_000]).unwrap();
    fs::write(src.join("d/b"), vec![9u8; 5_000]).unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let o = run(&state, &["copy", &format!("{}/", s(&src)), &s(&dst)]);
    assert!(o.status.success(), "{}", text(&o.stderr));

    let o = run(&state, &["scrub", &s(&dst)]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    assert!(
        text(&o.stdout).contains("scrubbed 2 files"),
        "{}",
        text(&o.stdout)
    );
    assert!(text(&o.stdout).contains("2 clean"), "{}", text(&o.stdout));

    fs::remove_file(dst.join("d/b")).unwrap();
    let o = run(&state, &["scrub", &s(&dst)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    assert!(
        text(&o.stdout).contains("MISSING d/b"),
        "{}",
        text(&o.stdout)
    );

    let o = run(&state, &["status", "--json", &s(&dst)]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["files"], 2);
    assert_eq!(v["bytes"], 75_000);
    assert_eq!(v["last_scrub"]["missing"], 1, "{v}");
    assert_eq!(v["last_scrub"]["clean"], 1, "{v}");
    assert_eq!(v["never_scrubbed"], 0);

    let o = run(&state, &["scrub", "--json", &s(&dst)]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["missing"], 1, "{v}");
    assert_eq!(
        v["reports"].as_array().unwrap().len(),
        2,
        "--json lists every file"
    );
}

#[test]
fn a_root_without_a_catalog_is_a_usage_error_that_says_so() {
    let t = tempfile::tempdir().unwrap();
    for cmd in ["scrub", "status"] {
        let o = run(&t.path().join("state"), &[cmd, t.path().to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{cmd}");
        assert!(
            text(&o.stderr).contains("no catalog there"),
            "{}",
            text(&o.stderr)
        );
    }
}
