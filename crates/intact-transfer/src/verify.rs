//! Verification modes and the level each one reaches.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use intact_cache::{Backing, ReadOutcome};

use crate::TransferError;

/// How a transfer is verified (PRODUCT.md, capability 3). All modes run
/// through the same pipeline so that they can be compared on the same data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum VerifyMode {
    /// Transfer only: the baseline for overhead.
    None,
    /// Transfer a file, then re-read the copy written (through the page
    /// cache) and compare each block with the digest of the source's bytes
    /// as they were sent, file by file.
    Sequential,
    /// File-level pipelining: the same re-read of file i at its end, while
    /// the sender goes on with file i+1. (In this build the receiver's
    /// work for both is the same stage, `WholeReread`.)
    File,
    /// Block-level pipelining (Liu et al.): verify block i (re-read after
    /// write) while block i+1 transfers.
    Block,
    /// FIVER: hash the very buffers used for the transfer at both ends.
    Fiver,
    /// RIVA: every block is written, flushed, evicted and re-read from the
    /// device at the receiver, and re-read from the device for its digest
    /// at the sender; transfer, eviction and checksum of different blocks
    /// overlap.
    Riva,
    /// Kim et al.'s flash-aware verification: as `riva`, but each written
    /// block is re-read from the device only once the device's write cache
    /// has turned over (W bytes written to the device after it), so the
    /// read reaches the flash media, not the SSD's DRAM buffer.
    Flash,
}

impl VerifyMode {
    /// Every mode this build implements.
    pub const ALL: [VerifyMode; 7] = [
        VerifyMode::None,
        VerifyMode::Sequential,
        VerifyMode::File,
        VerifyMode::Block,
        VerifyMode::Fiver,
        VerifyMode::Riva,
        VerifyMode::Flash,
    ];

    /// The default of `copy` and `send`.
    pub const DEFAULT: VerifyMode = VerifyMode::Riva;

    /// Name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            VerifyMode::None => "none",
            VerifyMode::Sequential => "sequential",
            VerifyMode::File => "file",
            VerifyMode::Block => "block",
            VerifyMode::Fiver => "fiver",
            VerifyMode::Riva => "riva",
            VerifyMode::Flash => "flash",
        }
    }

    /// What the mode does, in one line, for help texts and man pages
    /// (the one place the command line's description of a mode comes from).
    pub fn description(self) -> &'static str {
        match self {
            VerifyMode::None => "transfer only, no check (the baseline); level none",
            VerifyMode::Sequential => {
                "after each file, re-read the copy written and compare it with the source's block digests; level cache"
            }
            VerifyMode::File => {
                "the same re-read, while the sender goes on with the next file; level cache"
            }
            VerifyMode::Block => {
                "re-read each block after writing it, pipelined, through the page cache; level cache"
            }
            VerifyMode::Fiver => {
                "hash the transfer buffers themselves at both ends, as blocks cross the link; level network"
            }
            VerifyMode::Riva => {
                "re-read every block from the device after evicting its cached copy, at both ends; level device"
            }
            VerifyMode::Flash => {
                "as riva, but re-read each block only after the device's write cache has turned over (--device-cache), so the read reaches the flash media; level media"
            }
        }
    }

    /// The mode's id on the wire.
    pub fn wire_id(self) -> u8 {
        match self {
            VerifyMode::None => 0,
            VerifyMode::Sequential => 1,
            VerifyMode::File => 2,
            VerifyMode::Block => 3,
            VerifyMode::Fiver => 4,
            VerifyMode::Riva => 5,
            VerifyMode::Flash => 6,
        }
    }

    /// The mode with wire id `id`.
    pub fn from_wire_id(id: u8) -> Option<VerifyMode> {
        VerifyMode::ALL.into_iter().find(|m| m.wire_id() == id)
    }

    /// The level a file verified in this mode reaches at best; `riva`
    /// falls to `cache` where the device cannot be reached.
    pub fn level(self) -> VerifyLevel {
        match self {
            VerifyMode::None => VerifyLevel::None,
            VerifyMode::Fiver => VerifyLevel::Network,
            VerifyMode::Sequential | VerifyMode::File | VerifyMode::Block => VerifyLevel::Cache,
            VerifyMode::Riva => VerifyLevel::Device,
            VerifyMode::Flash => VerifyLevel::Media,
        }
    }

    /// Whether the mode can verify one range of a split file alone:
    /// `sequential` and `file` re-read the whole file at its end, and
    /// `flash` waits for the device's write cache to turn over after the
    /// file's last write, which one range cannot know.
    pub fn verifies_ranges(self) -> bool {
        matches!(
            self,
            VerifyMode::None | VerifyMode::Block | VerifyMode::Fiver | VerifyMode::Riva
        )
    }

    /// Whether the mode's verification reads must reach the device.
    pub fn reads_device(self) -> bool {
        matches!(self, VerifyMode::Riva | VerifyMode::Flash)
    }
}

impl VerifyLevel {
    /// The level's id on the wire.
    pub fn wire_id(self) -> u8 {
        self as u8
    }

    /// The level with wire id `id`.
    pub fn from_wire_id(id: u8) -> Option<VerifyLevel> {
        VerifyLevel::ALL.into_iter().find(|l| l.wire_id() == id)
    }
}

impl fmt::Display for VerifyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for VerifyMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        VerifyMode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = VerifyMode::ALL.iter().map(|m| m.name()).collect();
                format!("unknown verify mode '{s}' ({})", names.join(", "))
            })
    }
}

/// How far a file's verification really reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum VerifyLevel {
    /// Not verified at all (`--verify none`).
    None,
    /// The bytes that crossed the link matched the sender's digests; what
    /// was stored was not re-read.
    Network,
    /// The stored copy was re-read and matched, but through the page
    /// cache: a device that stored other bytes would go unnoticed.
    Cache,
    /// Every block was re-read from the device (after an eviction that
    /// a residency count confirmed, or through `O_DIRECT`) at both ends, and matched.
    Device,
    /// As `device`, and every block's re-read at the destination came only
    /// after the device's write cache window (W bytes written to the same
    /// device after the block) had passed: the bytes came from the media
    /// behind an SSD's DRAM buffer, not from the buffer (`--verify flash`).
    Media,
}

impl VerifyLevel {
    /// Every level, lowest first.
    pub const ALL: [VerifyLevel; 5] = [
        VerifyLevel::None,
        VerifyLevel::Network,
        VerifyLevel::Cache,
        VerifyLevel::Device,
        VerifyLevel::Media,
    ];

    /// Name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            VerifyLevel::None => "none",
            VerifyLevel::Network => "network",
            VerifyLevel::Cache => "cache",
            VerifyLevel::Device => "device",
            VerifyLevel::Media => "media",
        }
    }

    /// The cap a read of the source at this level puts on a file: reading
    /// the source's device is all a source can give (there is no window
    /// to wait for at the sending end), so `device` caps nothing below
    /// `media`.
    pub fn as_source_cap(self) -> VerifyLevel {
        if self == VerifyLevel::Device {
            VerifyLevel::Media
        } else {
            self
        }
    }
}

impl fmt::Display for VerifyLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for VerifyLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        VerifyLevel::ALL
            .into_iter()
            .find(|l| l.name() == s)
            .ok_or_else(|| format!("unknown level '{s}' (none, network, cache, device, media)"))
    }
}

/// What the device-level reads of one file did, at one end.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeviceStats {
    /// Verification reads.
    pub reads: u64,
    /// Of those, reads whose every byte came from the device.
    pub device_reads: u64,
    /// Of those, `O_DIRECT` reads the file system served through the page
    /// cache.
    pub buffered: u64,
    /// Pages found still resident after eviction, summed.
    pub resident: u64,
    /// Time spent flushing and evicting.
    pub evict: Duration,
}

impl DeviceStats {
    /// Counts one read.
    pub fn add(&mut self, out: &ReadOutcome) {
        self.reads += 1;
        self.device_reads += u64::from(out.device);
        self.buffered += u64::from(out.buffered);
        self.resident += out.resident;
        self.evict += out.evict_time;
    }

    /// Adds another end's or another pass's counts.
    pub fn merge(&mut self, other: &DeviceStats) {
        self.reads += other.reads;
        self.device_reads += other.device_reads;
        self.buffered += other.buffered;
        self.resident += other.resident;
        self.evict += other.evict;
    }

    /// The level these reads support: `device` only when every one reached
    /// it; None when there were no reads (they support nothing).
    pub fn level(&self) -> Option<VerifyLevel> {
        match self.reads {
            0 => None,
            n if self.device_reads == n => Some(VerifyLevel::Device),
            _ => Some(VerifyLevel::Cache),
        }
    }

    /// Lowers `reached` to what one end (`source` or `destination`) on
    /// `backing` supports: `cache` with the reason where the file system
    /// has no device (whether or not reads were made), `cache` where some
    /// read did not reach the device, unchanged where every read did.
    pub fn lower(&self, reached: &mut Reached, end: &str, backing: Backing) {
        if let Some(why) = backing.no_device_reason() {
            reached.lower(VerifyLevel::Cache, format!("the {end} is on {why}"));
            return;
        }
        if self.level() != Some(VerifyLevel::Cache) {
            return;
        }
        let why = if self.buffered > 0 {
            format!(
                "{} of {} O_DIRECT re-reads at the {end} went through the page cache (the file system buffers O_DIRECT, as ext4 data=journal does)",
                self.buffered, self.reads
            )
        } else {
            format!(
                "{} of {} re-reads at the {end} found pages still cached after eviction",
                self.reads - self.device_reads,
                self.reads
            )
        };
        reached.lower(VerifyLevel::Cache, why);
    }
}

/// Why a receiver lowered a file to the level the source's reads reached
/// (the sender, which knows the source's own reason, tells it instead).
pub(crate) fn source_cap_note(level: VerifyLevel) -> String {
    format!("the source's reads reached level {level}")
}

/// The level a file reached: the lowest level at which any of its bytes
/// was checked (in this run, or as recorded when a trusted block was
/// checked), with the reason it is below the mode's aim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reached {
    /// The level so far.
    pub level: VerifyLevel,
    /// Why it is below the mode's aim, first reason given.
    pub note: Option<String>,
}

impl Reached {
    /// Starts at the level `mode` aims at.
    pub fn aim(mode: VerifyMode) -> Reached {
        Reached {
            level: mode.level(),
            note: None,
        }
    }

    /// Lowers the level to `level` (if it is lower) for reason `why`.
    pub fn lower(&mut self, level: VerifyLevel, why: impl Into<String>) {
        if level < self.level {
            self.level = level;
            self.note = Some(why.into());
        } else if level == self.level && self.note.is_none() && level < VerifyLevel::Device {
            let why = why.into();
            if !why.is_empty() {
                self.note = Some(why);
            }
        }
    }
}

/// Refuses a run whose mode cannot reach the level it requires.
pub(crate) fn check_reachable(
    mode: VerifyMode,
    required: Option<VerifyLevel>,
) -> Result<(), crate::TransferError> {
    match required {
        Some(want) if want > mode.level() => Err(crate::TransferError::Usage(format!(
            "--verify {mode} reaches at most level {}, so --require-level {want} cannot be met (use --verify {})",
            mode.level(),
            if want == VerifyLevel::Media { "flash" } else { "riva" }
        ))),
        _ => Ok(()),
    }
}

/// Fails a file whose verification stopped below the level asked for.
pub(crate) fn require_level(
    required: Option<VerifyLevel>,
    reached: Option<VerifyLevel>,
    path: &str,
) -> Result<(), TransferError> {
    match (required, reached) {
        (Some(want), got) if got.unwrap_or(VerifyLevel::None) < want => {
            Err(TransferError::Verification {
                path: path.to_string(),
                what: format!(
                    "reached level {}, but --require-level {want} was asked for",
                    got.unwrap_or(VerifyLevel::None)
                ),
            })
        }
        _ => Ok(()),
    }
}
