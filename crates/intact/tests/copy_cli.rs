//! `intact copy` as a real binary.

use std::fs;
use std::process::Command;

mod common;

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
}

#[test]
fn by_default_riva_reaches_the_device_of_a_mounted_ext4_and_says_so() {
    const T: &str = "by_default_riva_reaches_the_device_of_a_mounted_ext4_and_says_so";
    // The destination is an ext4 this test made on a loop device: a device
    // is under it, so riva must reach level device there.
    let Some(lfs) = common::loop_ext4(T, 64) else {
        return;
    };
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let src = dir.path().join("data");
    fs::create_dir_all(src.join("a/b")).unwrap();
    fs::write(src.join("a/b/x.dat"), intact_sample::bytes(300_000, 1)).unwrap();
    let dst = lfs.mnt().join("out");
    // Human summary by default, riva by default.
    let out = intact(&["copy", src.to_str().unwrap(), dst.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("verify riva: level device"), "{text}");
    assert_eq!(
        common::on_device(&dst.join("data/a/b/x.dat")),
        intact_sample::bytes(300_000, 1),
        "the device does not hold the source's bytes"
    );
}

#[test]
fn nothing_but_a_missing_source_fails_before_the_destination_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("out");
    for json in [false, true] {
        let mut args = vec!["copy", "/nonexistent/source", d.to_str().unwrap()];
        if json {
            args.insert(1, "--json");
        }
        let out = intact(&args);
        assert_eq!(out.status.code(), Some(1), "--json {json}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("/nonexistent/source"), "{err}");
        assert!(
            !d.exists(),
            "no destination made for nothing (--json {json})"
        );
        if json {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(v["failed"], 1, "{v}");
        }
    }
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
        "media",
        good.to_str().unwrap(),
        d.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value 'media'"));
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
    // A tmpfs the test mounted (root) or saw to be one (/dev/shm).
    let Some(shm) =
        intact_testkit::tmpfs("a_tmpfs_destination_warns_and_require_level_device_fails_there")
    else {
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

/// Runs intact as the unprivileged user nobody (tests run as root, and
/// root reads everything), or None with a loud line when that cannot be.
fn as_nobody(test: &str, args: &[&str]) -> Option<std::process::Output> {
    if !intact_testkit::is_root() {
        intact_testkit::skip(test, "needs root to switch to the user nobody");
        return None;
    }
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_intact"))
        .args(args)
        .output();
    match out {
        Ok(o) => Some(o),
        Err(e) => {
            intact_testkit::skip(
                test,
                &format!("setpriv (util-linux, scripts/setup installs it) is not available: {e}"),
            );
            None
        }
    }
}

#[test]
fn permission_denied_fails_that_file_only_with_a_clear_message() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let src = dir.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("open.dat"), b"anyone may read this").unwrap();
    fs::write(src.join("secret.dat"), b"only root").unwrap();
    fs::set_permissions(src.join("secret.dat"), fs::Permissions::from_mode(0o000)).unwrap();
    let dst = dir.path().join("dst");
    fs::create_dir(&dst).unwrap();
    // SAFETY: chown of a path we own, to nobody.
    let c = std::ffi::CString::new(dst.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0);
    let (s, d) = (src.to_str().unwrap(), dst.to_str().unwrap());
    const T: &str = "permission_denied_fails_that_file_only_with_a_clear_message";
    let Some(out) = as_nobody(T, &["copy", s, d]) else {
        return;
    };
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("secret.dat") && err.contains("ermission denied"),
        "{err}"
    );
    assert_eq!(
        fs::read(dst.join("src/open.dat")).unwrap(),
        b"anyone may read this"
    );
    assert!(!dst.join("src/secret.dat").exists());

    // A destination it may not write to: a clear error, nothing written.
    let locked = dir.path().join("locked");
    fs::create_dir(&locked).unwrap();
    let open = src.join("open.dat");
    let out = as_nobody(
        T,
        &["copy", open.to_str().unwrap(), locked.to_str().unwrap()],
    )
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ermission denied"), "{err}");
    assert_eq!(fs::read_dir(&locked).unwrap().count(), 0);
}
