//! One file being received: its entry, its partial file, its verify
//! stage, what verified, what was held from an earlier run, and what is
//! yet to be journaled.

use std::collections::{HashMap, HashSet};

use intact_proto::Entry;

use super::digests::BlockDigests;
use crate::dest::PartialFile;
use crate::journal::{unix_now, BlockRecord, Journal, VerifiedAt};
use crate::net::bounds::Slot;
use crate::net::whole_digest::WholeDigest;
use crate::profile::{Profile, Stage};
use crate::stage::verify::{stage_without_file, VerifyStage};
use crate::verify::{Reached, VerifyLevel, VerifyMode};
use crate::TransferError;
use intact_digest::Digest;

pub(super) struct Incoming {
    pub(super) entry: Entry,
    pub(super) mode: VerifyMode,
    /// The partial file; None while the file is held whole under its final
    /// name and no block has come for it.
    pub(super) partial: Option<PartialFile>,
    /// What proves a written block (chosen from the mode).
    pub(super) verify: Box<dyn VerifyStage>,
    /// Blocks at the verifier now.
    pub(super) checking: u32,
    /// The sender's FileEnd, held while blocks are still at the verifier.
    pub(super) ended: Option<u64>,
    /// Per block: the digest it verified against, once it has.
    pub(super) verified: BlockDigests,
    pub(super) rounds: u32,
    /// The file's journal row.
    pub(super) row: i64,
    /// Verified blocks not yet in the journal, and their bytes.
    pub(super) unjournaled: Vec<BlockRecord>,
    pub(super) unjournaled_bytes: u64,
    /// What the bytes held from an earlier run contributed.
    pub(super) held: Held,
    /// The level the sender's reads of the source reached (its FileEnd).
    pub(super) source_level: Option<VerifyLevel>,
    /// The whole-file BLAKE3 of the bytes held, checked at FileEnd.
    pub(super) whole: WholeDigest,
    /// What the file holds of the stream's and the server's limits.
    pub(super) slot: Option<Slot>,
    /// Blocks whose bad pages this receiver named (a BlockResult with
    /// pages): only they may be answered with a patch of pages.
    pub(super) awaiting_pages: HashSet<u64>,
    /// Blocks a recovery cache may repair, and what it did.
    pub(super) repairs: super::repair::Repairs,
    /// One range of a split file (see `split.rs`); None: the whole file.
    pub(super) range: Option<super::split::RangeIn>,
}

/// Blocks a file already held when this run began: re-verified in place,
/// or trusted from the journal at the level it records. A held block the
/// sender replaces (its source changed) is forgotten here.
#[derive(Debug, Default, Clone)]
pub(super) struct Held {
    /// Per block: its length, and the record it was trusted on (None:
    /// re-verified in place in this run).
    pub(super) blocks: HashMap<u64, (u64, Option<VerifiedAt>)>,
}

impl Held {
    pub(super) fn trust(&mut self, index: u64, bytes: u64, v: VerifiedAt) {
        self.blocks.insert(index, (bytes, Some(v)));
    }

    pub(super) fn reverified(&mut self, index: u64, bytes: u64) {
        self.blocks.insert(index, (bytes, None));
    }

    pub(super) fn forget(&mut self, index: u64) {
        self.blocks.remove(&index);
    }

    pub(super) fn reverified_bytes(&self) -> u64 {
        self.blocks
            .values()
            .filter(|(_, v)| v.is_none())
            .map(|(n, _)| n)
            .sum()
    }

    pub(super) fn trusted_bytes(&self) -> u64 {
        self.blocks
            .values()
            .filter(|(_, v)| v.is_some())
            .map(|(n, _)| n)
            .sum()
    }

    /// The lowest level recorded for a trusted block.
    pub(super) fn trusted_level(&self) -> Option<VerifyLevel> {
        self.blocks
            .values()
            .filter_map(|(_, v)| v.map(|v| v.level))
            .min()
    }

    /// When the oldest trusted block was verified.
    pub(super) fn trusted_at(&self) -> Option<i64> {
        self.blocks
            .values()
            .filter_map(|(_, v)| v.map(|v| v.at))
            .min()
    }
}

impl Incoming {
    /// Makes the verified data durable, then records it.
    pub(super) fn journal(
        &mut self,
        journal: &Journal,
        profile: &Profile,
    ) -> Result<(), TransferError> {
        if self.unjournaled.is_empty() {
            return Ok(());
        }
        if self.partial.as_ref().is_some_and(PartialFile::is_unnamed) {
            // Its bytes end with this transfer unless it is committed: a
            // record now would name blocks nothing may hold. Its blocks
            // stay for the commit's record (`DoneFile`).
            return Ok(());
        }
        let _timed = profile.timer(Stage::Journal);
        if let Some(partial) = &self.partial {
            partial
                .file()
                .sync_data()
                .map_err(|e| TransferError::Destination {
                    path: self.entry.path.to_string(),
                    source: e,
                })?;
        }
        journal.add_blocks(self.row, &self.unjournaled)?;
        self.unjournaled.clear();
        self.unjournaled_bytes = 0;
        Ok(())
    }

    /// The level the receiver's end reached for this file: the mode's aim,
    /// lowered by every re-read that did not reach the device and by the
    /// recorded level of every trusted block.
    pub(super) fn reached(&self) -> Reached {
        let mut r = Reached::aim(self.mode);
        self.verify.lower(&mut r);
        if let Some(level) = self.source_level {
            r.lower(level.as_source_cap(), crate::verify::source_cap_note(level));
        }
        if let Some(level) = self.held.trusted_level() {
            r.lower(
                level,
                format!(
                    "{} bytes were trusted from the journal, where they are recorded at level {level}",
                    self.held.trusted_bytes()
                ),
            );
        }
        if r.note.is_none() {
            // `flash` says which window it waited for even at its aim.
            r.note = self.verify.statement();
        }
        r
    }

    /// The level of a block checked on arrival (its digest against the
    /// bytes received), before any re-read.
    pub(super) fn arrival_level(&self) -> VerifyLevel {
        if self.verify.checks_arrival() {
            VerifyLevel::Network
        } else {
            VerifyLevel::None
        }
    }

    /// How the file as a whole was verified, for the journal.
    pub(super) fn verified_at(&self, level: VerifyLevel) -> VerifiedAt {
        let now = unix_now();
        VerifiedAt {
            mode: self.mode,
            level,
            at: self.held.trusted_at().map_or(now, |t| t.min(now)),
        }
    }
}

impl Incoming {
    /// A file with nothing verified yet.
    pub(super) fn fresh(
        entry: Entry,
        mode: VerifyMode,
        partial: Option<PartialFile>,
        row: i64,
    ) -> Incoming {
        let blocks = entry.size.div_ceil(u64::from(entry.block_size)) as usize;
        // A range keeps state for its own blocks only (admission charged
        // only those).
        let first = entry.range.map_or(0, |r| r.first);
        Incoming {
            whole: WholeDigest::new_from(entry.size, entry.block_size, first),
            verified: BlockDigests::range(blocks, usize::try_from(first).unwrap_or(usize::MAX)),
            entry,
            mode,
            partial,
            verify: stage_without_file(mode),
            checking: 0,
            ended: None,
            rounds: 0,
            row,
            unjournaled: Vec::new(),
            unjournaled_bytes: 0,
            held: Held::default(),
            source_level: None,
            slot: None,
            awaiting_pages: HashSet::new(),
            repairs: Default::default(),
            range: None,
        }
    }

    /// A held block re-verified in place at `level`: verified, counted,
    /// and recorded anew; returns its (index, digest) for the Status.
    pub(super) fn reverified_in_place(
        &mut self,
        index: u64,
        len: usize,
        d: Digest,
        level: VerifyLevel,
    ) -> (u64, Vec<u8>) {
        self.verified.set(index as usize, Some(d));
        self.held.reverified(index, len as u64);
        self.unjournaled.push(BlockRecord {
            index,
            digest: d.as_bytes().to_vec(),
            verified: VerifiedAt::now(self.mode, level),
            // The journal keeps the page CRCs it has for this block while
            // its digest stays the same (see Journal::add_blocks).
            pages: None,
        });
        (index, d.as_bytes().to_vec())
    }

    /// The blocks this entry sends: its range's, or the whole file's.
    pub(super) fn expected_blocks(&self) -> u64 {
        self.range
            .as_ref()
            .map_or(self.verified.len() as u64, |r| r.blocks())
    }

    /// Whether block `index` is one this entry sends.
    pub(super) fn sends_block(&self, index: u64) -> bool {
        self.range
            .as_ref()
            .map_or(index < self.verified.len() as u64, |r| r.contains(index))
    }

    /// Turns an I/O error on this file into a destination error.
    pub(super) fn path_err(&self) -> impl Fn(std::io::Error) -> TransferError + '_ {
        |err| TransferError::Destination {
            path: self.entry.path.to_string(),
            source: err,
        }
    }
}
