//! The directories one session created, so that it sets the mode and time
//! of those and of no other: a directory that was already there (another
//! client's, the server owner's) keeps its own.

use std::collections::HashSet;
use std::os::fd::AsFd;
use std::sync::Mutex;

use rustix::fs as rfs;

/// Directories a session keeps by identity at most; past this, the ones it
/// creates keep the server's default mode (0755) and their own time.
pub const MAX_CREATED_DIRS: usize = 1 << 20;

/// Directories created by one session, by (device, inode).
#[derive(Debug, Default)]
pub struct CreatedDirs {
    set: Mutex<HashSet<(u64, u64)>>,
}

impl CreatedDirs {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<(u64, u64)>> {
        // A set of numbers: a panic elsewhere cannot leave it inconsistent.
        self.set.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the directory open as `fd` as created by this session.
    pub(crate) fn add(&self, fd: impl AsFd) {
        if let Ok(st) = rfs::fstat(fd) {
            let mut set = self.lock();
            if set.len() < MAX_CREATED_DIRS {
                set.insert((st.st_dev, st.st_ino));
            }
        }
    }

    /// Whether the directory open as `fd` was created by this session.
    pub(crate) fn has(&self, fd: impl AsFd) -> bool {
        rfs::fstat(fd).is_ok_and(|st| self.lock().contains(&(st.st_dev, st.st_ino)))
    }

    /// How many are recorded.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
