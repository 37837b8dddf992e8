//! Committing received files: each gets its mode and time, its data is
//! made durable, it takes its final name, and its directory is made
//! durable; a batch of small files shares one syncfs per file system and
//! one fsync per directory.

use std::os::fd::OwnedFd;

use rustix::fs::{self as rfs, Mode};

use super::{dest_err, partial_open, unnamed, Destination, Mtime, PartialFile};
use crate::TransferError;

impl Destination {
    /// Commits many verified files at once, for many small files: sets each
    /// one's mode and time, makes all their data durable with one syncfs
    /// per file system they are on (one fsync when there is a single
    /// file), renames each to its final name, and fsyncs each distinct
    /// directory once. Returns one result per file, in order; a file's
    /// result is Ok only after its data, its name and its directory are
    /// durable.
    pub fn commit_batch(
        &self,
        batch: Vec<(PartialFile, u32, Mtime)>,
    ) -> Vec<Result<(), TransferError>> {
        let mut results: Vec<Result<(), TransferError>> = Vec::with_capacity(batch.len());
        for (f, mode, mtime) in &batch {
            let p = &f.path;
            // An unnamed file made with these very bits needs no chmod.
            let chmod = || match f.mode_now {
                Some(now) if now == mode & 0o7777 => Ok(()),
                _ => rfs::fchmod(&f.file, Mode::from_raw_mode(mode & 0o7777)),
            };
            results.push(
                chmod()
                    .and_then(|()| rfs::futimens(&f.file, &mtime.timestamps()))
                    .map_err(|e| dest_err(p, e)),
            );
        }
        let synced = if batch.len() == 1 {
            batch[0]
                .0
                .file
                .sync_all()
                .map_err(|e| dest_err(&batch[0].0.path, e))
        } else {
            // Each file system the batch's files are on (a directory below
            // the root may be another mount), once.
            let mut devs: Vec<u64> = Vec::new();
            let mut synced = Ok(());
            for (f, _, _) in &batch {
                if devs.contains(&f.dev) {
                    continue;
                }
                devs.push(f.dev);
                if let Err(e) = rfs::syncfs(&f.file) {
                    synced = Err(TransferError::Destination {
                        path: "(file system)".into(),
                        source: e.into(),
                    });
                    break;
                }
            }
            synced
        };
        let mut dirs: Vec<(u64, u64, &OwnedFd)> = Vec::new();
        for (r, (f, _, _)) in results.iter_mut().zip(&batch) {
            if r.is_ok() {
                if let Err(e) = &synced {
                    *r = Err(dest_err(&f.path, std::io::Error::other(e.to_string())));
                    continue;
                }
                *r = f.rename_into_place();
                // Files of one directory share its descriptor.
                if r.is_ok() && !dirs.iter().any(|d| std::ptr::eq(d.2, &*f.dir)) {
                    if let Ok(st) = rfs::fstat(&f.dir) {
                        let key = (st.st_dev, st.st_ino);
                        if !dirs.iter().any(|d| (d.0, d.1) == key) {
                            dirs.push((key.0, key.1, &*f.dir));
                        }
                    }
                }
            }
        }
        let mut dir_errors = Vec::new();
        for (dev, ino, fd) in &dirs {
            if let Err(e) = rfs::fsync(fd) {
                dir_errors.push(((*dev, *ino), e));
            }
        }
        if !dir_errors.is_empty() {
            for (r, (f, _, _)) in results.iter_mut().zip(&batch) {
                let Ok(st) = rfs::fstat(&f.dir) else { continue };
                if let Some((_, e)) = dir_errors
                    .iter()
                    .find(|(k, _)| *k == (st.st_dev, st.st_ino))
                {
                    *r = Err(dest_err(&f.path, *e));
                }
            }
        }
        results
    }
}

impl PartialFile {
    /// Renames the partial file to its final name (refusing to replace a
    /// directory). The caller makes the directory durable.
    fn rename_into_place(&self) -> Result<(), TransferError> {
        let p = &self.path;
        let Some(tmp) = &self.tmp else {
            return unnamed::link_into_place(&self.file, &self.dir, &self.name)
                .map_err(|e| dest_err(p, e));
        };
        // Only the file this transfer holds (locked) gets the final name.
        if !partial_open::names(&self.dir, tmp, &self.file) {
            return Err(dest_err(
                p,
                std::io::Error::other(
                    "its partial file was replaced by another; nothing was renamed",
                ),
            ));
        }
        // A directory at the final name stays: rename(2) refuses to put a
        // file over one (EISDIR).
        rfs::renameat(&self.dir, tmp, &self.dir, &self.name).map_err(|e| dest_err(p, e))
    }
}
