//! `intact demo` runs end to end on its built-in dataset and cleans up.

use std::process::Command;

mod common;

#[test]
fn demo_sends_its_sample_through_a_server_and_verifies_it() {
    const T: &str = "demo_sends_its_sample_through_a_server_and_verifies_it";
    // The demo works in TMPDIR; pointed at an ext4 this test made on a
    // loop device, riva must reach level device there. Without root
    // loop_ext4 records a counted skip (the level goes unchecked) and the
    // demo runs in the default TMPDIR.
    let lfs = common::loop_ext4(T, 640);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_intact"));
    cmd.args(["demo", "--json", "--large-mib", "8"]);
    if let Some(lfs) = &lfs {
        cmd.env("TMPDIR", lfs.mnt());
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verified"], true);
    // 1 large + 200 + 1000 + empty + non-ASCII = 1203 files.
    assert_eq!(v["dataset_files"], 1203);
    let bytes = (8 + 200) * (1u64 << 20) + 1000 * 4096 + 1234;
    assert_eq!(v["dataset_bytes"], bytes);
    assert_eq!(v["transfer"]["failed"], 0);
    assert_eq!(v["transfer"]["bytes_sent"], bytes);
    assert_eq!(v["independent_check"]["files_compared"], 1203);
    assert_eq!(v["independent_check"]["mismatched"], 0);
    let files = v["transfer"]["files"].as_array().unwrap();
    for f in files.iter().filter(|f| f["kind"] == "file") {
        assert_eq!(f["verify"], "riva");
        if lfs.is_some() {
            assert_eq!(f["level"], "device", "{f}");
        }
    }
    // The demo cleaned up after itself.
    if let Some(lfs) = &lfs {
        assert_eq!(
            std::fs::read_dir(lfs.mnt()).unwrap().count(),
            1,
            "only lost+found"
        );
    }
}

/// A tmpfs of `mib` MiB mounted for one test, unmounted when dropped.
struct OwnTmpfs(tempfile::TempDir);

impl Drop for OwnTmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

#[test]
fn on_tmpfs_the_demo_neither_evicts_nor_claims_it_did() {
    const T: &str = "on_tmpfs_the_demo_neither_evicts_nor_claims_it_did";
    // The demo's dataset and its received copy (~420 MiB) do not fit in
    // the test kit's 256 MiB tmpfs: this test mounts its own.
    if !intact_testkit::is_root() {
        intact_testkit::skip(T, "needs root to mount a 640 MiB tmpfs");
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=640m", "intact-demo-test"])
        .arg(dir.path())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        intact_testkit::skip(T, "root, but mount -t tmpfs failed");
        return;
    }
    let shm = OwnTmpfs(dir);
    let run = |json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_intact"));
        cmd.args(["demo", "--large-mib", "16"]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.env("TMPDIR", shm.0.path()).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let v: serde_json::Value = serde_json::from_slice(&run(true)).unwrap();
    assert_eq!(v["verified"], true);
    assert_eq!(v["independent_check"]["mismatched"], 0);
    assert_eq!(v["independent_check"]["evicted_first"], false);
    for f in v["transfer"]["files"].as_array().unwrap() {
        if f["kind"] == "file" {
            assert_eq!(f["level"], "cache", "{f}");
            assert_eq!(f["evict_seconds"], 0.0, "no eviction on tmpfs: {f}");
        }
    }
    let text = String::from_utf8(run(false)).unwrap();
    assert!(!text.contains("evicted from the cache first"), "{text}");
    assert!(!text.contains("stayed cached after eviction"), "{text}");
    assert!(text.contains("read from memory"), "{text}");
    assert!(
        text.contains("level reached by every file: cache"),
        "{text}"
    );
    // The demo cleaned up after itself.
    assert_eq!(std::fs::read_dir(shm.0.path()).unwrap().count(), 0);
}
