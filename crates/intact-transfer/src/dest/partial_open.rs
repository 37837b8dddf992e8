//! Opening a partial file so that it belongs to one transfer at a time.
//!
//! The partial name is deterministic (an interrupted transfer finds its
//! data again), so it is also predictable: another session may be writing
//! it, and a local user who can write the directory may have planted a
//! hard link or a symlink there. So a new partial file is created with
//! `O_CREAT | O_EXCL | O_NOFOLLOW` (mode 0600); an existing one is reused
//! (a resume) only if it is a regular file owned by this process's user
//! with one link, and is otherwise removed, never written through. The
//! open file is then locked (`flock(LOCK_EX | LOCK_NB)`, which belongs to
//! this open file description) for as long as the transfer holds it, its
//! commit's rename included: this is what keeps out transfers of other
//! processes (inside one process, the path's claim, `claim.rs`, taken
//! first, already does). A second transfer of the same path waits for it
//! a few seconds (a transfer whose client was just killed is ended by
//! then) and then fails that file, rather than mixing its bytes into the
//! first's.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};

use intact_proto::WirePath;
use rustix::fs::{self as rfs, AtFlags, FlockOperation, Mode, OFlags};
use rustix::io::Errno;

use super::dest_err;
use crate::TransferError;

/// Attempts before giving up on a partial name that keeps changing.
const ATTEMPTS: usize = 4;

/// How long a transfer waits for another to let go of a partial file, or
/// of its path's claim, before it fails the file (a named partial may wait
/// for both in turn): long enough for a session whose client was
/// just killed to be ended by its server (so the same command run again
/// at once resumes), far below any session's idle timeout.
pub(super) const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Locks `fd` exclusively, waiting up to `wait` for another holder (polled:
/// a blocking flock could not be bounded).
fn lock_within(
    fd: &OwnedFd,
    path: &WirePath,
    wait: std::time::Duration,
) -> Result<(), TransferError> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        match rfs::flock(fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(()),
            Err(Errno::WOULDBLOCK) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            Err(Errno::WOULDBLOCK) => {
                return Err(dest_err(
                    path,
                    io::Error::new(io::ErrorKind::WouldBlock, BUSY),
                ))
            }
            Err(e) => return Err(dest_err(path, e)),
        }
    }
}

/// Why a file is refused while another transfer holds its partial file.
pub(super) const BUSY: &str =
    "being received by another session (its partial file is locked); try again when that transfer ends";

/// Opens (creating it, or reusing one this server left) the partial file
/// `tmp` in `dir` for `path`, locked for this transfer alone, and no
/// longer than `size` (it is not pre-sized: its length is what arrives);
/// with its file system's device number.
pub(super) fn open_locked(
    dir: &OwnedFd,
    tmp: &OsStr,
    path: &WirePath,
    size: u64,
) -> Result<(File, u64), TransferError> {
    for _ in 0..ATTEMPTS {
        let create = OFlags::CREATE | OFlags::EXCL | OFlags::RDWR | OFlags::NOFOLLOW;
        let fd = match rfs::openat(
            dir,
            tmp,
            create | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        ) {
            Ok(fd) => fd,
            Err(Errno::EXIST) => match reusable(dir, tmp, path)? {
                Some(fd) => fd,
                None => continue,
            },
            Err(e) => return Err(dest_err(path, e)),
        };
        lock_within(&fd, path, LOCK_WAIT)?;
        // The holder before us may have renamed it to its final name (or
        // someone replaced it) between our open and our lock: the lock
        // counts only if the name is still this file.
        let Some((len, dev)) = named_size(dir, tmp, &fd) else {
            continue;
        };
        let file = File::from(fd);
        if len > size {
            file.set_len(size).map_err(|e| dest_err(path, e))?;
        }
        return Ok((file, dev));
    }
    Err(dest_err(
        path,
        io::Error::other("its partial file kept changing while it was being opened"),
    ))
}

/// Whether `tmp` in `dir` is the file open as `fd` (not a symlink to it).
pub(super) fn names(dir: &OwnedFd, tmp: &OsStr, fd: impl AsFd) -> bool {
    named_size(dir, tmp, fd).is_some()
}

/// The length and device number of the file open as `fd` if `tmp` in
/// `dir` is that file.
fn named_size(dir: &OwnedFd, tmp: &OsStr, fd: impl AsFd) -> Option<(u64, u64)> {
    match (
        rfs::statat(dir, tmp, AtFlags::SYMLINK_NOFOLLOW),
        rfs::fstat(fd),
    ) {
        (Ok(a), Ok(b)) if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) => {
            Some((b.st_size.max(0) as u64, b.st_dev))
        }
        _ => None,
    }
}

/// An existing partial file, opened for reuse if it is one this server's
/// user left (regular, owned, one link); anything else there is removed
/// and None returned (create anew). A directory in the way is an error.
fn reusable(dir: &OwnedFd, tmp: &OsStr, path: &WirePath) -> Result<Option<OwnedFd>, TransferError> {
    let st = match rfs::statat(dir, tmp, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(dest_err(path, e)),
    };
    let kind = rfs::FileType::from_raw_mode(st.st_mode);
    if kind == rfs::FileType::Directory {
        return Err(dest_err(
            path,
            io::Error::other("a directory is in the way of its partial file"),
        ));
    }
    if kind != rfs::FileType::RegularFile {
        remove(dir, tmp, (st.st_dev, st.st_ino), path)?;
        return Ok(None);
    }
    let flags = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY;
    let fd = match rfs::openat(dir, tmp, flags | OFlags::CLOEXEC, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(dest_err(path, e)),
    };
    let now = rfs::fstat(&fd).map_err(|e| dest_err(path, e))?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let ours = rfs::FileType::from_raw_mode(now.st_mode) == rfs::FileType::RegularFile
        && now.st_uid == uid
        && now.st_nlink == 1;
    if ours {
        return Ok(Some(fd));
    }
    drop(fd);
    remove(dir, tmp, (now.st_dev, now.st_ino), path)?;
    Ok(None)
}

/// Removes `tmp` from `dir` if it is still the file `(dev, ino)`.
fn remove(
    dir: &OwnedFd,
    tmp: &OsStr,
    id: (u64, u64),
    path: &WirePath,
) -> Result<(), TransferError> {
    match rfs::statat(dir, tmp, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if (st.st_dev, st.st_ino) == id => {}
        _ => return Ok(()),
    }
    match rfs::unlinkat(dir, tmp, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(dest_err(path, e)),
    }
}
