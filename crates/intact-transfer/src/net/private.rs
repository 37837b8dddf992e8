//! intact's own state under a root, `ROOT/.intact`, is private: the
//! directory is 0700 and every file in it (the journal and SQLite's files
//! beside it, the lock file) 0600, whatever the umask and whatever an older
//! build left there. The journal names every path received and its
//! digests; no other local user needs to read it.

use std::fs::{DirBuilder, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::journal::STATE_DIR;

/// Mode of `ROOT/.intact`.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file in it.
pub const FILE_MODE: u32 = 0o600;

/// Why the state directory cannot be used.
#[derive(Debug)]
pub(crate) enum StateDirError {
    /// `ROOT/.intact` exists and is not a directory (a symlink included).
    NotADirectory(PathBuf),
    /// It could not be created or made private.
    Io(PathBuf, std::io::Error),
}

impl std::fmt::Display for StateDirError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateDirError::NotADirectory(p) => write!(f, "{}: not a directory", p.display()),
            StateDirError::Io(p, e) => write!(f, "{}: {e}", p.display()),
        }
    }
}

/// `ROOT/.intact`, created 0700 if missing (the root too, with the
/// umask's mode), made 0700 if not.
pub(crate) fn state_dir(root: &Path) -> Result<PathBuf, StateDirError> {
    std::fs::create_dir_all(root).map_err(|e| StateDirError::Io(root.to_path_buf(), e))?;
    private_dir(&root.join(STATE_DIR))
}

/// `dir` (its parent existing), created if missing, 0700, not a symlink.
pub(crate) fn private_dir(dir: &Path) -> Result<PathBuf, StateDirError> {
    let dir = dir.to_path_buf();
    let io = |e| StateDirError::Io(dir.clone(), e);
    match DirBuilder::new().mode(DIR_MODE).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(e)),
    }
    // Opened without following a link, so the mode set is this directory's.
    let handle = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&dir)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) | Some(libc::ENOTDIR) => StateDirError::NotADirectory(dir.clone()),
            _ => io(e),
        })?;
    set_mode(&handle, DIR_MODE).map_err(io)?;
    Ok(dir)
}

/// Makes `file` 0600 (a no-op when it is).
pub(crate) fn private(file: &File) -> std::io::Result<()> {
    set_mode(file, FILE_MODE)
}

/// Creates `path` 0600 if missing (never through a symlink), and makes it
/// 0600 if it exists, before a library that creates files its own way
/// (SQLite) opens it.
pub(crate) fn private_file(path: &Path) -> std::io::Result<()> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    private(&f)
}

/// Makes an existing `path` 0600; a missing one is fine.
pub(crate) fn private_if_present(path: &Path) -> std::io::Result<()> {
    match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => private(&f),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn set_mode(f: &File, mode: u32) -> std::io::Result<()> {
    if f.metadata()?.permissions().mode() & 0o7777 != mode {
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn the_state_is_made_private_whatever_was_there() {
        let t = tempfile::tempdir().unwrap();
        let dir = state_dir(t.path()).unwrap();
        assert_eq!(mode(&dir), 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let f = dir.join("x");
        std::fs::write(&f, b"x").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        state_dir(t.path()).unwrap();
        private_file(&f).unwrap();
        // A journal from an older build, opened under umask 022.
        let j = crate::journal::Journal::open(t.path()).unwrap();
        drop(j);
        for name in ["journal.sqlite", "journal.sqlite-wal"] {
            let p = dir.join(name);
            if p.exists() {
                assert_eq!(mode(&p), 0o600, "{name}");
            }
        }
        assert!(dir.join("journal.sqlite").exists());
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&f), 0o600);
        assert_eq!(std::fs::read(&f).unwrap(), b"x", "kept, not truncated");
        private_if_present(&dir.join("missing")).unwrap();
    }

    #[test]
    fn a_symlinked_state_dir_or_file_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = t.path().join("root");
        std::fs::create_dir(&root).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join(STATE_DIR)).unwrap();
        assert!(matches!(
            state_dir(&root),
            Err(StateDirError::NotADirectory(_))
        ));
        assert_eq!(mode(&elsewhere), 0o755, "the link's target is untouched");
        let target = t.path().join("target");
        std::fs::write(&target, b"t").unwrap();
        std::os::unix::fs::symlink(&target, elsewhere.join("j")).unwrap();
        assert!(private_file(&elsewhere.join("j")).is_err());
    }
}
