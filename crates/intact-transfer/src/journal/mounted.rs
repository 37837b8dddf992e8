//! What `intact mount` keeps in the catalog: files written through the
//! mount (their new page CRCs and block digests, their size and mtime),
//! names changed through it, and the pages its reads found bad.
//!
//! A file written through the mount was not compared with any source: its
//! row says mode and level `none`, with the time (`mounted_at`), and its
//! whole-file BLAKE3 is dropped (a later send answers it as changed).

use rusqlite::{params, OptionalExtension};

use super::{db_err, insert_blocks, unix_now, BlockRecord, Journal};
use crate::TransferError;

/// A catalog row as the mount reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountRow {
    /// Row id.
    pub id: i64,
    /// Path under the root.
    pub path: Vec<u8>,
    /// Size in bytes.
    pub size: u64,
    /// Modification time (seconds, nanoseconds).
    pub mtime: (i64, u32),
    /// Block size.
    pub block_size: u32,
    /// Whether the file is finished (a partial file is not served as
    /// cataloged).
    pub done: bool,
    /// How it arrived, and when.
    pub arrival: super::VerifiedAt,
    /// Its whole-file BLAKE3, when known for the bytes it holds.
    pub digest: Option<[u8; 32]>,
    /// When it was last written through the mount (0: never).
    pub mounted_at: i64,
}

/// What `intact mount` found and did, in numbers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountSummary {
    /// Bad pages refused to readers (each counted once per mount run).
    pub read_pages: u64,
    /// Their bytes.
    pub read_bytes: u64,
    /// Bad pages found by writes (a partly covered page) and by the
    /// read-back at fsync or close.
    pub other_pages: u64,
    /// When the last was found.
    pub last: Option<i64>,
    /// Files last written through the mount.
    pub written: u64,
}

impl Journal {
    /// Adds the mount's column and table to an older journal.
    pub(super) fn add_mount_columns(db: &rusqlite::Connection) -> Result<(), TransferError> {
        super::add_missing_columns(db, &[("files", "mounted_at INTEGER NOT NULL DEFAULT 0")])?;
        db.execute_batch(
            "CREATE TABLE IF NOT EXISTS mount_errors (
                 id INTEGER PRIMARY KEY,
                 path BLOB NOT NULL,
                 offset INTEGER NOT NULL,
                 len INTEGER NOT NULL,
                 at INTEGER NOT NULL,
                 kind TEXT NOT NULL DEFAULT 'read'
             );",
        )
        .map_err(db_err)?;
        super::add_missing_columns(db, &[("mount_errors", "kind TEXT NOT NULL DEFAULT 'read'")])?;
        Ok(())
    }

    /// The row of `path`, if any.
    pub fn mount_row(&self, path: &[u8]) -> Result<Option<MountRow>, TransferError> {
        self.mount_row_where("path = ?1", params![path])
    }

    /// The row with id `id`, if any.
    pub fn mount_row_by_id(&self, id: i64) -> Result<Option<MountRow>, TransferError> {
        self.mount_row_where("id = ?1", params![id])
    }

    fn mount_row_where(
        &self,
        cond: &str,
        p: impl rusqlite::Params,
    ) -> Result<Option<MountRow>, TransferError> {
        self.db()
            .prepare_cached(&format!(
                "SELECT id, path, size, mtime_sec, mtime_nsec, block_size, done, mode, level, at, digest, mounted_at
                 FROM files WHERE {cond}"
            ))
            .map_err(db_err)?
            .query_row(p, |r| {
                Ok(MountRow {
                    id: r.get(0)?,
                    path: r.get(1)?,
                    size: r.get::<_, i64>(2)? as u64,
                    mtime: (r.get(3)?, r.get::<_, i64>(4)? as u32),
                    block_size: r.get::<_, i64>(5)? as u32,
                    done: r.get(6)?,
                    arrival: super::VerifiedAt::from_row(r.get(7)?, r.get(8)?, r.get(9)?),
                    digest: r
                        .get::<_, Option<Vec<u8>>>(10)?
                        .and_then(|d| <[u8; 32]>::try_from(d).ok()),
                    mounted_at: r.get(11)?,
                })
            })
            .optional()
            .map_err(db_err)
    }

    /// Records file `id` as written through the mount, now: its size and
    /// mtime, `blocks` (rebuilt from the bytes it holds, each page checked
    /// against the CRC written with it) replacing those of the same
    /// numbers, and no block from `blocks_kept` on. One transaction, with
    /// whatever was left open.
    pub fn mount_written(
        &self,
        id: i64,
        size: u64,
        mtime: (i64, u32),
        blocks: &[BlockRecord],
        blocks_kept: u64,
    ) -> Result<(), TransferError> {
        self.commit_with(|db| {
            insert_blocks(db, id, blocks)?;
            db.prepare_cached("DELETE FROM blocks WHERE file = ?1 AND idx >= ?2")
                .and_then(|mut st| st.execute(params![id, blocks_kept as i64]))
                .map_err(db_err)?;
            db.prepare_cached(
                // Nothing of what arrived or was scrubbed describes these
                // bytes any more: not the level, the digest, the source
                // (no replica of them), nor the last scrub's verdict.
                "UPDATE files SET size = ?2, mtime_sec = ?3, mtime_nsec = ?4, done = 1, mode = 0,
                     level = 0, at = ?5, digest = NULL, mounted_at = ?5, session = NULL,
                     source = NULL, adopted = 0, scrubbed_at = 0, scrub_state = 0,
                     scrub_level = 0, rot_bytes = 0
                 WHERE id = ?1",
            )
            .and_then(|mut st| {
                st.execute(params![
                    id,
                    size as i64,
                    mtime.0,
                    i64::from(mtime.1),
                    unix_now()
                ])
            })
            .map_err(db_err)?;
            Ok(())
        })
    }

    /// Records a new mtime for file `id` whose bytes did not change (set
    /// through the mount by `touch` or `cp -p`): the catalog still
    /// describes them.
    pub fn set_mtime(&self, id: i64, mtime: (i64, u32)) -> Result<(), TransferError> {
        self.commit_with(|db| {
            db.prepare_cached("UPDATE files SET mtime_sec = ?2, mtime_nsec = ?3 WHERE id = ?1")
                .and_then(|mut st| st.execute(params![id, mtime.0, i64::from(mtime.1)]))
                .map_err(db_err)?;
            Ok(())
        })
    }

    /// Catalogs a file created through the mount (empty, with
    /// `block_size`-byte blocks), replacing any row of that path.
    pub fn mount_create(
        &self,
        path: &[u8],
        block_size: u32,
        mtime: (i64, u32),
    ) -> Result<i64, TransferError> {
        let id = self.start(path, 0, mtime, block_size, None, b"")?;
        self.mount_written(id, 0, mtime, &[], 0)?;
        Ok(id)
    }

    /// Forgets `path` (unlinked through the mount).
    pub fn forget_path(&self, path: &[u8]) -> Result<(), TransferError> {
        self.commit_with(|db| {
            db.prepare_cached(
                "DELETE FROM blocks WHERE file = (SELECT id FROM files WHERE path = ?1)",
            )
            .and_then(|mut st| st.execute(params![path]))
            .map_err(db_err)?;
            db.prepare_cached("DELETE FROM files WHERE path = ?1")
                .and_then(|mut st| st.execute(params![path]))
                .map_err(db_err)?;
            Ok(())
        })
    }

    /// Renames `from` to `to` in the catalog (a file, or a directory and
    /// everything cataloged under it); a row already at a new name is
    /// forgotten first, as the rename replaced its file.
    pub fn rename_path(&self, from: &[u8], to: &[u8]) -> Result<(), TransferError> {
        self.commit_with(|db| {
            // The rename replaced whatever was at the new name.
            db.prepare_cached("DELETE FROM blocks WHERE file = (SELECT id FROM files WHERE path = ?1)")
                .and_then(|mut st| st.execute(params![to]))
                .map_err(db_err)?;
            db.prepare_cached("DELETE FROM files WHERE path = ?1")
                .and_then(|mut st| st.execute(params![to]))
                .map_err(db_err)?;
            let mut moves: Vec<(i64, Vec<u8>)> = Vec::new();
            {
                let mut st = db
                    .prepare_cached("SELECT id, path FROM files")
                    .map_err(db_err)?;
                let rows = st
                    .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)))
                    .map_err(db_err)?;
                for row in rows {
                    let (id, path) = row.map_err(db_err)?;
                    if path == from {
                        moves.push((id, to.to_vec()));
                    } else if path.len() > from.len()
                        && path.starts_with(from)
                        && path[from.len()] == b'/'
                    {
                        let mut new = to.to_vec();
                        new.extend_from_slice(&path[from.len()..]);
                        moves.push((id, new));
                    }
                }
            }
            for (id, new) in &moves {
                db.prepare_cached(
                    "DELETE FROM blocks WHERE file = (SELECT id FROM files WHERE path = ?1 AND id != ?2)",
                )
                .and_then(|mut st| st.execute(params![new, id]))
                .map_err(db_err)?;
                db.prepare_cached("DELETE FROM files WHERE path = ?1 AND id != ?2")
                    .and_then(|mut st| st.execute(params![new, id]))
                    .map_err(db_err)?;
                db.prepare_cached("UPDATE files SET path = ?2 WHERE id = ?1")
                    .and_then(|mut st| st.execute(params![id, new]))
                    .map_err(db_err)?;
            }
            Ok(())
        })
    }

    /// Records that the mount found `len` bytes at `offset` of `path` not
    /// matching their page CRC, now, by `kind` ("read": refused to a
    /// reader; "write": a partly covered page read before a write;
    /// "commit": read back at fsync or close).
    pub fn record_mount_error(
        &self,
        path: &[u8],
        offset: u64,
        len: u64,
        kind: &str,
    ) -> Result<(), TransferError> {
        self.commit_with(|db| {
            db.prepare_cached(
                "INSERT INTO mount_errors (path, offset, len, at, kind) VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .and_then(|mut st| {
                st.execute(params![path, offset as i64, len as i64, unix_now(), kind])
            })
            .map_err(db_err)?;
            Ok(())
        })
    }

    /// What the mount found and did, for `intact status`.
    pub fn mount_summary(&self) -> Result<MountSummary, TransferError> {
        let db = self.db();
        let (read_pages, read_bytes, other_pages, last): (i64, i64, i64, Option<i64>) = db
            .query_row(
                "SELECT COALESCE(SUM(kind = 'read'), 0), COALESCE(SUM(CASE WHEN kind = 'read' THEN len END), 0),
                        COALESCE(SUM(kind != 'read'), 0), MAX(at)
                 FROM mount_errors",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .map_err(db_err)?;
        let written: i64 = db
            .query_row(
                "SELECT COUNT(*) FROM files WHERE done = 1 AND mounted_at > 0",
                [],
                |r| r.get(0),
            )
            .map_err(db_err)?;
        Ok(MountSummary {
            read_pages: read_pages as u64,
            read_bytes: read_bytes as u64,
            other_pages: other_pages as u64,
            last,
            written: written as u64,
        })
    }
}
