//! The end of a file: the whole-file digest compared, a file held whole
//! answered, and the ready files committed as one group (one syncfs, one
//! fsync per directory, one journal transaction) with their results.

use intact_digest::AlignedBuf;
use intact_proto::{FileResult, FileStatus, Message, WirePath};

use super::{Incoming, Session, SessionSummary, GROUP_COMMIT_FILES};
use crate::dest::{Destination, Mtime};
use crate::hooks::CommitHook;
use crate::journal::{DoneFile, Journal};
use crate::link::Outbound;
use crate::net::watchdog::Working;
use crate::net::whole_digest::{HeldWhole, Stamp};
use crate::profile::{Profile, Stage};
use crate::verify::{Reached, VerifyLevel};
use crate::TransferError;

impl Session<'_> {
    /// FileEnd of a file held whole under its final name, to which the
    /// sender sent no block: it is unchanged only if the sender's digest of
    /// its source equals the digest held (recorded at its commit, or
    /// computed now from a re-read in place).
    pub(super) fn end_held(
        &mut self,
        file: u64,
        mut f: Incoming,
        held: HeldWhole,
        blocks: u64,
    ) -> Result<(), TransferError> {
        let path = f.entry.path.to_string();
        let checked = if blocks != f.verified.len() as u64 {
            Err("the sender abandoned the file".to_string())
        } else {
            f.whole.confirm(held.digest).map_err(|_| {
                "the sender's digest differs from the file held, and it sent no block: \
                 nothing changed, the file is not reported unchanged"
                    .to_string()
            })
        };
        // A trusted answer goes now; a re-verified file is checked again
        // right before its record is written (at commit).
        let checked = match held.trusted {
            Some(_) => checked.and_then(|()| still_held(self.dest, &f.entry.path, &held)),
            None => checked,
        };
        if let Err(why) = checked {
            self.summary.fail(&path, &why);
            self.out.put(failed(file, &why))?;
            return Ok(());
        }
        let Some(v) = held.trusted else {
            // Re-verified in place now: recorded anew, at this run's level.
            self.ready.push((file, f));
            if self.ready.len() >= GROUP_COMMIT_FILES {
                self.commit()?;
            }
            return Ok(());
        };
        // Trusted at the level its record says, no higher; nothing to record.
        self.summary.verified += 1;
        self.out.put(Message::FileResult(FileResult {
            unchanged: true,
            trusted: f.entry.size,
            trusted_level: v.level.wire_id(),
            trusted_at: v.at,
            ..verified(file, v.level, "")
        }))?;
        Ok(())
    }
}

/// Why a file held whole is not answered or recorded: the version that was
/// checked is no longer the one under its name.
const CHANGED_MEANWHILE: &str = "the file at the destination changed while it was being \
     checked (another transfer committed it, or it was written in place): \
     nothing is reported unchanged; send it again";

/// Whether the final file is still the version `held` was checked on.
pub(super) fn still_held(
    dest: &Destination,
    path: &WirePath,
    held: &HeldWhole,
) -> Result<(), String> {
    match dest.stat_final(path).map(|st| Stamp::of_stat(&st)) {
        Some(now) if now == held.stamp => Ok(()),
        _ => Err(CHANGED_MEANWHILE.to_string()),
    }
}

/// Every block verified: the BLAKE3 of the bytes held (the parts of the
/// blocks written and re-read, or a read of the partial file) must equal
/// the sender's. Err: why the file is not committed.
pub(super) fn whole_digest_matches(f: &mut Incoming, buf: &mut AlignedBuf) -> Result<(), String> {
    let Some(partial) = &f.partial else {
        return Err("no partial file to compare".into());
    };
    let ours = f
        .whole
        .of_file(partial.file(), f.entry.size, buf)
        .map_err(|e| format!("{}: reading it for its digest: {e}", f.entry.path))?;
    f.whole
        .confirm(ours)
        .map_err(|why| format!("{}: {why}", f.entry.path))
}

/// Commits the ready files as one group and sends their results. A file
/// held whole under its final name needs no rename: only its new record.
/// `before_journal` (tests) is called between the renames and the rows.
#[allow(clippy::too_many_arguments)]
pub(super) fn commit_ready(
    out: &mut dyn Outbound,
    dest: &Destination,
    journal: &Journal,
    ready: &mut Vec<(u64, Incoming)>,
    summary: &mut SessionSummary,
    working: &Working,
    profile: &Profile,
    before_journal: Option<&CommitHook>,
) -> Result<(), TransferError> {
    if ready.is_empty() {
        return Ok(());
    }
    // Files to rename, in the same order in all three: (id, path,
    // result), their records, and what the commit needs.
    let mut meta = Vec::with_capacity(ready.len());
    let mut records = Vec::with_capacity(ready.len());
    let mut batch = Vec::with_capacity(ready.len());
    let mut in_place = Vec::new();
    for (id, mut f) in ready.drain(..) {
        let mtime = Mtime {
            sec: f.entry.mtime_sec,
            nsec: f.entry.mtime_nsec,
        };
        let reached = f.reached();
        let mut result = FileResult {
            unchanged: f.partial.is_none(),
            reverified: f.held.reverified_bytes(),
            trusted: f.held.trusted_bytes(),
            trusted_level: f.held.trusted_level().map_or(0, VerifyLevel::wire_id),
            trusted_at: f.held.trusted_at().unwrap_or(0),
            cache_repairs: f.repairs.from_cache,
            cache_micros: f.repairs.cache_micros,
            source_repairs: f.repairs.from_source,
            source_micros: f.repairs.source_micros,
            ..verified(id, reached.level, reached.note.as_deref().unwrap_or(""))
        };
        if let Some(r) = f.verify.block_reread() {
            result.resident = r.stats.resident;
            result.evict_micros = r.stats.evict.as_micros() as u64;
            result.check_micros = r.check.as_micros() as u64;
            profile.add(Stage::Verify, r.check);
            if !r.stats.evict.is_zero() {
                profile.add(Stage::Evict, r.stats.evict);
            }
        }
        let Some(digest) = f.whole.confirmed else {
            // Only a file whose digest was compared is ever made ready.
            let why = "the whole-file digest was not compared: not committed";
            summary.fail(&f.entry.path.to_string(), why);
            out.put(failed(id, why))?;
            continue;
        };
        let record = DoneFile {
            row: f.row,
            blocks: std::mem::take(&mut f.unjournaled),
            verified: f.verified_at(reached.level),
            digest,
        };
        match f.partial.take() {
            Some(partial) => {
                meta.push((id, f.entry.path.to_string(), result));
                records.push(record);
                batch.push((partial, f.entry.mode, mtime));
            }
            None => in_place.push((id, f.entry.path.clone(), f.whole.held, record, result)),
        }
    }
    // A file answered from what it held is recorded only if it is still
    // the version that was checked (another transfer may have committed
    // over it meanwhile).
    let (in_place, moved): (Vec<_>, Vec<_>) =
        in_place.into_iter().partition(|(_, path, held, _, _)| {
            held.as_ref()
                .is_some_and(|h| still_held(dest, path, h).is_ok())
        });
    for (id, path, _, _, _) in moved {
        summary.fail(&path.to_string(), CHANGED_MEANWHILE);
        out.put(failed(id, CHANGED_MEANWHILE))?;
    }
    // Each path stays this session's until its row is written below (the
    // partial files themselves are gone once committed).
    let claims: Vec<_> = batch.iter().map(|(p, _, _)| p.claim()).collect();
    let results = {
        let _working = working.now();
        profile.time(Stage::Commit, || dest.commit_batch(batch))
    };
    if let Some(hook) = before_journal {
        let named: Vec<String> = meta
            .iter()
            .zip(&results)
            .filter(|(_, r)| r.is_ok())
            .map(|((_, path, _), _)| path.clone())
            .collect();
        hook(&named);
    }
    let mut done: Vec<DoneFile> = records
        .into_iter()
        .zip(&results)
        .filter(|(_, r)| r.is_ok())
        .map(|(record, _)| record)
        .collect();
    let mut answered = Vec::with_capacity(in_place.len());
    for (id, _, _, record, result) in in_place {
        done.push(record);
        answered.push(((id, String::new(), result), Ok(())));
    }
    // A journal failure does not undo a durable, verified file; it only
    // means a later send may move it again.
    let _ = profile.time(Stage::Journal, || journal.done_batch(&done));
    drop(claims);
    let outcomes = meta.into_iter().zip(results).chain(answered);
    for ((id, path, result), r) in outcomes {
        let msg = match r {
            Ok(()) => {
                summary.verified += 1;
                Message::FileResult(result)
            }
            Err(e) => {
                summary.fail(&path, &e.to_string());
                failed(id, &e.to_string())
            }
        };
        out.put(msg)?;
    }
    Ok(())
}

/// Why a file below `--require-level want` fails.
pub(super) fn below_required(reached: &Reached, want: VerifyLevel) -> String {
    format!(
        "reached level {}, but --require-level {want} was asked for: {}",
        reached.level,
        reached.note.as_deref().unwrap_or("")
    )
}

/// A verified result at `level` with `note`.
pub(super) fn verified(file: u64, level: VerifyLevel, note: &str) -> FileResult {
    FileResult {
        file,
        status: FileStatus::Verified,
        level: level.wire_id(),
        message: note.to_string(),
        resident: 0,
        evict_micros: 0,
        check_micros: 0,
        unchanged: false,
        reverified: 0,
        trusted: 0,
        trusted_level: 0,
        trusted_at: 0,
        split: 0,
        cache_repairs: 0,
        cache_micros: 0,
        source_repairs: 0,
        source_micros: 0,
        digest: Vec::new(),
    }
}

/// The result of an entry that holds no data to verify (a directory, a
/// symlink): done, at level none, with why if there is more to say.
pub(super) fn verified_because(file: u64, why: &str) -> Message {
    Message::FileResult(verified(file, VerifyLevel::None, why))
}

pub(super) fn failed(file: u64, why: &str) -> Message {
    Message::FileResult(FileResult {
        status: FileStatus::Failed,
        ..verified(file, VerifyLevel::None, why)
    })
}
