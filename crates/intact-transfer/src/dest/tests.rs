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
