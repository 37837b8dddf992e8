//! A server's hold on its root: checked before it listens, and one server
//! per root.
//!
//! [`RootLock::acquire`] makes sure the root is a directory (creating it
//! if missing), then takes an exclusive `flock` on `ROOT/.intact/lock` and
//! writes the server's PID into it. `ROOT/.intact` is made 0700 and the
//! lock file 0600, whatever the umask. A second server on the same root is
//! refused at once and told which PID holds it, instead of starting and
//! then failing on its journal. The kernel drops the lock when the process
//! ends, however it ends, so a file left behind never blocks a restart.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::net::private::{private, state_dir, StateDirError};
use crate::TransferError;

/// Name of the lock file under `ROOT/.intact`.
pub const LOCK_FILE: &str = "lock";

/// Why a server cannot use its root.
#[derive(Debug, thiserror::Error)]
pub enum RootError {
    /// The root exists and is not a directory.
    #[error("root {}: not a directory; give --root a directory (it is created if missing)", .0.display())]
    NotADirectory(PathBuf),
    /// The root (or intact's state in it) could not be created or opened.
    #[error("root {}: {}; give --root a directory this user can write", path.display(), intact_digest::io_reason(source))]
    Unusable {
        /// The path that failed.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Another server holds the root.
    #[error(
        "root {} is in use by another intact serve ({}); stop that one, or give this one another --root",
        root.display(),
        pid.map_or("PID unknown".to_string(), |p| format!("PID {p}"))
    )]
    InUse {
        /// The root.
        root: PathBuf,
        /// The PID written in the lock file, if it could be read.
        pid: Option<u32>,
    },
    /// The root is locked, but its journal or directory could not be opened.
    #[error(transparent)]
    State(#[from] TransferError),
}

impl RootError {
    /// Whether the error is in what the user passed (exit status 2), not
    /// in the state of the machine.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            RootError::NotADirectory(_) | RootError::Unusable { .. }
        )
    }
}

impl From<RootError> for TransferError {
    fn from(e: RootError) -> TransferError {
        match e {
            RootError::State(e) => e,
            other => TransferError::Usage(other.to_string()),
        }
    }
}

/// How long a lock still held under this process's own PID is waited for.
const OWN_LOCK_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// The exclusive hold of one server on one root; released when dropped
/// (or when the process ends).
#[derive(Debug)]
pub struct RootLock {
    _file: File,
}

impl RootLock {
    /// Checks `root` (a directory, created if missing), then locks it for
    /// this process and records its PID.
    pub fn acquire(root: &Path) -> Result<RootLock, RootError> {
        RootLock::acquire_with(root, None)
    }

    /// [`RootLock::acquire`], the lock kept in the private directory
    /// `state` instead of `root/.intact` (a local copy's, under the user's
    /// own state directory).
    pub fn acquire_with(root: &Path, state: Option<&Path>) -> Result<RootLock, RootError> {
        let unusable = |path: &Path| {
            let path = path.to_path_buf();
            move |source| RootError::Unusable { path, source }
        };
        match std::fs::metadata(root) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(RootError::NotADirectory(root.to_path_buf())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(root).map_err(unusable(root))?;
            }
            Err(e) => return Err(unusable(root)(e)),
        }
        let state = match state {
            Some(s) => s.to_path_buf(),
            None => state_dir(root).map_err(|e| match e {
                StateDirError::NotADirectory(p) => RootError::NotADirectory(p),
                StateDirError::Io(path, source) => RootError::Unusable { path, source },
            })?,
        };
        let path = state.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(unusable(&path))?;
        // Whatever the umask, and whatever an older build left.
        private(&file).map_err(unusable(&path))?;
        match flock_or_holder(
            &mut file,
            rustix::fs::FlockOperation::NonBlockingLockExclusive,
        ) {
            Ok(()) => {}
            Err(Held::By(pid)) => {
                return Err(RootError::InUse {
                    root: root.to_path_buf(),
                    pid,
                })
            }
            Err(Held::Error(e)) => return Err(unusable(&path)(e.into())),
        }
        // Only the holder writes: a reader sees the PID or, for a moment
        // after the lock was taken, nothing.
        file.set_len(0).map_err(unusable(&path))?;
        file.rewind().map_err(unusable(&path))?;
        writeln!(file, "{}", std::process::id()).map_err(unusable(&path))?;
        Ok(RootLock { _file: file })
    }
}

/// The PID holding the lock in the private directory `state`, if another
/// process holds it now (a running server, copy or mount); None if it is
/// free (or cannot be read). The lock is not taken.
pub fn lock_holder(state: &Path) -> Option<Option<u32>> {
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(state.join(LOCK_FILE))
        .ok()?;
    match flock_or_holder(&mut file, rustix::fs::FlockOperation::NonBlockingLockShared) {
        Ok(()) => {
            let _ = rustix::fs::flock(&file, rustix::fs::FlockOperation::Unlock);
            None
        }
        Err(Held::By(pid)) => Some(pid),
        Err(Held::Error(_)) => None,
    }
}

/// Why a lock could not be taken.
enum Held {
    /// Another holder (the PID its file records, if readable).
    By(Option<u32>),
    /// flock failed otherwise.
    Error(rustix::io::Errno),
}

/// Takes the lock `op` (non-blocking) on `file`. A lock whose recorded
/// holder is this very process was let go by us: a child another thread
/// was spawning at that moment can still hold a copy of the descriptor
/// until its exec closes it. That is waited for, briefly
/// ([`OWN_LOCK_GRACE`]); any other holder is answered at once.
fn flock_or_holder(file: &mut std::fs::File, op: rustix::fs::FlockOperation) -> Result<(), Held> {
    let deadline = std::time::Instant::now() + OWN_LOCK_GRACE;
    loop {
        match rustix::fs::flock(&*file, op) {
            Ok(()) => return Ok(()),
            Err(rustix::io::Errno::WOULDBLOCK) => {
                let mut text = String::new();
                let _ = file.rewind();
                let _ = file.read_to_string(&mut text);
                let pid: Option<u32> = text.trim().parse().ok();
                if pid == Some(std::process::id()) && std::time::Instant::now() < deadline {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    continue;
                }
                return Err(Held::By(pid));
            }
            Err(e) => return Err(Held::Error(e)),
        }
    }
}
