//! Split files: one large file received as block ranges by several
//! sessions (the shards of one plan, see `intact plan`), committed under
//! its final name once ranges covering it have all verified.
//!
//! The rule that a partial file belongs to one session has one exception
//! here, and it needs the plan: every range of a split carries its split
//! id, which only holders of the plan can make. The server keeps one
//! record per split file ([`Splits`], per destination root and path). It
//! holds the one locked partial file, which every range writes through a
//! handle of its own on the same open file description (so they share
//! its lock and its path claim, and a whole-file transfer of the path is
//! still kept out),
//! and the live claims: block ranges being received now, which never
//! overlap. A block outside its session's claim ends that connection.
//!
//! A range that verified whole (every block, and its range digest against
//! the sender's) is *confirmed* in the journal with its blocks, in the
//! same critical section that drops its claim and reads all confirmed
//! ranges back: the session that then finds them covering the file, with
//! no claim live, commits it, once. The file's BLAKE3 composes from the
//! chaining values the confirmations recorded, and its level is the
//! lowest of theirs.

use std::sync::Arc;

use intact_digest::{defaults, hash, AlignedBuf, Blake3Blocks};
use intact_proto::{Entry, EntryRange, Holding, MAX_STATUS_BLOCKS};

use super::begin::{open_stage, unchanged_since};
use super::resume::reverify_held;
use super::{Incoming, ReceiveOptions};
use crate::dest::{Destination, PartialFile};
use crate::journal::Journal;
use crate::net::whole_digest::{HeldWhole, Stamp};
use crate::profile::Stage;
use crate::verify::VerifyMode;
use crate::TransferError;

mod finish;
mod registry;

pub use registry::Splits;
use registry::{digest_of, known_of, Claim, FileStamp, Known, Open, Quiet};

/// Most claims and confirmed ranges one split file may have at once.
pub const MAX_RANGES: usize = 4096;

/// The smallest block size a split file may have.
pub const MIN_SPLIT_BLOCK: u32 = 4096;

/// The range of an incoming file that is one range of a split file.
pub(super) struct RangeIn {
    pub(super) range: EntryRange,
    /// None: the file was committed already, and the range is answered
    /// from the final file.
    claim: Option<Claim>,
    file_id: (u64, u64),
}

impl RangeIn {
    pub(super) fn blocks(&self) -> u64 {
        self.range.end - self.range.first
    }

    pub(super) fn contains(&self, index: u64) -> bool {
        (self.range.first..self.range.end).contains(&index)
    }
}

fn refuse(e: &Entry, what: impl Into<String>) -> TransferError {
    TransferError::Verification {
        path: e.path.to_string(),
        what: what.into(),
    }
}

fn blocks_of(e: &Entry) -> u64 {
    e.size.div_ceil(u64::from(e.block_size))
}

/// Checks a range entry before anything is looked up or allocated.
fn check(e: &Entry, r: &EntryRange, mode: VerifyMode) -> Result<(), TransferError> {
    if !mode.verifies_ranges() {
        return Err(refuse(
            e,
            format!(
                "verify {mode} cannot verify one range of a file (use riva, block, fiver or none)"
            ),
        ));
    }
    if !e.block_size.is_power_of_two()
        || e.block_size < MIN_SPLIT_BLOCK
        || e.block_size as usize > intact_proto::MAX_BLOCK
    {
        return Err(refuse(
            e,
            format!(
                "a split file needs a power-of-two block size of at least {MIN_SPLIT_BLOCK} bytes"
            ),
        ));
    }
    let n = blocks_of(e);
    if n < 2 || r.end > n {
        return Err(refuse(
            e,
            format!(
                "range {}..{} is not inside the file's {n} blocks (a split file has 2 or more)",
                r.first, r.end
            ),
        ));
    }
    if r.end - r.first > MAX_STATUS_BLOCKS as u64 {
        return Err(refuse(
            e,
            format!("a range of more than {MAX_STATUS_BLOCKS} blocks"),
        ));
    }
    Ok(())
}

/// Begins one range of a split file: claims its blocks (refused if they
/// overlap another session's), joining the file's record or opening it,
/// and answers with what this root holds of the range. A range of a file
/// committed already is answered from the final file.
pub(super) fn begin_range(
    dest: &Destination,
    journal: &Journal,
    opts: &ReceiveOptions,
    e: Entry,
    r: EntryRange,
    mode: VerifyMode,
    buf: &mut AlignedBuf,
) -> Result<(Incoming, Holding), TransferError> {
    check(&e, &r, mode)?;
    // Only a file this very split committed is answered from the final
    // file: held answers of two ranges must be of one version of it, and
    // only the split's own commit says which (a file committed whole, or
    // by another split, is received again).
    let same = |row: &crate::journal::FileRow| {
        row.size == e.size
            && (row.mtime_sec, row.mtime_nsec) == (e.mtime_sec, e.mtime_nsec)
            && row.block_size == e.block_size
            && row.split == Some(r.split)
    };
    let row = journal.lookup(e.path.as_bytes())?.filter(same);
    if let Some(row) = row.filter(|row| row.done) {
        if let Some(held) = held_range(dest, &e, r, mode, &row, buf)? {
            return Ok(held);
        }
    }
    let root = dest.root_id().map_err(|err| TransferError::Destination {
        path: e.path.to_string(),
        source: err,
    })?;
    let key = (root.0, root.1, e.path.as_bytes().to_vec());
    let file = opts.splits.join(key, || {
        (r.split, e.size, (e.mtime_sec, e.mtime_nsec), e.block_size)
    });
    if (file.id, file.size, file.mtime, file.block)
        != (r.split, e.size, (e.mtime_sec, e.mtime_nsec), e.block_size)
    {
        return Err(refuse(
            &e,
            "being received as part of another split (another plan, or the file changed since this plan)",
        ));
    }
    // The first session may be reading the confirmed ranges back: the
    // others wait for it as for the server's own work.
    let mut inner = {
        let _working = opts.working.now();
        file.lock()
    };
    if inner.open.is_none() {
        let quiet = inner.quiet.take();
        let opened = open_split(dest, journal, opts, &e, r.split, quiet);
        inner.open = Some(
            opened
                .map(|(open, known)| {
                    inner.known = known;
                    open
                })
                .map_err(|e| e.to_string()),
        );
    }
    let open = match inner.open.as_ref().expect("set above") {
        Ok(open) => open,
        Err(why) => return Err(refuse(&e, why.clone())),
    };
    if inner.committing || inner.committed {
        return Err(refuse(
            &e,
            "the file was committed by another range meanwhile: send it again (or run this shard \
             again), and it is found held",
        ));
    }
    if let Some((&a, &b)) = inner.claims.range(..r.end).next_back() {
        if b > r.first {
            return Err(refuse(
                &e,
                format!(
                    "blocks {a}..{b} are being received by another session (this range is {}..{})",
                    r.first, r.end
                ),
            ));
        }
    }
    let confirmed = journal.ranges(open.row, open.file_id, false)?;
    let mut again = false;
    for c in &confirmed {
        if (c.first, c.end) == (r.first, r.end) {
            again = true;
        } else if c.first < r.end && r.first < c.end {
            return Err(refuse(
                &e,
                format!(
                    "blocks {}..{} were confirmed as another range of this split (this range is {}..{})",
                    c.first, c.end, r.first, r.end
                ),
            ));
        }
    }
    if inner.claims.len() + confirmed.len() - usize::from(again) >= MAX_RANGES {
        return Err(refuse(&e, format!("more than {MAX_RANGES} ranges")));
    }
    let partial = open
        .template
        .share()
        .map_err(|err| TransferError::Destination {
            path: e.path.to_string(),
            source: err,
        })?;
    let (row, file_id) = (open.row, open.file_id);
    inner.claims.insert(r.first, r.end);
    drop(inner);
    let claim = Claim {
        file: Arc::clone(&file),
        first: r.first,
        live: true,
    };
    let mut inc = Incoming::fresh(e, mode, Some(partial), row);
    inc.range = Some(RangeIn {
        range: r,
        claim: Some(claim),
        file_id,
    });
    inc.verify = open_stage(&inc, super::begin::partial_reread(&inc), opts)?;
    let records = journal.blocks_in(row, r.first, r.end)?;
    let list = reverify_held(&mut inc, records, buf)?;
    if again {
        // Received again: only a session that finishes confirms it. Last,
        // after everything that may refuse the range (its claim, live
        // since, keeps any commit out meanwhile).
        let mut inner = file.lock();
        journal.unconfirm_range(row, r.first)?;
        inner.known.remove(&r.first);
    }
    let holding = if list.is_empty() {
        Holding::Nothing
    } else {
        Holding::Blocks(list)
    };
    Ok((inc, holding))
}

/// The first session of a split file opens (and locks) its partial file
/// and starts its journal row, or goes on with the row an earlier run of
/// the same split left: then the ranges confirmed are trusted only as far
/// as they are known to be true (see [`recheck_confirmed`]). Returns the
/// open file and the confirmed ranges known to be true of it.
fn open_split(
    dest: &Destination,
    journal: &Journal,
    opts: &ReceiveOptions,
    e: &Entry,
    split: [u8; 16],
    quiet: Option<Quiet>,
) -> Result<(Open, Known), TransferError> {
    let profile = &*opts.profile;
    let template = profile.time(Stage::Create, || dest.partial(&e.path, e.size))?;
    let file_id = template
        .file_id()
        .map_err(|err| TransferError::Destination {
            path: e.path.to_string(),
            source: err,
        })?;
    let session = opts.session.map(|s| s.0);
    let row = journal.lookup(e.path.as_bytes())?.filter(|row| {
        !row.done
            && row.split == Some(split)
            && row.size == e.size
            && (row.mtime_sec, row.mtime_nsec) == (e.mtime_sec, e.mtime_nsec)
            && row.block_size == e.block_size
    });
    let (row, known) = match row {
        Some(row) => {
            journal.reopen_as(row.id, session, true)?;
            let _working = opts.working.now();
            let known = recheck_confirmed(journal, row.id, file_id, &template, e, quiet)?;
            (row.id, known)
        }
        None => {
            let id = journal.start(
                e.path.as_bytes(),
                e.size,
                (e.mtime_sec, e.mtime_nsec),
                e.block_size,
                session,
                &e.origin,
            )?;
            journal.set_split(id, split)?;
            journal.flush()?;
            (id, Known::new())
        }
    };
    Ok((
        Open {
            template,
            row,
            file_id,
        },
        known,
    ))
}

/// The ranges an earlier holder of the partial file confirmed are trusted
/// only if the file still holds what they recorded. If the last record of
/// this server knew them, and the partial file is the very version it
/// left (same inode, size and ctime: nobody wrote it since), they are
/// known still. Otherwise each is read back (through the cache) and its
/// blocks' chaining values compared with the recorded ones; a range that
/// differs (the partial file was made anew, even on the same inode, or
/// written by another transfer since) is no longer confirmed, and its
/// blocks are received again. Returns the ranges known to be true.
fn recheck_confirmed(
    journal: &Journal,
    row: i64,
    file_id: (u64, u64),
    partial: &PartialFile,
    e: &Entry,
    quiet: Option<Quiet>,
) -> Result<Known, TransferError> {
    let ranges = journal.ranges(row, file_id, true)?;
    let recorded: Known = ranges.iter().map(known_of).collect();
    if let Some(q) = quiet {
        let same = q.row == row && q.known == digest_of(&recorded);
        if same && Some(q.stamp) == FileStamp::of(partial) {
            return Ok(recorded);
        }
    }
    let bs = u64::from(e.block_size);
    let mut buf = Vec::new();
    let mut known = Known::new();
    for c in ranges {
        buf.resize(bs as usize, 0);
        let Some(mut tree) = Blake3Blocks::new_from(e.size, bs, c.first) else {
            journal.unconfirm_range(row, c.first)?;
            continue;
        };
        let mut readable = true;
        for i in c.first..c.end.min(e.size.div_ceil(bs)) {
            let offset = i * bs;
            let len = (e.size - offset).min(bs) as usize;
            if std::os::unix::fs::FileExt::read_exact_at(partial.file(), &mut buf[..len], offset)
                .is_err()
            {
                readable = false;
                break;
            }
            tree.set(i, &buf[..len]);
        }
        let same = readable
            && tree
                .range_cvs(c.first, c.end)
                .is_some_and(|cvs| cvs.concat() == c.cvs);
        if same {
            let (first, v) = known_of(&c);
            known.insert(first, v);
        } else {
            journal.unconfirm_range(row, c.first)?;
        }
    }
    Ok(known)
}

/// A range of a split file committed already: the range's blocks are read
/// from the final file, and its digests are what the sender checks its
/// source against; the range is unchanged only if the sender then sends
/// no block and its range digest equals the one of these reads. Trusted
/// at the level the file's record says, as a file held whole is.
/// None: the file under its name is not the one committed (gone, or
/// changed): the file is received anew.
fn held_range(
    dest: &Destination,
    e: &Entry,
    r: EntryRange,
    mode: VerifyMode,
    row: &crate::journal::FileRow,
    buf: &mut AlignedBuf,
) -> Result<Option<(Incoming, Holding)>, TransferError> {
    let Some(file) = dest.open_final(&e.path).filter(|f| unchanged_since(f, e)) else {
        return Ok(None);
    };
    // A row recorded without its BLAKE3 (an older build) cannot say which
    // version of the file its held ranges are of: received again.
    let Some(recorded) = row.digest else {
        return Ok(None);
    };
    if e.flags & Entry::REVERIFY != 0 || row.verified.level < mode.level() {
        return Err(refuse(
            e,
            format!(
                "the file was committed from its ranges at level {}; one range of it cannot be \
                 re-verified alone (--reverify, or a mode aiming higher): send the file whole \
                 (intact send --spread never, which re-verifies it in place), or make a new plan",
                row.verified.level
            ),
        ));
    }
    let stamp = Stamp::of(&file).map_err(|err| TransferError::Destination {
        path: e.path.to_string(),
        source: err,
    })?;
    let mut inc = Incoming::fresh(e.clone(), mode, None, row.id);
    let bs = u64::from(inc.entry.block_size);
    let size = inc.entry.size;
    if buf.len() < bs as usize {
        *buf = AlignedBuf::new(bs as usize);
    }
    let mut list = Vec::with_capacity((r.end - r.first) as usize);
    for index in r.first..r.end {
        let offset = index * bs;
        let len = (size - offset).min(bs) as usize;
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut buf[..len], offset)
            .map_err(inc.path_err())?;
        let d = hash(defaults::BLOCK_ALGORITHM, &buf[..len]);
        inc.whole.add(index, &buf[..len]);
        inc.verified.set(index as usize, Some(d));
        inc.held.trust(index, len as u64, row.verified);
        list.push((index, d.as_bytes().to_vec()));
    }
    inc.whole.held = Some(HeldWhole {
        digest: recorded,
        trusted: Some(row.verified),
        stamp,
    });
    inc.range = Some(RangeIn {
        range: r,
        claim: None,
        file_id: (0, 0),
    });
    Ok(Some((inc, Holding::Blocks(list))))
}
