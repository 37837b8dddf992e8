//! Disk full at the receiver: the files that do not fit fail with a clear
//! message, nothing unverified gets its final name, the server goes on,
//! and once space is freed the same send completes. Needs root (it mounts
//! a small tmpfs); skips loudly otherwise.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs of a given size, lazily unmounted on every path out of the test.
struct SmallFs(PathBuf);

impl SmallFs {
    fn mount(at: &Path, size: &str) -> SmallFs {
        fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount tmpfs at {}", at.display());
        SmallFs(at.to_path_buf())
    }

    fn resize(&self, size: &str) {
        let ok = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .unwrap()
            .success();
        assert!(ok, "remount");
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

mod common;
use common::Server;

#[test]
fn disk_full_fails_cleanly_and_the_send_completes_after_space_is_freed() {
    if !intact_testkit::is_root() {
        intact_testkit::skip(
            "disk_full_fails_cleanly_and_the_send_completes_after_space_is_freed",
            "needs root to mount a small tmpfs to fill",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let small = SmallFs::mount(&dir.path().join("small"), "4m");
    let root = dir.path().join("small/root");
    let src = dir.path().join("data");
    fs::create_dir_all(&src).unwrap();
    for i in 0..10 {
        fs::write(src.join(format!("f{i}")), intact_sample::bytes(1 << 20, i)).unwrap();
    }

    let server = Server::start(&root);
    let send = || {
        Command::new(env!("CARGO_BIN_EXE_intact"))
            .args(["send", "--streams", "1", "--block-size", "256KiB"])
            .arg(&src)
            .arg(server.addr())
            .output()
            .unwrap()
    };

    let out = send();
    assert_eq!(out.status.code(), Some(1), "the send reports failure");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("No space left on device"), "{err}");
    // Every file that carries its final name is complete and correct.
    let mut finals = 0;
    for i in 0..10 {
        let p = root.join(format!("data/f{i}"));
        if p.exists() {
            finals += 1;
            assert_eq!(
                fs::read(&p).unwrap(),
                intact_sample::bytes(1 << 20, i),
                "f{i}"
            );
        }
    }
    assert!(finals < 10, "not everything fit");

    small.resize("64m");
    let out = send();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for i in 0..10 {
        assert_eq!(
            fs::read(root.join(format!("data/f{i}"))).unwrap(),
            intact_sample::bytes(1 << 20, i)
        );
    }
    drop(server);
}
