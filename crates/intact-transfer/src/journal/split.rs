//! Split files in the journal: a file sent as block ranges by several
//! sessions (the shards of one plan). Its row carries the split id it
//! was started for (`files.split`), and each range that verified whole is
//! recorded as *confirmed* in `split_ranges`, with the BLAKE3 chaining
//! values of its blocks (from which the file's BLAKE3 composes at commit)
//! and the inode of the partial file it was written to. A confirmation
//! counts only on that inode: a partial file made anew starts with none.
//!
//! Starting a row afresh ([`Journal::start`]) or reopening it for a
//! whole-file transfer ([`Journal::reopen`]) forgets its ranges.

use rusqlite::params;

use super::{db_err, insert_blocks, BlockRecord, Journal, VerifiedAt};
use crate::TransferError;

/// One confirmed range of a split file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeRecord {
    /// Its first block.
    pub first: u64,
    /// One past its last block.
    pub end: u64,
    /// How and when it verified (the lowest of its blocks).
    pub verified: VerifiedAt,
    /// The partial file it was written to: (device, inode).
    pub file_id: (u64, u64),
    /// The BLAKE3 chaining value of each of its blocks, 32 bytes each.
    pub cvs: Vec<u8>,
}

impl Journal {
    /// Adds the split columns and table to an older journal.
    pub(super) fn add_split_columns(db: &rusqlite::Connection) -> Result<(), TransferError> {
        super::add_missing_columns(db, &[("files", "split BLOB")])?;
        db.execute_batch(
            "CREATE TABLE IF NOT EXISTS split_ranges (
                 file INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,
                 first INTEGER NOT NULL,
                 end INTEGER NOT NULL,
                 mode INTEGER NOT NULL,
                 level INTEGER NOT NULL,
                 at INTEGER NOT NULL,
                 dev INTEGER NOT NULL,
                 ino INTEGER NOT NULL,
                 cvs BLOB NOT NULL,
                 PRIMARY KEY (file, first)
             );",
        )
        .map_err(db_err)
    }

    /// Marks row `id` (just started) as the split `split`.
    pub fn set_split(&self, id: i64, split: [u8; 16]) -> Result<(), TransferError> {
        self.db()
            .prepare_cached("UPDATE files SET split = ?2 WHERE id = ?1")
            .and_then(|mut st| st.execute(params![id, &split[..]]))
            .map_err(db_err)?;
        Ok(())
    }

    /// Records a range of split row `id` as confirmed, with the blocks of
    /// it not yet recorded, in one transaction (the caller has fdatasynced
    /// their data), which also reads back every range confirmed on the
    /// same partial file (without their chaining values).
    pub fn confirm_range(
        &self,
        id: i64,
        range: &RangeRecord,
        blocks: &[BlockRecord],
    ) -> Result<Vec<RangeRecord>, TransferError> {
        self.commit_with(|tx| {
            insert_blocks(tx, id, blocks)?;
            tx.prepare_cached(
                "INSERT OR REPLACE INTO split_ranges (file, first, end, mode, level, at, dev, ino, cvs)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )
            .and_then(|mut st| {
                st.execute(params![
                    id,
                    range.first as i64,
                    range.end as i64,
                    i64::from(range.verified.mode.wire_id()),
                    i64::from(range.verified.level.wire_id()),
                    range.verified.at,
                    range.file_id.0 as i64,
                    range.file_id.1 as i64,
                    range.cvs
                ])
            })
            .map_err(db_err)?;
            // Not confirmed unless read back with the others: the
            // transaction commits what succeeded, so undo the insert.
            ranges_in(tx, id, range.file_id, false).inspect_err(|_| {
                let _ = tx.execute(
                    "DELETE FROM split_ranges WHERE file = ?1 AND first = ?2",
                    params![id, range.first as i64],
                );
            })
        })
    }

    /// The confirmed ranges of row `id` written to the partial file
    /// `file_id`, in block order, with their chaining values if `cvs`;
    /// those on any other file are forgotten.
    pub fn ranges(
        &self,
        id: i64,
        file_id: (u64, u64),
        cvs: bool,
    ) -> Result<Vec<RangeRecord>, TransferError> {
        ranges_in(&self.db(), id, file_id, cvs)
    }

    /// Forgets the confirmed range of row `id` that starts at `first` (a
    /// session now claims it again: only one that finishes confirms it).
    ///
    /// Committed at once (with whatever [`Journal::start`] left open): a
    /// later rollback must never bring a confirmation back.
    pub fn unconfirm_range(&self, id: i64, first: u64) -> Result<(), TransferError> {
        self.commit_with(|tx| {
            tx.prepare_cached("DELETE FROM split_ranges WHERE file = ?1 AND first = ?2")
                .and_then(|mut st| st.execute(params![id, first as i64]))
                .map_err(db_err)?;
            Ok(())
        })
    }
}

fn ranges_in(
    db: &rusqlite::Connection,
    id: i64,
    file_id: (u64, u64),
    cvs: bool,
) -> Result<Vec<RangeRecord>, TransferError> {
    db.prepare_cached("DELETE FROM split_ranges WHERE file = ?1 AND (dev <> ?2 OR ino <> ?3)")
        .and_then(|mut st| st.execute(params![id, file_id.0 as i64, file_id.1 as i64]))
        .map_err(db_err)?;
    let mut st = db
        .prepare_cached(
            "SELECT first, end, mode, level, at, dev, ino, CASE WHEN ?2 THEN cvs ELSE x'' END
             FROM split_ranges WHERE file = ?1 ORDER BY first",
        )
        .map_err(db_err)?;
    let rows = st
        .query_map(params![id, cvs], |r| {
            Ok(RangeRecord {
                first: r.get::<_, i64>(0)? as u64,
                end: r.get::<_, i64>(1)? as u64,
                verified: VerifiedAt::from_row(r.get(2)?, r.get(3)?, r.get(4)?),
                file_id: (r.get::<_, i64>(5)? as u64, r.get::<_, i64>(6)? as u64),
                cvs: r.get(7)?,
            })
        })
        .map_err(db_err)?;
    rows.collect::<Result<_, _>>().map_err(db_err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::{VerifyLevel, VerifyMode};

    fn range(first: u64, end: u64, ino: u64) -> RangeRecord {
        RangeRecord {
            first,
            end,
            verified: VerifiedAt::now(VerifyMode::Riva, VerifyLevel::Device),
            file_id: (1, ino),
            cvs: vec![7; 32 * (end - first) as usize],
        }
    }

    #[test]
    fn ranges_are_kept_on_their_inode_and_forgotten_by_a_new_start_or_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path()).unwrap();
        let id = j.start(b"big", 8192, (5, 0), 1024, None, b"").unwrap();
        j.set_split(id, [9; 16]).unwrap();
        assert_eq!(j.lookup(b"big").unwrap().unwrap().split, Some([9; 16]));
        let block = BlockRecord {
            index: 4,
            digest: vec![1; 16],
            verified: VerifiedAt::now(VerifyMode::Riva, VerifyLevel::Device),
            pages: None,
        };
        j.confirm_range(id, &range(4, 8, 50), &[block]).unwrap();
        let back = j.confirm_range(id, &range(0, 4, 50), &[]).unwrap();
        assert_eq!(
            back.iter()
                .map(|r| (r.first, r.end, r.cvs.len()))
                .collect::<Vec<_>>(),
            [(0, 4, 0), (4, 8, 0)],
            "read back in the same transaction, without chaining values"
        );
        assert_eq!(
            j.blocks(id).unwrap().len(),
            1,
            "blocks go in with the range"
        );
        let got = j.ranges(id, (1, 50), true).unwrap();
        assert_eq!(
            got.iter().map(|r| (r.first, r.end)).collect::<Vec<_>>(),
            [(0, 4), (4, 8)]
        );
        assert_eq!(got[1], range(4, 8, 50).clone_at(got[1].verified.at));
        j.unconfirm_range(id, 0).unwrap();
        assert_eq!(j.ranges(id, (1, 50), true).unwrap().len(), 1);
        // Another partial file: its confirmations are gone for good.
        assert!(j.ranges(id, (1, 51), true).unwrap().is_empty());
        assert!(j.ranges(id, (1, 50), true).unwrap().is_empty());
        j.confirm_range(id, &range(0, 4, 50), &[]).unwrap();
        j.reopen(id, None).unwrap();
        assert!(
            j.ranges(id, (1, 50), true).unwrap().is_empty(),
            "reopen whole"
        );
        assert_eq!(j.lookup(b"big").unwrap().unwrap().split, None);
        j.set_split(id, [9; 16]).unwrap();
        j.confirm_range(id, &range(0, 4, 50), &[]).unwrap();
        j.start(b"big", 8192, (5, 0), 1024, None, b"").unwrap();
        assert!(
            j.ranges(id, (1, 50), true).unwrap().is_empty(),
            "started anew"
        );
        assert_eq!(j.lookup(b"big").unwrap().unwrap().split, None);
    }

    impl RangeRecord {
        fn clone_at(mut self, at: i64) -> RangeRecord {
            self.verified.at = at;
            self
        }
    }
}
