//! Where a transfer's time goes, stage by stage: for each step of the
//! pipeline (see [`crate::stage`]), the seconds threads spent in it and
//! how many times it ran, summed over every stream. A report carries it
//! ([`crate::CopyReport::stages`]) so that a benchmark can print a
//! per-stage profile and see what a small file costs (opens, journal
//! rows, commits, round trips) beside what its bytes cost.
//!
//! The seconds are thread-seconds, measured around each call: stages of
//! different threads overlap, so they add up to more than the wall time
//! on more than one core, and a stage that blocks (a read that waits for
//! the device, a sender waiting for answers) counts its waiting too. Each
//! stage is timed where it is done, and no stage contains another.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One step of the pipeline, at the side that does it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Sender: opening a source file and taking its status (its cache
    /// key; at its end, the check that it did not change).
    Open,
    /// Sender: reading source blocks (in `riva`, from the device).
    Read,
    /// Sender: block digests and the whole-file BLAKE3 (with the read of
    /// the source, when the digest needs the file read again).
    Digest,
    /// Sender: handing messages to the link (queueing, flushing, and
    /// waiting for the receiver's credit).
    Handoff,
    /// Sender: waiting for the receiver's answers (Status, block and file
    /// results) with nothing else to do.
    Wait,
    /// Receiver: looking a file up in the journal, recording its start,
    /// its verified blocks and its commit.
    Journal,
    /// Receiver: the quick check of a file held whole under its final
    /// name (open, status, digest compared; with `--reverify` or a
    /// recorded level below the mode's, its re-read in place too).
    Quick,
    /// Receiver: creating a file's partial file.
    Create,
    /// Receiver: checking an arrived block against its digest.
    Check,
    /// Receiver: writing blocks.
    Write,
    /// Receiver: the whole-file BLAKE3 of the bytes written.
    Whole,
    /// Receiver: re-reading written blocks and hashing them (block, riva;
    /// in `send`, as each file's result reports it).
    Verify,
    /// Both ends of device-level modes: flushing and evicting pages.
    Evict,
    /// Receiver: making a group of files durable and giving them their
    /// final names (fsync or syncfs, renames, directory fsyncs).
    Commit,
}

/// Every stage, in pipeline order.
pub const STAGES: [Stage; 14] = [
    Stage::Open,
    Stage::Read,
    Stage::Digest,
    Stage::Handoff,
    Stage::Wait,
    Stage::Journal,
    Stage::Quick,
    Stage::Create,
    Stage::Check,
    Stage::Write,
    Stage::Whole,
    Stage::Verify,
    Stage::Evict,
    Stage::Commit,
];

impl Stage {
    /// Which half does it: "sender", "receiver", or "both".
    pub fn side(self) -> &'static str {
        match self {
            Stage::Open | Stage::Read | Stage::Digest | Stage::Handoff | Stage::Wait => "sender",
            Stage::Evict => "both",
            _ => "receiver",
        }
    }

    /// Its place in [`STAGES`] (declared in the same order).
    fn slot(self) -> usize {
        self as usize
    }
}

/// One stage's total in a report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StageTime {
    /// The stage.
    pub stage: Stage,
    /// "sender", "receiver" or "both".
    pub side: &'static str,
    /// Thread-seconds spent in it (see the module's doc).
    pub seconds: f64,
    /// Times it ran.
    pub calls: u64,
}

/// The running totals of one transfer, shared by all its threads.
#[derive(Debug, Default)]
pub struct Profile {
    nanos: [AtomicU64; STAGES.len()],
    calls: [AtomicU64; STAGES.len()],
}

impl Profile {
    /// Adds one run of `stage` that took `took`.
    pub fn add(&self, stage: Stage, took: Duration) {
        let i = stage.slot();
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.nanos[i].fetch_add(nanos, Ordering::Relaxed);
        self.calls[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Runs `f` as one run of `stage`.
    pub fn time<T>(&self, stage: Stage, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let r = f();
        self.add(stage, t.elapsed());
        r
    }

    /// Times one run of `stage`, from now until the guard is dropped
    /// (whichever way its scope is left).
    pub fn timer(&self, stage: Stage) -> Timer<'_> {
        Timer {
            profile: self,
            stage,
            start: Instant::now(),
        }
    }

    /// The stages that ran, on one line: `create 0.368 s (5000 calls), …`.
    pub fn line(&self) -> String {
        let parts: Vec<String> = self
            .stages()
            .iter()
            .map(|s| format!("{:?} {:.3} s ({} calls)", s.stage, s.seconds, s.calls).to_lowercase())
            .collect();
        parts.join(", ")
    }

    /// The stages that ran, in pipeline order.
    pub fn stages(&self) -> Vec<StageTime> {
        STAGES
            .iter()
            .enumerate()
            .filter_map(|(i, &stage)| {
                let calls = self.calls[i].load(Ordering::Relaxed);
                (calls > 0).then(|| StageTime {
                    stage,
                    side: stage.side(),
                    seconds: self.nanos[i].load(Ordering::Relaxed) as f64 / 1e9,
                    calls,
                })
            })
            .collect()
    }
}

/// One run of a stage, added to its profile when dropped.
#[must_use = "the stage is timed until the guard is dropped"]
pub struct Timer<'a> {
    profile: &'a Profile,
    stage: Stage,
    start: Instant,
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        self.profile.add(self.stage, self.start.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_per_stage_and_lists_only_what_ran() {
        let p = Profile::default();
        p.add(Stage::Write, Duration::from_millis(3));
        p.add(Stage::Write, Duration::from_millis(1));
        p.add(Stage::Write, Duration::from_millis(3));
        let got = p.time(Stage::Read, || 7);
        assert_eq!(got, 7);
        let s = p.stages();
        assert_eq!(
            s.iter().map(|t| t.stage).collect::<Vec<_>>(),
            [Stage::Read, Stage::Write],
            "pipeline order, and nothing that did not run"
        );
        assert_eq!(s[1].calls, 3);
        assert!((s[1].seconds - 0.007).abs() < 1e-9);
        assert_eq!(s[1].side, "receiver");
        assert_eq!(s[0].side, "sender");
        assert_eq!(
            p.line(),
            format!(
                "read {:.3} s (1 calls), write 0.007 s (3 calls)",
                s[0].seconds
            )
        );
    }

    #[test]
    fn every_stage_has_its_own_slot() {
        for (i, s) in STAGES.iter().enumerate() {
            assert_eq!(s.slot(), i);
        }
    }
}
