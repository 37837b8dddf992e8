//! The mount's intent log: before `intact mount` writes an application's
//! bytes to a file it appends the new page CRCs (and, for a truncate, the
//! new size) here, in one `write`, so that a crash of the mount daemon
//! can never leave a page whose CRC disagrees with what was acknowledged
//! to the application.
//!
//! After a crash a logged page holds either its old bytes (the data
//! write never happened) or the new ones: [`recover_intents`] reads each
//! logged page and keeps whichever CRC it matches, then rebuilds the
//! touched blocks' records. A page matching none of them is left with
//! its cataloged CRC, so that the damage stays visible to reads and to
//! `intact scrub`. The log is emptied once the catalog holds everything
//! in it (the mount does so at every commit of its CRCs).
//!
//! A record is 29 bytes: kind, file row, two numbers, a CRC and a
//! check of the rest (XXH3); a torn last record fails its check and ends the
//! log.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use super::layout::{
    block_matches, crcs_of_blob, failing_block, rebuild_block, Layout, RebuildError,
};
use super::{BlockRecord, Journal};
use crate::TransferError;

/// The log's name in a catalog's directory.
pub const INTENT_LOG: &str = "mount-intents";

const RECORD: usize = 29;

/// One logged intent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent {
    /// Page `index` of block `block` of file row `file` is about to hold
    /// bytes whose CRC-32C is `crc`.
    Page {
        /// The file's row.
        file: i64,
        /// The block.
        block: u64,
        /// The page within it.
        index: u32,
        /// The new CRC.
        crc: u32,
    },
    /// File row `file` is about to be cut or grown to `size` bytes.
    Size {
        /// The file's row.
        file: i64,
        /// The new size.
        size: u64,
    },
}

impl Intent {
    fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        let (kind, file, a, b, crc) = match *self {
            Intent::Page {
                file,
                block,
                index,
                crc,
            } => (1u8, file, block, index, crc),
            Intent::Size { file, size } => (2u8, file, size, 0, 0),
        };
        out.push(kind);
        out.extend_from_slice(&file.to_le_bytes());
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&b.to_le_bytes());
        out.extend_from_slice(&crc.to_le_bytes());
        let check = record_check(&out[start..]);
        out.extend_from_slice(&check.to_le_bytes());
    }

    fn decode(r: &[u8]) -> Option<Intent> {
        let le8 = |at: usize| u64::from_le_bytes(r[at..at + 8].try_into().expect("8 bytes"));
        let le4 = |at: usize| u32::from_le_bytes(r[at..at + 4].try_into().expect("4 bytes"));
        if record_check(&r[..RECORD - 4]) != le4(RECORD - 4) {
            return None;
        }
        let file = le8(1) as i64;
        match r[0] {
            1 => Some(Intent::Page {
                file,
                block: le8(9),
                index: le4(17),
                crc: le4(21),
            }),
            2 => Some(Intent::Size { file, size: le8(9) }),
            _ => None,
        }
    }

    fn file(&self) -> i64 {
        match *self {
            Intent::Page { file, .. } | Intent::Size { file, .. } => file,
        }
    }
}

/// A record's check: the low 32 bits of its XXH3-64 (a CRC call per
/// 25-byte record cost as much as summing its page, in a 1 MiB write of
/// 256 records).
fn record_check(r: &[u8]) -> u32 {
    xxhash_rust::xxh3::xxh3_64(r) as u32
}

/// The open log (appended with `O_APPEND`, private to the user).
#[derive(Debug)]
pub struct IntentLog {
    file: File,
}

impl IntentLog {
    /// Opens (creating it) the log in the catalog directory `dir`.
    pub fn open(dir: &Path) -> std::io::Result<IntentLog> {
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(dir.join(INTENT_LOG))?;
        Ok(IntentLog { file })
    }

    /// Appends `intents` in one write.
    pub fn append(&self, intents: &[Intent]) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(intents.len() * RECORD);
        for i in intents {
            i.encode(&mut buf);
        }
        (&self.file).write_all(&buf)
    }

    /// Empties the log (everything in it is in the catalog now).
    pub fn clear(&self) -> std::io::Result<()> {
        self.file.set_len(0)
    }
}

/// What [`recover_intents`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Files whose records were made again.
    pub files: u64,
    /// Logged pages found holding their new bytes (CRC taken).
    pub pages_new: u64,
    /// Logged pages found holding their old bytes (the write never
    /// happened).
    pub pages_old: u64,
    /// Pages matching no CRC known for them: damage, left visible.
    pub pages_damaged: u64,
    /// Pages with no CRC logged or cataloged (blocks recorded without page
    /// CRCs), taken from their bytes because their block still matches
    /// its cataloged digest.
    pub pages_by_block_digest: u64,
}

/// Replays the intent log of the catalog in `dir` (files under `root`)
/// left by a mount that did not end cleanly, then empties it.
pub fn recover_intents(
    journal: &Journal,
    dir: &Path,
    root: &Path,
) -> Result<Recovered, TransferError> {
    let path = dir.join(INTENT_LOG);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Recovered::default()),
        Err(e) => return Err(TransferError::Journal(format!("{}: {e}", path.display()))),
    };
    let mut out = Recovered::default();
    if bytes.is_empty() {
        return Ok(out);
    }
    let mut by_file: BTreeMap<i64, Vec<Intent>> = BTreeMap::new();
    for r in bytes.chunks_exact(RECORD) {
        let Some(i) = Intent::decode(r) else { break };
        by_file.entry(i.file()).or_default().push(i);
    }
    for (id, intents) in by_file {
        recover_file(journal, root, id, &intents, &mut out)?;
    }
    let log = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| TransferError::Journal(format!("{}: {e}", path.display())))?;
    log.set_len(0)
        .map_err(|e| TransferError::Journal(format!("{}: {e}", path.display())))?;
    Ok(out)
}

fn recover_file(
    journal: &Journal,
    root: &Path,
    id: i64,
    intents: &[Intent],
    out: &mut Recovered,
) -> Result<(), TransferError> {
    let Some(row) = journal.mount_row_by_id(id)? else {
        return Ok(());
    };
    let Ok(file) = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(root.join(OsStr::from_bytes(&row.path)))
    else {
        return Ok(());
    };
    let Ok(meta) = file.metadata() else {
        return Ok(());
    };
    let layout = Layout {
        size: meta.len(),
        block: u64::from(row.block_size.max(1)),
        page: journal.page_size() as u64,
    };
    let records = journal.blocks(id)?;
    let old: BTreeMap<u64, Vec<u32>> = records
        .iter()
        .filter_map(|b| Some((b.index, crcs_of_blob(b.pages.as_ref()?))))
        .collect();
    let digests: BTreeMap<u64, &[u8]> = records
        .iter()
        .map(|b| (b.index, b.digest.as_slice()))
        .collect();
    let mut logged: BTreeMap<(u64, usize), Vec<u32>> = BTreeMap::new();
    let mut touched = BTreeSet::new();
    for i in intents {
        if let Intent::Page {
            block, index, crc, ..
        } = *i
        {
            logged.entry((block, index as usize)).or_default().push(crc);
            touched.insert(block);
        }
    }
    if layout.size != row.size && layout.blocks() > 0 {
        touched.insert(layout.blocks() - 1);
        touched.insert(row.size / layout.block);
    }
    let mut records: Vec<BlockRecord> = Vec::new();
    let mut page_buf = vec![0u8; layout.page as usize];
    let mut buf = Vec::new();
    for b in touched.into_iter().filter(|&b| b < layout.blocks()) {
        let mut crcs = Vec::new();
        let mut unvouched = Vec::new();
        for j in 0..layout.pages_in_block(b) {
            let p = layout.page(b, j);
            let bytes = &mut page_buf[..p.len as usize];
            file.read_exact_at(bytes, p.offset)
                .map_err(|e| TransferError::Journal(format!("reading a logged page: {e}")))?;
            let actual = intact_digest::page_crc(bytes);
            let cataloged = old.get(&b).and_then(|c| c.get(j)).copied();
            let new = logged.get(&(b, j));
            let crc = if new.is_some_and(|n| n.contains(&actual)) {
                out.pages_new += u64::from(new.is_some());
                actual
            } else if cataloged == Some(actual) {
                out.pages_old += u64::from(new.is_some());
                actual
            } else if let Some(c) = cataloged.or_else(|| new.and_then(|n| n.last().copied())) {
                out.pages_damaged += 1;
                c
            } else {
                unvouched.push(j);
                actual
            };
            crcs.push(crc);
        }
        if !unvouched.is_empty() {
            // Pages nothing names a CRC for: their bytes are taken only
            // if the whole block still matches its cataloged digest;
            // otherwise they are recorded as failing, never vouched for.
            let holds = match digests.get(&b) {
                Some(d) => block_matches(&file, &layout, b, d, &mut buf)
                    .map_err(|e| TransferError::Journal(format!("reading a logged block: {e}")))?,
                None => false,
            };
            if holds {
                out.pages_by_block_digest += unvouched.len() as u64;
            } else {
                out.pages_damaged += unvouched.len() as u64;
                for j in unvouched {
                    crcs[j] ^= 1;
                }
            }
        }
        match rebuild_block(&file, &layout, b, &crcs, &mut buf) {
            Ok(r) => records.push(r),
            Err(RebuildError::Pages(_)) => records.push(failing_block(b, &crcs)),
            Err(RebuildError::Io(e)) => {
                return Err(TransferError::Journal(format!(
                    "reading a logged block: {e}"
                )))
            }
        }
    }
    journal.mount_written(
        id,
        layout.size,
        (meta.mtime(), meta.mtime_nsec() as u32),
        &records,
        layout.blocks(),
    )?;
    out.files += 1;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_and_a_torn_or_damaged_one_ends_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = IntentLog::open(dir.path()).unwrap();
        let a = Intent::Page {
            file: 7,
            block: 3,
            index: 1023,
            crc: 0xdead_beef,
        };
        let b = Intent::Size {
            file: -1,
            size: u64::MAX,
        };
        log.append(&[a, b, a]).unwrap();
        let bytes = std::fs::read(dir.path().join(INTENT_LOG)).unwrap();
        assert_eq!(bytes.len(), 3 * RECORD);
        let read = |bytes: &[u8]| -> Vec<Intent> {
            bytes
                .chunks_exact(RECORD)
                .map_while(Intent::decode)
                .collect()
        };
        assert_eq!(read(&bytes), vec![a, b, a]);
        assert_eq!(read(&bytes[..3 * RECORD - 1]), vec![a, b], "torn");
        let mut bad = bytes.clone();
        bad[RECORD + 5] ^= 1;
        assert_eq!(read(&bad), vec![a], "damaged");
        log.clear().unwrap();
        assert_eq!(
            std::fs::metadata(dir.path().join(INTENT_LOG))
                .unwrap()
                .len(),
            0
        );
    }
}
