//! Verification modes and the level each one reaches.

use std::fmt;
use std::str::FromStr;

/// How a transfer is verified (PRODUCT.md, capability 3). All modes run
/// through the same pipeline so that they can be compared on the same data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum VerifyMode {
    /// Transfer only: the baseline for overhead.
    None,
    /// Transfer a file, then re-read both copies and compare, file by file.
    Sequential,
    /// File-level pipelining: verify file i while file i+1 transfers.
    File,
    /// Block-level pipelining (Liu et al.): verify block i (re-read after
    /// write) while block i+1 transfers.
    Block,
    /// FIVER: hash the very buffers used for the transfer at both ends.
    Fiver,
}

impl VerifyMode {
    /// Every mode this build implements.
    pub const ALL: [VerifyMode; 5] = [
        VerifyMode::None,
        VerifyMode::Sequential,
        VerifyMode::File,
        VerifyMode::Block,
        VerifyMode::Fiver,
    ];

    /// Name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            VerifyMode::None => "none",
            VerifyMode::Sequential => "sequential",
            VerifyMode::File => "file",
            VerifyMode::Block => "block",
            VerifyMode::Fiver => "fiver",
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
        }
    }

    /// The mode with wire id `id`.
    pub fn from_wire_id(id: u8) -> Option<VerifyMode> {
        VerifyMode::ALL.into_iter().find(|m| m.wire_id() == id)
    }

    /// The level a file verified in this mode reaches.
    pub fn level(self) -> VerifyLevel {
        match self {
            VerifyMode::None => VerifyLevel::None,
            VerifyMode::Fiver => VerifyLevel::Network,
            VerifyMode::Sequential | VerifyMode::File | VerifyMode::Block => VerifyLevel::Cache,
        }
    }
}

impl VerifyLevel {
    /// The level's id on the wire.
    pub fn wire_id(self) -> u8 {
        self as u8
    }

    /// The level with wire id `id`.
    pub fn from_wire_id(id: u8) -> Option<VerifyLevel> {
        [VerifyLevel::None, VerifyLevel::Network, VerifyLevel::Cache]
            .into_iter()
            .find(|l| l.wire_id() == id)
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
            .ok_or_else(|| match s {
                "riva" | "flash" => format!(
                    "--verify {s} (device-level verification) is not built yet; available: none, sequential, file, block, fiver"
                ),
                _ => format!("unknown verify mode '{s}' (none, sequential, file, block, fiver)"),
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
}
