//! The receiver's journal of verified blocks: an SQLite database in
//! `ROOT/.intact/journal.sqlite`.
//!
//! A block is recorded only after it verified *and* the partial file's
//! data was fdatasynced, so the journal never claims more than the disk
//! holds. It is still only advice: on resume every recorded block is
//! re-read from the partial file and re-hashed, and only blocks that match
//! their recorded digest are skipped. A file that reached its final name is
//! recorded as done, with its size, mtime and level, for the quick check
//! that lets a repeated send move almost nothing.
//!
//! Every block and every finished file carries a [`VerifiedAt`]: the mode
//! and level it was verified at, and when. A later run trusts a record
//! only up to that level: a block verified by `fiver` (level `network`) is
//! re-verified in place by a `riva` run, never taken as `device`. Rows
//! from journals older than these columns read as level `none`, so they
//! are always re-verified.
//!
//! A finished file also carries its whole-file BLAKE3, set only from the
//! receiver's own comparison of the bytes it holds with the sender's
//! digest (at commit). The quick check answers a repeated send with it, and
//! the file counts as unchanged only if the sender's source has the same
//! digest. Rows from journals older than this column have none, and are
//! never unchanged.

use std::path::Path;

use std::sync::{Mutex, MutexGuard};

use rusqlite::{params, Connection, OptionalExtension};

use crate::verify::{VerifyLevel, VerifyMode};
use crate::TransferError;

mod catalog;
mod intents;
mod layout;
mod mounted;
mod owner;
mod split;

pub use catalog::{CatalogFile, CatalogSummary, ScrubMark, ScrubPass, ScrubState};
pub use intents::{recover_intents, Intent, IntentLog, Recovered, INTENT_LOG};
pub use layout::{
    blob_of_crcs, block_matches, crcs_of_blob, failing_block, rebuild_block, written_block, Layout,
    Page, RebuildError,
};
pub use mounted::{MountRow, MountSummary};
pub use owner::Owner;
pub use split::RangeRecord;

/// Directory under the root that holds intact's own state; paths from the
/// wire may not enter it.
pub const STATE_DIR: &str = ".intact";

/// How and when a block or a file was verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifiedAt {
    /// The mode that verified it.
    pub mode: VerifyMode,
    /// The level that check reached.
    pub level: VerifyLevel,
    /// When, in seconds since the epoch.
    pub at: i64,
}

impl VerifiedAt {
    /// Verified now, by `mode`, at `level`.
    pub fn now(mode: VerifyMode, level: VerifyLevel) -> VerifiedAt {
        VerifiedAt {
            mode,
            level,
            at: unix_now(),
        }
    }

    fn from_row(mode: i64, level: i64, at: i64) -> VerifiedAt {
        // An id this build does not know is read as the weakest: a record
        // is trusted only as far as it is understood; one without a time
        // predates these records.
        let level = if at <= 0 { 0 } else { level };
        VerifiedAt {
            mode: u8::try_from(mode)
                .ok()
                .and_then(VerifyMode::from_wire_id)
                .unwrap_or(VerifyMode::None),
            level: u8::try_from(level)
                .ok()
                .and_then(VerifyLevel::from_wire_id)
                .unwrap_or(VerifyLevel::None),
            at,
        }
    }
}

/// Seconds since the epoch, now.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// One verified block as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRecord {
    /// Block number.
    pub index: u64,
    /// Its digest (intact's block algorithm).
    pub digest: Vec<u8>,
    /// How and when it was verified.
    pub verified: VerifiedAt,
    /// The CRC-32C of each page of the block (the catalog's page size,
    /// [`Journal::page_size`]), little-endian, computed
    /// from the received bytes before their digest was checked (checksum
    /// chaining: see `journal/catalog.rs`); None where none was kept.
    pub pages: Option<Vec<u8>>,
}

/// One file's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRow {
    /// Row id.
    pub id: i64,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, seconds.
    pub mtime_sec: i64,
    /// Modification time, nanoseconds.
    pub mtime_nsec: u32,
    /// Block size in bytes.
    pub block_size: u32,
    /// Whether the file reached its final name.
    pub done: bool,
    /// How and when it was verified as a whole, when done.
    pub verified: VerifiedAt,
    /// Its whole-file BLAKE3, when done and recorded by a build that checks
    /// it (None in older rows, and in any row not done).
    pub digest: Option<[u8; 32]>,
    /// The split id it was started for, when it is received as ranges by
    /// several sessions (see `journal/split.rs`).
    pub split: Option<[u8; 16]>,
}

/// A file that reached its final name, as [`Journal::done_batch`] records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoneFile {
    /// Its row.
    pub row: i64,
    /// Blocks verified since the last record.
    pub blocks: Vec<BlockRecord>,
    /// How the file as a whole was verified.
    pub verified: VerifiedAt,
    /// The BLAKE3 of the bytes it holds, found equal to the sender's.
    pub digest: [u8; 32],
}

/// The journal of one receiving root, shared by all sessions of a server
/// (one connection behind a mutex: SQLite's own lock would make sessions
/// sleep and retry, which cost seconds per 20,000 small files).
pub struct Journal {
    /// [`Journal::start`] leaves its rows in an open write transaction,
    /// and the next write that must be durable commits them too (a started
    /// row alone needs no commit: lost in a crash, the file is started
    /// again). One commit per group of files, not one per file. Whether
    /// one is open is SQLite's to say (`is_autocommit`): an I/O error may
    /// have rolled it back.
    db: Mutex<Connection>,
    /// The root's catalog page size in bytes (see [`Journal::page_size`]).
    page_size: std::sync::atomic::AtomicUsize,
}

impl Drop for Journal {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

fn db_err(e: rusqlite::Error) -> TransferError {
    TransferError::Journal(e.to_string())
}

/// Adds each `(table, "name TYPE …")` column an older journal lacks;
/// returns the `(table, name)` of those it added.
fn add_missing_columns<'a>(
    db: &Connection,
    columns: &[(&'a str, &'a str)],
) -> Result<Vec<(&'a str, &'a str)>, TransferError> {
    let mut added = Vec::new();
    for (table, column) in columns {
        let name = column.split(' ').next().expect("a name");
        let has: bool = db
            .query_row(
                &format!("SELECT COUNT(*) FROM pragma_table_info('{table}') WHERE name = ?1"),
                params![name],
                |r| r.get::<_, i64>(0).map(|n| n > 0),
            )
            .map_err(db_err)?;
        if !has {
            db.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column}"))
                .map_err(db_err)?;
            added.push((*table, name));
        }
    }
    Ok(added)
}

impl Journal {
    /// Opens (creating it if needed) the journal of `root`, in
    /// `root/.intact`.
    pub fn open(root: &Path) -> Result<Journal, TransferError> {
        let dir = crate::net::private::state_dir(root)
            .map_err(|e| TransferError::Journal(e.to_string()))?;
        Journal::open_in(&dir)
    }

    /// Opens (creating it if needed) the journal kept in the private
    /// directory `dir`.
    pub fn open_in(dir: &Path) -> Result<Journal, TransferError> {
        // Private (0700, files 0600): SQLite creates its files from the
        // database file's mode, so that one is made first.
        let path = dir.join("journal.sqlite");
        let file_err = |p: &Path| {
            let p = p.to_path_buf();
            move |e: std::io::Error| TransferError::Journal(format!("{}: {e}", p.display()))
        };
        crate::net::private::private_file(&path).map_err(file_err(&path))?;
        for side in [
            "journal.sqlite-wal",
            "journal.sqlite-shm",
            "journal.sqlite-journal",
        ] {
            let p = dir.join(side);
            crate::net::private::private_if_present(&p).map_err(file_err(&p))?;
        }
        let db = Connection::open(&path).map_err(db_err)?;
        // One server owns a root's journal (its sessions share this one
        // connection): no lock per transaction, and a second server on the
        // same root waits, then fails, instead of interleaving. Set before
        // WAL is entered, so there is no shared-memory index and none of its
        // fcntl locks either (measured: ~12 fcntl calls per file otherwise).
        db.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(db_err)?;
        db.pragma_update(None, "locking_mode", "EXCLUSIVE")
            .map_err(db_err)?;
        db.pragma_update(None, "journal_mode", "WAL")
            .map_err(db_err)?;
        // The journal is advice (resume re-checks every block it names), so
        // a commit need not wait for the disk: WAL with NORMAL may lose the
        // last commits in a power cut, never consistency.
        db.pragma_update(None, "synchronous", "NORMAL")
            .map_err(db_err)?;
        db.execute_batch(
            "CREATE TABLE IF NOT EXISTS files (
                 id INTEGER PRIMARY KEY,
                 path BLOB NOT NULL UNIQUE,
                 size INTEGER NOT NULL,
                 mtime_sec INTEGER NOT NULL,
                 mtime_nsec INTEGER NOT NULL,
                 block_size INTEGER NOT NULL,
                 done INTEGER NOT NULL DEFAULT 0,
                 level INTEGER NOT NULL DEFAULT 0,
                 mode INTEGER NOT NULL DEFAULT 0,
                 at INTEGER NOT NULL DEFAULT 0,
                 digest BLOB
             );
             CREATE TABLE IF NOT EXISTS blocks (
                 file INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,
                 idx INTEGER NOT NULL,
                 digest BLOB NOT NULL,
                 mode INTEGER NOT NULL DEFAULT 0,
                 level INTEGER NOT NULL DEFAULT 0,
                 at INTEGER NOT NULL DEFAULT 0,
                 PRIMARY KEY (file, idx)
             );",
        )
        .map_err(db_err)?;
        // How and when each record was verified (added after the first
        // journals were written: old rows read as level none), and the
        // whole-file digest (added later still: old rows have none, so
        // they are never answered as unchanged).
        let added = add_missing_columns(
            &db,
            &[
                ("files", "mode INTEGER NOT NULL DEFAULT 0"),
                ("files", "at INTEGER NOT NULL DEFAULT 0"),
                ("blocks", "mode INTEGER NOT NULL DEFAULT 0"),
                ("blocks", "level INTEGER NOT NULL DEFAULT 0"),
                ("blocks", "at INTEGER NOT NULL DEFAULT 0"),
                ("files", "digest BLOB"),
            ],
        )?;
        if added.contains(&("files", "mode")) {
            // Older builds wrote files.level by rules that could claim
            // more than was checked: none of it is trusted.
            db.execute_batch("UPDATE files SET level = 0")
                .map_err(db_err)?;
        }
        // Whose a file is (added later again: old rows have no owner).
        Journal::add_owner_columns(&db)?;
        // The at-rest catalog: page checksums and scrub records.
        Journal::add_catalog_columns(&db)?;
        // What `intact mount` records.
        Journal::add_mount_columns(&db)?;
        // Split files: their split id and confirmed ranges.
        Journal::add_split_columns(&db)?;
        let page_size = catalog::read_page_size(&db)?;
        Ok(Journal {
            db: Mutex::new(db),
            page_size: page_size.into(),
        })
    }

    fn db(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves SQLite consistent (every
        // change is a transaction), so the poison can be ignored.
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The row for `path`, if any.
    pub fn lookup(&self, path: &[u8]) -> Result<Option<FileRow>, TransferError> {
        self.db()
            .prepare_cached(
                "SELECT id, size, mtime_sec, mtime_nsec, block_size, done, mode, level, at, digest, split FROM files WHERE path = ?1",
            )
            .map_err(db_err)?
            .query_row(params![path], |r| {
                    Ok(FileRow {
                        id: r.get(0)?,
                        size: r.get::<_, i64>(1)? as u64,
                        mtime_sec: r.get(2)?,
                        mtime_nsec: r.get::<_, i64>(3)? as u32,
                        block_size: r.get::<_, i64>(4)? as u32,
                        done: r.get(5)?,
                        verified: VerifiedAt::from_row(r.get(6)?, r.get(7)?, r.get(8)?),
                        digest: r
                            .get::<_, Option<Vec<u8>>>(9)?
                            .and_then(|d| <[u8; 32]>::try_from(d).ok()),
                        split: r
                            .get::<_, Option<Vec<u8>>>(10)?
                            .and_then(|d| <[u8; 16]>::try_from(d).ok()),
                    })
            })
            .optional()
            .map_err(db_err)
    }

    /// Starts `path` afresh (forgetting any blocks recorded for it), held
    /// by `session` (None: a receiver outside any server session) from
    /// now, coming from `source` (the sender's name for it; empty: none
    /// given): one transaction.
    pub fn start(
        &self,
        path: &[u8],
        size: u64,
        mtime: (i64, u32),
        block_size: u32,
        session: Option<[u8; 16]>,
        source: &[u8],
    ) -> Result<i64, TransferError> {
        let db = self.begun()?;
        let (size, mtime_nsec, block_size) =
            (size as i64, i64::from(mtime.1), i64::from(block_size));
        let session = session.map(|s| s.to_vec());
        let source = (!source.is_empty()).then_some(source);
        let row = params![
            path,
            size,
            mtime.0,
            mtime_nsec,
            block_size,
            session,
            unix_now(),
            source
        ];
        macro_rules! insert {
            ($on_conflict:literal) => {
                concat!(
                    "INSERT INTO files (path, size, mtime_sec, mtime_nsec, block_size, done, level, mode, at, digest, session, session_at, source)
                     VALUES (?1, ?2, ?3, ?4, ?5, 0, 0, 0, 0, NULL, ?6, ?7, ?8) ",
                    $on_conflict,
                    " RETURNING id"
                )
            };
        }
        // A path the journal has no row for (every file of a first
        // transfer) is one statement: nothing can be recorded for it yet.
        let fresh: Option<i64> = db
            .prepare_cached(insert!("ON CONFLICT(path) DO NOTHING"))
            .and_then(|mut st| st.query_row(row, |r| r.get(0)).optional())
            .map_err(db_err)?;
        if let Some(id) = fresh {
            return Ok(id);
        }
        // A scalar subquery (the path is unique): `IN (SELECT …)` would
        // build a temporary table per call.
        db.prepare_cached("DELETE FROM blocks WHERE file = (SELECT id FROM files WHERE path = ?1)")
            .and_then(|mut st| st.execute(params![path]))
            .map_err(db_err)?;
        db.prepare_cached(
            "DELETE FROM split_ranges WHERE file = (SELECT id FROM files WHERE path = ?1)",
        )
        .and_then(|mut st| st.execute(params![path]))
        .map_err(db_err)?;
        db.prepare_cached(insert!(
            "ON CONFLICT(path) DO UPDATE SET size = ?2, mtime_sec = ?3, mtime_nsec = ?4,
                 block_size = ?5, done = 0, level = 0, mode = 0, at = 0, digest = NULL,
                 session = ?6, session_at = ?7, scrubbed_at = 0, scrub_state = 0,
                 scrub_level = 0, rot_bytes = 0, adopted = 0, source = ?8, mounted_at = 0,
                 split = NULL"
        ))
        .and_then(|mut st| st.query_row(row, |r| r.get(0)))
        .map_err(db_err)
    }

    /// The connection inside the open write transaction (begun now if
    /// none is).
    fn begun(&self) -> Result<MutexGuard<'_, Connection>, TransferError> {
        let db = self.db();
        if db.is_autocommit() {
            db.execute_batch("BEGIN IMMEDIATE").map_err(db_err)?;
        }
        Ok(db)
    }

    /// Runs `f` in the open write transaction (or a new one) and commits
    /// it, with whatever [`Journal::start`] left in it. A statement that
    /// failed changed nothing; what the others did is committed anyway.
    fn commit_with<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, TransferError>,
    ) -> Result<T, TransferError> {
        let db = self.begun()?;
        let r = f(&db);
        let c = end_transaction(&db);
        let r = r?;
        c?;
        Ok(r)
    }

    /// Commits what [`Journal::start`] left open (a session's end).
    pub fn flush(&self) -> Result<(), TransferError> {
        end_transaction(&self.db())
    }

    /// Marks the file unfinished again (its recorded blocks stay; its
    /// whole-file digest goes, as the file's bytes may now change), held
    /// by `session` from now, received whole (a split it was started for
    /// is forgotten, with its confirmed ranges).
    pub fn reopen(&self, id: i64, session: Option<[u8; 16]>) -> Result<(), TransferError> {
        self.reopen_as(id, session, false)
    }

    /// As [`Journal::reopen`]; `keep_split`: the file goes on being
    /// received as the split it was started for (its ranges stay).
    pub fn reopen_as(
        &self,
        id: i64,
        session: Option<[u8; 16]>,
        keep_split: bool,
    ) -> Result<(), TransferError> {
        let db = self.db();
        db.prepare_cached(
            "UPDATE files SET done = 0, digest = NULL, session = ?2, session_at = ?3,
                 split = CASE WHEN ?4 THEN split END WHERE id = ?1",
        )
        .and_then(|mut st| {
            st.execute(params![
                id,
                session.map(|s| s.to_vec()),
                unix_now(),
                keep_split
            ])
        })
        .map_err(db_err)?;
        if !keep_split {
            db.prepare_cached("DELETE FROM split_ranges WHERE file = ?1")
                .and_then(|mut st| st.execute(params![id]))
                .map_err(db_err)?;
        }
        Ok(())
    }

    /// The blocks recorded for file `id`, with their digests and how they
    /// were verified.
    pub fn blocks(&self, id: i64) -> Result<Vec<BlockRecord>, TransferError> {
        self.blocks_in(id, 0, i64::MAX as u64)
    }

    /// The blocks recorded for file `id` from block `first` up to `end`.
    pub fn blocks_in(
        &self,
        id: i64,
        first: u64,
        end: u64,
    ) -> Result<Vec<BlockRecord>, TransferError> {
        let db = self.db();
        let mut st = db
            .prepare_cached(
                "SELECT idx, digest, mode, level, at, pages FROM blocks
                 WHERE file = ?1 AND idx >= ?2 AND idx < ?3 ORDER BY idx",
            )
            .map_err(db_err)?;
        let rows = st
            .query_map(params![id, first as i64, end as i64], |r| {
                Ok(BlockRecord {
                    index: r.get::<_, i64>(0)? as u64,
                    digest: r.get(1)?,
                    verified: VerifiedAt::from_row(r.get(2)?, r.get(3)?, r.get(4)?),
                    pages: r.get(5)?,
                })
            })
            .map_err(db_err)?;
        rows.collect::<Result<_, _>>().map_err(db_err)
    }

    /// Records verified blocks (the caller has fdatasynced their data); a
    /// block recorded before is replaced, with its new level (its page
    /// CRCs stay if the new record has none and the same digest).
    pub fn add_blocks(&self, id: i64, blocks: &[BlockRecord]) -> Result<(), TransferError> {
        if blocks.is_empty() {
            return Ok(());
        }
        self.commit_with(|db| insert_blocks(db, id, blocks))
    }

    /// Records, in one transaction, files that reached their final names
    /// (with the whole-file digest the receiver's own comparison found);
    /// every block of such a file is capped at the file's level.
    pub fn done_batch(&self, files: &[DoneFile]) -> Result<(), TransferError> {
        self.commit_with(|tx| {
            let mut done = tx
                .prepare_cached(
                    "UPDATE files SET done = 1, mode = ?2, level = ?3, at = ?4, digest = ?5 WHERE id = ?1",
                )
                .map_err(db_err)?;
            let mut cap = tx
                .prepare_cached("UPDATE blocks SET level = MIN(level, ?2) WHERE file = ?1")
                .map_err(db_err)?;
            for f in files {
                let (id, v) = (&f.row, &f.verified);
                insert_blocks(tx, *id, &f.blocks)?;
                // No block of a file is recorded above the file's level
                // (which includes what the source's reads reached).
                cap.execute(params![id, i64::from(v.level.wire_id())])
                    .map_err(db_err)?;
                done.execute(params![
                    id,
                    i64::from(v.mode.wire_id()),
                    i64::from(v.level.wire_id()),
                    v.at,
                    &f.digest[..]
                ])
                .map_err(db_err)?;
            }
            Ok(())
        })
    }
}

/// Commits the transaction open on `db`, if one is; if the commit fails,
/// rolls it back, so that the next write can begin one again.
fn end_transaction(db: &Connection) -> Result<(), TransferError> {
    if db.is_autocommit() {
        return Ok(());
    }
    db.execute_batch("COMMIT").map_err(db_err).inspect_err(|_| {
        let _ = db.execute_batch("ROLLBACK");
    })
}

fn insert_blocks(tx: &Connection, id: i64, blocks: &[BlockRecord]) -> Result<(), TransferError> {
    let mut st = tx
        .prepare_cached(
            // A record without page CRCs (a block re-verified in place)
            // keeps those recorded with the same digest.
            "INSERT INTO blocks (file, idx, digest, mode, level, at, pages) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT(file, idx) DO UPDATE SET digest = excluded.digest, mode = excluded.mode,
                 level = excluded.level, at = excluded.at,
                 pages = COALESCE(excluded.pages, CASE WHEN digest = excluded.digest THEN pages END)",
        )
        .map_err(db_err)?;
    for b in blocks {
        st.execute(params![
            id,
            b.index as i64,
            b.digest,
            i64::from(b.verified.mode.wire_id()),
            i64::from(b.verified.level.wire_id()),
            b.verified.at,
            b.pages
        ])
        .map_err(db_err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
