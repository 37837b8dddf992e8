//! From what a run said and what the device holds to an [`Outcome`].
//!
//! The rule for LIE is kept crisp: a run that *succeeded* while the device
//! (after a remount) differs from the source is a LIE if it reported a file
//! at level `device` (or `media`, which claims more), or if it ran with
//! `--require-level device` (exit 0 there promises the device). On the
//! emulated SSD the level that claims the faulted layer is the fault's
//! own ([`crate::Fault::claimed_by`]): `cache` for a wrong page cache,
//! `media` for a wrong flash program. The unchanged case needs no rule of its
//! own: a file reported `unchanged` at a level the journal remembered but
//! this run never checked is caught by the second clause under riva. Any
//! other success with wrong bytes is MISSED: the level it reported did not
//! claim the device.

use intact_transfer::{CopyReport, TransferError, VerifyLevel};

use crate::Outcome;

/// What one run of the tool under test said about the lab's one file.
#[derive(Debug, Clone, Default)]
pub(crate) struct Said {
    /// Exit 0: no file failed.
    pub ok: bool,
    /// Why it failed, or what it reported.
    pub why: String,
    /// The level reported for the file.
    pub level: Option<VerifyLevel>,
    /// Whether the run had `--require-level device`.
    pub require_device: bool,
    /// Blocks resent after a failed check.
    pub resent: u64,
    /// Blocks not sent because the receiver held them.
    pub blocks_skipped: u64,
    /// Whether the file was reported unchanged (nothing sent).
    pub unchanged: bool,
    /// The lowest level that claims the faulted layer (None: `device`).
    pub claimed_by: Option<VerifyLevel>,
}

impl Said {
    /// From an in-process `send`.
    pub fn from_report(r: &Result<CopyReport, TransferError>, require_device: bool) -> Said {
        match r {
            Ok(r) => {
                let file = r.files.iter().find(|f| f.kind == "file");
                Said {
                    ok: r.failed == 0,
                    why: r
                        .files
                        .iter()
                        .find_map(|f| f.error.clone())
                        .unwrap_or_default(),
                    level: file.and_then(|f| f.level),
                    require_device,
                    resent: r.files.iter().map(|f| f.blocks_resent).sum(),
                    blocks_skipped: r.files.iter().map(|f| f.blocks_skipped).sum(),
                    unchanged: file.is_some_and(|f| f.unchanged),
                    claimed_by: None,
                }
            }
            Err(e) => Said {
                why: e.to_string(),
                require_device,
                ..Said::default()
            },
        }
    }

    /// From `intact send --json` (the real binary).
    pub fn from_json(success: bool, json: Option<&serde_json::Value>) -> Said {
        let file = json.and_then(|v| {
            v["files"]
                .as_array()?
                .iter()
                .find(|f| f["kind"] == "file")
                .cloned()
        });
        let level = file
            .as_ref()
            .and_then(|f| f["level"].as_str())
            .and_then(|l| l.parse().ok());
        Said {
            ok: success,
            why: json
                .and_then(|v| v["stderr"].as_str())
                .unwrap_or_default()
                .to_string(),
            level,
            require_device: false,
            resent: file
                .as_ref()
                .and_then(|f| f["blocks_resent"].as_u64())
                .unwrap_or(0),
            blocks_skipped: file
                .as_ref()
                .and_then(|f| f["blocks_skipped"].as_u64())
                .unwrap_or(0),
            unchanged: file
                .as_ref()
                .and_then(|f| f["unchanged"].as_bool())
                .unwrap_or(false),
            claimed_by: None,
        }
    }

    /// Whether a success promised the faulted layer's bytes: a level at or
    /// above [`Said::claimed_by`] (`device`, or `media` above it, unless
    /// the fault says otherwise), or `--require-level device`.
    pub fn claims_layer(&self) -> bool {
        let claim = self.claimed_by.unwrap_or(VerifyLevel::Device);
        self.ok && (self.level >= Some(claim) || self.require_device)
    }

    /// The same, judged against a fault whose layer `level` claims.
    pub fn claimed_by(self, level: VerifyLevel) -> Said {
        Said {
            claimed_by: Some(level),
            ..self
        }
    }

    /// "level device, 2 blocks skipped, unchanged" for the detail column.
    pub fn summary(&self) -> String {
        let mut s = match self.level {
            Some(l) => format!("level {l}"),
            None => "no level".to_string(),
        };
        if self.require_device {
            s += " (--require-level device)";
        }
        if self.resent > 0 {
            s += &format!(", {} block(s) resent", self.resent);
        }
        if self.blocks_skipped > 0 {
            s += &format!(", {} block(s) skipped", self.blocks_skipped);
        }
        if self.unchanged {
            s += ", unchanged";
        }
        if !self.ok && !self.why.is_empty() {
            s += &format!(": {}", self.why);
        }
        s
    }
}

/// A success with wrong bytes on the device: LIE if it claimed the device.
fn wrong(said: &Said) -> (Outcome, String) {
    if said.claims_layer() {
        (
            Outcome::Lie,
            format!(
                "exit 0, the device differs after remount: {}",
                said.summary()
            ),
        )
    } else {
        (
            Outcome::Missed,
            format!("exit 0, the device differs: {}", said.summary()),
        )
    }
}

/// Judges a run into which the fault was injected during the run: it must
/// have detected it (resent a block) to be repaired, else the injection
/// had no effect. `named_wrong`: a file with wrong bytes carries the final
/// name; `equal`: the device holds the source's bytes.
pub(crate) fn judge_during(
    said: &Said,
    injected: bool,
    equal: bool,
    named: bool,
) -> (Outcome, String) {
    if !injected {
        return (Outcome::NoEffect, "the injector never fired".into());
    }
    match (said.ok, equal) {
        (true, true) if said.resent > 0 => (Outcome::Repaired, said.summary()),
        (true, true) => (
            Outcome::NoEffect,
            format!("success, right bytes, nothing resent: {}", said.summary()),
        ),
        (true, false) => wrong(said),
        (false, _) if named && !equal => (
            Outcome::Missed,
            format!(
                "failed, but a wrong file has its final name: {}",
                said.summary()
            ),
        ),
        (false, _) => (Outcome::FailedClean, said.summary()),
    }
}

/// Judges the run that follows a fault already proven in place (a resume,
/// a file damaged since it was sent, a wrong source cache): repaired if it
/// succeeded and the device now holds the source's bytes; failed (clean)
/// if it failed, since it claimed nothing for the damaged file.
pub(crate) fn judge_after(said: &Said, equal: bool) -> (Outcome, String) {
    match (said.ok, equal) {
        (true, true) => (Outcome::Repaired, said.summary()),
        (true, false) => wrong(said),
        (false, _) => (Outcome::FailedClean, said.summary()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_bytes_under_a_device_or_media_level_are_a_lie() {
        let at = |level| Said {
            ok: true,
            level: Some(level),
            ..Said::default()
        };
        for (level, want) in [
            (VerifyLevel::Media, Outcome::Lie),
            (VerifyLevel::Device, Outcome::Lie),
            (VerifyLevel::Cache, Outcome::Missed),
            (VerifyLevel::Network, Outcome::Missed),
        ] {
            assert_eq!(judge_after(&at(level), false).0, want, "{level}");
        }
    }

    #[test]
    fn a_flash_fault_is_claimed_by_media_only() {
        let at = |level| {
            Said {
                ok: true,
                level: Some(level),
                ..Said::default()
            }
            .claimed_by(VerifyLevel::Media)
        };
        for (level, want) in [
            (VerifyLevel::Media, Outcome::Lie),
            (VerifyLevel::Device, Outcome::Missed),
        ] {
            assert_eq!(judge_after(&at(level), false).0, want, "{level}");
        }
        // A wrong page cache is claimed by `cache` already.
        let cache = Said {
            ok: true,
            level: Some(VerifyLevel::Cache),
            ..Said::default()
        }
        .claimed_by(VerifyLevel::Cache);
        assert_eq!(judge_after(&cache, false).0, Outcome::Lie);
    }
}
