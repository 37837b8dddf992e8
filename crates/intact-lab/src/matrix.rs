//! Cells, outcomes and the whole matrix, and what makes a run fail CI.

use std::path::PathBuf;

use intact_transfer::VerifyMode;

use crate::Fault;

/// How a cell ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// The run succeeded after detecting the fault (a resend, a resume) and
    /// the device holds the source's bytes. For the cells whose fault is
    /// proven in place before the judged run ([`Fault::LEVELS`] and the
    /// resumes), the device was wrong (or the source's cache was) before
    /// that run and holds the source's bytes after it.
    Repaired,
    /// The run reported failure and no wrong file was claimed verified: no
    /// new wrong file carries a final name.
    FailedClean,
    /// Silent corruption: the run succeeded but the device holds wrong
    /// bytes (or a failed run left a new wrong file under its final name),
    /// at a level that does not claim the device.
    Missed,
    /// The run claimed a level its check did not pass: it succeeded, the
    /// device (read after a remount) differs from the source, and a file
    /// was reported at level `device` or the run had `--require-level
    /// device`. Worse than MISSED: the report itself is false.
    Lie,
    /// The fault left no trace: not injected, or without effect. A lab
    /// bug, never a pass.
    NoEffect,
}

impl Outcome {
    /// Short form for tables.
    pub fn short(self) -> &'static str {
        match self {
            Outcome::Repaired => "repaired",
            Outcome::FailedClean => "failed",
            Outcome::Missed => "MISSED",
            Outcome::Lie => "LIE",
            Outcome::NoEffect => "NO-EFFECT",
        }
    }
}

/// One fault × mode × size.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Cell {
    /// The fault.
    pub fault: Fault,
    /// The verification mode.
    pub mode: VerifyMode,
    /// File size in bytes.
    pub size: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// Evidence that the fault took effect.
    pub evidence: String,
    /// Anything else worth reading (the level reported, why it failed).
    pub detail: String,
    /// For Kim et al.'s Table 2 cells of `file`, `riva` and `flash`: the
    /// outcome the table predicts ([`Fault::table_2`]), or REPAIRED where
    /// the emulator's log shows the run read the faulted copy itself (then
    /// the detail starts with [`crate::PREMISE`]). None elsewhere.
    pub expected: Option<Outcome>,
    /// Wall-clock seconds (of the last attempt).
    pub seconds: f64,
    /// Times the cell was run again because another job dropped the
    /// machine's caches while it ran (`drop_pagecache` in `/proc/vmstat`).
    pub reruns: u32,
}

impl Cell {
    /// "fault × mode × size".
    pub fn label(&self) -> String {
        format!(
            "{} × {} × {}",
            self.fault.name(),
            self.mode,
            size_name(self.size)
        )
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct MatrixConfig {
    /// Work directory on a real disk (images, sources).
    pub dir: PathBuf,
    /// File sizes.
    pub sizes: Vec<u64>,
    /// Verification modes.
    pub modes: Vec<VerifyMode>,
    /// Faults.
    pub faults: Vec<Fault>,
    /// Kill-and-resume trials per crash cell.
    pub crash_trials: u32,
    /// The `intact` binary, for the crash faults (they need a process to kill).
    pub intact: Option<PathBuf>,
    /// The negative control: every in-process receiver runs with
    /// `ReceiveOptions::reread_through_cache`, a riva broken on purpose
    /// (its re-read is served by the page cache). The riva device-write
    /// cells must then come out MISSED, proving the lab able to fail. The
    /// crash cells use the real binary and are not affected.
    pub negative_control: bool,
    /// The emulated SSD's write buffer, in bytes, for the Table 2 faults
    /// ([`Fault::TABLE_2`]); their blocks are 1/16 of it and `flash`'s W
    /// twice it.
    pub ssd_buffer: u64,
}

/// The whole run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Matrix {
    /// Every cell, in order.
    pub cells: Vec<Cell>,
    /// Physical memory here, in bytes: files below it stay cached.
    pub ram_bytes: u64,
    /// Whether this was the negative control ([`MatrixConfig::negative_control`]).
    pub negative_control: bool,
    /// What could not be run, and why.
    pub skipped: Vec<String>,
    /// Loop devices left attached under the work directory afterwards.
    pub leftover_loops: Vec<String>,
    /// File systems left mounted under the work directory afterwards.
    pub leftover_mounts: Vec<String>,
}

impl Matrix {
    /// Why this run must fail CI: any LIE; a fault that left no trace; a
    /// loop device or mount left behind; a riva cell not ending as its
    /// fault requires ([`Fault::riva_accepts`]); a Table 2 cell of `file`,
    /// `riva` or `flash` not ending as the paper's table says
    /// ([`Fault::table_2`]: a MISSED there proves the emulator able to
    /// hide what a mode cannot reach); or, in the negative control, a riva
    /// device-write cell that is not MISSED.
    pub fn problems(&self) -> Vec<String> {
        let mut p: Vec<String> = self
            .cells
            .iter()
            .filter(|c| {
                let riva = c.mode == VerifyMode::Riva;
                match c.outcome {
                    Outcome::Lie | Outcome::NoEffect => true,
                    o if c.fault.on_ssd() => c.expected.is_some_and(|want| o != want),
                    o if self.negative_control => {
                        riva && Fault::NEGATIVE_CONTROL.contains(&c.fault) && o != Outcome::Missed
                    }
                    o => riva && !c.fault.riva_accepts().contains(&o),
                }
            })
            .map(|c| {
                let expected = match c.expected {
                    Some(want) if want != c.outcome => {
                        format!(" (Table 2: expected {})", want.short())
                    }
                    _ if self.negative_control => " (negative control: expected MISSED)".into(),
                    _ => String::new(),
                };
                format!(
                    "{}: {}{expected} ({}; {})",
                    c.label(),
                    c.outcome.short(),
                    c.evidence,
                    c.detail
                )
            })
            .collect();
        p.extend(
            self.leftover_loops
                .iter()
                .map(|l| format!("loop device left attached: {l}")),
        );
        p.extend(
            self.leftover_mounts
                .iter()
                .map(|m| format!("file system left mounted: {m}")),
        );
        p
    }
}

/// 1 MiB, 100 MiB, 1 GiB.
pub fn size_name(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}
