//! The faults the lab injects, and what a riva run must make of each.

use intact_transfer::{VerifyLevel, VerifyMode};

use crate::Outcome;

/// A fault the lab injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// One bit flipped on the destination device under the middle block,
    /// after it was written and before it was verified; the page cache
    /// keeps the good copy (an undetected write error).
    DeviceWrite,
    /// The first bit of every 4 KiB page flipped on the device under every
    /// block, once each (the RIVA paper's extreme injection).
    DeviceWriteExtreme,
    /// The source's page cache holds a flipped bit while its device holds
    /// the right bytes (an undetected read error).
    SourceRead,
    /// A proxy flips one bit of the block data on the wire.
    NetworkFlip,
    /// A proxy cuts the connection halfway, then the same send again.
    NetworkCut,
    /// A proxy swallows everything after halfway (the server's idle
    /// timeout ends the session), then the same send again.
    NetworkStall,
    /// A bit flipped in a received buffer after its digest was checked and
    /// before it was written (the Z²FS t0–t1 window).
    Memory,
    /// The sender SIGKILLed at a random point, then the same send again.
    CrashSender,
    /// The server SIGKILLed at a random point, restarted, the send again.
    CrashServer,
    /// The destination file system fills up; space is freed; the send again.
    DiskFull,
    /// A `fiver` send cut with several blocks journaled; one bit flipped on
    /// the device under block 0 of the partial file (the page cache keeps
    /// the good copy); the send resumed in the cell's mode.
    HeldBlockResume,
    /// A file sent whole in `fiver`; one bit flipped on the device under
    /// the final file (the cache keeps the good copy); sent again in the
    /// cell's mode (riva: with `--require-level device`).
    UnchangedDamaged,
    /// The source on an ext4 mounted `data=journal`, where `O_DIRECT` is
    /// served through the page cache; the source's cache wrong, its device
    /// right; sent with `--read-path direct`.
    DirectDataJournal,
    /// On the emulated SSD: the destination's page cache holds a flipped
    /// bit under the middle block after it was written, while the device
    /// holds the right bytes (Kim et al.'s Table 2, host memory).
    HostMemory,
    /// On the emulated SSD: the copy of one page of the middle block in
    /// the device's write buffer is corrupted (Table 2, buffer cache).
    SsdBuffer,
    /// On the emulated SSD: one page of the middle block is programmed
    /// to the flash wrong while the buffer keeps the good copy (Table 2,
    /// flash memory).
    SsdMedia,
}

impl Fault {
    /// Every fault, in table order.
    pub const ALL: [Fault; 16] = [
        Fault::DeviceWrite,
        Fault::DeviceWriteExtreme,
        Fault::SourceRead,
        Fault::NetworkFlip,
        Fault::NetworkCut,
        Fault::NetworkStall,
        Fault::Memory,
        Fault::CrashSender,
        Fault::CrashServer,
        Fault::DiskFull,
        Fault::HeldBlockResume,
        Fault::UnchangedDamaged,
        Fault::DirectDataJournal,
        Fault::HostMemory,
        Fault::SsdBuffer,
        Fault::SsdMedia,
    ];

    /// Kim et al.'s Table 2: the layers of the receiver's storage stack,
    /// run on the emulated SSD (intact-faults' `EmulatedSsd`).
    pub const TABLE_2: [Fault; 3] = [Fault::HostMemory, Fault::SsdBuffer, Fault::SsdMedia];

    /// The faults that test the level a run reports rather than one
    /// transfer: a file the tool already holds, or a read path that claims
    /// more than it does.
    pub const LEVELS: [Fault; 3] = [
        Fault::HeldBlockResume,
        Fault::UnchangedDamaged,
        Fault::DirectDataJournal,
    ];

    /// The faults the negative control must turn into MISSED under riva.
    pub const NEGATIVE_CONTROL: [Fault; 2] = [Fault::DeviceWrite, Fault::DeviceWriteExtreme];

    /// Name in tables and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Fault::DeviceWrite => "device-write",
            Fault::DeviceWriteExtreme => "device-write-extreme",
            Fault::SourceRead => "source-read",
            Fault::NetworkFlip => "network-flip",
            Fault::NetworkCut => "network-cut",
            Fault::NetworkStall => "network-stall",
            Fault::Memory => "memory",
            Fault::CrashSender => "crash-sender",
            Fault::CrashServer => "crash-server",
            Fault::DiskFull => "disk-full",
            Fault::HeldBlockResume => "held-block-resume",
            Fault::UnchangedDamaged => "unchanged-damaged",
            Fault::DirectDataJournal => "direct-data-journal",
            Fault::HostMemory => "host-memory",
            Fault::SsdBuffer => "ssd-buffer",
            Fault::SsdMedia => "ssd-media",
        }
    }

    /// Whether the cell runs on the emulated SSD rather than a loop device
    /// over a file.
    pub fn on_ssd(self) -> bool {
        Fault::TABLE_2.contains(&self)
    }

    /// The lowest level whose claim covers the layer the fault is in: a
    /// success with wrong bytes at this level or above is a LIE. A wrong
    /// page cache is claimed by `cache`; a wrong flash program only by
    /// `media` (a `device` re-read answered by the SSD's buffer is true of
    /// what it read); everything else by `device`.
    pub fn claimed_by(self) -> VerifyLevel {
        match self {
            Fault::HostMemory => VerifyLevel::Cache,
            Fault::SsdMedia => VerifyLevel::Media,
            _ => VerifyLevel::Device,
        }
    }

    /// What Kim et al.'s Table 2 says `mode` makes of this fault, for the
    /// three modes of the table (`file` catches host memory only; `riva`
    /// host memory and the buffer; `flash` all three); None elsewhere.
    /// Caught is REPAIRED; not caught is MISSED (exit 0, wrong bytes, no
    /// level claiming the layer).
    pub fn table_2(self, mode: VerifyMode) -> Option<Outcome> {
        let caught = match (self, mode) {
            (Fault::HostMemory, VerifyMode::File | VerifyMode::Riva | VerifyMode::Flash) => true,
            (Fault::SsdBuffer, VerifyMode::Riva | VerifyMode::Flash) => true,
            (Fault::SsdMedia, VerifyMode::Flash) => true,
            (f, VerifyMode::File | VerifyMode::Riva) if f.on_ssd() => false,
            _ => return None,
        };
        Some(if caught {
            Outcome::Repaired
        } else {
            Outcome::Missed
        })
    }

    /// Whether the cell needs the real `intact` binary (a process to kill).
    pub fn needs_binary(self) -> bool {
        matches!(self, Fault::CrashSender | Fault::CrashServer)
    }

    /// Whether the fault hides behind (or sits in) the page cache, so that
    /// another job dropping the machine's caches mid-cell would change it:
    /// such a cell is run again (see `quiet`). The Table 2 faults care
    /// too: `file`'s miss of the SSD faults rests on its re-read being
    /// served by the page cache. The wire, crash and disk-full faults do
    /// not care.
    pub fn cache_sensitive(self) -> bool {
        matches!(
            self,
            Fault::DeviceWrite
                | Fault::DeviceWriteExtreme
                | Fault::SourceRead
                | Fault::HeldBlockResume
                | Fault::UnchangedDamaged
                | Fault::DirectDataJournal
                | Fault::HostMemory
                | Fault::SsdBuffer
                | Fault::SsdMedia
        )
    }

    /// The outcomes a `riva` cell may end in. Repaired everywhere; for
    /// `unchanged-damaged` and `direct-data-journal` an honest failure too:
    /// a file damaged after it was verified, or a `--read-path` that cannot
    /// be honoured on this file system, may be refused rather than repaired
    /// (the run fails, and claims no level for the wrong bytes). A resume
    /// must repair: the sender still has every byte.
    pub fn riva_accepts(self) -> &'static [Outcome] {
        match self {
            Fault::UnchangedDamaged | Fault::DirectDataJournal => {
                &[Outcome::Repaired, Outcome::FailedClean]
            }
            _ => &[Outcome::Repaired],
        }
    }
}

impl std::str::FromStr for Fault {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Fault::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| format!("unknown fault '{s}'"))
    }
}
