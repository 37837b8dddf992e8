//! What a run reports: one [`FileReport`] per entry and the run's
//! [`CopyReport`], the same for `intact copy` and `intact send` (both run
//! the one sender half, which builds them from the receiver's answers).

use std::time::Instant;

use intact_cache::ReadPath;

use crate::source::{SourceEntry, SourceKind};
use crate::verify::{VerifyLevel, VerifyMode};
use crate::TransferError;

/// What happened to one entry.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FileReport {
    /// Destination path, relative to the root.
    pub path: String,
    /// "file", "dir" or "symlink".
    pub kind: &'static str,
    /// Bytes.
    pub size: u64,
    /// BLAKE3 of the file as read for the transfer, in every mode: the
    /// digest the receiver compared with the bytes it holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// How the source's whole-file digest was obtained (this run's
    /// reads, read now to compare with a file the server held whole, or
    /// the source-digest cache and when it was recorded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_digest: Option<crate::SourceDigest>,
    /// Blocks the file was cut into.
    pub blocks: u64,
    /// Blocks sent again after failing verification (whole, or only the
    /// pages the receiver found bad).
    pub blocks_resent: u64,
    /// Pages (4 KiB) sent alone in those resends: where the receiver named
    /// the bad pages of a block, only they crossed the wire again. A block
    /// resent whole counts none here.
    pub pages_resent: u64,
    /// Blocks that failed a check at the receiver and were repaired from
    /// its recovery cache (`intact serve --recovery-cache`), not sent again.
    pub blocks_from_cache: u64,
    /// Seconds from those blocks' failures to their verified repairs.
    pub cache_seconds: f64,
    /// Blocks that failed a check at the receiver and were repaired by
    /// this sender (whole or only their bad pages).
    pub blocks_from_source: u64,
    /// Seconds from those blocks' failures to their verified repairs, as
    /// the receiver measured them.
    pub source_repair_seconds: f64,
    /// Blocks not sent because the receiver already held them verified
    /// (resume after an interruption).
    pub blocks_skipped: u64,
    /// Bytes in those blocks.
    pub bytes_skipped: u64,
    /// The receiver already held the file whole and unchanged; nothing was sent.
    pub unchanged: bool,
    /// Bytes of this file read and sent, resends included.
    pub bytes_sent: u64,
    /// Bytes the receiver held from an earlier run and re-verified in place
    /// in this one (not sent), at the level of this run's checks.
    pub bytes_reverified: u64,
    /// Bytes the receiver held and trusted from its journal (not sent, not
    /// re-read beyond a check through the cache): they count at the level
    /// recorded when they were verified.
    pub bytes_trusted: u64,
    /// The lowest level recorded for the trusted bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trusted_level: Option<VerifyLevel>,
    /// When the oldest trusted byte was verified, seconds since the epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trusted_since: Option<i64>,
    /// The verification mode.
    pub verify: VerifyMode,
    /// The level really reached (files only; absent when the file failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level: Option<VerifyLevel>,
    /// Seconds spent reading, sending and writing.
    pub transfer_seconds: f64,
    /// Seconds spent computing and comparing checksums.
    pub checksum_seconds: f64,
    /// Device-level modes: how verification reads reached the device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_path: Option<ReadPath>,
    /// Device-level modes: pages found still resident after eviction, at
    /// both ends (each one keeps its block at level `cache`).
    pub pages_resident: u64,
    /// Device-level modes: seconds spent flushing and evicting.
    pub evict_seconds: f64,
    /// Seconds the sender spent on this file's blocks (source reads, the
    /// riva source re-read, digests, handing them to the link); the
    /// receiver's write is not in it.
    pub transfer_stage_seconds: f64,
    /// Riva and block: seconds the destination's verifier spent re-reading
    /// and hashing this file's blocks (eviction excluded).
    pub verify_stage_seconds: f64,
    /// Why the level is below what the mode aims at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// One range of a split file (a plan's shard sent it): `size`,
    /// `blocks` and the level are the range's; the file is verified as a
    /// whole only when its state is `committed` or `held`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub range: Option<RangeReport>,
}

/// One range of a split file, in its report row.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RangeReport {
    /// The split id, in hex.
    pub split: String,
    /// First block.
    pub first: u64,
    /// One past the last block.
    pub end: u64,
    /// Blocks of the whole file.
    pub file_blocks: u64,
    /// Bytes of the whole file.
    pub file_size: u64,
    /// Where the file stands, as the receiver said with the range's
    /// verdict: `waiting` (for its other ranges), `committed` (this range
    /// completed it, and it is under its final name), `held` (committed
    /// earlier; this range unchanged). Absent when the range failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<&'static str>,
    /// `committed` or `held`: the BLAKE3 of the file under its final name
    /// as the receiver recorded it, in hex (protocol 13).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_digest: Option<String>,
}

impl RangeReport {
    /// The state a FileResult's `split` names.
    pub fn state_of(split: u8) -> Option<&'static str> {
        match split {
            intact_proto::FileResult::SPLIT_WAITING => Some("waiting"),
            intact_proto::FileResult::SPLIT_COMMITTED => Some("committed"),
            intact_proto::FileResult::SPLIT_HELD => Some("held"),
            _ => None,
        }
    }
}

/// The whole copy.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CopyReport {
    /// One entry per file, directory and symlink, in scan order.
    pub files: Vec<FileReport>,
    /// Sources that could not be scanned.
    pub errors: Vec<String>,
    /// Special files skipped.
    pub skipped: Vec<String>,
    /// Bytes of regular files.
    pub bytes: u64,
    /// Bytes read and sent, resends included.
    pub bytes_sent: u64,
    /// Bytes held by the receiver and re-verified in place in this run.
    pub bytes_reverified: u64,
    /// Bytes held by the receiver and trusted from its journal, at the
    /// level recorded for them (see each file's `trusted_level`).
    pub bytes_trusted: u64,
    /// Entries that failed.
    pub failed: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Riva: the RIVA paper's execution-time model (Eq. 1) from the
    /// measured per-block stage times, beside the measured time (Eq. 2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<crate::model::RivaModel>,
    /// `send`: how the frames were protected on the wire (`encrypted,
    /// AES-256-GCM`, `authenticated, not encrypted, …`, or `plain (no
    /// key)`), as the handshake settled it; None for a local copy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frames: Option<String>,
    /// Where the time went, per stage of the pipeline (see
    /// [`crate::Profile`]): both halves for `copy`; for `send`, the
    /// sender's stages and the server's verify and evict times as its
    /// results report them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<crate::StageTime>,
    /// `copy --verify flash`: bytes of filler written to push the last
    /// blocks past the device's write-cache window (each file's note says
    /// which window). None for other modes, and for `send` (the server
    /// writes it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filler_bytes: Option<u64>,
    /// `send`: whether large files were spread over the streams as block
    /// ranges, why, and the round trip that decided it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spread: Option<crate::SpreadReport>,
    /// `send --streams auto` over a long round trip: how many streams it
    /// started with and ended with, and why it added each.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub streams: Option<crate::StreamsReport>,
    /// `--block-size auto`: the block size chosen, Eq. 1's prediction per
    /// candidate, and what was probed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_size: Option<crate::BlockSizeReport>,
}

/// Progress callback: bytes sent so far.
pub type Progress<'a> = &'a (dyn Fn(u64) + Sync);

impl CopyReport {
    /// The report of a run: per-entry reports in scan order, the scan's
    /// own errors and skips, bytes read and sent, and the time since `start`.
    pub(crate) fn new(
        files: Vec<FileReport>,
        scanned: &crate::source::Scan,
        bytes_sent: u64,
        start: Instant,
        streams: usize,
    ) -> CopyReport {
        let failed = files.iter().filter(|f| f.error.is_some()).count() + scanned.errors.len();
        CopyReport {
            bytes: scanned.entries.iter().map(|e| e.bytes()).sum(),
            bytes_sent,
            bytes_reverified: files.iter().map(|f| f.bytes_reverified).sum(),
            bytes_trusted: files.iter().map(|f| f.bytes_trusted).sum(),
            failed: failed as u64,
            files,
            errors: scanned.errors.iter().map(|e| e.to_string()).collect(),
            skipped: scanned
                .skipped
                .iter()
                .map(|p| p.display().to_string())
                .collect(),
            seconds: start.elapsed().as_secs_f64(),
            model: None,
            frames: None,
            stages: Vec::new(),
            filler_bytes: None,
            spread: None,
            streams: None,
            block_size: None,
        }
        .with_model(streams)
    }

    /// The report of a run whose scan listed nothing and failed to read
    /// something (every source named is missing, say): such a run ends
    /// there, before it makes, opens or reaches the destination.
    pub(crate) fn nothing_listed(
        scanned: &crate::source::Scan,
        start: Instant,
    ) -> Option<CopyReport> {
        (scanned.entries.is_empty() && !scanned.errors.is_empty())
            .then(|| CopyReport::new(Vec::new(), scanned, 0, start, 1))
    }

    /// Counts a receiver half that ended in error (a local copy: there is
    /// no server log to say why, so the report does).
    pub(crate) fn receiver_failed(&mut self, why: String) {
        self.errors.push(format!("receiver: {why}"));
        self.failed += 1;
    }

    fn with_model(mut self, streams: usize) -> CopyReport {
        self.model = crate::model::RivaModel::of(&self, streams);
        self
    }
}

pub(crate) fn simple_report(
    e: &SourceEntry,
    verify: VerifyMode,
    err: Option<TransferError>,
) -> FileReport {
    FileReport {
        path: e.rel.to_string(),
        kind: match e.kind {
            SourceKind::File => "file",
            SourceKind::Dir => "dir",
            SourceKind::Symlink(_) => "symlink",
        },
        size: e.bytes(),
        digest: None,
        source_digest: None,
        blocks: 0,
        blocks_resent: 0,
        pages_resent: 0,
        blocks_from_cache: 0,
        cache_seconds: 0.0,
        blocks_from_source: 0,
        source_repair_seconds: 0.0,
        blocks_skipped: 0,
        bytes_skipped: 0,
        unchanged: false,
        bytes_sent: 0,
        bytes_reverified: 0,
        bytes_trusted: 0,
        trusted_level: None,
        trusted_since: None,
        verify,
        level: (err.is_none() && e.kind == SourceKind::File).then_some(verify.level()),
        transfer_seconds: 0.0,
        checksum_seconds: 0.0,
        read_path: None,
        pages_resident: 0,
        evict_seconds: 0.0,
        transfer_stage_seconds: 0.0,
        verify_stage_seconds: 0.0,
        note: None,
        error: err.map(|e| e.to_string()),
        range: e.range.map(|r| RangeReport {
            split: r.split.iter().map(|b| format!("{b:02x}")).collect(),
            first: r.first,
            end: r.end,
            file_blocks: e.size.div_ceil(r.block_size.max(1)),
            file_size: e.size,
            state: None,
            file_digest: None,
        }),
    }
}

/// `n` bytes as people read them: `512 B`, `3.2 MiB`.
pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}
