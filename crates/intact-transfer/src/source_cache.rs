//! The sender's cache of its sources' whole-file BLAKE3 digests.
//!
//! A file the server holds whole is unchanged only if the digest the
//! server recorded equals the digest of the sender's source. That digest
//! comes from a read of the source now, or from this cache: a small SQLite
//! database (`$XDG_CACHE_HOME/intact/source-digests.sqlite`, else
//! `~/.cache/intact/`; directory 0700, file 0600, refused if another user
//! owns it or others may read or write it), keyed by the file's device,
//! inode, size, mtime and ctime (both to the nanosecond). An entry is used
//! only when all five still match: an in-place edit that puts the mtime
//! back (`touch -r`) still moves the ctime, which no unprivileged call can
//! set.
//!
//! An entry is written only for a digest of bytes this run read, when the
//! file's key is the same after the read as before it, and when its ctime
//! is more than [`RACY_SECS`] older than the read's start: a write in the
//! same clock tick as the stat could otherwise leave the ctime as it was
//! (git's "racy" entries). Writes through a shared mapping that the kernel
//! has not yet stamped are not seen by any stat-keyed cache; `--reverify`
//! (which never consults the cache) or `--no-source-cache` read every
//! source instead.
//!
//! A cache that cannot be opened or read is never an error of the send:
//! the digest is then read from the source.

use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use rusqlite::{params, Connection, OptionalExtension};

/// A file's ctime must be this much older than the start of the read
/// whose digest is cached (seconds).
pub const RACY_SECS: u64 = 1;

/// Entries kept at most; the oldest recorded go first.
const MAX_ENTRIES: i64 = 1_000_000;

/// Where the sender's source-digest cache lives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SourceCacheSetting {
    /// No cache: every digest is read from the source.
    #[default]
    Off,
    /// The user's cache directory (`$XDG_CACHE_HOME/intact`, else
    /// `$HOME/.cache/intact`).
    User,
    /// This file.
    At(PathBuf),
}

impl SourceCacheSetting {
    /// The database file, if any.
    pub fn path(&self) -> Option<PathBuf> {
        match self {
            SourceCacheSetting::Off => None,
            SourceCacheSetting::At(p) => Some(p.clone()),
            SourceCacheSetting::User => {
                let base = std::env::var_os("XDG_CACHE_HOME")
                    .filter(|v| Path::new(v).is_absolute())
                    .map(PathBuf::from)
                    .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?;
                Some(base.join("intact").join("source-digests.sqlite"))
            }
        }
    }
}

/// How the digest of a source that the server held whole was obtained,
/// for the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "from", rename_all = "snake_case")]
pub enum SourceDigest {
    /// From the reads that sent the file in this run.
    Transfer,
    /// Read from the source now, to compare with the server's.
    Read,
    /// From the source-digest cache, recorded at this time (seconds since
    /// the epoch), its key (device, inode, size, mtime, ctime) unchanged.
    Cache {
        /// When the digest was recorded.
        recorded_at: i64,
    },
}

impl std::fmt::Display for SourceDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SourceDigest::Transfer => write!(f, "source digest: from this run's reads"),
            SourceDigest::Read => write!(f, "source digest: read now"),
            SourceDigest::Cache { recorded_at } => {
                write!(
                    f,
                    "source digest: from the source cache, recorded at {recorded_at}"
                )
            }
        }
    }
}

/// What identifies one version of a source file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl SourceKey {
    /// The key of the open file `f` now.
    pub fn of(f: &File) -> std::io::Result<SourceKey> {
        Ok(SourceKey::of_metadata(&f.metadata()?))
    }

    /// The key of a file whose status is `m`.
    pub fn of_metadata(m: &std::fs::Metadata) -> SourceKey {
        SourceKey {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        }
    }

    /// Whether the ctime is old enough, against a read that started at
    /// `read_start`, for the digest of that read to be cached.
    fn settled(&self, read_start: SystemTime) -> bool {
        let Ok(start) = read_start.duration_since(SystemTime::UNIX_EPOCH) else {
            return false;
        };
        let limit = (start - Duration::from_secs(RACY_SECS.min(start.as_secs()))).as_nanos();
        self.ctime_ns >= 0 && (self.ctime_ns as u128) < limit
    }
}

/// An open source-digest cache.
pub struct SourceCache {
    /// The database file (a [`CacheReader`] opens it again).
    path: PathBuf,
    db: Mutex<Connection>,
    /// Entries not yet written: written [`PUT_BATCH`] at a time, in one
    /// transaction, and when the cache is closed.
    pending: Mutex<Vec<Row>>,
    /// Batches written so far: a [`CacheReader`] ends its read transaction
    /// when this moves, so that its snapshot neither hides the rows nor
    /// holds the log (WAL) from being folded back and restarted.
    written: AtomicU64,
}

/// Entries written together.
const PUT_BATCH: usize = 256;

/// One entry: its key, its digest and when it was recorded.
type Row = (SourceKey, [u8; 32], i64);

/// Why a cache could not be used.
#[derive(Debug, thiserror::Error)]
#[error("source cache {path}: {why}")]
pub struct SourceCacheError {
    path: String,
    why: String,
}

impl SourceCache {
    /// Opens (creating it 0600, in a 0700 directory) the cache at `path`.
    pub fn open(path: &Path) -> Result<SourceCache, SourceCacheError> {
        let err = |why: String| SourceCacheError {
            path: path.display().to_string(),
            why,
        };
        if let Some(dir) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| err(e.to_string()))?;
        }
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| err(e.to_string()))?;
        let m = f.metadata().map_err(|e| err(e.to_string()))?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if !m.is_file() || m.uid() != me || m.mode() & 0o077 != 0 {
            return Err(err(format!(
                "not a private file of this user (owner {}, mode {:o}): not used",
                m.uid(),
                m.mode() & 0o7777
            )));
        }
        drop(f);
        let db = Connection::open(path).map_err(|e| err(e.to_string()))?;
        db.busy_timeout(Duration::from_secs(2))
            .map_err(|e| err(e.to_string()))?;
        // A cache: an entry lost in a crash costs one read of its source,
        // so no fsync per entry (rollback journaling fsynced four times a
        // file, more than copying a small file costs). WAL keeps the file
        // consistent whatever happens.
        db.pragma_update(None, "journal_mode", "WAL")
            .and_then(|()| db.pragma_update(None, "synchronous", "NORMAL"))
            .map_err(|e| err(e.to_string()))?;
        db.execute_batch(
            "CREATE TABLE IF NOT EXISTS digests (
                 dev INTEGER NOT NULL,
                 ino INTEGER NOT NULL,
                 size INTEGER NOT NULL,
                 mtime_ns BLOB NOT NULL,
                 ctime_ns BLOB NOT NULL,
                 digest BLOB NOT NULL,
                 recorded_at INTEGER NOT NULL,
                 PRIMARY KEY (dev, ino)
             );",
        )
        .map_err(|e| err(e.to_string()))?;
        trim(&db);
        Ok(SourceCache {
            path: path.to_path_buf(),
            db: Mutex::new(db),
            pending: Mutex::new(Vec::new()),
            written: AtomicU64::new(0),
        })
    }

    /// Opens the cache `setting` names; None when off or unusable (then
    /// every digest is read from the source).
    pub fn from_setting(setting: &SourceCacheSetting) -> Option<SourceCache> {
        SourceCache::open(&setting.path()?).ok()
    }

    fn db(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The digest recorded for exactly this key, and when it was recorded.
    pub fn get(&self, key: &SourceKey) -> Option<([u8; 32], i64)> {
        self.pending_get(key).or_else(|| lookup(&self.db(), key))
    }

    /// The entry for `key` among those not yet written.
    fn pending_get(&self, key: &SourceKey) -> Option<([u8; 32], i64)> {
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending
            .iter()
            .rev()
            .find(|(k, _, _)| k == key)
            .map(|(_, d, at)| (*d, *at))
    }

    /// A reader of the cache for one thread: a connection of its own
    /// (read-only, opened at its first lookup), whose lookups share one
    /// read transaction of at most [`READS_PER_TRANSACTION`], ended
    /// earlier by [`CacheReader::pause`] or when a batch of entries is
    /// written. One lookup per small file otherwise costs a transaction
    /// (locks taken and released, the file checked) and the shared
    /// connection's lock: 4% of a 20,000-file send's time.
    pub(crate) fn reader(&self) -> CacheReader<'_> {
        CacheReader {
            cache: self,
            db: None,
            opened: false,
            reading: None,
        }
    }

    /// Records `digest` for `file`, read from a read that began at
    /// `read_start` when the file's key was `before`: only if the key is
    /// the same now and its ctime settled before that read. Returns
    /// whether it was kept (written with others, at the latest when the
    /// cache is closed).
    pub fn put(
        &self,
        file: &File,
        before: &SourceKey,
        read_start: SystemTime,
        digest: &[u8; 32],
    ) -> bool {
        let same = SourceKey::of(file).is_ok_and(|now| now == *before);
        if !same || !before.settled(read_start) {
            return false;
        }
        let row = (*before, *digest, crate::journal::unix_now());
        let full = {
            let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            p.push(row);
            (p.len() >= PUT_BATCH).then(|| std::mem::take(&mut *p))
        };
        if let Some(rows) = full {
            self.write(&rows);
        }
        true
    }

    /// Writes `rows` in one transaction (a cache: a failure loses them).
    fn write(&self, rows: &[Row]) {
        let mut db = self.db();
        let Ok(tx) = db.transaction() else {
            return;
        };
        if let Ok(mut st) = tx.prepare_cached(
            "INSERT OR REPLACE INTO digests (dev, ino, size, mtime_ns, ctime_ns, digest, recorded_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        ) {
            for (key, digest, now) in rows {
                let _ = st.execute(params![
                    key.dev as i64,
                    key.ino as i64,
                    key.size as i64,
                    &key.mtime_ns.to_be_bytes()[..],
                    &key.ctime_ns.to_be_bytes()[..],
                    &digest[..],
                    now
                ]);
            }
        }
        let _ = tx.commit();
        self.written.fetch_add(1, Ordering::Relaxed);
    }
}

/// Lookups one read transaction of a [`CacheReader`] makes at most.
const READS_PER_TRANSACTION: u32 = 64;

/// One thread's lookups in a [`SourceCache`] (see [`SourceCache::reader`]).
/// If its connection cannot be opened, it asks the cache's own.
pub(crate) struct CacheReader<'a> {
    cache: &'a SourceCache,
    db: Option<Connection>,
    /// `db` was tried.
    opened: bool,
    /// The read transaction open on `db`: lookups made in it, and the
    /// cache's batches written when it began.
    reading: Option<(u32, u64)>,
}

impl CacheReader<'_> {
    /// As [`SourceCache::get`], inside this reader's read transaction
    /// (begun now if none is, or if entries were written since it began).
    pub(crate) fn get(&mut self, key: &SourceKey) -> Option<([u8; 32], i64)> {
        if !self.opened {
            self.opened = true;
            let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
                | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX
                | rusqlite::OpenFlags::SQLITE_OPEN_NOFOLLOW;
            self.db = Connection::open_with_flags(&self.cache.path, flags)
                .and_then(|db| db.busy_timeout(Duration::from_secs(2)).map(|()| db))
                .ok();
        }
        if self.db.is_none() {
            return self.cache.get(key);
        }
        if let Some(hit) = self.cache.pending_get(key) {
            return Some(hit);
        }
        let written = self.cache.written.load(Ordering::Relaxed);
        match self.reading {
            Some((n, w)) if n < READS_PER_TRANSACTION && w == written => {}
            _ => self.pause(),
        }
        let Some(db) = &self.db else {
            return self.cache.get(key);
        };
        let (n, _) = self.reading.get_or_insert((0, written));
        if *n == 0 && db.execute_batch("BEGIN").is_err() {
            self.reading = None;
        } else {
            *n += 1;
        }
        lookup(db, key)
    }

    /// Ends the read transaction (call before waiting: a snapshot held
    /// keeps the cache's log from being folded back past it).
    pub(crate) fn pause(&mut self) {
        if let (Some(_), Some(db)) = (self.reading.take(), &self.db) {
            let _ = db.execute_batch("COMMIT");
        }
    }
}

impl Drop for CacheReader<'_> {
    fn drop(&mut self) {
        self.pause();
    }
}

/// The digest `db` holds for exactly `key`, and when it was recorded.
fn lookup(db: &Connection, key: &SourceKey) -> Option<([u8; 32], i64)> {
    let row: Option<(Vec<u8>, i64)> = db
        .prepare_cached(
            "SELECT digest, recorded_at FROM digests
             WHERE dev = ?1 AND ino = ?2 AND size = ?3 AND mtime_ns = ?4 AND ctime_ns = ?5",
        )
        .and_then(|mut st| {
            st.query_row(
                params![
                    key.dev as i64,
                    key.ino as i64,
                    key.size as i64,
                    &key.mtime_ns.to_be_bytes()[..],
                    &key.ctime_ns.to_be_bytes()[..]
                ],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
        })
        .ok()
        .flatten();
    let (d, at) = row?;
    Some((<[u8; 32]>::try_from(d).ok()?, at))
}

impl Drop for SourceCache {
    fn drop(&mut self) {
        let rows = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        self.write(&rows);
        trim(&self.db());
    }
}

/// Bounded: past [`MAX_ENTRIES`], the oldest entries go (when a cache is
/// opened and when it is closed, not at every entry: counting them is a
/// scan of the table).
fn trim(db: &Connection) {
    let _ = db.execute(
        "DELETE FROM digests WHERE rowid IN (SELECT rowid FROM digests ORDER BY recorded_at
         LIMIT MAX(0, (SELECT COUNT(*) FROM digests) - ?1))",
        params![MAX_ENTRIES],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_must_match_whole_and_a_fresh_ctime_is_not_cached() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("c").join("d.sqlite");
        let cache = SourceCache::open(&db).unwrap();
        let mode = std::fs::metadata(&db).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let src = dir.path().join("s");
        std::fs::write(&src, b"hello").unwrap();
        let f = File::open(&src).unwrap();
        let key = SourceKey::of(&f).unwrap();
        let d = [7u8; 32];
        // Its ctime is now: racy, not recorded.
        assert!(!cache.put(&f, &key, SystemTime::now(), &d));
        assert!(cache.get(&key).is_none());
        // A read that began well after the ctime: recorded.
        let later = SystemTime::now() + Duration::from_secs(5);
        assert!(cache.put(&f, &key, later, &d));
        assert_eq!(cache.get(&key).map(|(d, _)| d), Some(d));
        let other = SourceKey {
            ctime_ns: key.ctime_ns + 1,
            ..key
        };
        assert!(cache.get(&other).is_none());
    }

    /// A reader finds what the cache holds: entries not yet written, and
    /// entries written while its read transaction was open (it begins
    /// another); a key that does not match is a miss.
    #[test]
    fn a_reader_sees_pending_and_written_entries() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("d.sqlite");
        let cache = SourceCache::open(&db).unwrap();
        let later = SystemTime::now() + Duration::from_secs(5);
        let files: Vec<(File, SourceKey)> = (0..=PUT_BATCH)
            .map(|i| {
                let p = dir.path().join(format!("s{i}"));
                std::fs::write(&p, i.to_string()).unwrap();
                let f = File::open(&p).unwrap();
                let k = SourceKey::of(&f).unwrap();
                (f, k)
            })
            .collect();
        let mut r = cache.reader();
        assert!(r.get(&files[0].1).is_none());
        assert!(r.db.is_some(), "the reader has a connection of its own");
        assert!(r.reading.is_some(), "a read transaction is open");
        assert!(cache.put(&files[0].0, &files[0].1, later, &[1; 32]));
        assert_eq!(r.get(&files[0].1).map(|(d, _)| d), Some([1; 32]));
        // A full batch is written: out of `pending`, into the file.
        for (i, (f, k)) in files.iter().enumerate().skip(1) {
            assert!(cache.put(f, k, later, &[i as u8; 32]));
        }
        assert!(cache.pending.lock().unwrap().len() < PUT_BATCH);
        for (i, (_, k)) in files.iter().enumerate() {
            let want = if i == 0 { 1 } else { i as u8 };
            assert_eq!(r.get(k).map(|(d, _)| d), Some([want; 32]), "entry {i}");
        }
        let other = SourceKey {
            size: files[3].1.size + 1,
            ..files[3].1
        };
        assert!(r.get(&other).is_none());
    }
}
