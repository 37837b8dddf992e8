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
    Connection, Entry, EntryKind, FileResult, FileStatus, Message, ProtoError, WirePath,
};

use crate::dest::{Destination, Mtime, PartialFile};
use crate::verify::{VerifyLevel, VerifyMode};
use crate::TransferError;

/// How many times one file may come back for re-verification rounds.
const MAX_ROUNDS: u32 = 16;

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
) -> Result<SessionSummary, TransferError> {
    let mut files: HashMap<u64, Incoming> = HashMap::new();
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
                let result = begin(dest, e, &mut files, &mut dirs);
                if let Some(r) = result {
                    if r.status == FileStatus::Failed {
                        summary.failed += 1;
                    }
                    conn.write_message(&Message::FileResult(r))?;
                }
            }
            Message::Block(b) => {
                let Some(f) = files.get_mut(&b.file) else {
                    // A file that already failed: drop its blocks.
                    continue;
                };
                let ok = accept_block(f, b.index, &b.digest, &b.data, &mut buf)?;
                summary.bytes += b.data.len() as u64;
                summary.blocks_rejected += u64::from(!ok);
                conn.write_message(&Message::BlockResult {
                    file: b.file,
                    index: b.index,
                    ok,
                })?;
            }
            Message::FileEnd { file, .. } => {
                let Some(mut f) = files.remove(&file) else {
                    continue;
                };
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
                        let level = f.mode.level();
                        let mtime = Mtime {
                            sec: f.entry.mtime_sec,
                            nsec: f.entry.mtime_nsec,
                        };
                        let r = match f.partial.commit(f.entry.mode, mtime) {
                            Ok(()) => {
                                summary.verified += 1;
                                verified(file, level)
                            }
                            Err(e) => {
                                summary.failed += 1;
                                failed(file, &e.to_string())
                            }
                        };
                        conn.write_message(&r)?;
                    }
                    Err(e) => {
                        summary.failed += 1;
                        conn.write_message(&failed(file, &e.to_string()))?;
                    }
                }
            }
            Message::Bye => {
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

fn verified(file: u64, level: VerifyLevel) -> Message {
    Message::FileResult(FileResult {
        file,
        status: FileStatus::Verified,
        level: level.wire_id(),
        message: String::new(),
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

/// Handles an Entry; returns its result unless it is a file (whose result
/// comes at FileEnd).
fn begin(
    dest: &Destination,
    e: Entry,
    files: &mut HashMap<u64, Incoming>,
    dirs: &mut Vec<(WirePath, u32, Mtime)>,
) -> Option<FileResult> {
    let id = e.file;
    let result = |r: Result<(), TransferError>| {
        Some(match r {
            Ok(()) => FileResult {
                file: id,
                status: FileStatus::Verified,
                level: 0,
                message: String::new(),
            },
            Err(err) => FileResult {
                file: id,
                status: FileStatus::Failed,
                level: 0,
                message: err.to_string(),
            },
        })
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
        EntryKind::File => {
            let Some(mode) = VerifyMode::from_wire_id(e.verify) else {
                return result(Err(TransferError::Verification {
                    path: e.path.to_string(),
                    what: format!("unknown verification mode id {}", e.verify),
                }));
            };
            if e.algorithm != block_algorithm_id() || e.block_size == 0 {
                return result(Err(TransferError::Verification {
                    path: e.path.to_string(),
                    what: "unsupported block algorithm or block size".into(),
                }));
            }
            match dest.partial(&e.path, e.size) {
                Ok(partial) => {
                    let blocks = e.size.div_ceil(u64::from(e.block_size)) as usize;
                    files.insert(
                        id,
                        Incoming {
                            verified: vec![None; blocks],
                            entry: e,
                            mode,
                            partial,
                            rounds: 0,
                        },
                    );
                    None
                }
                Err(err) => result(Err(err)),
            }
        }
    }
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
