//! The destination tree: every write lands under the root, through file
//! descriptors, never through a symlink, and a file gets its final name
//! only when the caller commits it.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use intact_proto::WirePath;
use rustix::fs::{self as rfs, AtFlags, Mode, OFlags, Timespec, Timestamps};
use rustix::io::Errno;

use crate::TransferError;

mod claim;
mod commit;
mod created;
mod last_parent;
mod partial;
mod partial_open;
#[cfg(test)]
mod tests;
mod unnamed;

pub use claim::Claim;
pub use created::CreatedDirs;
pub use partial::PartialFile;

/// The receiving root. A path's directories are opened with one
/// `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` from the root, or,
/// where that fails (a directory to create, an error to name, a kernel
/// without it), component by component with `openat(O_DIRECTORY |
/// O_NOFOLLOW)`: either way a symlink anywhere on the way, even one
/// planted inside the root, ends the operation instead of leading out of
/// it.
pub struct Destination {
    root: OwnedFd,
    /// Where the directories this destination creates are recorded (a
    /// receiving session's), if anywhere.
    created: Mutex<Option<Arc<CreatedDirs>>>,
    /// The directory of the last partial file, for the next one in it.
    last_parent: last_parent::LastParent,
}

/// Modification time to set, in seconds and nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mtime {
    /// Seconds.
    pub sec: i64,
    /// Nanoseconds.
    pub nsec: u32,
}

impl Mtime {
    pub(crate) fn timestamps(self) -> Timestamps {
        let t = Timespec {
            tv_sec: self.sec,
            tv_nsec: self.nsec.into(),
        };
        Timestamps {
            last_access: t,
            last_modification: t,
        }
    }
}

/// Up to `len` bytes of `file` from `offset`: fewer only at its end.
pub(crate) fn read_at_most(file: &File, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(buf)
}

/// Whether a path's components name the state directory at the root or a
/// partial file: never a file a transfer or a scrub may open.
fn reserved(comps: &[&OsStr]) -> bool {
    comps
        .first()
        .is_some_and(|c| c.as_bytes() == crate::journal::STATE_DIR.as_bytes())
        || comps
            .iter()
            .any(|c| c.as_bytes().starts_with(b".intact-partial-"))
}

/// `path`'s last component and its directories, refused where a transfer
/// may never write ([`reserved`]).
fn split_checked(path: &WirePath) -> Result<(OsString, Vec<&OsStr>), TransferError> {
    let mut comps: Vec<&OsStr> = path.components().collect();
    if reserved(&comps) {
        return Err(TransferError::Reserved(path.to_string()));
    }
    let name = comps
        .pop()
        .expect("a WirePath is never empty")
        .to_os_string();
    Ok((name, comps))
}

fn dest_err(path: &WirePath, e: impl Into<std::io::Error>) -> TransferError {
    TransferError::Destination {
        path: path.to_string(),
        source: e.into(),
    }
}

/// Counts the temporary names of symlinks being made.
static SYMLINK_TMP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Name of the hidden file a file's data is written to before it is
/// verified. Deterministic, so that an interrupted transfer finds its
/// partial data again; hashed, so that long names still fit in 255 bytes.
pub fn partial_name(final_name: &OsStr) -> OsString {
    let h = blake3::hash(final_name.as_bytes());
    OsString::from(format!(".intact-partial-{}", &h.to_hex()[..24]))
}

impl Destination {
    /// The root directory's device and inode: which tree this is.
    pub fn root_id(&self) -> std::io::Result<(u64, u64)> {
        let st = rfs::fstat(&self.root)?;
        Ok((st.st_dev, st.st_ino))
    }

    /// Opens (creating it if needed) the root directory.
    pub fn open(root: &Path) -> Result<Destination, TransferError> {
        let err = |e: std::io::Error| TransferError::Destination {
            path: root.display().to_string(),
            source: e,
        };
        std::fs::create_dir_all(root).map_err(err)?;
        let fd = rfs::open(
            root,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| err(e.into()))?;
        Ok(Destination {
            root: fd,
            created: Mutex::new(None),
            last_parent: Default::default(),
        })
    }

    /// Opens the directory that holds `path`'s last component, creating
    /// missing directories (mode 0755) when `create` is set.
    fn parent(&self, path: &WirePath, create: bool) -> Result<(OwnedFd, OsString), TransferError> {
        let (name, dirs) = split_checked(path)?;
        Ok((self.open_dirs(path, &dirs, create)?, name))
    }

    /// Opens the directory `dirs` (the directories of `path`) below the
    /// root, creating missing ones (mode 0755) when `create` is set.
    fn open_dirs(
        &self,
        path: &WirePath,
        dirs: &[&OsStr],
        create: bool,
    ) -> Result<OwnedFd, TransferError> {
        if let Some(dir) = self.beneath(dirs) {
            return Ok(dir);
        }
        let mut dir = rfs::openat(
            &self.root,
            ".",
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| dest_err(path, e))?;
        for c in dirs {
            let flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC;
            let next = match rfs::openat(&dir, *c, flags, Mode::empty()) {
                Err(Errno::NOENT) if create => {
                    let made = match rfs::mkdirat(&dir, *c, Mode::from_raw_mode(0o755)) {
                        Ok(()) => true,
                        Err(Errno::EXIST) => false,
                        Err(e) => return Err(dest_err(path, e)),
                    };
                    let next = rfs::openat(&dir, *c, flags, Mode::empty());
                    if let (true, Ok(fd)) = (made, &next) {
                        self.record_created(fd);
                    }
                    next
                }
                other => other,
            };
            dir = match next {
                Ok(fd) => fd,
                Err(Errno::NOTDIR) | Err(Errno::LOOP) => {
                    return Err(TransferError::NotADirectory {
                        path: path.to_string(),
                        component: c.to_string_lossy().into_owned(),
                    })
                }
                Err(e) => return Err(dest_err(path, e)),
            };
        }
        Ok(dir)
    }

    /// The directory `dirs` below the root in one `openat2` that refuses
    /// every symlink and any step out of the root: what the walk in
    /// [`Destination::open_dirs`] checks, in one call instead of one per
    /// component. None when that fails for any reason (a directory
    /// missing, a symlink in the way, a kernel without `openat2`): the
    /// walk then creates what is missing or says what is wrong.
    fn beneath(&self, dirs: &[&OsStr]) -> Option<OwnedFd> {
        let mut rel = Vec::with_capacity(dirs.iter().map(|c| c.len() + 1).sum::<usize>() + 1);
        for c in dirs {
            rel.extend_from_slice(c.as_bytes());
            rel.push(b'/');
        }
        rel.push(b'.');
        let flags = OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC;
        self.openat2_beneath(OsStr::from_bytes(&rel), flags)
    }

    /// Opens `rel` under the root by `openat2` refusing every symlink (the
    /// last component's too) and any step out of the root. None when that
    /// fails for any reason; the caller then walks (or gives up).
    fn openat2_beneath(&self, rel: &OsStr, flags: OFlags) -> Option<OwnedFd> {
        static NO_OPENAT2: AtomicBool = AtomicBool::new(false);
        if NO_OPENAT2.load(Ordering::Relaxed) {
            return None;
        }
        let resolve = rfs::ResolveFlags::BENEATH
            | rfs::ResolveFlags::NO_SYMLINKS
            | rfs::ResolveFlags::NO_MAGICLINKS;
        match rfs::openat2(&self.root, rel, flags, Mode::empty(), resolve) {
            Ok(fd) => Some(fd),
            // Missing, or refused by a seccomp filter (EPERM; a write-open
            // of an immutable file also says EPERM, and that says nothing
            // of openat2).
            Err(Errno::NOSYS) => {
                NO_OPENAT2.store(true, Ordering::Relaxed);
                None
            }
            Err(Errno::PERM) if !flags.intersects(OFlags::WRONLY | OFlags::RDWR) => {
                NO_OPENAT2.store(true, Ordering::Relaxed);
                None
            }
            Err(_) => None,
        }
    }

    /// Records every directory this destination creates from now on in
    /// `dirs` (a receiving session's, so that it finishes only those).
    pub fn record_created_dirs(&self, dirs: Arc<CreatedDirs>) {
        *self.created.lock().unwrap_or_else(|p| p.into_inner()) = Some(dirs);
    }

    fn record_created(&self, fd: &OwnedFd) {
        if let Some(dirs) = &*self.created.lock().unwrap_or_else(|p| p.into_inner()) {
            dirs.add(fd);
        }
    }

    /// Opens the partial file for `path`, claimed in this process
    /// (`dest/claim.rs`) and locked (`dest/partial_open.rs`) for this
    /// transfer alone: created exclusively, or an earlier
    /// run's reused (data kept, cut to `size` bytes if longer; never
    /// pre-sized). Fails ("being received by another session") while another
    /// transfer holds it.
    pub fn partial(&self, path: &WirePath, size: u64) -> Result<PartialFile, TransferError> {
        let (dir, name) = self.partial_dir(path)?;
        let claim = claim::claim_within(&dir, &name, path, partial_open::LOCK_WAIT)?;
        let tmp = partial_name(&name);
        let (file, dev) = partial_open::open_locked(&dir, &tmp, path, size)?;
        Ok(PartialFile {
            claim,
            dir,
            tmp: Some(tmp),
            name,
            file: Arc::new(file),
            dev,
            mode_now: None,
            path: path.clone(),
        })
    }

    /// An unnamed file (`O_TMPFILE`) in `path`'s directory, for a file
    /// received in one block, made with the permission bits of `mode`: it
    /// has no name until its commit links it in (`dest/unnamed.rs`), so
    /// for a new file there is no partial name to create, lock,
    /// check and rename, and nothing of it stays behind if the transfer
    /// ends early. The path is claimed as for [`Destination::partial`]
    /// (`dest/claim.rs`): a second transfer of it in this process waits,
    /// then fails. None where the file system or the kernel cannot (then
    /// [`Destination::partial`]).
    pub fn unnamed(
        &self,
        path: &WirePath,
        mode: u32,
    ) -> Result<Option<PartialFile>, TransferError> {
        if !unnamed::linkable() {
            return Ok(None);
        }
        let (dir, name) = self.partial_dir(path)?;
        let claim = claim::claim_within(&dir, &name, path, partial_open::LOCK_WAIT)?;
        let Some(file) = unnamed::create(&dir, mode).map_err(|e| dest_err(path, e))? else {
            return Ok(None);
        };
        let st = rfs::fstat(&file).map_err(|e| dest_err(path, e))?;
        Ok(Some(PartialFile {
            claim,
            dir,
            tmp: None,
            name,
            file: Arc::new(file),
            dev: st.st_dev,
            mode_now: Some(st.st_mode & 0o7777),
            path: path.clone(),
        }))
    }

    /// Whether a named partial file of `path` is there (an earlier
    /// transfer's, to resume), as any kind of entry.
    pub fn has_partial(&self, path: &WirePath) -> Result<bool, TransferError> {
        let (dir, name) = self.partial_dir(path)?;
        match rfs::statat(&*dir, partial_name(&name), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(e) => Err(dest_err(path, e)),
        }
    }

    /// The directory a partial file of `path` goes in (the last one's,
    /// while it is young), and `path`'s final name; reserved names are
    /// refused.
    fn partial_dir(&self, path: &WirePath) -> Result<(Arc<OwnedFd>, OsString), TransferError> {
        let (name, dirs) = split_checked(path)?;
        let key = last_parent::key(path);
        let dir = match self.last_parent.get(&key) {
            Some(dir) => dir,
            None => {
                let dir = Arc::new(self.open_dirs(path, &dirs, true)?);
                self.last_parent.put(key, &dir);
                dir
            }
        };
        Ok((dir, name))
    }

    /// Opens the file at `path` (its final name) for reading, never
    /// through a symlink; `None` if it is not there as a regular file.
    pub fn open_final(&self, path: &WirePath) -> Option<File> {
        self.open_regular(path, OFlags::RDONLY).map(|(f, _)| f)
    }

    /// As [`Destination::open_final`], with the file's status as it was
    /// opened (one `fstat` for the caller that needs both).
    /// An error of kind `NotFound` means no regular file is there; any
    /// other (out of descriptors, permission, I/O) says nothing of it.
    pub fn open_final_stat(&self, path: &WirePath) -> std::io::Result<(File, rfs::Stat)> {
        self.try_open_regular(path, OFlags::RDONLY)
    }

    /// As [`Destination::open_final`], open for writing too (a repair
    /// writes good bytes over rotten ones in place).
    pub fn open_final_rw(&self, path: &WirePath) -> Option<File> {
        self.open_regular(path, OFlags::RDWR).map(|(f, _)| f)
    }

    fn open_regular(&self, path: &WirePath, access: OFlags) -> Option<(File, rfs::Stat)> {
        self.try_open_regular(path, access).ok()
    }

    /// As [`Destination::open_regular`], saying why not: an error of kind
    /// `NotFound` when there is no regular file by that name under the
    /// root (none, a symlink, a directory in the way, not regular, a
    /// reserved name); any other error as the system gave it (out of
    /// descriptors, permission, I/O), which says nothing of the file.
    fn try_open_regular(
        &self,
        path: &WirePath,
        access: OFlags,
    ) -> std::io::Result<(File, rfs::Stat)> {
        let not_there = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let sys = |e: Errno| match e {
            Errno::NOENT | Errno::LOOP | Errno::NOTDIR => not_there(),
            e => e.into(),
        };
        // Non-blocking: a FIFO planted under the name must not hold the
        // thread in open (it is then refused as not regular).
        let flags = access | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        let comps: Vec<&OsStr> = path.components().collect();
        // One call where the kernel can refuse every symlink and step out
        // of the root itself; else the walk.
        let fast = (!reserved(&comps))
            .then(|| self.openat2_beneath(OsStr::from_bytes(path.as_bytes()), flags))
            .flatten();
        let fd = match fast {
            Some(fd) => fd,
            None => {
                let (dir, name) = match self.parent(path, false) {
                    Ok(p) => p,
                    Err(TransferError::Destination { source, .. })
                        if source.kind() != std::io::ErrorKind::NotFound =>
                    {
                        return Err(source)
                    }
                    Err(_) => return Err(not_there()),
                };
                rfs::openat(&dir, &name, flags, Mode::empty()).map_err(sys)?
            }
        };
        let st = rfs::fstat(&fd)?;
        if rfs::FileType::from_raw_mode(st.st_mode) != rfs::FileType::RegularFile {
            return Err(not_there());
        }
        Ok((File::from(fd), st))
    }

    /// The status of the regular file `path` holds now, not following a
    /// symlink at its name (no descriptor is opened).
    pub fn stat_final(&self, path: &WirePath) -> Option<rfs::Stat> {
        let (dir, name) = self.parent(path, false).ok()?;
        let st = rfs::statat(&dir, &name, rfs::AtFlags::SYMLINK_NOFOLLOW).ok()?;
        (rfs::FileType::from_raw_mode(st.st_mode) == rfs::FileType::RegularFile).then_some(st)
    }

    /// Makes `path` a directory (an existing directory is kept). Its mode
    /// and time are applied by [`Destination::finish_dir`], after its contents.
    pub fn make_dir(&self, path: &WirePath) -> Result<(), TransferError> {
        let (dir, name) = self.parent(path, true)?;
        match rfs::mkdirat(&dir, &name, Mode::from_raw_mode(0o755)) {
            Ok(()) => {
                let flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC;
                if let Ok(fd) = rfs::openat(&dir, &name, flags, Mode::empty()) {
                    self.record_created(&fd);
                }
                Ok(())
            }
            Err(Errno::EXIST) => match rfs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if rfs::FileType::from_raw_mode(st.st_mode) == rfs::FileType::Directory => {
                    Ok(())
                }
                Ok(_) => Err(TransferError::NotADirectory {
                    path: path.to_string(),
                    component: name.to_string_lossy().into_owned(),
                }),
                Err(e) => Err(dest_err(path, e)),
            },
            Err(e) => Err(dest_err(path, e)),
        }
    }

    /// Sets a directory's mode and modification time (call after its contents are written).
    pub fn finish_dir(
        &self,
        path: &WirePath,
        mode: u32,
        mtime: Mtime,
    ) -> Result<(), TransferError> {
        let fd = self.open_dir(path)?;
        set_dir_meta(&fd, path, mode, mtime)
    }

    /// Opens the directory at `path`, never through a symlink.
    fn open_dir(&self, path: &WirePath) -> Result<OwnedFd, TransferError> {
        let (dir, name) = self.parent(path, false)?;
        rfs::openat(
            &dir,
            &name,
            OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| dest_err(path, e))
    }

    /// Whether the directory at `path` is one of `dirs` (created by the
    /// session that recorded them).
    pub fn is_created_dir(&self, path: &WirePath, dirs: &CreatedDirs) -> bool {
        self.open_dir(path).is_ok_and(|fd| dirs.has(&fd))
    }

    /// [`Destination::finish_dir`] for a directory of `dirs` only (checked
    /// on the open directory itself): returns false, changing nothing, for
    /// any other directory at `path`.
    pub fn finish_created_dir(
        &self,
        path: &WirePath,
        mode: u32,
        mtime: Mtime,
        dirs: &CreatedDirs,
    ) -> Result<bool, TransferError> {
        let fd = self.open_dir(path)?;
        if !dirs.has(&fd) {
            return Ok(false);
        }
        set_dir_meta(&fd, path, mode, mtime)?;
        Ok(true)
    }

    /// Creates `path` as a symlink to `target` (never followed), replacing
    /// whatever non-directory was there, atomically.
    pub fn make_symlink(
        &self,
        path: &WirePath,
        target: &[u8],
        mtime: Mtime,
    ) -> Result<(), TransferError> {
        let (dir, name) = self.parent(path, true)?;
        // The same link already there: only its time, if that differs,
        // so that a repeated run leaves its directory's mtime alone.
        if rfs::readlinkat(&dir, &name, Vec::new()).is_ok_and(|t| t.as_bytes() == target) {
            return rfs::utimensat(&dir, &name, &mtime.timestamps(), AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| dest_err(path, e));
        }
        // A name of its own, never a file transfer's partial name (which
        // another session may hold): the partial name, a pid and a count.
        let mut tmp;
        loop {
            tmp = partial_name(&name);
            let n = SYMLINK_TMP.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tmp.push(format!("-link-{}-{n}", std::process::id()));
            match rfs::symlinkat(OsStr::from_bytes(target), &dir, &tmp) {
                Ok(()) => break,
                Err(Errno::EXIST) => continue,
                Err(e) => return Err(dest_err(path, e)),
            }
        }
        rfs::utimensat(&dir, &tmp, &mtime.timestamps(), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| dest_err(path, e))?;
        rfs::renameat(&dir, &tmp, &dir, &name).map_err(|e| dest_err(path, e))?;
        rfs::fsync(&dir).map_err(|e| dest_err(path, e))
    }
}

/// Sets the mode and time of the directory open as `fd`, durably.
fn set_dir_meta(
    fd: &OwnedFd,
    path: &WirePath,
    mode: u32,
    mtime: Mtime,
) -> Result<(), TransferError> {
    rfs::fchmod(fd, Mode::from_raw_mode(mode & 0o7777)).map_err(|e| dest_err(path, e))?;
    rfs::futimens(fd, &mtime.timestamps()).map_err(|e| dest_err(path, e))?;
    rfs::fsync(fd).map_err(|e| dest_err(path, e))
}
