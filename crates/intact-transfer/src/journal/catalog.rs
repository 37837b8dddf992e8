//! The at-rest catalog: what the journal keeps of a finished file for as
//! long as it lives, and what each scrub found.
//!
//! A finished file's row (path, size, mtime, whole-file BLAKE3, the mode
//! and level reached at arrival and when) and its block rows (the block's
//! XXH3-128 and the CRC-32C of each page) are the catalog: two checksums
//! per region, as Z²FS keeps two. The page size is the root's, 4 KiB
//! unless `intact catalog init --page-size` chose another before the
//! first file arrived (PVFS used 64 KiB). The page CRCs are computed by
//! the receiver from the buffer it received *before* that buffer's digest
//! is checked against the sender's (checksum chaining): the two checks
//! overlap in time, so a memory flip after the check cannot leave a
//! catalog that describes the flipped bytes. They cost 4 bytes per page
//! (0.1% at 4 KiB, 0.006% at 64 KiB).
//!
//! A scrub marks each file it read ([`ScrubMark`]) and keeps its place in
//! a pass ([`ScrubPass`]), so an interrupted scrub goes on where it
//! stopped.

use rusqlite::{params, OptionalExtension};

use super::{db_err, unix_now, Journal, VerifiedAt};
use crate::verify::VerifyLevel;
use crate::TransferError;

/// What the last scrub of a file found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScrubState {
    /// Never scrubbed.
    Never,
    /// Every checksum held.
    Clean,
    /// Some bytes no longer match the catalog (rot).
    Rot,
    /// Its size or mtime differ from the catalog: changed by another
    /// program, which is not rot.
    Changed,
    /// Not there (or not a regular file) under its name.
    Missing,
    /// It could not be read (an I/O error).
    Unreadable,
    /// It had rot, and the rotten bytes were fetched from a replica,
    /// checked against the catalog, written, and re-read clean.
    Repaired,
}

impl ScrubState {
    fn id(self) -> i64 {
        match self {
            ScrubState::Never => 0,
            ScrubState::Clean => 1,
            ScrubState::Rot => 2,
            ScrubState::Changed => 3,
            ScrubState::Missing => 4,
            ScrubState::Unreadable => 5,
            ScrubState::Repaired => 6,
        }
    }

    fn from_id(id: i64) -> ScrubState {
        match id {
            1 => ScrubState::Clean,
            2 => ScrubState::Rot,
            3 => ScrubState::Changed,
            4 => ScrubState::Missing,
            5 => ScrubState::Unreadable,
            6 => ScrubState::Repaired,
            _ => ScrubState::Never,
        }
    }

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            ScrubState::Never => "never scrubbed",
            ScrubState::Clean => "clean",
            ScrubState::Rot => "rot",
            ScrubState::Changed => "changed",
            ScrubState::Missing => "missing",
            ScrubState::Unreadable => "unreadable",
            ScrubState::Repaired => "repaired",
        }
    }
}

/// A cataloged (finished) file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogFile {
    /// Row id.
    pub id: i64,
    /// Path under the root, as received.
    pub path: Vec<u8>,
    /// Size in bytes.
    pub size: u64,
    /// Modification time (seconds, nanoseconds).
    pub mtime: (i64, u32),
    /// Block size of its block records.
    pub block_size: u32,
    /// How it was verified at arrival, and when.
    pub arrival: VerifiedAt,
    /// Its whole-file BLAKE3 (None in rows older than that column).
    pub digest: Option<[u8; 32]>,
    /// When it was last scrubbed (0: never).
    pub scrubbed_at: i64,
    /// The bytes each of its page CRCs covers (the root's page size).
    pub page_size: usize,
    /// Where the sender said it came from (`host:/path`); None: not
    /// named (adopted in place, or received from an older build).
    pub source: Option<Vec<u8>>,
}

impl CatalogFile {
    /// Whether a file now of `size` bytes and mtime `mtime` (seconds,
    /// nanoseconds) is as cataloged; if not, another program changed it.
    pub fn is_as_cataloged(&self, size: u64, mtime: (i64, u32)) -> bool {
        (size, mtime) == (self.size, self.mtime)
    }

    /// Whether all its bytes are one block.
    pub fn is_one_block(&self) -> bool {
        self.size <= u64::from(self.block_size)
    }
}

/// What a scrub found of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScrubMark {
    /// The verdict.
    pub state: ScrubState,
    /// The level of the scrub's reads.
    pub level: VerifyLevel,
    /// Bytes found rotten.
    pub rot_bytes: u64,
}

/// A scrub pass: when it began, the last file it finished (by row id), and
/// when it ended (0 while it runs or was interrupted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScrubPass {
    /// Its id.
    pub id: i64,
    /// Unix seconds it began.
    pub started: i64,
    /// The row id of the last file it finished.
    pub last_file: i64,
    /// Unix seconds it finished (0: not finished).
    pub finished: i64,
}

/// The catalog in numbers, for `intact status`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CatalogSummary {
    /// Files cataloged (finished).
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Files per level reached at arrival (level name, count), of those
    /// that arrived by a transfer.
    pub arrival_levels: Vec<(String, u64)>,
    /// Files adopted by `intact catalog add`, per level of the read their
    /// checksums came from (never compared with a source).
    pub adopted_levels: Vec<(String, u64)>,
    /// Files per last scrub verdict (state name, count).
    pub scrub_states: Vec<(String, u64)>,
    /// Files whose last scrub read reached each level (level name, count).
    pub scrub_levels: Vec<(String, u64)>,
    /// Bytes found rotten by the last scrub of each file and not repaired.
    pub rot_bytes: u64,
    /// Repairs from a replica ever made (each one re-read clean after).
    pub repairs: u64,
    /// Bytes those repairs wrote.
    pub repaired_bytes: u64,
    /// When the last repair was made (unix seconds).
    pub last_repair: Option<i64>,
    /// When the file scrubbed longest ago was scrubbed, if every file's
    /// last scrub read all of it from the device and found it clean or
    /// rotten: every cataloged file has been read back since then.
    pub every_file_read_back_since: Option<i64>,
    /// Files whose last scrub did not read them whole from the device
    /// (never scrubbed, missing, changed, unreadable, or read through the
    /// page cache only).
    pub not_read_back: u64,
    /// Files never scrubbed.
    pub never_scrubbed: u64,
    /// Files still partial (being received, or left by an interrupted run).
    pub partial: u64,
}

impl Journal {
    /// Adds the catalog's columns and tables to an older journal.
    pub(super) fn add_catalog_columns(db: &rusqlite::Connection) -> Result<(), TransferError> {
        super::add_missing_columns(
            db,
            &[
                ("blocks", "pages BLOB"),
                ("files", "scrubbed_at INTEGER NOT NULL DEFAULT 0"),
                ("files", "scrub_state INTEGER NOT NULL DEFAULT 0"),
                ("files", "scrub_level INTEGER NOT NULL DEFAULT 0"),
                ("files", "rot_bytes INTEGER NOT NULL DEFAULT 0"),
                ("files", "adopted INTEGER NOT NULL DEFAULT 0"),
                ("files", "source BLOB"),
            ],
        )?;
        db.execute_batch(
            "CREATE TABLE IF NOT EXISTS scrub_passes (
                 id INTEGER PRIMARY KEY,
                 started INTEGER NOT NULL,
                 last_file INTEGER NOT NULL DEFAULT 0,
                 finished INTEGER NOT NULL DEFAULT 0,
                 older_than INTEGER NOT NULL DEFAULT -1
             );
             CREATE TABLE IF NOT EXISTS settings (
                 key TEXT PRIMARY KEY,
                 value INTEGER NOT NULL
             );
             CREATE TABLE IF NOT EXISTS repairs (
                 id INTEGER PRIMARY KEY,
                 path BLOB NOT NULL,
                 at INTEGER NOT NULL,
                 bytes INTEGER NOT NULL,
                 replica TEXT NOT NULL
             );",
        )
        .map_err(db_err)
    }

    /// The root's catalog page size in bytes: the CRC-32C in a block
    /// record covers this many bytes each. Fixed once any file is
    /// recorded (see [`Journal::set_page_size`]); 4 KiB unless set.
    pub fn page_size(&self) -> usize {
        self.page_size.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets the root's catalog page size: a power of two from 512 bytes to
    /// 1 MiB, chosen before the first file is recorded (the page CRCs
    /// recorded already were computed at the page size they have).
    pub fn set_page_size(&self, page: u64) -> Result<(), TransferError> {
        if !intact_digest::valid_page_size(page) {
            return Err(TransferError::Usage(format!(
                "page size {page}: a power of two from {} bytes to {} KiB is needed",
                intact_digest::MIN_PAGE_SIZE,
                intact_digest::MAX_PAGE_SIZE / 1024
            )));
        }
        if page as usize == self.page_size() {
            return Ok(());
        }
        self.commit_with(|db| {
            let files: i64 = db
                .query_row("SELECT COUNT(*) FROM files", [], |r| r.get(0))
                .map_err(db_err)?;
            if files > 0 {
                return Err(TransferError::Usage(format!(
                    "the catalog already records {files} file(s) with {}-byte pages; a page size is chosen before the first file arrives",
                    self.page_size()
                )));
            }
            db.execute(
                "INSERT INTO settings (key, value) VALUES ('page_size', ?1)
                 ON CONFLICT(key) DO UPDATE SET value = ?1",
                params![page as i64],
            )
            .map_err(db_err)?;
            Ok(())
        })?;
        self.page_size
            .store(page as usize, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Up to `limit` finished files with row ids above `after`, last
    /// scrubbed before `scrubbed_before` (unix seconds; never scrubbed
    /// counts as 0), in id order.
    pub fn catalog_after(
        &self,
        after: i64,
        scrubbed_before: i64,
        limit: u32,
    ) -> Result<Vec<CatalogFile>, TransferError> {
        let page_size = self.page_size();
        let db = self.db();
        let mut st = db
            .prepare_cached(
                "SELECT id, path, size, mtime_sec, mtime_nsec, block_size, mode, level, at, digest, scrubbed_at, source
                 FROM files WHERE done = 1 AND id > ?1 AND scrubbed_at < ?2 ORDER BY id LIMIT ?3",
            )
            .map_err(db_err)?;
        let rows = st
            .query_map(params![after, scrubbed_before, limit], |r| {
                Ok(CatalogFile {
                    id: r.get(0)?,
                    path: r.get(1)?,
                    size: r.get::<_, i64>(2)? as u64,
                    mtime: (r.get(3)?, r.get::<_, i64>(4)? as u32),
                    block_size: r.get::<_, i64>(5)? as u32,
                    arrival: VerifiedAt::from_row(r.get(6)?, r.get(7)?, r.get(8)?),
                    digest: r
                        .get::<_, Option<Vec<u8>>>(9)?
                        .and_then(|d| <[u8; 32]>::try_from(d).ok()),
                    scrubbed_at: r.get(10)?,
                    page_size,
                    source: r.get(11)?,
                })
            })
            .map_err(db_err)?;
        rows.collect::<Result<_, _>>().map_err(db_err)
    }

    /// Files and bytes [`Journal::catalog_after`] would list, all pages.
    pub fn catalog_due(
        &self,
        after: i64,
        scrubbed_before: i64,
    ) -> Result<(u64, u64), TransferError> {
        self.db()
            .query_row(
                "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM files WHERE done = 1 AND id > ?1 AND scrubbed_at < ?2",
                params![after, scrubbed_before],
                |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
            )
            .map_err(db_err)
    }

    /// Records what a scrub found of `file`, now, and that `pass` got past
    /// it; left in the open transaction ([`Journal::flush`] commits).
    /// Only if its row still describes what was read (a transfer may have
    /// begun or finished a new version of the path meanwhile: its row is
    /// then not marked, and false is returned).
    pub fn mark_scrubbed(
        &self,
        file: &CatalogFile,
        mark: ScrubMark,
        pass: i64,
    ) -> Result<bool, TransferError> {
        let db = self.begun()?;
        db.prepare_cached("UPDATE scrub_passes SET last_file = ?2 WHERE id = ?1")
            .and_then(|mut st| st.execute(params![pass, file.id]))
            .map_err(db_err)?;
        let marked = db
            .prepare_cached(
                "UPDATE files SET scrubbed_at = ?2, scrub_state = ?3, scrub_level = ?4, rot_bytes = ?5
                 WHERE id = ?1 AND done = 1 AND size = ?6 AND mtime_sec = ?7 AND mtime_nsec = ?8
                   AND at = ?9 AND digest IS ?10",
            )
            .and_then(|mut st| {
                st.execute(params![
                    file.id,
                    unix_now(),
                    mark.state.id(),
                    i64::from(mark.level.wire_id()),
                    mark.rot_bytes as i64,
                    file.size as i64,
                    file.mtime.0,
                    i64::from(file.mtime.1),
                    file.arrival.at,
                    file.digest.map(|d| d.to_vec()),
                ])
            })
            .map_err(db_err)?;
        Ok(marked == 1)
    }

    /// Catalogs a file that reached the root by other means (`intact
    /// catalog add`): its row, done, marked adopted, with mode `none` (it
    /// was never compared with a source) and the level of the read its
    /// checksums came from; its block records with their page CRCs. One
    /// transaction.
    #[allow(clippy::too_many_arguments)]
    pub fn adopt(
        &self,
        path: &[u8],
        size: u64,
        mtime: (i64, u32),
        block_size: u32,
        blocks: &[super::BlockRecord],
        read: VerifyLevel,
        digest: [u8; 32],
    ) -> Result<i64, TransferError> {
        // start() leaves its row in the open transaction, the mark joins
        // it, and done_batch() commits all three.
        let id = self.start(path, size, mtime, block_size, None, b"")?;
        self.begun()?
            .execute("UPDATE files SET adopted = 1 WHERE id = ?1", params![id])
            .map_err(db_err)?;
        let verified = VerifiedAt::now(crate::verify::VerifyMode::None, read);
        self.done_batch(&[super::DoneFile {
            row: id,
            blocks: blocks.to_vec(),
            verified,
            digest,
        }])?;
        Ok(id)
    }

    /// Records that `bytes` of `path` were repaired from `replica`, now
    /// (in the open transaction, with the file's scrub mark).
    pub fn record_repair(
        &self,
        path: &[u8],
        bytes: u64,
        replica: &str,
    ) -> Result<(), TransferError> {
        self.begun()?
            .prepare_cached(
                "INSERT INTO repairs (path, at, bytes, replica) VALUES (?1, ?2, ?3, ?4)",
            )
            .and_then(|mut st| st.execute(params![path, unix_now(), bytes as i64, replica]))
            .map_err(db_err)?;
        Ok(())
    }

    /// The scrub pass left unfinished, if any (the latest), when it was
    /// begun for the same `older_than` (seconds, -1 for none): a pass
    /// only goes on with the selection it began with.
    pub fn open_scrub_pass(&self, older_than: i64) -> Result<Option<ScrubPass>, TransferError> {
        self.db()
            .query_row(
                "SELECT id, started, last_file, finished FROM scrub_passes
                 WHERE id = (SELECT MAX(id) FROM scrub_passes) AND older_than = ?1",
                params![older_than],
                pass_row,
            )
            .optional()
            .map(|p| p.filter(|p| p.finished == 0))
            .map_err(db_err)
    }

    /// Begins a scrub pass now, for files due by `older_than` (seconds,
    /// -1 for all).
    pub fn begin_scrub_pass(&self, older_than: i64) -> Result<ScrubPass, TransferError> {
        let started = unix_now();
        let db = self.db();
        db.execute(
            "INSERT INTO scrub_passes (started, older_than) VALUES (?1, ?2)",
            params![started, older_than],
        )
        .map_err(db_err)?;
        Ok(ScrubPass {
            id: db.last_insert_rowid(),
            started,
            last_file: 0,
            finished: 0,
        })
    }

    /// Records that `pass` finished, now.
    pub fn finish_scrub_pass(&self, pass: i64) -> Result<(), TransferError> {
        self.flush()?;
        self.db()
            .execute(
                "UPDATE scrub_passes SET finished = ?2 WHERE id = ?1",
                params![pass, unix_now()],
            )
            .map_err(db_err)?;
        Ok(())
    }

    /// The catalog in numbers.
    pub fn catalog_summary(&self) -> Result<CatalogSummary, TransferError> {
        let db = self.db();
        let mut s = CatalogSummary::default();
        let (files, bytes, rot, partial): (i64, i64, i64, i64) = db
            .query_row(
                "SELECT COALESCE(SUM(done), 0), COALESCE(SUM(CASE WHEN done = 1 THEN size END), 0),
                        COALESCE(SUM(CASE WHEN done = 1 AND scrub_state = 2 THEN rot_bytes END), 0),
                        COALESCE(SUM(1 - done), 0)
                 FROM files",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .map_err(db_err)?;
        (s.files, s.bytes, s.rot_bytes, s.partial) =
            (files as u64, bytes as u64, rot as u64, partial as u64);
        let (repairs, repaired, last): (i64, i64, Option<i64>) = db
            .query_row(
                "SELECT COUNT(*), COALESCE(SUM(bytes), 0), MAX(at) FROM repairs",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .map_err(db_err)?;
        (s.repairs, s.repaired_bytes, s.last_repair) = (repairs as u64, repaired as u64, last);
        let grouped = |sql: &str, name: &dyn Fn(i64, i64) -> String| {
            let mut st = db.prepare(sql).map_err(db_err)?;
            let rows = st
                .query_map([], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                })
                .map_err(db_err)?;
            let mut out: Vec<(String, u64)> = Vec::new();
            for row in rows {
                let (a, b, n) = row.map_err(db_err)?;
                let key = name(a, b);
                match out.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, c)) => *c += n as u64,
                    None => out.push((key, n as u64)),
                }
            }
            Ok::<_, TransferError>(out)
        };
        let level_name =
            |level: i64, at: i64| VerifiedAt::from_row(0, level, at).level.name().to_string();
        s.arrival_levels = grouped(
            "SELECT level, MIN(at, 1), COUNT(*) FROM files WHERE done = 1 AND adopted = 0 GROUP BY level, MIN(at, 1) ORDER BY level",
            &level_name,
        )?;
        s.adopted_levels = grouped(
            "SELECT level, MIN(at, 1), COUNT(*) FROM files WHERE done = 1 AND adopted = 1 GROUP BY level, MIN(at, 1) ORDER BY level",
            &level_name,
        )?;
        s.scrub_states = grouped(
            "SELECT scrub_state, 0, COUNT(*) FROM files WHERE done = 1 GROUP BY scrub_state ORDER BY scrub_state",
            &|state, _| ScrubState::from_id(state).name().to_string(),
        )?;
        s.scrub_levels = grouped(
            "SELECT scrub_level, 1, COUNT(*) FROM files WHERE done = 1 AND scrubbed_at > 0 GROUP BY scrub_level ORDER BY scrub_level",
            &level_name,
        )?;
        let device = i64::from(VerifyLevel::Device.wire_id());
        let (never, not_back, oldest): (i64, i64, Option<i64>) = db
            .query_row(
                "SELECT COALESCE(SUM(scrubbed_at = 0), 0),
                        COALESCE(SUM(NOT (scrub_state IN (1, 2, 6) AND scrub_level = ?1)), 0),
                        MIN(scrubbed_at)
                 FROM files WHERE done = 1",
                params![device],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .map_err(db_err)?;
        s.never_scrubbed = never as u64;
        s.not_read_back = not_back as u64;
        // Only when every file's last scrub read all of it from the device.
        s.every_file_read_back_since = oldest.filter(|_| not_back == 0 && files > 0);
        Ok(s)
    }
}

fn pass_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ScrubPass> {
    Ok(ScrubPass {
        id: r.get(0)?,
        started: r.get(1)?,
        last_file: r.get(2)?,
        finished: r.get(3)?,
    })
}

/// The page size a catalog records (4 KiB where none was set; a value
/// this build would not accept is a damaged catalog).
pub(super) fn read_page_size(db: &rusqlite::Connection) -> Result<usize, TransferError> {
    let set: Option<i64> = db
        .query_row(
            "SELECT value FROM settings WHERE key = 'page_size'",
            [],
            |r| r.get(0),
        )
        .optional()
        .map_err(db_err)?;
    match set {
        None => Ok(intact_digest::PAGE_SIZE),
        Some(p) if p > 0 && intact_digest::valid_page_size(p as u64) => Ok(p as usize),
        Some(p) => Err(TransferError::Journal(format!(
            "the catalog's page size {p} is not one this build accepts: the catalog is damaged"
        ))),
    }
}
