//! Per-client confinement: a session authenticated by a keyring client
//! with a subtree sees only `ROOT/SUBTREE` (see [`intact_proto::Keyring`]).
//!
//! The subtree is opened from the root component by component with
//! `openat(O_DIRECTORY | O_NOFOLLOW)`, created (mode 0755) where missing,
//! so a symlink planted anywhere on the way (by another client, or a local
//! user) ends the session instead of leading out. The session's
//! [`Destination`] and its `--delete` pruning then work through that held
//! directory (by `/proc/self/fd/N`, which names the open directory itself,
//! not a path that could be swapped afterwards), and every path from the
//! wire is resolved under it by the usual rules (relative, no `..`,
//! symlinks never followed).
//!
//! Each subtree has its own journal, so two clients' records never mix:
//! `ROOT/.intact/clients/<first 32 hex digits of BLAKE3(subtree)>/.intact/journal.sqlite`
//! (the directory also holds a file `subtree` naming it, for people).
//! `ROOT/.intact` is outside every subtree (a subtree may not start with
//! `.intact`), and `ROOT/.intact/clients` is created mode 0700. A journal
//! is opened when its first session starts and shared by the subtree's
//! sessions while any runs (SQLite's exclusive lock allows one opener).

use std::collections::HashMap;
use std::ops::Deref;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use intact_proto::WirePath;
use rustix::fs::{self as rfs, Mode, OFlags};
use rustix::io::Errno;

use crate::dest::Destination;
use crate::journal::{Journal, STATE_DIR};
use crate::TransferError;

/// Where a session writes, prunes and journals.
pub(crate) struct Confined<'a> {
    /// The session's destination (the root or its subtree).
    pub dest: Destination,
    /// The directory `--delete` prunes under.
    pub root: PathBuf,
    /// The journal of that directory.
    pub journal: JournalRef<'a>,
    /// Keeps `root` (a `/proc/self/fd/N`) naming the subtree.
    _held: Option<OwnedFd>,
}

/// The server's journal, or a subtree's.
pub(crate) enum JournalRef<'a> {
    Shared(&'a Journal),
    Own(Arc<Journal>),
}

impl Deref for JournalRef<'_> {
    type Target = Journal;
    fn deref(&self) -> &Journal {
        match self {
            JournalRef::Shared(j) => j,
            JournalRef::Own(j) => j,
        }
    }
}

fn refused(subtree: &WirePath, why: impl std::fmt::Display) -> TransferError {
    TransferError::Usage(format!("this client's subtree {subtree}: {why}"))
}

/// The destination of a session: the whole root (with the server's
/// journal) without `subtree`, else the subtree, confined.
pub(crate) fn confine<'a>(
    root: &Path,
    subtree: Option<&WirePath>,
    shared: &'a Journal,
) -> Result<Confined<'a>, TransferError> {
    let Some(subtree) = subtree else {
        return Ok(Confined {
            dest: Destination::open(root)?,
            root: root.to_path_buf(),
            journal: JournalRef::Shared(shared),
            _held: None,
        });
    };
    let dir = open_subtree(root, subtree)?;
    let held = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    let dest = Destination::open(&held)?;
    let journal = JournalRef::Own(subtree_journal(root, subtree)?);
    Ok(Confined {
        dest,
        root: held,
        journal,
        _held: Some(dir),
    })
}

/// Opens (creating what is missing) `ROOT/subtree` without following any
/// symlink below the root.
pub(crate) fn open_subtree(root: &Path, subtree: &WirePath) -> Result<OwnedFd, TransferError> {
    let io = |e: Errno| TransferError::Destination {
        path: root.display().to_string(),
        source: e.into(),
    };
    let flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC;
    let mut dir = rfs::open(
        root,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io)?;
    for (i, c) in subtree.components().enumerate() {
        if i == 0 && c == STATE_DIR {
            return Err(refused(subtree, "inside the server's state (.intact)"));
        }
        let next = match rfs::openat(&dir, c, flags, Mode::empty()) {
            Err(Errno::NOENT) => {
                match rfs::mkdirat(&dir, c, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(refused(subtree, e)),
                }
                rfs::openat(&dir, c, flags, Mode::empty())
            }
            other => other,
        };
        dir = match next {
            Ok(fd) => fd,
            Err(Errno::LOOP) | Err(Errno::NOTDIR) => {
                return Err(refused(
                    subtree,
                    format!(
                        "'{}' is a symlink or not a directory (never followed)",
                        c.to_string_lossy()
                    ),
                ))
            }
            Err(e) => return Err(refused(subtree, e)),
        };
    }
    Ok(dir)
}

/// The journal directory of `subtree` (its journal is under its own
/// `.intact`, as [`Journal::open`] places it).
pub(crate) fn journal_dir(root: &Path, subtree: &WirePath) -> PathBuf {
    let h = blake3::hash(subtree.as_bytes());
    root.join(STATE_DIR).join("clients").join(&h.to_hex()[..32])
}

/// The open journal of `subtree`, shared while any session holds it.
fn subtree_journal(root: &Path, subtree: &WirePath) -> Result<Arc<Journal>, TransferError> {
    static OPEN: OnceLock<Mutex<HashMap<PathBuf, Weak<Journal>>>> = OnceLock::new();
    let dir = journal_dir(root, subtree);
    let mut open = OPEN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(j) = open.get(&dir).and_then(Weak::upgrade) {
        return Ok(j);
    }
    let clients = dir.parent().expect("journal_dir has a parent");
    make_private_dir(clients)?;
    make_private_dir(&dir)?;
    let _ = std::fs::write(dir.join("subtree"), format!("{subtree}\n"));
    let j = Arc::new(Journal::open(&dir)?);
    open.retain(|_, w| w.strong_count() > 0);
    open.insert(dir, Arc::downgrade(&j));
    Ok(j)
}

/// Creates `dir` mode 0700 if missing; refuses a symlink there.
fn make_private_dir(dir: &Path) -> Result<(), TransferError> {
    use std::os::unix::fs::DirBuilderExt;
    let err = |e: std::io::Error| TransferError::Journal(format!("{}: {e}", dir.display()));
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let m = std::fs::symlink_metadata(dir).map_err(err)?;
            if m.is_dir() {
                Ok(())
            } else {
                Err(err(std::io::Error::other("not a directory")))
            }
        }
        Err(e) => Err(err(e)),
    }
}
