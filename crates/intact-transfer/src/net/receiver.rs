//! The receiving side of one connection.
//!
//! Every Entry gets exactly one FileResult. A file's blocks are checked
//! against the digests that travel with them, written, and (block mode)
//! re-read; each Block gets a BlockResult, and a failed one is resent by
//! the sender. At FileEnd the file is re-read if the mode says so, bad
//! blocks are asked for again, and only a fully verified file is fsynced
//! and renamed to its final name.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;

use intact_digest::{defaults, hash, Algorithm, AlignedBuf, Digest};
use intact_proto::{
    Connection, Entry, EntryKind, FileResult, FileStatus, Holding, Message, ProtoError, WirePath,
};

use crate::dest::{Destination, Mtime, PartialFile};
use crate::journal::Journal;
use crate::verify::{VerifyLevel, VerifyMode};
use crate::TransferError;

/// How many times one file may come back for re-verification rounds.
const MAX_ROUNDS: u32 = 16;

/// Verified files committed together at most (one syncfs, one fsync per
/// directory, one journal transaction).
const GROUP_COMMIT_FILES: usize = 1024;

/// Verified-but-unjournaled data after which the partial file is
/// fdatasynced and its blocks recorded, in bytes: what a server crash can
/// cost a file in resent data, against one fdatasync per batch.
const JOURNAL_BATCH: u64 = 8 << 20;

/// What one session did, for the server's log.
#[derive(Debug, Default, Clone, Copy)]
pub struct SessionSummary {
    /// Files verified and committed.
    pub verified: u64,
    /// Entries that failed.
    pub failed: u64,
    /// Blocks that failed verification and were asked for again.
    pub blocks_rejected: u64,
    /// Bytes of block payload received.
    pub bytes: u64,
}

struct Incoming {
    entry: Entry,
    mode: VerifyMode,
    partial: PartialFile,
    /// Per block: the digest it verified against, once it has.
    verified: Vec<Option<Digest>>,
    rounds: u32,
    /// The file's journal row.
    row: i64,
    /// Verified blocks not yet in the journal, and their bytes.
    unjournaled: Vec<(u64, Vec<u8>)>,
    unjournaled_bytes: u64,
}

impl Incoming {
    /// Makes the verified data durable, then records it.
    fn journal(&mut self, journal: &Journal) -> Result<(), TransferError> {
        if self.unjournaled.is_empty() {
            return Ok(());
        }
        self.partial
            .file()
            .sync_data()
            .map_err(|e| TransferError::Destination {
                path: self.entry.path.to_string(),
                source: e,
            })?;
        journal.add_blocks(self.row, &self.unjournaled)?;
        self.unjournaled.clear();
        self.unjournaled_bytes = 0;
        Ok(())
    }
}

/// The algorithm id of intact's block digest on the wire.
pub(crate) fn block_algorithm_id() -> u8 {
    Algorithm::ALL
        .iter()
        .position(|a| *a == defaults::BLOCK_ALGORITHM)
        .expect("the block algorithm is in ALL") as u8
}

/// Runs the receiving side of a session that passed its handshake.
/// Returns when the sender says Bye or goes away; a protocol violation
/// ends the session with an error (partial files stay for resume).
pub fn receive<S: Read + Write>(
    conn: &mut Connection<S>,
    dest: &Destination,
    journal: &Journal,
) -> Result<SessionSummary, TransferError> {
    let mut files: HashMap<u64, Incoming> = HashMap::new();
    let mut ready: Vec<(u64, Incoming)> = Vec::new();
    let result = session(conn, dest, journal, &mut files, &mut ready);
    // However the session ended, keep what verified for the next attempt
    // (files still waiting for the group commit included: they stay
    // partial, every block journaled, and the next send only ends them).
    files.extend(ready);
    for f in files.values_mut() {
        let _ = f.journal(journal);
    }
    result
}

fn session<S: Read + Write>(
    conn: &mut Connection<S>,
    dest: &Destination,
    journal: &Journal,
    files: &mut HashMap<u64, Incoming>,
    ready: &mut Vec<(u64, Incoming)>,
) -> Result<SessionSummary, TransferError> {
    let mut dirs: Vec<(WirePath, u32, Mtime)> = Vec::new();
    let mut summary = SessionSummary::default();
    let mut buf = AlignedBuf::new(0);
    loop {
        if !conn.has_buffered_message() {
            conn.flush()?;
        }
        let Some(msg) = conn.read_message()? else {
            return Ok(summary);
        };
        match msg {
            Message::Entry(e) => {
                let reply = begin(dest, journal, e, files, &mut dirs, &mut buf);
                if let Message::FileResult(r) = &reply {
                    match r.status {
                        FileStatus::Failed => summary.failed += 1,
                        FileStatus::Verified => {
                            summary.verified += u64::from(!r.message.is_empty())
                        }
                    }
                }
                conn.write_message(&reply)?;
            }
            Message::Block(b) => {
                let Some(f) = files.get_mut(&b.file) else {
                    // A file that already failed: drop its blocks.
                    continue;
                };
                let accepted =
                    accept_block(f, b.index, &b.digest, &b.data, &mut buf).and_then(|ok| {
                        if ok && f.mode != VerifyMode::None {
                            f.unjournaled.push((b.index, b.digest.clone()));
                            f.unjournaled_bytes += b.data.len() as u64;
                            if f.unjournaled_bytes >= JOURNAL_BATCH {
                                f.journal(journal)?;
                            }
                        }
                        Ok(ok)
                    });
                let ok = match accepted {
                    Ok(ok) => ok,
                    // The destination failed this file (disk full, I/O
                    // error): it fails alone; what verified stays journaled
                    // for a later attempt, and the session goes on.
                    Err(e @ (TransferError::Destination { .. } | TransferError::Journal(_))) => {
                        let mut f = files.remove(&b.file).expect("looked up above");
                        let _ = f.journal(journal);
                        summary.failed += 1;
                        conn.write_message(&failed(b.file, &e.to_string()))?;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                summary.bytes += b.data.len() as u64;
                crate::fault::maybe_kill(summary.bytes);
                summary.blocks_rejected += u64::from(!ok);
                conn.write_message(&Message::BlockResult {
                    file: b.file,
                    index: b.index,
                    ok,
                })?;
            }
            Message::FileEnd { file, blocks, .. } => {
                let Some(mut f) = files.remove(&file) else {
                    continue;
                };
                if blocks != f.verified.len() as u64 {
                    // Abandoned (the source changed or failed) or inconsistent:
                    // keep what verified for a later attempt, name nothing.
                    f.journal(journal)?;
                    summary.failed += 1;
                    conn.write_message(&failed(file, "the sender abandoned the file"))?;
                    continue;
                }
                match end_file(&mut f, &mut buf) {
                    Ok(bad) if !bad.is_empty() && f.rounds < MAX_ROUNDS => {
                        f.rounds += 1;
                        for index in bad {
                            f.verified[index as usize] = None;
                            summary.blocks_rejected += 1;
                            conn.write_message(&Message::BlockResult {
                                file,
                                index,
                                ok: false,
                            })?;
                        }
                        files.insert(file, f);
                    }
                    Ok(bad) if !bad.is_empty() => {
                        summary.failed += 1;
                        conn.write_message(&failed(
                            file,
                            &format!("block {} never verified", bad[0]),
                        ))?;
                    }
                    Ok(_) => {
                        ready.push((file, f));
                        if ready.len() >= GROUP_COMMIT_FILES {
                            commit_ready(conn, dest, journal, ready, &mut summary)?;
                        }
                    }
                    Err(e) => {
                        summary.failed += 1;
                        conn.write_message(&failed(file, &e.to_string()))?;
                    }
                }
            }
            Message::Waiting => {
                // The sender blocks until it hears back: commit the group
                // now, so small files share one syncfs and their results go.
                commit_ready(conn, dest, journal, ready, &mut summary)?;
            }
            Message::Bye => {
                commit_ready(conn, dest, journal, ready, &mut summary)?;
                for (path, mode, mtime) in dirs.iter().rev() {
                    // A directory whose entry succeeded but whose final
                    // metadata cannot be set is only logged by the sender's
                    // report of the entry; the data inside is safe.
                    let _ = dest.finish_dir(path, *mode, *mtime);
                }
                conn.send(&Message::Bye)?;
                return Ok(summary);
            }
            other => {
                return Err(ProtoError::Unexpected {
                    got: other.name(),
                    wanted: "Entry, Block, FileEnd or Bye",
                }
                .into())
            }
        }
    }
}

/// Commits the ready files as one group and sends their results.
fn commit_ready<S: Read + Write>(
    conn: &mut Connection<S>,
    dest: &Destination,
    journal: &Journal,
    ready: &mut Vec<(u64, Incoming)>,
    summary: &mut SessionSummary,
) -> Result<(), TransferError> {
    if ready.is_empty() {
        return Ok(());
    }
    let mut meta = Vec::with_capacity(ready.len());
    let mut batch = Vec::with_capacity(ready.len());
    for (id, mut f) in ready.drain(..) {
        let mtime = Mtime {
            sec: f.entry.mtime_sec,
            nsec: f.entry.mtime_nsec,
        };
        meta.push((
            id,
            f.row,
            std::mem::take(&mut f.unjournaled),
            f.mode.level(),
        ));
        batch.push((f.partial, f.entry.mode, mtime));
    }
    let results = dest.commit_batch(batch);
    let done: Vec<(i64, crate::journal::BlockDigests, u8)> = meta
        .iter()
        .zip(&results)
        .filter(|(_, r)| r.is_ok())
        .map(|((_, row, blocks, level), _)| (*row, blocks.clone(), level.wire_id()))
        .collect();
    // A journal failure does not undo a durable, verified file; it only
    // means a later send may move it again.
    let _ = journal.done_batch(&done);
    for ((id, _, _, level), r) in meta.into_iter().zip(results) {
        let msg = match r {
            Ok(()) => {
                summary.verified += 1;
                verified(id, level)
            }
            Err(e) => {
                summary.failed += 1;
                failed(id, &e.to_string())
            }
        };
        conn.write_message(&msg)?;
    }
    Ok(())
}

fn verified(file: u64, level: VerifyLevel) -> Message {
    verified_because(file, level.wire_id(), "")
}

fn verified_because(file: u64, level: u8, why: &str) -> Message {
    Message::FileResult(FileResult {
        file,
        status: FileStatus::Verified,
        level,
        message: why.to_string(),
    })
}

fn failed(file: u64, why: &str) -> Message {
    Message::FileResult(FileResult {
        file,
        status: FileStatus::Failed,
        level: 0,
        message: why.to_string(),
    })
}

/// Handles an Entry: the FileResult of a directory, a symlink or a file
/// already held whole, or the Status of a file whose blocks must come.
fn begin(
    dest: &Destination,
    journal: &Journal,
    e: Entry,
    files: &mut HashMap<u64, Incoming>,
    dirs: &mut Vec<(WirePath, u32, Mtime)>,
    buf: &mut AlignedBuf,
) -> Message {
    let id = e.file;
    let result = |r: Result<(), TransferError>| match r {
        Ok(()) => verified_because(id, 0, ""),
        Err(err) => failed(id, &err.to_string()),
    };
    let mtime = Mtime {
        sec: e.mtime_sec,
        nsec: e.mtime_nsec,
    };
    match &e.kind {
        EntryKind::Dir => {
            let r = dest.make_dir(&e.path);
            if r.is_ok() {
                dirs.push((e.path.clone(), e.mode, mtime));
            }
            result(r)
        }
        EntryKind::Symlink(target) => result(dest.make_symlink(&e.path, target, mtime)),
        EntryKind::File => match begin_file(dest, journal, e, files, buf) {
            Ok(m) => m,
            Err(err) => failed(id, &err.to_string()),
        },
    }
}

fn begin_file(
    dest: &Destination,
    journal: &Journal,
    e: Entry,
    files: &mut HashMap<u64, Incoming>,
    buf: &mut AlignedBuf,
) -> Result<Message, TransferError> {
    let id = e.file;
    let Some(mode) = VerifyMode::from_wire_id(e.verify) else {
        return Err(TransferError::Verification {
            path: e.path.to_string(),
            what: format!("unknown verification mode id {}", e.verify),
        });
    };
    if e.algorithm != block_algorithm_id() || e.block_size == 0 {
        return Err(TransferError::Verification {
            path: e.path.to_string(),
            what: "unsupported block algorithm or block size".into(),
        });
    }
    let blocks = e.size.div_ceil(u64::from(e.block_size)) as usize;
    let same = |r: &crate::journal::FileRow| {
        r.size == e.size
            && r.mtime_sec == e.mtime_sec
            && r.mtime_nsec == e.mtime_nsec
            && r.block_size == e.block_size
    };
    let row = journal.lookup(e.path.as_bytes())?.filter(same);
    // Held whole, unchanged since: the quick check (re-read on --reverify).
    if let Some(r) = row.as_ref().filter(|r| r.done) {
        if let Some(file) = dest.open_final(&e.path) {
            let meta = file.metadata().ok();
            let unchanged = meta.is_some_and(|m| {
                use std::os::unix::fs::MetadataExt;
                m.len() == e.size
                    && m.mtime() == e.mtime_sec
                    && m.mtime_nsec() as u32 == e.mtime_nsec
            });
            if unchanged && e.flags & Entry::REVERIFY == 0 {
                return Ok(verified_because(id, r.level, "unchanged"));
            }
            if unchanged && mode != VerifyMode::None {
                let good = recorded_blocks_that_match(journal, r.id, &file, &e, buf)?;
                if good.len() == blocks {
                    return Ok(verified_because(
                        id,
                        VerifyLevel::Cache.wire_id(),
                        "reverified",
                    ));
                }
            }
        }
    }
    let partial = dest.partial(&e.path, e.size)?;
    let mut verified = vec![None; blocks];
    let (row_id, holding) = match row.filter(|r| !r.done) {
        Some(r) => {
            let good = recorded_blocks_that_match(journal, r.id, partial.file(), &e, buf)?;
            for (i, d) in &good {
                verified[*i as usize] = Some(*d);
            }
            let list: Vec<(u64, Vec<u8>)> = good
                .iter()
                .map(|(i, d)| (*i, d.as_bytes().to_vec()))
                .collect();
            (
                r.id,
                if list.is_empty() {
                    Holding::Nothing
                } else {
                    Holding::Blocks(list)
                },
            )
        }
        None => {
            let row = journal.start(
                e.path.as_bytes(),
                e.size,
                (e.mtime_sec, e.mtime_nsec),
                e.block_size,
            )?;
            (row, Holding::Nothing)
        }
    };
    journal.reopen(row_id)?;
    files.insert(
        id,
        Incoming {
            verified,
            entry: e,
            mode,
            partial,
            rounds: 0,
            row: row_id,
            unjournaled: Vec::new(),
            unjournaled_bytes: 0,
        },
    );
    Ok(Message::Status { file: id, holding })
}

/// The journaled blocks of row `id` whose bytes in `file` still hash to
/// their recorded digest.
fn recorded_blocks_that_match(
    journal: &Journal,
    id: i64,
    file: &std::fs::File,
    e: &Entry,
    buf: &mut AlignedBuf,
) -> Result<Vec<(u64, Digest)>, TransferError> {
    let bs = u64::from(e.block_size);
    let mut good = Vec::new();
    for (idx, raw) in journal.blocks(id)? {
        let offset = idx * bs;
        let Some(d) = Digest::from_bytes(defaults::BLOCK_ALGORITHM, &raw) else {
            continue;
        };
        if offset >= e.size {
            continue;
        }
        let len = (e.size - offset).min(bs) as usize;
        if reread_matches(file, offset, len, &d, buf).unwrap_or(false) {
            good.push((idx, d));
        }
    }
    Ok(good)
}

/// Checks, writes and (block mode) re-reads one block; returns whether it verified.
fn accept_block(
    f: &mut Incoming,
    index: u64,
    digest: &[u8],
    data: &[u8],
    buf: &mut AlignedBuf,
) -> Result<bool, TransferError> {
    let bs = u64::from(f.entry.block_size);
    let Some(slot) = f.verified.get(index as usize) else {
        return Err(ProtoError::Malformed {
            message: "Block",
            detail: "block index past the end of the file",
        }
        .into());
    };
    let offset = index * bs;
    let want_len = (f.entry.size - offset).min(bs) as usize;
    if data.len() != want_len {
        return Err(ProtoError::Malformed {
            message: "Block",
            detail: "block length does not match the file",
        }
        .into());
    }
    if slot.is_some() {
        return Ok(true);
    }
    let expected = match f.mode {
        VerifyMode::None => None,
        _ => match Digest::from_bytes(defaults::BLOCK_ALGORITHM, digest) {
            Some(d) => Some(d),
            None => return Ok(false),
        },
    };
    if let Some(d) = &expected {
        if !hash(defaults::BLOCK_ALGORITHM, data).ct_eq(d) {
            return Ok(false);
        }
    }
    let path = f.entry.path.to_string();
    let dest_err = |e| TransferError::Destination {
        path: path.clone(),
        source: e,
    };
    f.partial
        .file()
        .write_all_at(data, offset)
        .map_err(dest_err)?;
    if let (VerifyMode::Block, Some(d)) = (f.mode, &expected) {
        if !reread_matches(f.partial.file(), offset, want_len, d, buf).map_err(dest_err)? {
            return Ok(false);
        }
    }
    // In none mode there is no digest; record the data's own so the slot
    // reads as done.
    f.verified[index as usize] = Some(expected.unwrap_or_else(|| hash(Algorithm::Crc32c, &[])));
    Ok(true)
}

fn reread_matches(
    file: &std::fs::File,
    offset: u64,
    len: usize,
    want: &Digest,
    buf: &mut AlignedBuf,
) -> std::io::Result<bool> {
    if buf.len() < len {
        *buf = AlignedBuf::new(len);
    }
    file.read_exact_at(&mut buf[..len], offset)?;
    Ok(hash(defaults::BLOCK_ALGORITHM, &buf[..len]).ct_eq(want))
}

/// At FileEnd: every block must have verified; sequential and file modes
/// re-read the whole file. Returns the blocks that must be sent again.
fn end_file(f: &mut Incoming, buf: &mut AlignedBuf) -> Result<Vec<u64>, TransferError> {
    let missing: Vec<u64> = (0..f.verified.len() as u64)
        .filter(|&i| f.verified[i as usize].is_none())
        .collect();
    if !missing.is_empty() || !matches!(f.mode, VerifyMode::Sequential | VerifyMode::File) {
        return Ok(missing);
    }
    let bs = u64::from(f.entry.block_size);
    let path = f.entry.path.to_string();
    let mut bad = Vec::new();
    for (i, d) in f.verified.iter().enumerate() {
        let offset = i as u64 * bs;
        let len = (f.entry.size - offset).min(bs) as usize;
        let d = d.as_ref().expect("all verified");
        let ok = reread_matches(f.partial.file(), offset, len, d, buf).map_err(|e| {
            TransferError::Destination {
                path: path.clone(),
                source: e,
            }
        })?;
        if !ok {
            bad.push(i as u64);
        }
    }
    Ok(bad)
}
