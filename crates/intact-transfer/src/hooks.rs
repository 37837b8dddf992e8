//! The fault seams of the pipeline, for tests and the fault lab: they are
//! set only in a build with the `fault-hooks` feature (the `intact` binary
//! has none).

use std::fs::File;
use std::sync::Arc;

/// Corrupts a block on the link: (file's destination path, block index, bytes).
pub type LinkFault = Arc<dyn Fn(&str, u64, &mut [u8]) + Send + Sync>;

/// Called right after a block was written at the destination and before
/// anything verifies it: (the destination file, its path, block index,
/// offset, length). Tests and the fault lab change the device under the
/// block here.
pub type WriteHook = Arc<dyn Fn(&File, &str, u64, u64, usize) + Send + Sync>;

/// Called by a receiver after a group of files took their final names and
/// before their journal rows are written: (their paths). Tests start
/// another session on one of those paths here.
pub type CommitHook = Arc<dyn Fn(&[String]) + Send + Sync>;

/// Called by a scrub right after it read a block of a file and before it
/// checks it: (the file's path under the root, block index). Tests change
/// the file here, as another program could while it is read.
#[derive(Clone)]
pub struct ScrubReadHook(pub ScrubReadFn);

/// What a [`ScrubReadHook`] calls: (path under the root, block index).
pub type ScrubReadFn = Arc<dyn Fn(&str, u64) + Send + Sync>;

impl std::fmt::Debug for ScrubReadHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScrubReadHook")
    }
}
