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
//! its lock, and a whole-file transfer of the path is still kept out),
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

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use intact_digest::{defaults, hash, AlignedBuf, Blake3Blocks};
use intact_proto::{
    range_digest, Entry, EntryRange, FileResult, Holding, Message, MAX_STATUS_BLOCKS,
};

use super::begin::{open_stage, unchanged_since};
use super::commit::{below_required, failed, still_held, verified};
use super::resume::reverify_held;
use super::{Incoming, ReceiveOptions, Session};
use crate::dest::{Destination, Mtime, PartialFile};
use crate::journal::{unix_now, DoneFile, Journal, RangeRecord, VerifiedAt};
use crate::net::whole_digest::{HeldWhole, Stamp};
use crate::profile::Stage;
use crate::verify::{VerifyLevel, VerifyMode};
use crate::TransferError;

/// Most claims and confirmed ranges one split file may have at once.
pub const MAX_RANGES: usize = 4096;

/// The smallest block size a split file may have.
pub const MIN_SPLIT_BLOCK: u32 = 4096;

/// The split files being received, per destination root and path (shared
/// by the clones of one server's receive options).
#[derive(Clone, Default)]
pub struct Splits(Arc<Mutex<HashMap<SplitKey, Weak<SplitFile>>>>);

/// (root device, root inode, path).
type SplitKey = (u64, u64, Vec<u8>);

/// One split file being received.
pub(super) struct SplitFile {
    id: [u8; 16],
    size: u64,
    mtime: (i64, u32),
    block: u32,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Set by the first session to join: the locked partial file, its
    /// journal row, its (device, inode); or why it could not be.
    open: Option<Result<Open, String>>,
    /// Live claims: first block → end.
    claims: BTreeMap<u64, u64>,
    committing: bool,
    committed: bool,
}

struct Open {
    template: PartialFile,
    row: i64,
    file_id: (u64, u64),
}

/// A session's claim on blocks `first..end` of a split file; dropped (the
/// session's file ended, failed, or its connection went), the blocks are
/// free to be claimed again.
pub(super) struct Claim {
    file: Arc<SplitFile>,
    first: u64,
    /// Still in the file's claims (a confirmed range's claim is released
    /// inside the critical section that confirms it).
    live: bool,
}

impl Claim {
    fn release(&mut self, inner: &mut Inner) {
        if std::mem::take(&mut self.live) {
            inner.claims.remove(&self.first);
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if self.live {
            let file = Arc::clone(&self.file);
            self.release(&mut file.lock());
        }
    }
}

impl SplitFile {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every change under it is a plain field update: a panic leaves
        // it consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The range of an incoming file that is one range of a split file.
pub(super) struct RangeIn {
    pub(super) range: EntryRange,
    /// None: the file was committed already, and the range is answered
    /// from the final file.
    claim: Option<Claim>,
    row: i64,
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
    if !matches!(
        mode,
        VerifyMode::None | VerifyMode::Block | VerifyMode::Fiver | VerifyMode::Riva
    ) {
        return Err(refuse(
            e,
            format!(
                "verify {mode} cannot verify one range of a file (use riva, block, fiver or none)"
            ),
        ));
    }
    if !e.block_size.is_power_of_two() || e.block_size < MIN_SPLIT_BLOCK {
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
    let file = {
        let mut map = opts.splits.0.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, w| w.strong_count() > 0);
        match map.get(&key).and_then(Weak::upgrade) {
            Some(f) => f,
            None => {
                let f = Arc::new(SplitFile {
                    id: r.split,
                    size: e.size,
                    mtime: (e.mtime_sec, e.mtime_nsec),
                    block: e.block_size,
                    inner: Mutex::new(Inner::default()),
                });
                map.insert(key, Arc::downgrade(&f));
                f
            }
        }
    };
    if (file.id, file.size, file.mtime, file.block)
        != (r.split, e.size, (e.mtime_sec, e.mtime_nsec), e.block_size)
    {
        return Err(refuse(
            &e,
            "being received as part of another split (another plan, or the file changed since this plan)",
        ));
    }
    let mut inner = file.lock();
    if inner.open.is_none() {
        inner.open = Some(open_split(dest, journal, opts, &e, r.split).map_err(|e| e.to_string()));
    }
    let open = match inner.open.as_ref().expect("set above") {
        Ok(open) => open,
        Err(why) => return Err(refuse(&e, why.clone())),
    };
    if inner.committing || inner.committed {
        return Err(refuse(
            &e,
            "the file was committed by another range meanwhile: run this shard again",
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
    if again {
        // Received again: only a session that finishes confirms it.
        journal.unconfirm_range(open.row, r.first)?;
    }
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
        row,
        file_id,
    });
    inc.verify = open_stage(&inc, inc.partial.as_ref().map(|p| p.file()), opts)?;
    let records = journal.blocks_in(row, r.first, r.end)?;
    let list = reverify_held(&mut inc, records, buf)?;
    let holding = if list.is_empty() {
        Holding::Nothing
    } else {
        Holding::Blocks(list)
    };
    Ok((inc, holding))
}

/// The first session of a split file opens (and locks) its partial file
/// and starts its journal row, or goes on with the row an earlier run of
/// the same split left.
fn open_split(
    dest: &Destination,
    journal: &Journal,
    opts: &ReceiveOptions,
    e: &Entry,
    split: [u8; 16],
) -> Result<Open, TransferError> {
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
    let row = match row {
        Some(row) => {
            journal.reopen_as(row.id, session, true)?;
            let _working = opts.working.now();
            recheck_confirmed(journal, row.id, file_id, &template, e)?;
            row.id
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
            id
        }
    };
    Ok(Open {
        template,
        row,
        file_id,
    })
}

/// The ranges an earlier holder of the partial file confirmed are trusted
/// only if the file still holds what they recorded: each is read back
/// (through the cache) and its blocks' chaining values compared with the
/// recorded ones; a range that differs (the partial file was made anew,
/// even on the same inode, or written by another transfer since) is no
/// longer confirmed, and its blocks are received again.
fn recheck_confirmed(
    journal: &Journal,
    row: i64,
    file_id: (u64, u64),
    partial: &PartialFile,
    e: &Entry,
) -> Result<(), TransferError> {
    let bs = u64::from(e.block_size);
    let mut buf = vec![0u8; bs as usize];
    for c in journal.ranges(row, file_id, true)? {
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
        if !same {
            journal.unconfirm_range(row, c.first)?;
        }
    }
    Ok(())
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
    if e.flags & Entry::REVERIFY != 0 || row.verified.level < mode.level() {
        return Err(refuse(
            e,
            format!(
                "the file was committed from its ranges at level {}; one range of it cannot be \
                 re-verified alone (--reverify, or a mode aiming higher): send the file whole, \
                 or make a new plan",
                row.verified.level
            ),
        ));
    }
    let Some(file) = dest.open_final(&e.path).filter(|f| unchanged_since(f, e)) else {
        return Ok(None);
    };
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
        digest: [0; 32],
        trusted: Some(row.verified),
        stamp,
    });
    inc.range = Some(RangeIn {
        range: r,
        claim: None,
        row: row.id,
        file_id: (0, 0),
    });
    Ok(Some((inc, Holding::Blocks(list))))
}

/// The range digest of the blocks `f` holds of its range (None: a block's
/// part is missing, which never happens to a range whose blocks all
/// verified).
fn range_digest_of(f: &Incoming, r: &EntryRange) -> Option<([u8; 32], Vec<[u8; 32]>)> {
    let cvs = f.whole.tree()?.range_cvs(r.first, r.end)?;
    let d = range_digest(
        f.entry.size,
        u64::from(f.entry.block_size),
        r.first,
        r.end,
        &cvs,
    );
    Some((d, cvs))
}

/// Whether confirmed ranges cover blocks `0..n` exactly; else the first
/// blocks they leave out.
fn gap(ranges: &[RangeRecord], n: u64) -> Option<(u64, u64)> {
    let mut at = 0;
    for r in ranges {
        if r.first != at {
            return Some((at, r.first.min(n)));
        }
        at = r.end;
    }
    (at != n).then_some((at, n))
}

impl Session<'_> {
    /// FileEnd of a range whose every block verified: its range digest is
    /// compared with the sender's, then it is confirmed, and the session
    /// that completes the file commits it.
    pub(super) fn end_range(&mut self, file: u64, mut f: Incoming) -> Result<(), TransferError> {
        let path = f.entry.path.to_string();
        let range_in = f.range.take().expect("a range");
        let r = range_in.range;
        let Some((ours, cvs)) = range_digest_of(&f, &r) else {
            return self.range_failed(file, f, "a block's part of the range digest is missing");
        };
        if let Err(why) = f.whole.confirm(ours) {
            return self.range_failed(file, f, &format!("range {}..{}: {why}", r.first, r.end));
        }
        let Some(mut claim) = range_in.claim else {
            return self.end_held_range(file, f, &r);
        };
        let reached = f.reached();
        if let Some(want) = super::required_level(f.entry.flags).filter(|w| reached.level < *w) {
            let msg = below_required(&reached, want);
            return self.range_failed(file, f, &msg);
        }
        let synced = f
            .partial
            .as_ref()
            .expect("a claimed range has its partial file")
            .file()
            .sync_data();
        if let Err(err) = synced {
            return self.range_failed(file, f, &format!("{path}: {err}"));
        }
        let record = RangeRecord {
            first: r.first,
            end: r.end,
            verified: f.verified_at(reached.level),
            file_id: range_in.file_id,
            cvs: cvs.concat(),
        };
        let n = blocks_of(&f.entry);
        let split = Arc::clone(&claim.file);
        // Confirmed, the claim dropped and the ranges read back in one
        // critical section: of two ranges ending at once, the second sees
        // the first's confirmation and no claim.
        let decided = {
            let mut inner = split.lock();
            let ranges = self
                .journal
                .confirm_range(range_in.row, &record, &f.unjournaled);
            claim.release(&mut inner);
            ranges.map(|ranges| {
                let gap = gap(&ranges, n);
                let commit = gap.is_none() && inner.claims.is_empty() && !inner.committing;
                inner.committing |= commit;
                (gap, commit, ranges)
            })
        };
        drop(claim);
        let (gap, commit, ranges) = match decided {
            Ok(d) => d,
            Err(e) => return self.range_failed(file, f, &e.to_string()),
        };
        f.unjournaled.clear();
        f.unjournaled_bytes = 0;
        let mut result = FileResult {
            split: FileResult::SPLIT_WAITING,
            ..verified(file, reached.level, "")
        };
        let why_below = reached
            .note
            .as_deref()
            .filter(|_| reached.level < f.mode.level())
            .map(|n| format!(" (range at level {}: {n})", reached.level))
            .unwrap_or_default();
        if !commit {
            result.message = match gap {
                Some((a, b)) => format!(
                    "range {}..{} verified; the file is committed when blocks {a}..{b} have verified too",
                    r.first, r.end
                ),
                None => format!(
                    "range {}..{} verified; another range is being received or committed",
                    r.first, r.end
                ),
            };
            result.message.push_str(&why_below);
            self.summary.verified += 1;
            self.out.put(Message::FileResult(result))?;
            return Ok(());
        }
        // The file's level is the lowest of its ranges': what a shard's
        // --require-level asks of it, and what the committing range says.
        let level = ranges
            .iter()
            .map(|r| r.verified.level)
            .min()
            .unwrap_or(VerifyLevel::None);
        let required = super::required_level(f.entry.flags).filter(|w| level < *w);
        let committed = match required {
            Some(want) => Err(format!(
                "every range verified, but the file would be committed at level {level} \
                 (its lowest range's), and --require-level {want} was asked for: not committed"
            )),
            None => {
                let _working = self.opts.working.now();
                self.commit_split(&mut f, range_in.row, range_in.file_id, n)
            }
        };
        {
            let mut inner = split.lock();
            inner.committing = false;
            inner.committed = committed.is_ok();
            if let (Err(why), None) = (&committed, required) {
                // Renamed or not, its partial file is written no more by
                // this record: the next range opens it afresh.
                inner.open = Some(Err(why.clone()));
            }
        }
        match committed {
            Ok(level) => {
                result.level = level.wire_id();
                result.split = FileResult::SPLIT_COMMITTED;
                result.message = format!(
                    "range {}..{} verified; with it all {} ranges: the file is committed at level {level}",
                    r.first,
                    r.end,
                    ranges.len()
                );
                result.message.push_str(&why_below);
                self.summary.verified += 1;
                self.out.put(Message::FileResult(result))?;
            }
            Err(why) => {
                self.summary.fail(&path, &why);
                self.out.put(failed(file, &why))?;
            }
        }
        Ok(())
    }

    /// Commits a split file whose confirmed `ranges` cover it: its BLAKE3
    /// composed from their chaining values, its level the lowest of
    /// theirs. Returns that level, or why it was not committed.
    fn commit_split(
        &mut self,
        f: &mut Incoming,
        row: i64,
        file_id: (u64, u64),
        n: u64,
    ) -> Result<VerifyLevel, String> {
        let ranges = self
            .journal
            .ranges(row, file_id, true)
            .map_err(|e| e.to_string())?;
        if gap(&ranges, n).is_some() {
            return Err("the confirmed ranges no longer cover the file: not committed".into());
        }
        let bs = u64::from(f.entry.block_size);
        let cvs: Vec<[u8; 32]> = ranges
            .iter()
            .flat_map(|r| r.cvs.chunks_exact(32))
            .map(|c| <[u8; 32]>::try_from(c).expect("chunks of 32"))
            .collect();
        let digest = Blake3Blocks::from_cvs(f.entry.size, bs, cvs)
            .and_then(|t| t.finalize())
            .ok_or("the confirmed ranges' chaining values do not make the file")?;
        let level = ranges
            .iter()
            .map(|r| r.verified.level)
            .min()
            .unwrap_or(VerifyLevel::None);
        let at = ranges.iter().map(|r| r.verified.at).min().unwrap_or(0);
        let partial = f.partial.take().ok_or("no partial file")?;
        let mtime = Mtime {
            sec: f.entry.mtime_sec,
            nsec: f.entry.mtime_nsec,
        };
        let profile = &self.opts.profile;
        let results = profile.time(Stage::Commit, || {
            self.dest.commit_batch(vec![(partial, f.entry.mode, mtime)])
        });
        for r in results {
            r.map_err(|e| e.to_string())?;
        }
        let done = DoneFile {
            row: f.row,
            blocks: Vec::new(),
            verified: VerifiedAt {
                mode: f.mode,
                level,
                at: at.min(unix_now()),
            },
            digest: *digest.as_bytes(),
        };
        // The file is durable and verified under its name; a journal
        // failure only means a later send may move it again.
        let _ = profile.time(Stage::Journal, || self.journal.done_batch(&[done]));
        Ok(level)
    }

    /// FileEnd of a range of a committed file that the sender sent no
    /// block of, whose range digest matched the blocks read from it.
    fn end_held_range(
        &mut self,
        file: u64,
        f: Incoming,
        r: &EntryRange,
    ) -> Result<(), TransferError> {
        let held = f.whole.held.expect("a held range");
        if let Err(why) = still_held(self.dest, &f.entry.path, &held) {
            return self.range_failed(file, f, &why);
        }
        let v = held.trusted.expect("trusted");
        self.summary.verified += 1;
        self.out.put(Message::FileResult(FileResult {
            unchanged: true,
            trusted: f.held.trusted_bytes(),
            trusted_level: v.level.wire_id(),
            trusted_at: v.at,
            split: FileResult::SPLIT_HELD,
            ..verified(
                file,
                v.level,
                &format!(
                    "range {}..{} of the committed file is unchanged",
                    r.first, r.end
                ),
            )
        }))?;
        Ok(())
    }

    /// A range that does not confirm: what verified stays journaled.
    fn range_failed(&mut self, file: u64, mut f: Incoming, why: &str) -> Result<(), TransferError> {
        if f.partial.is_some() {
            let _ = f.journal(self.journal, &self.opts.profile);
        }
        self.summary.fail(&f.entry.path.to_string(), why);
        self.out.put(failed(file, why))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(first: u64, end: u64) -> RangeRecord {
        RangeRecord {
            first,
            end,
            verified: VerifiedAt::now(VerifyMode::Riva, VerifyLevel::Device),
            file_id: (0, 0),
            cvs: Vec::new(),
        }
    }

    #[test]
    fn ranges_cover_a_file_only_without_gaps() {
        assert_eq!(gap(&[], 4), Some((0, 4)));
        assert_eq!(gap(&[rec(0, 2), rec(2, 4)], 4), None);
        assert_eq!(gap(&[rec(0, 2)], 4), Some((2, 4)));
        assert_eq!(gap(&[rec(2, 4)], 4), Some((0, 2)));
        assert_eq!(gap(&[rec(0, 1), rec(2, 4)], 4), Some((1, 2)));
    }
}
