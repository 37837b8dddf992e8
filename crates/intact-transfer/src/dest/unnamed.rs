//! Unnamed files: a file received in one block is written to an
//! `O_TMPFILE` inode in its directory and linked in at its commit.
//!
//! A named partial file costs a directory entry made with the file, a
//! lock, a check that the name is still the file, and a rename that
//! removes one entry and makes another; for a 16 KiB file that is most of
//! its cost on the receiver. An unnamed file costs one entry, made by
//! `linkat` when the data is durable. Its data is checked and made
//! durable exactly as a named partial's, and where nothing has its final
//! name yet the name appears with the whole file behind it. Where a file
//! has it (a file sent again), the inode is linked to a fresh hidden name
//! and renamed over it, as a named partial would be.
//!
//! `linkat` of an open file takes `AT_EMPTY_PATH` where the process may
//! (`CAP_DAC_READ_SEARCH`), else its `/proc/self/fd` link; without
//! `/proc` unnamed files are not used at all.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};
use rustix::io::Errno;

/// Fresh hidden names tried before a replacing commit gives up.
const ATTEMPTS: usize = 4;

/// Whether an unnamed file could be given a name: `/proc/self/fd` is there
/// (asked once).
pub(super) fn linkable() -> bool {
    static PROC: OnceLock<bool> = OnceLock::new();
    *PROC.get_or_init(|| std::path::Path::new("/proc/self/fd").is_dir())
}

/// An unnamed file in `dir`, open for reading and writing, made with the
/// permission bits of `mode` and at least 0600 (the umask applies): no
/// one else can open a file without a name, so it may have its final
/// permissions from the start, and the commit's `fchmod` is left out
/// where they came out as asked. None where the file system or the
/// kernel has no `O_TMPFILE`.
pub(super) fn create(dir: &OwnedFd, mode: u32) -> io::Result<Option<File>> {
    let flags = OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC;
    let mode = Mode::from_raw_mode((mode & 0o777) | 0o600);
    match rfs::openat(dir, ".", flags, mode) {
        Ok(fd) => Ok(Some(File::from(fd))),
        // No O_TMPFILE here: old kernels say EISDIR, file systems without
        // it EOPNOTSUPP.
        Err(Errno::OPNOTSUPP) | Err(Errno::ISDIR) | Err(Errno::INVAL) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Gives the unnamed `file` the name `name` in `dir`, replacing a file of
/// that name (never a directory: rename(2) refuses, EISDIR).
pub(super) fn link_into_place(file: &File, dir: &OwnedFd, name: &OsStr) -> io::Result<()> {
    match link(file, dir, name) {
        Err(Errno::EXIST) => {}
        other => return other.map_err(Into::into),
    }
    for _ in 0..ATTEMPTS {
        let hidden = hidden_name()?;
        match link(file, dir, &hidden) {
            Ok(()) => {}
            Err(Errno::EXIST) => continue,
            Err(e) => return Err(e.into()),
        }
        // Someone who may write the directory could put another file at
        // the hidden name between the link and the rename: the name is
        // checked to be this very file before the rename (nothing else is
        // moved over the old file) and after it (nothing else is reported
        // as committed).
        if !is_this(dir, &hidden, file) {
            return Err(io::Error::other(REPLACED));
        }
        if let Err(e) = rfs::renameat(dir, &hidden, dir, name) {
            let _ = rfs::unlinkat(dir, &hidden, AtFlags::empty());
            return Err(e.into());
        }
        if !is_this(dir, name, file) {
            return Err(io::Error::other(REPLACED));
        }
        return Ok(());
    }
    Err(io::Error::other(
        "no free hidden name to link it under before its rename",
    ))
}

/// Why a replacing commit fails when its names are not its file.
const REPLACED: &str =
    "the name it was linked under is not the file received (replaced during the commit); nothing is reported committed";

/// Whether `name` in `dir` is the open `file` (not a symlink to it); false
/// where either cannot be asked.
fn is_this(dir: &OwnedFd, name: &OsStr, file: &File) -> bool {
    match (
        rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW),
        rfs::fstat(file),
    ) {
        (Ok(a), Ok(b)) => (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino),
        _ => false,
    }
}

/// `linkat` of the open `file` to `name` in `dir`.
fn link(file: &File, dir: &OwnedFd, name: &OsStr) -> Result<(), Errno> {
    static NO_EMPTY_PATH: AtomicBool = AtomicBool::new(false);
    if !NO_EMPTY_PATH.load(Ordering::Relaxed) {
        match rfs::linkat(file, "", dir, name, AtFlags::EMPTY_PATH) {
            // Not allowed to this process (no CAP_DAC_READ_SEARCH).
            Err(Errno::NOENT) | Err(Errno::PERM) => NO_EMPTY_PATH.store(true, Ordering::Relaxed),
            other => return other,
        }
    }
    let proc = format!("/proc/self/fd/{}", file.as_raw_fd());
    rfs::linkat(rfs::CWD, proc.as_str(), dir, name, AtFlags::SYMLINK_FOLLOW)
}

/// A fresh hidden name: the reserved partial prefix and 96 random bits,
/// so that no one can put a file there in advance.
fn hidden_name() -> io::Result<OsString> {
    let mut r = [0u8; 12];
    getrandom::fill(&mut r).map_err(|e| io::Error::other(e.to_string()))?;
    let hex: String = r.iter().map(|b| format!("{b:02x}")).collect();
    Ok(OsString::from(format!(".intact-partial-link-{hex}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::fs::FileExt;

    fn dir_fd(p: &std::path::Path) -> OwnedFd {
        OwnedFd::from(File::open(p).unwrap())
    }

    #[test]
    fn an_unnamed_file_gets_its_name_new_or_replacing_and_never_over_a_directory() {
        let root = tempfile::tempdir().unwrap();
        let dir = dir_fd(root.path());
        let Some(f) = create(&dir, 0o600).unwrap() else {
            intact_testkit::skip(
                "an_unnamed_file_gets_its_name_new_or_replacing_and_never_over_a_directory",
                "no O_TMPFILE on the test directory's file system",
            );
            return;
        };
        if !linkable() {
            intact_testkit::skip(
                "an_unnamed_file_gets_its_name_new_or_replacing_and_never_over_a_directory",
                "no /proc/self/fd to link an unnamed file by",
            );
            return;
        }
        f.write_all_at(b"first", 0).unwrap();
        assert_eq!(
            std::fs::read_dir(root.path()).unwrap().count(),
            0,
            "no name yet"
        );
        link_into_place(&f, &dir, OsStr::new("a")).unwrap();
        assert_eq!(std::fs::read(root.path().join("a")).unwrap(), b"first");

        // Sent again: replaces the file, leaves no hidden name behind.
        let g = create(&dir, 0o600).unwrap().unwrap();
        g.write_all_at(b"second", 0).unwrap();
        link_into_place(&g, &dir, OsStr::new("a")).unwrap();
        let mut got = String::new();
        File::open(root.path().join("a"))
            .unwrap()
            .read_to_string(&mut got)
            .unwrap();
        assert_eq!(got, "second");
        let names: Vec<_> = std::fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["a"]);

        // A directory at the name stays, and so does nothing else.
        std::fs::create_dir(root.path().join("d")).unwrap();
        let h = create(&dir, 0o600).unwrap().unwrap();
        let err = link_into_place(&h, &dir, OsStr::new("d")).unwrap_err();
        assert!(root.path().join("d").is_dir(), "{err}");
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 2);
    }
}
