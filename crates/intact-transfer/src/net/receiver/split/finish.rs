//! The end of one range of a split file: its range digest compared, its
//! confirmation, and the one commit of the file once confirmed ranges
//! cover it.

use std::sync::Arc;

use intact_digest::Blake3Blocks;
use intact_proto::{range_digest, EntryRange, FileResult, Message};

use super::super::commit::{below_required, failed, still_held, verified};
use super::super::{Incoming, Session};
use super::blocks_of;
use super::registry::{known_of, Known};
use crate::dest::Mtime;
use crate::journal::{unix_now, DoneFile, RangeRecord, VerifiedAt};
use crate::profile::Stage;
use crate::verify::VerifyLevel;
use crate::TransferError;

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

/// The lowest level of confirmed ranges, and when the oldest verified
/// (not after now).
fn lowest(ranges: &[RangeRecord]) -> (VerifyLevel, i64) {
    let level = ranges.iter().map(|r| r.verified.level).min();
    let at = ranges.iter().map(|r| r.verified.at).min().unwrap_or(0);
    (level.unwrap_or(VerifyLevel::None), at.min(unix_now()))
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
    pub(in crate::net::receiver) fn end_range(
        &mut self,
        file: u64,
        mut f: Incoming,
    ) -> Result<(), TransferError> {
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
        if let Some(want) =
            super::super::required_level(f.entry.flags).filter(|w| reached.level < *w)
        {
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
            let ranges = self.journal.confirm_range(f.row, &record, &f.unjournaled);
            claim.release(&mut inner);
            ranges.map(|ranges| {
                let (first, v) = known_of(&record);
                inner.known.insert(first, v);
                let gap = gap(&ranges, n);
                let commit = gap.is_none() && inner.claims.is_empty() && !inner.committing;
                inner.committing |= commit;
                (gap, commit, ranges, inner.known.clone())
            })
        };
        drop(claim);
        let (gap, commit, ranges, known) = match decided {
            Ok(d) => d,
            Err(e) => return self.range_failed(file, f, &e.to_string()),
        };
        f.unjournaled.clear();
        f.unjournaled_bytes = 0;
        let mut result = FileResult {
            split: FileResult::SPLIT_WAITING,
            cache_repairs: f.repairs.from_cache,
            cache_micros: f.repairs.cache_micros,
            source_repairs: f.repairs.from_source,
            source_micros: f.repairs.source_micros,
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
        let (level, at) = lowest(&ranges);
        let required = super::super::required_level(f.entry.flags).filter(|w| level < *w);
        let committed = match required {
            Some(want) => Err(format!(
                "every range verified, but the file would be committed at level {level} \
                 (its lowest range's), and --require-level {want} was asked for: not committed"
            )),
            None => {
                let _working = self.opts.working.now();
                let mode = f.mode;
                let verified = VerifiedAt { mode, level, at };
                self.commit_split(&mut f, range_in.file_id, &known, verified)
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
            Ok((level, digest)) => {
                result.level = level.wire_id();
                result.split = FileResult::SPLIT_COMMITTED;
                result.digest = digest.to_vec();
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

    /// Commits a split file whose confirmed ranges (exactly those
    /// `known`) cover it: its BLAKE3 composed from their chaining values,
    /// recorded as `verified` (the lowest of theirs). Returns its level
    /// and BLAKE3, or why it was not committed.
    fn commit_split(
        &mut self,
        f: &mut Incoming,
        file_id: (u64, u64),
        known: &Known,
        verified: VerifiedAt,
    ) -> Result<(VerifyLevel, [u8; 32]), String> {
        let ranges = self
            .journal
            .ranges(f.row, file_id, true)
            .map_err(|e| e.to_string())?;
        // The journal's confirmations must be exactly those this server
        // verified or read back (and they cover the file: the caller saw
        // so): never a chaining value the server does not know to be true.
        if ranges.iter().map(known_of).collect::<Known>() != *known {
            return Err(
                "the journal's confirmed ranges are not those this server verified: not \
                 committed; run one of the file's shards again"
                    .into(),
            );
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
            verified,
            digest: *digest.as_bytes(),
        };
        // The file is durable and verified under its name; a journal
        // failure only means a later send may move it again.
        let _ = profile.time(Stage::Journal, || self.journal.done_batch(&[done]));
        Ok((verified.level, *digest.as_bytes()))
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
            // The digest recorded when the file was committed (held_range
            // answers only rows that have one).
            digest: held.digest.to_vec(),
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
    use crate::verify::VerifyMode;

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
