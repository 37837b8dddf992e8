//! The receiver's verdict on a file, into its report: the level is the
//! lower of both ends'.

use std::time::Duration;

use intact_proto::{FileResult, FileStatus};

use super::stream::{Outgoing, Stream};
use crate::profile::Stage;
use crate::source_cache::SourceDigest;
use crate::verify::{Reached, VerifyLevel};

impl Stream<'_> {
    /// The level this end's reads of the source support for a file: the
    /// mode's aim, lowered where a riva read did not reach the device.
    pub(super) fn source_level(&self, o: &Outgoing) -> Reached {
        let mut reached = Reached::aim(self.ctx.opts.verify);
        if let Some(source) = &o.source {
            source.lower(&mut reached);
        }
        reached
    }

    /// The receiver's verdict on file `id`, into its report. The level is
    /// the lower of both ends': the receiver's (its checks in this run and
    /// the recorded level of what it trusted) and the source's reads.
    pub(super) fn file_result(&mut self, o: &mut Outgoing, r: FileResult) {
        o.report.unchanged = r.unchanged;
        o.report.bytes_reverified = r.reverified;
        o.report.bytes_trusted = r.trusted;
        if r.trusted > 0 {
            o.report.trusted_level = VerifyLevel::from_wire_id(r.trusted_level);
            o.report.trusted_since = (r.trusted_at > 0).then_some(r.trusted_at);
        }
        let secs = o.started.elapsed().as_secs_f64();
        o.report.transfer_seconds = (secs - o.report.checksum_seconds).max(0.0);
        o.report.checksum_seconds += r.check_micros as f64 / 1e6;
        o.report.verify_stage_seconds = r.check_micros as f64 / 1e6;
        o.report.evict_seconds += r.evict_micros as f64 / 1e6;
        o.report.pages_resident += r.resident;
        // The receiver's account of its repairs; from a cache only where
        // this sender sent the BLAKE3s a cache's block is taken by.
        if o.strong {
            o.report.blocks_from_cache = o.report.blocks_from_cache.saturating_add(r.cache_repairs);
            o.report.cache_seconds += r.cache_micros as f64 / 1e6;
        }
        o.report.blocks_from_source = o.report.blocks_from_source.saturating_add(r.source_repairs);
        o.report.source_repair_seconds += r.source_micros as f64 / 1e6;
        if self.tcp.is_some() {
            // The server's stages as its result reports them (in process,
            // the receiver half adds them to the shared profile itself).
            let profile = self.ctx.profile;
            for (stage, micros) in [
                (Stage::Verify, r.check_micros),
                (Stage::Evict, r.evict_micros),
            ] {
                if micros > 0 {
                    profile.add(stage, Duration::from_micros(micros));
                }
            }
        }
        let verified = r.status == FileStatus::Verified;
        if !verified || o.gave_up.is_some() || o.report.error.is_some() {
            o.report.level = None;
            if o.report.error.is_none() {
                o.report.error = Some(match o.gave_up {
                    Some(index) => format!(
                        "{}: block {index} failed verification {} times",
                        o.report.path,
                        self.ctx.opts.retries + 1
                    ),
                    // The receiver's reasons may name the path already.
                    None if r.message.starts_with(&o.report.path) => r.message,
                    None => format!("{}: {}", o.report.path, r.message),
                });
            }
            return;
        }
        if o.source.is_none() {
            o.report.level = None;
            return;
        }
        if let Some(range) = o.report.range.as_mut() {
            range.state = crate::report::RangeReport::state_of(r.split);
            range.file_digest = <[u8; 32]>::try_from(r.digest.as_slice())
                .ok()
                .map(|d| blake3::Hash::from_bytes(d).to_hex().to_string());
            if range.state.is_none() {
                o.report.level = None;
                o.report.error = Some(format!(
                    "{}: the server did not say where the range's file stands",
                    o.report.path
                ));
                return;
            }
        }
        // An unknown level id reads as the weakest.
        let mut reached = Reached {
            level: VerifyLevel::from_wire_id(r.level).unwrap_or(VerifyLevel::None),
            note: (!r.message.is_empty()).then(|| r.message.clone()),
        };
        let mode = self.ctx.opts.verify;
        // This end's own reason, which says more than the receiver's echo
        // of the level the source's reads reached.
        let mut own = Reached::aim(mode);
        if let Some(source) = &o.source {
            if let Some(stats) = source.device_stats() {
                o.report.evict_seconds += stats.evict.as_secs_f64();
                if !stats.evict.is_zero() {
                    self.ctx.profile.add(Stage::Evict, stats.evict);
                }
                o.report.pages_resident += stats.resident;
            }
            source.lower(&mut own);
        }
        let own = own
            .note
            .filter(|_| own.level < mode.level())
            .map(|n| (own.level, n));
        if let Some((level, why)) = &own {
            if *level < reached.level {
                reached = Reached {
                    level: *level,
                    note: Some(why.clone()),
                };
            } else if *level == reached.level {
                let echo = crate::verify::source_cap_note(*level);
                reached.note = Some(match reached.note.take() {
                    Some(theirs) if theirs != echo => format!("{why}; {theirs}"),
                    _ => why.clone(),
                });
            }
        }
        o.report.level = Some(reached.level);
        // Below the aim, why; `flash` also says which window it waited for.
        o.report.note = reached
            .note
            .clone()
            .filter(|_| reached.level < mode.level() || mode == crate::VerifyMode::Flash);
        if o.report.range.is_some() {
            // Where the split file stands (and, below the aim, the
            // receiver's why), then why this end lowered the range.
            let mut note = r.message.clone();
            if let Some((level, why)) = &own {
                if !note.is_empty() {
                    note.push_str("; ");
                }
                note.push_str(&format!("the sender's reads reached level {level}: {why}"));
            }
            o.report.note = (!note.is_empty()).then_some(note);
        }
        // The bytes the receiver holds have this run's digest of the source:
        // the next quick check can take it from the cache. One it holds
        // already for this key (a file sent again to a new destination) is
        // left as recorded: writing the same row again costs a stat and a
        // row per file. (So its recorded time stays that of its first
        // digest, and past the cache's bound it goes before entries
        // recorded later, however often it is sent.)
        let known = o.cached.is_some_and(|(d, _)| Some(d) == o.digest);
        if let (Some(c), Some(k), Some(src), Some(d), Some(SourceDigest::Transfer), false) = (
            self.ctx.cache,
            &o.key,
            &o.source,
            &o.digest,
            o.report.source_digest,
            known,
        ) {
            c.put(src.file(), k, o.opened_at, d);
        }
        if let Err(err) = crate::verify::require_level(
            self.ctx.opts.require_level,
            o.report.level,
            &o.report.path,
        ) {
            // Committed at the receiver, but below the level asked for:
            // the run must say so, resumed and unchanged files included.
            o.report.error = Some(err.to_string());
        }
        if o.report.error.is_some() {
            o.report.level = None;
        }
    }
}
