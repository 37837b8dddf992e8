//! The faults the lab injects, and what a riva run must make of each.

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
}

impl Fault {
    /// Every fault, in table order.
    pub const ALL: [Fault; 13] = [
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
    ];

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
        }
    }

    /// Whether the cell needs the real `intact` binary (a process to kill).
    pub fn needs_binary(self) -> bool {
        matches!(self, Fault::CrashSender | Fault::CrashServer)
    }

    /// Whether the fault hides behind (or sits in) the page cache, so that
    /// another job dropping the machine's caches mid-cell would change it:
    /// such a cell is run again (see `quiet`). The wire, crash and
    /// disk-full faults do not care.
    pub fn cache_sensitive(self) -> bool {
        matches!(
            self,
            Fault::DeviceWrite
                | Fault::DeviceWriteExtreme
                | Fault::SourceRead
                | Fault::HeldBlockResume
                | Fault::UnchangedDamaged
                | Fault::DirectDataJournal
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
