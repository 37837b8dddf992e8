//! The journal's rows as `start` leaves them.

use super::*;
use crate::verify::{VerifyLevel, VerifyMode};

/// A path started for the first time gets a row of its own; started
/// again, it keeps its row and loses what was recorded for it.
#[test]
fn starting_a_path_again_forgets_its_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let j = Journal::open(dir.path()).unwrap();
    let a = j.start(b"d/a", 10, (1, 2), 4096, None, b"").unwrap();
    let b = j.start(b"d/b", 10, (1, 2), 4096, None, b"").unwrap();
    assert_ne!(a, b);
    let block = BlockRecord {
        index: 0,
        digest: vec![9; 16],
        verified: VerifiedAt::now(VerifyMode::Riva, VerifyLevel::Device),
        pages: None,
    };
    j.add_blocks(a, std::slice::from_ref(&block)).unwrap();
    j.add_blocks(b, &[block]).unwrap();
    assert_eq!(j.blocks(a).unwrap().len(), 1);
    let again = j.start(b"d/a", 20, (3, 4), 4096, None, b"").unwrap();
    assert_eq!(again, a, "the same row");
    assert!(j.blocks(a).unwrap().is_empty(), "its blocks are forgotten");
    assert_eq!(j.blocks(b).unwrap().len(), 1, "another path's stay");
    let row = j.lookup(b"d/a").unwrap().unwrap();
    assert_eq!((row.size, row.mtime_sec, row.done), (20, 3, false));
}
