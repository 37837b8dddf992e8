//! Spreading one large file over a send's streams, so that a long round
//! trip does not leave the file to a single TCP window.
//!
//! Why: one stream's bytes in flight are capped by the kernel's socket
//! buffers (`net.ipv4.tcp_wmem`/`tcp_rmem`, 4 and 6 MiB at most by
//! default), so at 30 ms one stream carries about half of a 1 Gbit/s link
//! whatever intact does. Files still go one per stream from a shared
//! queue, which fills every stream when there are many; a file large
//! enough is instead cut into block ranges that enter the queue one after
//! another, and each stream takes the next range as it takes the next
//! file. The receiver knows ranges already (the scale-out issue's split
//! files, `net/receiver/split.rs`): each range is claimed, verified and
//! confirmed on its own, and the file is committed once, under its final
//! name, when confirmed ranges cover it. The report joins the ranges back
//! into one row per file.
//!
//! When: `--spread auto` (the default) spreads when the fastest stream's
//! TCP connect took at least [`AUTO_MIN_RTT`] (a connect is one round
//! trip), so loopback and LAN sends, where one window is plenty, keep the
//! whole-file path and its quick check of unchanged files (a range of a
//! file the server holds is checked by reading the file at both ends, see
//! the receiver's split.rs). Only modes that verify a range on its own
//! spread (riva, block, fiver, none); `sequential`, `file` and `flash`
//! verify a file as a whole.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use intact_digest::Blake3Blocks;

use crate::report::{CopyReport, FileReport};
use crate::source::{Scan, SourceEntry, SourceKind, SourceRange};
use crate::{VerifyLevel, MAX_RANGES, MAX_RANGE_BLOCKS, MIN_SPLIT_BLOCK};

/// Whether large files are spread over the streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Spread {
    /// When the round trip is at least [`AUTO_MIN_RTT`].
    #[default]
    Auto,
    /// Whenever the mode and the block size allow it.
    Always,
    /// Never: each file rides one stream.
    Never,
}

impl std::str::FromStr for Spread {
    type Err = String;
    fn from_str(s: &str) -> Result<Spread, String> {
        match s {
            "auto" => Ok(Spread::Auto),
            "always" => Ok(Spread::Always),
            "never" => Ok(Spread::Never),
            other => Err(format!(
                "unknown --spread {other:?} (auto, always or never)"
            )),
        }
    }
}

/// `--spread auto` spreads from this round trip up.
pub const AUTO_MIN_RTT: Duration = Duration::from_millis(1);
/// Ranges are at least this large (their commit costs a journal
/// transaction and an fdatasync at the receiver), so files below twice
/// this ride one stream.
pub const MIN_RANGE_BYTES: u64 = 16 << 20;
/// And at most this large, so that streams finish a file together.
pub const MAX_RANGE_BYTES: u64 = 256 << 20;

/// The context of a spread file's split id (see [`split_id`]).
const SPLIT_ID_CONTEXT: &str = "intact 2026-11 split id of a file spread over streams";
/// The context the secret of [`split_id`] is derived from the key by.
pub(crate) const SPLIT_SECRET_CONTEXT: &str = "intact 2026-11 secret of spread split ids";

/// What [`cut`] did, for the run's report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SpreadReport {
    /// The fastest stream's TCP connect, in seconds (one round trip).
    pub rtt_seconds: f64,
    /// Why files were, or were not, spread.
    pub why: String,
    /// Files cut into ranges.
    pub files: u64,
    /// Ranges they were cut into.
    pub ranges: u64,
}

/// The ranges of one spread file: the original entry and where its
/// ranges sit in the spread scan.
pub(crate) struct Group {
    original: usize,
    ranges: std::ops::Range<usize>,
}

impl Group {
    /// Its ranges.
    pub(crate) fn len(&self) -> usize {
        self.ranges.len()
    }
}

/// Chaining values of each range that ended, by entry id of the spread
/// scan, so the joined row can carry the file's BLAKE3.
pub(crate) type RangeCvs = Mutex<HashMap<u64, Vec<[u8; 32]>>>;

/// Whether to spread, from the option, the mode, the streams and the
/// measured round trip; and the reason, for the report.
pub(crate) fn decide(
    spread: Spread,
    mode: crate::VerifyMode,
    block: usize,
    streams: usize,
    reverify: bool,
    rtt: Duration,
) -> (bool, String) {
    let ms = rtt.as_secs_f64() * 1e3;
    if spread == Spread::Never {
        return (false, "--spread never".into());
    }
    if reverify {
        // A file the server committed is re-verified in place only whole.
        return (false, "--reverify re-verifies whole files".into());
    }
    if streams < 2 {
        return (false, "one stream".into());
    }
    if !mode.verifies_ranges() {
        return (
            false,
            format!("--verify {mode} verifies a file as a whole, so a file rides one stream"),
        );
    }
    if !block.is_power_of_two() || (block as u64) < MIN_SPLIT_BLOCK {
        return (
            false,
            "ranges need a power-of-two block size of at least 4 KiB".into(),
        );
    }
    match spread {
        Spread::Always => (true, "--spread always".into()),
        _ if rtt >= AUTO_MIN_RTT => (
            true,
            format!(
                "round trip {ms:.1} ms ≥ {} ms: one TCP window cannot fill a long link",
                AUTO_MIN_RTT.as_millis()
            ),
        ),
        _ => (
            false,
            format!(
                "round trip {ms:.2} ms < {} ms: one window per file is enough",
                AUTO_MIN_RTT.as_millis()
            ),
        ),
    }
}

/// Ranges a file is cut into, at most, before [`MIN_RANGE_BYTES`] and
/// [`MAX_RANGE_BYTES`] bound their size: a quarter of a stream's share at
/// the default 4 streams. Not taken from `--streams`, so that the cut,
/// and with it the split id a resumed send must carry again, does not
/// change with it.
const RANGES_PER_FILE: u64 = 16;

/// Blocks per range for a file of `size` bytes cut at `block`:
/// `size ÷ 16`, within [`MIN_RANGE_BYTES`]..[`MAX_RANGE_BYTES`], and never
/// more ranges than the receiver keeps per file nor more blocks than one
/// Status lists.
fn range_blocks(size: u64, block: u64) -> u64 {
    let blocks = size.div_ceil(block);
    let want = (size / RANGES_PER_FILE).clamp(MIN_RANGE_BYTES, MAX_RANGE_BYTES);
    (want / block)
        .max(1)
        .max(blocks.div_ceil(MAX_RANGES))
        .min(MAX_RANGE_BLOCKS)
}

/// The split id of a spread file: derived from the pre-shared key (zeros
/// without one: plain sends are loopback only) and what identifies this
/// version of the file and its cut, so that the same send run again after
/// an interruption carries the same id, and the server keeps the ranges
/// it confirmed.
fn split_id(secret: &[u8; 32], e: &SourceEntry, block: u64, per_range: u64) -> [u8; 16] {
    let mut h = blake3::Hasher::new_derive_key(SPLIT_ID_CONTEXT);
    h.update(secret);
    h.update(&(e.rel.as_bytes().len() as u64).to_be_bytes());
    h.update(e.rel.as_bytes());
    for n in [
        e.size,
        e.mtime.sec as u64,
        u64::from(e.mtime.nsec),
        block,
        per_range,
    ] {
        h.update(&n.to_be_bytes());
    }
    let mut id = [0; 16];
    id.copy_from_slice(&h.finalize().as_bytes()[..16]);
    id
}

/// The scan with every whole file of at least two ranges replaced by its
/// ranges, in place (so they enter the queue one after another), and the
/// groups to join the report by.
pub(crate) fn cut(scan: &Scan, block: usize, secret: &[u8; 32]) -> (Scan, Vec<Group>) {
    let block = block as u64;
    let mut entries = Vec::with_capacity(scan.entries.len());
    let mut groups = Vec::new();
    for (i, e) in scan.entries.iter().enumerate() {
        if e.kind != SourceKind::File || e.range.is_some() || e.size < 2 * MIN_RANGE_BYTES {
            entries.push(e.clone());
            continue;
        }
        let blocks = e.size.div_ceil(block);
        let per = range_blocks(e.size, block);
        if blocks < 2 || blocks.div_ceil(per) < 2 {
            entries.push(e.clone());
            continue;
        }
        let split = split_id(secret, e, block, per);
        let start = entries.len();
        let mut first = 0;
        while first < blocks {
            let end = (first + per).min(blocks);
            let mut r = e.clone();
            r.range = Some(SourceRange {
                split,
                first,
                end,
                block_size: block,
            });
            entries.push(r);
            first = end;
        }
        groups.push(Group {
            original: i,
            ranges: start..entries.len(),
        });
    }
    // The scan's errors and skipped files are the original's: `join`
    // puts them back into the report.
    let spread = Scan {
        entries,
        errors: Vec::new(),
        skipped: Vec::new(),
    };
    (spread, groups)
}

/// Folds the range rows of `report` (made from the spread scan) back into
/// one row per file of `original`, in its order. A file is verified only
/// when every range verified and one of them says the server committed it
/// (or every one says it was held already); its level is the lowest of
/// its ranges', its BLAKE3 composed from their chaining values.
pub(crate) fn join(
    report: &mut CopyReport,
    original: &Scan,
    groups: &[Group],
    cvs: RangeCvs,
    block: usize,
    aim: VerifyLevel,
) {
    let mut cvs = cvs.into_inner().unwrap_or_else(|p| p.into_inner());
    let mut rows: Vec<Option<FileReport>> = std::mem::take(&mut report.files)
        .into_iter()
        .map(Some)
        .collect();
    let mut files = Vec::with_capacity(original.entries.len());
    let mut next = 0; // the next row of the spread scan
    for g in groups {
        // Rows before the group are the entries before it, one each.
        while files.len() < g.original {
            files.push(rows[next].take().expect("one row per entry"));
            next += 1;
        }
        let e = &original.entries[g.original];
        let parts: Vec<(u64, FileReport)> = g
            .ranges
            .clone()
            .map(|k| (k as u64, rows[k].take().expect("one row per range")))
            .collect();
        files.push(join_file(e, parts, &mut cvs, block as u64, aim));
        next = g.ranges.end;
    }
    while next < rows.len() {
        files.push(rows[next].take().expect("one row per entry"));
        next += 1;
    }
    // The run's own errors (sources that could not be read) and skipped
    // files are the original scan's: they count as failures as in any run.
    report.errors = original.errors.iter().map(|e| e.to_string()).collect();
    report.skipped = original
        .skipped
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    report.failed =
        (files.iter().filter(|f| f.error.is_some()).count() + report.errors.len()) as u64;
    report.files = files;
}

fn join_file(
    e: &SourceEntry,
    parts: Vec<(u64, FileReport)>,
    cvs: &mut HashMap<u64, Vec<[u8; 32]>>,
    block: u64,
    aim: VerifyLevel,
) -> FileReport {
    let why_lowest = lowest_reason(&parts);
    let mut parts = parts.into_iter();
    let (first_id, mut row) = parts.next().expect("two ranges or more");
    let n = row.range.as_ref().map_or(0, |r| r.file_blocks);
    let server_digest = |r: &FileReport| r.range.as_ref().and_then(|r| r.file_digest.clone());
    let mut states = vec![row.range.as_ref().and_then(|r| r.state)];
    let mut theirs = vec![server_digest(&row)];
    let mut all_cvs = cvs.remove(&first_id);
    let mut level = row.level;
    for (id, p) in parts {
        states.push(p.range.as_ref().and_then(|r| r.state));
        theirs.push(server_digest(&p));
        row.blocks += p.blocks;
        row.blocks_resent += p.blocks_resent;
        row.pages_resent += p.pages_resent;
        row.blocks_from_cache += p.blocks_from_cache;
        row.cache_seconds += p.cache_seconds;
        row.blocks_from_source += p.blocks_from_source;
        row.source_repair_seconds += p.source_repair_seconds;
        row.blocks_skipped += p.blocks_skipped;
        row.bytes_skipped += p.bytes_skipped;
        row.bytes_sent += p.bytes_sent;
        row.bytes_reverified += p.bytes_reverified;
        row.bytes_trusted += p.bytes_trusted;
        row.trusted_level = min_some(row.trusted_level, p.trusted_level);
        row.trusted_since = min_some(row.trusted_since, p.trusted_since);
        row.transfer_seconds = row.transfer_seconds.max(p.transfer_seconds);
        row.checksum_seconds += p.checksum_seconds;
        row.pages_resident += p.pages_resident;
        row.evict_seconds += p.evict_seconds;
        row.transfer_stage_seconds += p.transfer_stage_seconds;
        row.verify_stage_seconds += p.verify_stage_seconds;
        if row.read_path.is_none() {
            row.read_path = p.read_path;
        }
        row.note = row.note.or(p.note);
        if row.error.is_none() {
            row.error = p.error;
        }
        level = match (level, p.level) {
            (Some(a), Some(b)) => Some(a.min(b)),
            _ => None,
        };
        all_cvs = match (all_cvs, cvs.remove(&id)) {
            (Some(mut a), Some(b)) => {
                a.extend(b);
                Some(a)
            }
            _ => None,
        };
    }
    row.size = e.size;
    row.range = None;
    row.unchanged = false;
    row.digest = None;
    row.source_digest = None;
    let committed = states.contains(&Some("committed"));
    let held = states.iter().all(|s| *s == Some("held"));
    if row.error.is_none() && (level.is_none() || !(committed || held)) {
        row.error = Some(format!(
            "{}: every range verified, but the server did not say it committed the file \
             (send it again)",
            row.path
        ));
    }
    if row.error.is_some() {
        row.level = None;
        row.note = None;
        return row;
    }
    // The file under its final name must be the one these ranges make:
    // every range that says it is committed or held names the BLAKE3 the
    // server recorded, and all of them equal the one composed here from
    // this sender's blocks (another version committed between two
    // ranges' answers, or ranges of two senders interleaved, fail here).
    let ours = all_cvs
        .filter(|c| c.len() as u64 == n)
        .and_then(|c| Blake3Blocks::from_cvs(e.size, block, c))
        .and_then(|t| t.finalize())
        .map(|h| h.to_hex().to_string());
    let named: Vec<&Option<String>> = states
        .iter()
        .zip(&theirs)
        .filter(|(s, _)| matches!(s, Some("committed" | "held")))
        .map(|(_, d)| d)
        .collect();
    let mismatch = match &ours {
        None => Some("this sender could not compose its BLAKE3 from its ranges".to_string()),
        Some(o) => named
            .iter()
            .find(|d| d.as_ref() != Some(o))
            .map(|d| match d {
                None => "the server named no BLAKE3 for the file it says it holds".to_string(),
                Some(t) => format!(
                    "the server holds a file with BLAKE3 {t}, not {o} as this sender's \
                     ranges make (another version was sent meanwhile): send it again"
                ),
            }),
    };
    if let Some(why) = mismatch {
        row.error = Some(format!("{}: {why}", row.path));
        row.level = None;
        row.note = None;
        return row;
    }
    row.level = level;
    row.unchanged = held;
    // Below the aim, why: the reason the lowest range gave.
    row.note = why_lowest.filter(|_| level.is_some_and(|l| l < aim));
    row.digest = ours;
    row.source_digest = Some(crate::SourceDigest::Transfer);
    row
}

/// Why the lowest of `parts` is where it is: the note of a range that
/// stands at the lowest level itself, with the blocks it covers. A range
/// that committed the file carries the file's level, the lowest of every
/// range the server confirmed (some perhaps in an earlier run, or from
/// another sender): where no range of this run stands that low, that is
/// what the note says.
fn lowest_reason(parts: &[(u64, FileReport)]) -> Option<String> {
    let lowest = parts.iter().filter_map(|(_, p)| p.level).min()?;
    let committed = |p: &FileReport| p.range.as_ref().and_then(|r| r.state) == Some("committed");
    let at_lowest: Vec<_> = parts
        .iter()
        .map(|(_, p)| p)
        .filter(|p| p.level == Some(lowest) && !committed(p))
        .filter_map(|p| Some((p.range.as_ref()?, p.note.as_deref())))
        .collect();
    // The first that says why, else the first.
    let own = at_lowest.iter().find(|(_, note)| note.is_some());
    match own.or(at_lowest.first()) {
        Some((r, note)) => Some(format!(
            "blocks {}..{} at level {lowest}: {}",
            r.first,
            r.end,
            note.unwrap_or("no reason given")
        )),
        None => Some(format!(
            "committed at level {lowest}, the lowest of the ranges the server confirmed \
             (not one sent in this run, or its reason not given)"
        )),
    }
}

fn min_some<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_stay_within_the_receivers_limits() {
        for (size, block) in [
            (64u64 << 20, 4u64 << 20),
            (4 << 30, 4 << 20),
            (1 << 40, 4 << 20),
            (8 << 40, 4 << 20),
            (1 << 30, 4096),
            (100 << 20, 1 << 20),
        ] {
            let per = range_blocks(size, block);
            let blocks = size.div_ceil(block);
            assert!((1..=MAX_RANGE_BLOCKS).contains(&per), "{size} {block}");
            assert!(blocks.div_ceil(per) <= MAX_RANGES, "{size} {block}");
        }
        // 4 GiB: 256 MiB ranges, 16 of them.
        assert_eq!(range_blocks(4 << 30, 4 << 20), 64);
        // 100 MiB: at least 16 MiB each.
        assert_eq!(range_blocks(100 << 20, 4 << 20), 4);
    }

    /// A file of `size` bytes at `rel`, not read by these tests.
    fn entry(rel: &str, size: u64) -> SourceEntry {
        SourceEntry {
            rel: intact_proto::WirePath::parse(rel.as_bytes()).unwrap(),
            abs: std::path::PathBuf::from("/nonexistent").join(rel),
            kind: SourceKind::File,
            mode: 0o644,
            mtime: crate::dest::Mtime { sec: 1, nsec: 2 },
            size,
            range: None,
        }
    }

    #[test]
    fn join_gives_one_row_per_file_and_checks_the_servers_digest() {
        use crate::report::simple_report;
        let mib = 1u64 << 20;
        let original = Scan {
            entries: vec![entry("a", 3 * mib), entry("big", 64 * mib), entry("z", 1)],
            errors: vec![crate::TransferError::Verification {
                path: "unreadable".into(),
                what: "permission denied".into(),
            }],
            skipped: vec!["fifo".into()],
        };
        let (cut, groups) = cut(&original, 4 << 20, &[7; 32]);
        assert_eq!(cut.entries.len(), 2 + 4, "64 MiB in 16 MiB ranges");
        // The chaining values each range left, and the file they make.
        let cv = |i: u64| [i as u8; 32];
        let made = Blake3Blocks::from_cvs(64 * mib, 4 << 20, (0..16).map(cv).collect())
            .and_then(|t| t.finalize())
            .unwrap()
            .to_hex()
            .to_string();
        let cvs = || {
            let m = RangeCvs::default();
            for (k, e) in cut.entries.iter().enumerate() {
                if let Some(r) = e.range {
                    m.lock()
                        .unwrap()
                        .insert(k as u64, (r.first..r.end).map(cv).collect());
                }
            }
            m
        };
        let rows = |states: &[Option<&'static str>], named: Option<&str>| {
            let mut k = 0;
            cut.entries
                .iter()
                .map(|e| {
                    let mut r = simple_report(e, crate::VerifyMode::Riva, None);
                    r.level = Some(crate::VerifyLevel::Device);
                    if let Some(range) = r.range.as_mut() {
                        range.state = states[k];
                        if matches!(states[k], Some("committed" | "held")) {
                            range.file_digest = named.map(str::to_string);
                        }
                        r.blocks = range.end - range.first;
                        k += 1;
                    }
                    r
                })
                .collect::<Vec<_>>()
        };
        // The rows at `lowered` (index, note) at level cache.
        let joined_lowered =
            |states: &[Option<&'static str>], named: Option<&str>, lowered: &[(usize, &str)]| {
                let mut report =
                    CopyReport::new(rows(states, named), &cut, 0, std::time::Instant::now(), 4);
                for (k, note) in lowered {
                    report.files[*k].level = Some(crate::VerifyLevel::Cache);
                    report.files[*k].note = Some(note.to_string());
                }
                join(
                    &mut report,
                    &original,
                    &groups,
                    cvs(),
                    4 << 20,
                    crate::VerifyLevel::Device,
                );
                report
            };
        let joined = |states: &[Option<&'static str>], named: Option<&str>| {
            joined_lowered(states, named, &[])
        };
        let waiting = Some("waiting");
        let report = joined(&[waiting, Some("committed"), waiting, waiting], Some(&made));
        let paths: Vec<&str> = report.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["a", "big", "z"]);
        let big = &report.files[1];
        assert_eq!((big.size, big.blocks), (64 * mib, 16));
        assert_eq!(big.level, Some(crate::VerifyLevel::Device));
        assert!(big.range.is_none() && big.error.is_none(), "{big:?}");
        assert_eq!(big.digest.as_deref(), Some(made.as_str()));
        assert!(big.note.is_none(), "at the aim, no note: {big:?}");
        assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
        assert_eq!(report.skipped, ["fifo"]);
        assert_eq!(report.failed, 1, "the unreadable source counts");

        // One range below the aim, with its reason; the committing range
        // carries the file's (lowered) level with its state message only:
        // the joined row says why, naming the lower range.
        let lowest = [waiting, waiting, Some("committed"), waiting];
        let report = joined_lowered(
            &lowest,
            Some(&made),
            &[
                (2, "2 of 4 re-reads at the source found pages still cached"),
                (3, "range 8..12 verified; with it all 4 ranges: the file is committed at level cache"),
            ],
        );
        let big = &report.files[1];
        assert_eq!(big.level, Some(crate::VerifyLevel::Cache), "{big:?}");
        assert_eq!(
            big.note.as_deref(),
            Some("blocks 4..8 at level cache: 2 of 4 re-reads at the source found pages still cached"),
        );

        // Only the committing range carries the lower level (the range
        // that lowered it was confirmed before this run): the note says
        // so, naming no blocks of this run.
        let report = joined_lowered(
            &lowest,
            Some(&made),
            &[(3, "range 8..12 verified; the file is committed")],
        );
        let note = report.files[1].note.as_deref().unwrap_or("");
        assert!(
            note.starts_with("committed at level cache, the lowest of the ranges"),
            "{note}"
        );

        // All held, with the server's digest: unchanged.
        let report = joined(&[Some("held"); 4], Some(&made));
        assert!(report.files[1].unchanged && report.files[1].error.is_none());

        // No range says the file was committed; the server holds another
        // version than these ranges make; it names none: never verified.
        let other = "00".repeat(32);
        for (states, named) in [
            ([waiting; 4], Some(made.as_str())),
            ([Some("held"); 4], Some(other.as_str())),
            ([Some("held"); 4], None),
        ] {
            let report = joined(&states, named);
            let big = &report.files[1];
            assert!(big.error.is_some(), "{named:?}: {big:?}");
            assert!(!big.unchanged && big.level.is_none());
            assert_eq!(report.failed, 2);
        }
    }

    #[test]
    fn auto_spreads_only_on_a_long_round_trip_and_in_range_modes() {
        use crate::VerifyMode::*;
        let b = 4 << 20;
        let ms = Duration::from_millis;
        assert!(decide(Spread::Auto, Riva, b, 4, false, ms(30)).0);
        assert!(!decide(Spread::Auto, Riva, b, 4, false, Duration::from_micros(60)).0);
        assert!(decide(Spread::Always, Riva, b, 4, false, Duration::ZERO).0);
        assert!(!decide(Spread::Always, Riva, b, 1, false, ms(30)).0);
        assert!(!decide(Spread::Always, Flash, b, 4, false, ms(30)).0);
        assert!(!decide(Spread::Always, Sequential, b, 4, false, ms(30)).0);
        assert!(!decide(Spread::Always, Riva, 3 << 20, 4, false, ms(30)).0);
        assert!(!decide(Spread::Never, Riva, b, 4, false, ms(30)).0);
        assert!(!decide(Spread::Always, Riva, b, 4, true, ms(30)).0);
    }
}
