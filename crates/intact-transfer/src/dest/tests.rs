//! The destination's partial files: what they share and what they refuse.

use std::sync::Arc;

use intact_proto::WirePath;

use super::{Destination, Mtime};
use crate::TransferError;

fn wp(s: &str) -> WirePath {
    WirePath::parse(s.as_bytes()).unwrap()
}

#[test]
fn files_of_one_directory_share_its_descriptor_and_reserved_names_stay_refused() {
    let root = tempfile::tempdir().unwrap();
    let dest = Destination::open(root.path()).unwrap();
    let a = dest.partial(&wp("d/a"), 1).unwrap();
    let b = dest.partial(&wp("d/b"), 1).unwrap();
    assert!(Arc::ptr_eq(&a.dir, &b.dir), "d/a and d/b share d");
    // The directory d is kept now; names a transfer may never write there
    // are refused all the same.
    let hidden = dest.partial(&wp("d/.intact-partial-0123"), 1);
    assert!(
        matches!(hidden, Err(TransferError::Reserved(_))),
        "{:?}",
        hidden.err()
    );
    let c = dest.partial(&wp("e/c"), 1).unwrap();
    let top = dest.partial(&wp("t"), 1).unwrap();
    assert!(!Arc::ptr_eq(&a.dir, &c.dir), "e is not d");
    assert!(!Arc::ptr_eq(&c.dir, &top.dir), "the root is not e");

    // Committed together: each under its final name, in its own directory.
    let mtime = Mtime { sec: 1, nsec: 0 };
    let files = [(a, "d/a"), (b, "d/b"), (c, "e/c"), (top, "t")];
    for (f, _) in &files {
        std::os::unix::fs::FileExt::write_all_at(f.file(), b"x", 0).unwrap();
    }
    let names: Vec<&str> = files.iter().map(|(_, n)| *n).collect();
    let results = dest.commit_batch(files.into_iter().map(|(f, _)| (f, 0o644, mtime)).collect());
    assert!(results.iter().all(|r| r.is_ok()));
    for n in names {
        assert_eq!(std::fs::read(root.path().join(n)).unwrap(), b"x", "{n}");
    }
}

#[test]
fn a_directory_moved_away_is_opened_again_once_its_descriptor_is_old() {
    let root = tempfile::tempdir().unwrap();
    let dest = Destination::open(root.path()).unwrap();
    let first = dest.partial(&wp("d/a"), 1).unwrap();
    std::fs::rename(root.path().join("d"), root.path().join("moved")).unwrap();
    std::fs::create_dir(root.path().join("d")).unwrap();
    std::thread::sleep(super::last_parent::REUSE_FOR);
    let later = dest.partial(&wp("d/b"), 1).unwrap();
    assert!(!Arc::ptr_eq(&first.dir, &later.dir));
    let in_new_d = std::fs::read_dir(root.path().join("d")).unwrap().count();
    assert_eq!(in_new_d, 1, "the partial of d/b is in the d there now");
}

#[test]
fn a_batch_over_two_file_systems_commits_every_file() {
    use std::os::unix::fs::MetadataExt;
    const TEST: &str = "a_batch_over_two_file_systems_commits_every_file";
    if !intact_testkit::is_root() {
        intact_testkit::skip(TEST, "mounting a tmpfs below the root needs root");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let m = root.path().join("m");
    std::fs::create_dir(&m).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16m", "intact-test"])
        .arg(&m)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        intact_testkit::skip(TEST, "root, but mount -t tmpfs failed");
        return;
    }
    struct Unmount<'a>(&'a std::path::Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(self.0)
                .status();
        }
    }
    let _unmount = Unmount(&m);
    let dev = |p: &std::path::Path| std::fs::metadata(p).unwrap().dev();
    assert_ne!(dev(root.path()), dev(&m), "m is another file system");
    let dest = Destination::open(root.path()).unwrap();
    let names = ["a", "m/b", "c", "m/d"];
    let mtime = Mtime { sec: 1, nsec: 0 };
    let batch: Vec<_> = names
        .iter()
        .map(|n| {
            let f = dest.partial(&wp(n), 1).unwrap();
            std::os::unix::fs::FileExt::write_all_at(f.file(), n.as_bytes(), 0).unwrap();
            (f, 0o644, mtime)
        })
        .collect();
    let results = dest.commit_batch(batch);
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    for n in names {
        assert_eq!(std::fs::read(root.path().join(n)).unwrap(), n.as_bytes());
    }
}

#[test]
fn an_unnamed_file_ends_with_exactly_the_mode_asked_for() {
    // Unnamed files are made with their final permission bits and skip
    // the commit's chmod where the umask left those bits as asked: every
    // mode, the ones the umask cuts and the ones only chmod can set
    // (setuid, sticky) included, must still come out exact.
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let dest = Destination::open(root.path()).unwrap();
    let mtime = Mtime { sec: 1, nsec: 0 };
    let modes = [
        0o644, 0o600, 0o666, 0o777, 0o755, 0o400, 0o4755, 0o1777, 0o000,
    ];
    let mut batch = Vec::new();
    for m in modes {
        let Some(f) = dest.unnamed(&wp(&format!("m{m:o}")), m).unwrap() else {
            intact_testkit::skip(
                "an_unnamed_file_ends_with_exactly_the_mode_asked_for",
                "no O_TMPFILE on the test directory's file system",
            );
            return;
        };
        assert!(f.is_unnamed());
        std::os::unix::fs::FileExt::write_all_at(f.file(), b"x", 0).unwrap();
        batch.push((f, m, mtime));
    }
    let results = dest.commit_batch(batch);
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    for m in modes {
        let md = std::fs::metadata(root.path().join(format!("m{m:o}"))).unwrap();
        assert_eq!(md.permissions().mode() & 0o7777, m, "mode {m:o}");
    }
}

#[test]
fn overlapping_roots_claim_one_path_by_one_key() {
    // A keyring client confined to `sub` and another writing `sub/x` from
    // the root name one directory entry: the second transfer is refused
    // while the first holds it, then gets it. Unnamed files, which take no
    // lock: only the claim can refuse.
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("sub")).unwrap();
    let whole = Destination::open(root.path()).unwrap();
    let confined = Destination::open(&root.path().join("sub")).unwrap();
    let Some(held) = whole.unnamed(&wp("sub/x"), 0o644).unwrap() else {
        intact_testkit::skip(
            "overlapping_roots_claim_one_path_by_one_key",
            "no O_TMPFILE on the test directory's file system",
        );
        return;
    };
    let t = std::time::Instant::now();
    let refused = confined.unnamed(&wp("x"), 0o644);
    assert!(
        matches!(&refused, Err(TransferError::Destination { source, .. }) if source.to_string().contains("being received by another session")),
        "{:?}",
        refused.err()
    );
    assert!(t.elapsed() >= super::partial_open::LOCK_WAIT, "it waited");
    drop(held);
    assert!(confined.unnamed(&wp("x"), 0o644).unwrap().is_some());
}
