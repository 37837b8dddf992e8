//! `intact mount ROOT MOUNTPOINT`: a FUSE file system presenting a
//! cataloged root, so that programs that know nothing of checksums read
//! and write its data with every byte checked (PVFS §3–5, Z²FS §III–IV).
//!
//! - **Reads** of a cataloged file check every page they touch against
//!   the catalog's page CRCs; a bad page fails its read with EIO, is
//!   logged and recorded for `intact status`, and the file's other pages
//!   stay readable ([`node`]).
//! - **Writes** compute each page's new CRC before the bytes are handed
//!   on, read-verify-modify-write partial pages, log the new CRCs in an
//!   intent log before writing, and record them (with the blocks' new
//!   digests) in the catalog at fsync and close. An error a write meets
//!   is also owed to the application at its next fsync or close.
//! - **Checksum switching**: cached pages older than t_switch are dropped
//!   from the kernel's cache, so the next read checks them again
//!   ([`switch`]).
//! - **Names**: create, rename, unlink and truncate keep the catalog in
//!   step; `user.intact.*` extended attributes show each file's level and
//!   BLAKE3.
//!
//! A file the catalog does not describe (not cataloged, or changed by
//! another program) is served unchecked, and says so in
//! `user.intact.state`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use intact_transfer::{
    open_catalog_if_free, open_or_create_catalog, IntentLog, RootError, RootLock, TransferError,
};

mod attr;
mod fs;
mod inodes;
pub mod node;
mod streams;
pub mod switch;

pub use switch::{choose as choose_switch, Reliability, Switch};

/// What a mount did, counted as it runs.
#[derive(Debug, Default)]
pub struct Stats {
    /// Bytes returned to applications after their pages were checked.
    pub bytes_checked: AtomicU64,
    /// Bytes returned unchecked (files the catalog does not describe).
    pub bytes_unchecked: AtomicU64,
    /// Bytes applications wrote.
    pub bytes_written: AtomicU64,
    /// Pages found not matching their CRC.
    pub bad_pages: AtomicU64,
    /// Times a file's cached pages were dropped at t_switch.
    pub invalidations: AtomicU64,
}

/// How to mount.
#[derive(Debug, Clone)]
pub struct MountOptions {
    /// Refuse every change.
    pub read_only: bool,
    /// Check reads and keep CRCs (always, but for the benchmark's
    /// no-check control, which separates FUSE's cost from the checks').
    pub check: bool,
    /// When cached pages are dropped (see [`switch`]).
    pub switch: Switch,
    /// FUSE worker threads.
    pub threads: usize,
    /// Let other users in (FUSE's `allow_other`; root, or
    /// `user_allow_other` in /etc/fuse.conf).
    pub allow_other: bool,
}

/// Why a mount could not start.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// What the user gave is wrong.
    #[error("{0}")]
    Usage(String),
    /// The catalog could not be opened.
    #[error(transparent)]
    Catalog(#[from] TransferError),
    /// FUSE refused.
    #[error("mounting on {}: {source}", path.display())]
    Fuse {
        /// The mount point.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A running mount; unmounted when dropped.
pub struct Mounted {
    session: Option<fuser::BackgroundSession>,
    stop: Arc<AtomicBool>,
    switcher: Option<JoinHandle<()>>,
    stats: Arc<Stats>,
    /// The catalog it uses.
    pub catalog: PathBuf,
    /// The mount point.
    pub mountpoint: PathBuf,
    _lock: RootLock,
}

/// Mounts `root` on `mountpoint`.
pub fn mount(root: &Path, mountpoint: &Path, opts: &MountOptions) -> Result<Mounted, MountError> {
    let root = std::fs::canonicalize(root)
        .ok()
        .filter(|r| r.is_dir())
        .ok_or_else(|| {
            MountError::Usage(format!(
                "{}: not a directory; give the root of received data (where `intact serve` or `intact copy` wrote)",
                root.display()
            ))
        })?;
    let mountpoint = std::fs::canonicalize(mountpoint)
        .ok()
        .filter(|m| m.is_dir())
        .ok_or_else(|| {
            MountError::Usage(format!(
                "{}: not a directory; make the mount point first (mkdir)",
                mountpoint.display()
            ))
        })?;
    if mountpoint.starts_with(&root) {
        return Err(MountError::Usage(format!(
            "{} is inside the root {}: mount it somewhere else",
            mountpoint.display(),
            root.display()
        )));
    }
    let (journal, dir) = match open_catalog_if_free(&root) {
        Err(TransferError::Usage(_)) => open_or_create_catalog(&root)?,
        Err(TransferError::InUse { pid, .. }) => return Err(in_use(&root, pid)),
        other => other?,
    };
    let lock = RootLock::acquire_with(&root, Some(&dir)).map_err(|e| match e {
        RootError::InUse { pid, .. } => in_use(&root, pid),
        other => MountError::Catalog(other.into()),
    })?;
    let log = IntentLog::open(&dir).map_err(|e| {
        TransferError::Journal(format!(
            "{}: {e}",
            dir.join(intact_transfer::INTENT_LOG).display()
        ))
    })?;
    let stats = Arc::new(Stats::default());
    let fs = fs::IntactFs::new(
        root.clone(),
        Arc::new(journal),
        log,
        opts.read_only,
        opts.check,
        Arc::clone(&stats),
    );
    let cached = Arc::clone(&fs.cached);
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(format!("intact:{}", root.display())),
        fuser::MountOption::Subtype("intact".into()),
        fuser::MountOption::DefaultPermissions,
        if opts.read_only {
            fuser::MountOption::RO
        } else {
            fuser::MountOption::RW
        },
    ];
    if opts.allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config.n_threads = Some(opts.threads.max(1));
    let session =
        fuser::spawn_mount(fs, &mountpoint, &config).map_err(|source| MountError::Fuse {
            path: mountpoint.clone(),
            source,
        })?;
    let stop = Arc::new(AtomicBool::new(false));
    let switcher = match opts.switch.after {
        Some(after) => Some(
            switch::spawn(
                cached,
                session.notifier(),
                after,
                Arc::clone(&stop),
                Arc::clone(&stats),
            )
            .map_err(|source| MountError::Fuse {
                path: mountpoint.clone(),
                source,
            })?,
        ),
        None => None,
    };
    Ok(Mounted {
        session: Some(session),
        stop,
        switcher,
        stats,
        catalog: dir.join("journal.sqlite"),
        mountpoint,
        _lock: lock,
    })
}

fn in_use(root: &Path, pid: Option<u32>) -> MountError {
    MountError::Usage(format!(
        "root {} is in use by another intact process ({}): a server, a copy or a mount; stop it first",
        root.display(),
        pid.map_or("PID unknown".to_string(), |p| format!("PID {p}"))
    ))
}

impl Mounted {
    /// What it did so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Whether it is still mounted (false once someone unmounted it).
    pub fn is_running(&self) -> bool {
        self.session
            .as_ref()
            .is_some_and(|s| !s.guard.is_finished())
    }

    /// Unmounts (failing if files under it are still in use) and waits
    /// until every change is in the catalog.
    pub fn unmount(mut self) -> std::io::Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> std::io::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.switcher.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        match self.session.take() {
            Some(s) if s.guard.is_finished() => s.join(),
            Some(s) => s.umount_and_join(),
            None => Ok(()),
        }
    }

    /// Waits, polling every `poll`, until someone else unmounts it or
    /// `stop` is set.
    pub fn wait_until(&self, stop: &AtomicBool, poll: Duration) {
        while self.is_running() && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(poll);
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            eprintln!(
                "intact mount: unmounting {}: {e}",
                self.mountpoint.display()
            );
        }
    }
}
