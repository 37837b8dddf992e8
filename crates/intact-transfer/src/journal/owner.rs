//! Whose a partial file is: the session that holds it now (or held it
//! last, or finished it), recorded in the journal when a session takes
//! the file's lock, with the time it did.
//!
//! The lock itself (`flock` on the partial file, see
//! [`crate::dest`]) is what keeps a second session out; this record is
//! what an operator, or a later session that finds the file still
//! partial, can read: which client run was receiving it, and since when.

use rusqlite::{params, OptionalExtension};

use super::{db_err, Journal};
use crate::TransferError;

/// The session recorded for a file, and when it took the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// The session's id (as the server groups its streams).
    pub session: [u8; 16],
    /// Unix seconds when it took the file's lock.
    pub since: i64,
}

impl Journal {
    /// Adds the owner columns to an older journal.
    pub(super) fn add_owner_columns(db: &rusqlite::Connection) -> Result<(), TransferError> {
        super::add_missing_columns(
            db,
            &[
                ("files", "session BLOB"),
                ("files", "session_at INTEGER NOT NULL DEFAULT 0"),
            ],
        )?;
        Ok(())
    }

    /// The session recorded for `path`, if any.
    pub fn owner(&self, path: &[u8]) -> Result<Option<Owner>, TransferError> {
        let row: Option<(Option<Vec<u8>>, i64)> = self
            .db()
            .query_row(
                "SELECT session, session_at FROM files WHERE path = ?1",
                params![path],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(db_err)?;
        Ok(row.and_then(|(s, since)| {
            let session = <[u8; 16]>::try_from(s?).ok()?;
            Some(Owner { session, since })
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::unix_now;

    #[test]
    fn the_session_that_takes_a_file_is_recorded_and_replaced_by_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path()).unwrap();
        let id = j.start(b"a/f", 10, (0, 0), 4096, None, b"").unwrap();
        assert_eq!(j.owner(b"a/f").unwrap(), None, "nobody yet");
        let t0 = unix_now();
        j.reopen(id, Some([1; 16])).unwrap();
        let first = j.owner(b"a/f").unwrap().expect("recorded");
        assert_eq!(first.session, [1; 16]);
        assert!(first.since >= t0);
        j.reopen(id, Some([2; 16])).unwrap();
        assert_eq!(j.owner(b"a/f").unwrap().unwrap().session, [2; 16]);
        j.reopen(id, None).unwrap();
        assert_eq!(j.owner(b"a/f").unwrap(), None);
        // Started again, or reopened: the session that does it holds it.
        j.start(b"a/f", 10, (0, 0), 4096, Some([3; 16]), b"")
            .unwrap();
        assert_eq!(j.owner(b"a/f").unwrap().unwrap().session, [3; 16]);
        j.reopen(id, Some([4; 16])).unwrap();
        assert_eq!(j.owner(b"a/f").unwrap().unwrap().session, [4; 16]);
        assert_eq!(j.owner(b"other").unwrap(), None);
    }
}
