//! `intact copy` as a real binary.

use std::fs;
use std::process::Command;

fn intact(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_intact"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn copies_a_tree_and_reports_in_json() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("data");
    fs::create_dir_all(src.join("a/b")).unwrap();
    fs::write(src.join("a/b/x.dat"), intact_sample::bytes(300_000, 1)).unwrap();
    fs::write(src.join("empty.dat"), b"").unwrap();
    let dst = dir.path().join("out");
    let (s, d) = (src.to_str().unwrap(), dst.to_str().unwrap());
    let out = intact(&[
        "copy",
        "--json",
        "--block-size",
        "64KiB",
        "--verify",
        "fiver",
        s,
        d,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["failed"], 0);
    assert_eq!(v["bytes"], 300_000);
    let x = v["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "data/a/b/x.dat")
        .unwrap();
    assert_eq!(x["blocks"], 5);
    assert_eq!(x["level"], "network");
    assert_eq!(x["verify"], "fiver");
    assert_eq!(
        fs::read(dst.join("data/a/b/x.dat")).unwrap(),
        intact_sample::bytes(300_000, 1)
    );

    // Human summary by default.
    let out = intact(&["copy", s, d]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    // riva by default, and the level it really reached on this disk.
    let probe = fs::File::open(dst.join("data/a/b/x.dat")).unwrap();
    let level = if intact_cache::backing(&probe).unwrap().has_device() {
        "device"
    } else {
        "cache"
    };
    assert!(
        text.contains(&format!("verify riva: level {level}")),
        "{text}"
    );
}

#[test]
fn failures_and_usage_errors_have_their_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("out");
    let good = dir.path().join("good.dat");
    fs::write(&good, b"x").unwrap();
    let out = intact(&[
        "copy",
        "/nonexistent/source",
        good.to_str().unwrap(),
        d.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/source"));
    assert_eq!(
        fs::read(d.join("good.dat")).unwrap(),
        b"x",
        "the good source is still copied"
    );

    let out = intact(&[
        "copy",
        "--verify",
        "flash",
        good.to_str().unwrap(),
        d.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not built yet"));
    let out = intact(&[
        "copy",
        "--verify",
        "fiver",
        "--require-level",
        "device",
        good.to_str().unwrap(),
        d.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be met"));
    let out = intact(&["copy", good.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_tmpfs_destination_warns_and_require_level_device_fails_there() {
    let Ok(shm) = tempfile::tempdir_in("/dev/shm") else {
        eprintln!("SKIP a_tmpfs_destination_warns: no /dev/shm here");
        return;
    };
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let src = dir.path().join("f.dat");
    fs::write(&src, intact_sample::bytes(100_000, 3)).unwrap();
    let (s, d) = (src.to_str().unwrap(), shm.path().join("a"));
    let out = intact(&["copy", s, d.to_str().unwrap()]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning: 1 file(s) verified only to level cache") && err.contains("tmpfs"),
        "{err}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("level cache"));

    let d = shm.path().join("b");
    let out = intact(&["copy", "--require-level", "device", s, d.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--require-level device") && err.contains("tmpfs"),
        "{err}"
    );
    assert!(
        !d.join("f.dat").exists(),
        "a file below the level got its name"
    );
}
