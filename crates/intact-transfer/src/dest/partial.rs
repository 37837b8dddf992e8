//! A file being received: its partial file, named or unnamed, with what
//! its commit needs.

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use intact_proto::WirePath;
use rustix::fs as rfs;

use super::Claim;

/// A file being received under its hidden partial name, or unnamed.
pub struct PartialFile {
    /// This process's hold on the path (see `dest/claim.rs`).
    pub(super) claim: Arc<Claim>,
    pub(super) dir: Arc<OwnedFd>,
    /// Its hidden name in `dir`; None: an unnamed file (`O_TMPFILE`),
    /// linked in at its commit.
    pub(super) tmp: Option<OsString>,
    pub(super) name: OsString,
    /// Shared with the verifier's re-reader (no second descriptor).
    pub(super) file: Arc<File>,
    /// Its file system's device number.
    pub(super) dev: u64,
    /// Its permission bits as made, where they are known to be what the
    /// commit would set them to otherwise (an unnamed file's); None: the
    /// commit sets them.
    pub(super) mode_now: Option<u32>,
    pub(super) path: WirePath,
}

impl PartialFile {
    /// The open file (positional reads and writes).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The open file, shared.
    pub(crate) fn shared(&self) -> &Arc<File> {
        &self.file
    }

    /// Its file system's device number (`st_dev`).
    pub fn dev(&self) -> u64 {
        self.dev
    }

    /// The destination path.
    pub fn path(&self) -> &WirePath {
        &self.path
    }

    /// Another handle on the same open file description (a `dup`): it
    /// shares the description's lock, which lasts until the last handle
    /// closes. The ranges of a split file are written through such
    /// handles, one per receiving session, all under one lock.
    pub fn share(&self) -> std::io::Result<PartialFile> {
        Ok(PartialFile {
            claim: Arc::clone(&self.claim),
            dir: Arc::clone(&self.dir),
            tmp: self.tmp.clone(),
            name: self.name.clone(),
            file: Arc::new(self.file.try_clone()?),
            dev: self.dev,
            mode_now: self.mode_now,
            path: self.path.clone(),
        })
    }

    /// Another handle on this process's hold on the path: a commit keeps
    /// it until the file's journal row is written, after the partial file
    /// itself is gone.
    pub fn claim(&self) -> Arc<Claim> {
        Arc::clone(&self.claim)
    }

    /// Whether the file is unnamed (`O_TMPFILE`): nothing of it outlives
    /// the transfer, so no block of it may be journaled before its commit.
    pub fn is_unnamed(&self) -> bool {
        self.tmp.is_none()
    }

    /// The file's device and inode.
    pub fn file_id(&self) -> std::io::Result<(u64, u64)> {
        let st = rfs::fstat(&self.file)?;
        Ok((st.st_dev, st.st_ino))
    }
}
