//! One report of many: the shards' JSON reports merged into totals,
//! per-file rows, failures and levels, with what is missing said plainly.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use intact_transfer::VerifyLevel;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Plan, ShardError};

/// What a shard's report says of the shard it is (`"shard"` in the report
/// of `intact send --plan`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShardStamp {
    /// The plan's id.
    pub plan: String,
    /// This shard's index.
    pub index: u32,
    /// How many shards the plan has.
    pub of: u32,
    /// The server it sent to.
    pub to: String,
    /// Where the index came from (`--shard` or an engine's variable).
    pub index_from: String,
    /// The host that ran it.
    pub host: String,
    /// When it ended, seconds since the epoch: of two reports of one
    /// shard, the later counts (a re-run after a failure).
    pub finished: i64,
}

/// One shard's run as merged.
#[derive(Debug, Clone, Serialize)]
pub struct ShardRun {
    /// The shard's stamp.
    pub shard: ShardStamp,
    /// The report file.
    pub report: PathBuf,
    /// The run ended (false: it stopped, e.g. the connection was lost).
    pub complete: bool,
    /// Entries that failed in it.
    pub failed: u64,
    /// Rows its report has.
    pub entries: u64,
    /// Bytes of its regular files.
    pub bytes: u64,
    /// Bytes it sent.
    pub bytes_sent: u64,
    /// Its wall-clock seconds.
    pub seconds: f64,
}

/// A failure, and the shard it happened in.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    /// The shard.
    pub shard: u32,
    /// The entry (destination path), or empty for a failure of the run.
    pub path: String,
    /// Why.
    pub error: String,
}

/// The merged report.
#[derive(Debug, Clone, Serialize)]
pub struct Merged {
    /// The plan all the reports belong to.
    pub plan: String,
    /// How many shards it has.
    pub shards: u32,
    /// True only if every shard reported, every run ended, and nothing failed.
    pub complete: bool,
    /// Shards with no report.
    pub missing: Vec<u32>,
    /// Shards whose run failed something or did not end.
    pub failed_shards: Vec<u32>,
    /// Entries in all reports, each path once (a directory is in every
    /// shard that sent something under it).
    pub entries: u64,
    /// Bytes of regular files.
    pub bytes: u64,
    /// Bytes sent, resends included.
    pub bytes_sent: u64,
    /// Bytes held at the destinations and re-verified in place.
    pub bytes_reverified: u64,
    /// Bytes held at the destinations and trusted from their journals.
    pub bytes_trusted: u64,
    /// Entries that failed (and run errors).
    pub failed: u64,
    /// The slowest shard's wall-clock seconds.
    pub seconds: f64,
    /// Verified regular files per level reached.
    pub levels: BTreeMap<String, u64>,
    /// The level every verified regular file reached, at least.
    pub level: Option<String>,
    /// Every failure, with its shard.
    pub failures: Vec<Failure>,
    /// Each shard's run, by index.
    pub runs: Vec<ShardRun>,
    /// Reports left out because a later report of the same shard was given.
    pub superseded: Vec<PathBuf>,
    /// Every entry's row from its shard's report, with `"shard"` added.
    pub files: Vec<Value>,
}

/// The verified ranges of one split file, from the rows of its shards.
#[derive(Default)]
struct SplitFile {
    file_blocks: u64,
    ranges: Vec<(u64, u64)>,
    level: Option<VerifyLevel>,
    committed: bool,
    all_held: bool,
    rows: usize,
    shards: Vec<u32>,
    /// The BLAKE3s the server named for the committed file (protocol 13)
    /// in the rows that say it is committed or held.
    digests: BTreeSet<String>,
}

impl SplitFile {
    fn add(&mut self, shard: u32, r: &Value, level: VerifyLevel) {
        self.file_blocks = num(r, "file_blocks");
        self.ranges.push((num(r, "first"), num(r, "end")));
        self.level = Some(self.level.map_or(level, |l| l.min(level)));
        let state = r.get("state").and_then(Value::as_str).unwrap_or("");
        self.committed |= state == "committed";
        if let Some(d) = r.get("file_digest").and_then(Value::as_str) {
            if matches!(state, "committed" | "held") {
                self.digests.insert(d.to_string());
            }
        }
        self.all_held = (self.rows == 0 || self.all_held) && state == "held";
        self.rows += 1;
        if !self.shards.contains(&shard) {
            self.shards.push(shard);
            self.shards.sort_unstable();
        }
    }

    /// The file's level, if its ranges cover it and one of them committed
    /// it (or all found it committed); else why not.
    fn verdict(&self) -> Result<VerifyLevel, String> {
        let mut ranges = self.ranges.clone();
        ranges.sort_unstable();
        let mut at = 0;
        for (first, end) in ranges {
            if first != at {
                return Err(format!(
                    "split file: blocks {at}..{first} of {} have no verified range in these reports",
                    self.file_blocks
                ));
            }
            at = end;
        }
        if at != self.file_blocks {
            return Err(format!(
                "split file: blocks {at}..{} of {} have no verified range in these reports",
                self.file_blocks, self.file_blocks
            ));
        }
        if self.digests.len() > 1 {
            return Err(format!(
                "split file: its ranges' reports name {} different files under its name \
                 (BLAKE3 {}): another version was committed meanwhile; run its shards again",
                self.digests.len(),
                self.digests.iter().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        if !self.committed && !self.all_held {
            return Err(
                "split file: every range verified, but no report says the file was committed: \
                 run any of its shards again"
                    .into(),
            );
        }
        Ok(self.level.unwrap_or(VerifyLevel::None))
    }
}

fn num(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// Merges shard reports (each a report file's path and its JSON). With
/// `plan`, every report must belong to it, and every entry it gives a
/// shard must have a row in that shard's report. Reports of different
/// plans, or files that are not shard reports, are errors.
pub fn merge(reports: Vec<(PathBuf, Value)>, plan: Option<&Plan>) -> Result<Merged, ShardError> {
    let mut stamped = Vec::with_capacity(reports.len());
    for (path, v) in reports {
        let stamp: ShardStamp = match v.get("shard").cloned().map(serde_json::from_value) {
            Some(Ok(s)) => s,
            Some(Err(e)) => {
                return Err(ShardError::Report {
                    path,
                    why: format!("its \"shard\" is not readable ({e})"),
                })
            }
            None => return Err(ShardError::Report {
                path,
                why: "not a shard's report (no \"shard\"; was it written by `intact send --plan`?)"
                    .into(),
            }),
        };
        stamped.push((path, stamp, v));
    }
    let Some((_, first, _)) = stamped.first() else {
        return Err(ShardError::Usage("no reports to merge".into()));
    };
    let (plan_id, shards) = match plan {
        Some(p) => (p.id.clone(), p.shards.len() as u32),
        None => (first.plan.clone(), first.of),
    };
    if shards == 0 || shards > crate::MAX_SHARDS {
        return Err(ShardError::Usage(format!(
            "a plan of {shards} shards: a plan has 1 to {} shards",
            crate::MAX_SHARDS
        )));
    }
    for (path, s, _) in &stamped {
        if s.plan != plan_id || s.of != shards || s.index >= shards {
            return Err(ShardError::Report {
                path: path.clone(),
                why: format!(
                    "shard {} of plan {} ({} shards), not of plan {plan_id} ({shards} shards): reports of different plans are not merged",
                    s.index, s.plan, s.of
                ),
            });
        }
    }
    // The latest report of each shard counts.
    stamped.sort_by_key(|(_, s, _)| (s.index, s.finished));
    let mut latest: BTreeMap<u32, (PathBuf, ShardStamp, Value)> = BTreeMap::new();
    let mut superseded = Vec::new();
    for (path, s, v) in stamped {
        if let Some((old, _, _)) = latest.insert(s.index, (path, s, v)) {
            superseded.push(old);
        }
    }
    let mut m = Merged {
        plan: plan_id,
        shards,
        complete: false,
        missing: (0..shards).filter(|i| !latest.contains_key(i)).collect(),
        failed_shards: Vec::new(),
        entries: 0,
        bytes: 0,
        bytes_sent: 0,
        bytes_reverified: 0,
        bytes_trusted: 0,
        failed: 0,
        seconds: 0.0,
        levels: BTreeMap::new(),
        level: None,
        failures: Vec::new(),
        runs: Vec::new(),
        superseded,
        files: Vec::new(),
    };
    let mut lowest: Option<VerifyLevel> = None;
    let mut names: BTreeSet<String> = BTreeSet::new();
    let mut splits: BTreeMap<(String, String), SplitFile> = BTreeMap::new();
    for (index, (path, stamp, v)) in latest {
        let bad = |why: &str| ShardError::Report {
            path: path.clone(),
            why: why.to_string(),
        };
        // A report says it ended (`"complete": true`, written by every run
        // that reached its end) or did not; anything else is not a report.
        let complete = match v.get("complete") {
            Some(Value::Bool(c)) => *c,
            _ => {
                return Err(bad(
                    "no \"complete\": true or false (not a report of `intact send --report`)",
                ))
            }
        };
        let files = match v.get("files") {
            Some(Value::Array(rows)) if rows.iter().all(Value::is_object) => rows.clone(),
            None if !complete => Vec::new(),
            _ => return Err(bad("\"files\" is not a list of rows")),
        };
        let errors = match v.get("errors") {
            Some(Value::Array(e)) => e.clone(),
            None if !complete => Vec::new(),
            _ => return Err(bad("\"errors\" is not a list")),
        };
        let reported = match v.get("failed") {
            Some(n) => n.as_u64().ok_or_else(|| bad("\"failed\" is not a count"))?,
            None if !complete => 0,
            None => return Err(bad("no \"failed\" count")),
        };
        let mut failed = 0u64;
        if !complete {
            let why = v
                .get("error")
                .and_then(Value::as_str)
                .or_else(|| v.get("interrupted").and_then(Value::as_str))
                .unwrap_or("the run did not end");
            m.failures.push(Failure {
                shard: index,
                path: String::new(),
                error: format!("the shard stopped before its end: {why}"),
            });
            failed += 1;
        }
        for e in &errors {
            m.failures.push(Failure {
                shard: index,
                path: String::new(),
                error: e.as_str().map_or_else(|| e.to_string(), str::to_string),
            });
            failed += 1;
        }
        // Each name as often as the shard's report has a row for it.
        let mut seen: BTreeMap<String, u64> = BTreeMap::new();
        for f in &files {
            let path_of = f
                .get("path")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            match f.get("error") {
                None | Some(Value::Null) if f.get("range").is_some_and(Value::is_object) => {
                    let r = &f["range"];
                    let key = (
                        path_of.clone(),
                        r.get("split")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                    );
                    let level = f.get("level").and_then(Value::as_str).unwrap_or("none");
                    let s = splits.entry(key).or_default();
                    s.add(index, r, level.parse().unwrap_or(VerifyLevel::None));
                }
                None | Some(Value::Null) => {
                    if f.get("kind").and_then(Value::as_str) == Some("file") {
                        let level = f.get("level").and_then(Value::as_str).unwrap_or("none");
                        *m.levels.entry(level.to_string()).or_default() += 1;
                        let l = level.parse::<VerifyLevel>().unwrap_or(VerifyLevel::None);
                        lowest = Some(lowest.map_or(l, |x| x.min(l)));
                    }
                }
                Some(err) => {
                    m.failures.push(Failure {
                        shard: index,
                        path: path_of.clone(),
                        error: err.as_str().map_or_else(|| err.to_string(), str::to_string),
                    });
                    failed += 1;
                }
            }
            *seen.entry(path_of.clone()).or_default() += 1;
            names.insert(path_of);
            let mut row = f.clone();
            if let Some(o) = row.as_object_mut() {
                o.insert("shard".into(), index.into());
            }
            m.files.push(row);
        }
        if let Some(p) = plan {
            for e in &p.shards[index as usize].entries {
                let name = e.path.lossy();
                match seen.get_mut(&name) {
                    Some(n) if *n > 0 => *n -= 1,
                    _ => {
                        m.failures.push(Failure {
                            shard: index,
                            path: name,
                            error: "in the plan, but not in the shard's report".into(),
                        });
                        failed += 1;
                    }
                }
            }
        }
        // What the report counted, or what its rows show, whichever is more.
        let failed = failed.max(reported);
        if failed > 0 {
            m.failed_shards.push(index);
        }
        let run = ShardRun {
            shard: stamp,
            report: path,
            complete,
            failed,
            entries: files.len() as u64,
            bytes: num(&v, "bytes"),
            bytes_sent: num(&v, "bytes_sent"),
            seconds: v.get("seconds").and_then(Value::as_f64).unwrap_or(0.0),
        };
        m.bytes += run.bytes;
        m.bytes_sent += run.bytes_sent;
        m.bytes_reverified += num(&v, "bytes_reverified");
        m.bytes_trusted += num(&v, "bytes_trusted");
        m.failed += failed;
        m.seconds = m.seconds.max(run.seconds);
        m.runs.push(run);
    }
    // A split file counts once, when its ranges' rows show it whole and
    // committed; otherwise it is a failure of the lowest shard sending it.
    for ((path, _), s) in splits {
        match s.verdict() {
            Ok(level) => {
                *m.levels.entry(level.to_string()).or_default() += 1;
                lowest = Some(lowest.map_or(level, |x| x.min(level)));
            }
            Err(why) => {
                let shard = s.shards.first().copied().unwrap_or(0);
                m.failures.push(Failure {
                    shard,
                    path,
                    error: why,
                });
                m.failed += 1;
                if !m.failed_shards.contains(&shard) {
                    m.failed_shards.push(shard);
                    m.failed_shards.sort_unstable();
                }
            }
        }
    }
    // A directory is in every shard that sent something under it: each
    // path counts once.
    m.entries = names.len() as u64;
    m.level = lowest.map(|l| l.to_string());
    m.complete = m.missing.is_empty() && m.failed_shards.is_empty();
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn report(index: u32, finished: i64, files: Value, failed: u64) -> Value {
        json!({
            "shard": {"plan": "p1", "index": index, "of": 3, "to": "h:1", "index_from": "--shard", "host": "x", "finished": finished},
            "complete": true, "files": files, "errors": [], "bytes": 10, "bytes_sent": 10,
            "bytes_reverified": 0, "bytes_trusted": 0, "failed": failed, "seconds": 1.5
        })
    }

    fn range(first: u64, end: u64, state: &str, level: &str) -> Value {
        json!({"path": "big", "kind": "file", "level": level,
               "range": {"split": "ab", "first": first, "end": end, "file_blocks": 10,
                         "file_size": 40960, "state": state}})
    }

    fn merged_ranges(rows: [Value; 3]) -> Merged {
        let [a, b, c] = rows;
        merge(
            vec![
                ("r0".into(), report(0, 5, json!([a]), 0)),
                ("r1".into(), report(1, 5, json!([b]), 0)),
                ("r2".into(), report(2, 5, json!([c]), 0)),
            ],
            None,
        )
        .unwrap()
    }

    #[test]
    fn a_split_file_counts_once_and_only_when_whole_and_committed() {
        let m = merged_ranges([
            range(0, 3, "waiting", "device"),
            range(3, 7, "waiting", "cache"),
            range(7, 10, "committed", "device"),
        ]);
        assert!(m.complete, "{:?}", m.failures);
        assert_eq!(m.levels, BTreeMap::from([("cache".to_string(), 1)]));
        assert_eq!(m.entries, 1);
        // Every range verified, none committed it.
        let m = merged_ranges([
            range(0, 3, "waiting", "device"),
            range(3, 7, "waiting", "device"),
            range(7, 10, "waiting", "device"),
        ]);
        assert!(!m.complete && m.levels.is_empty());
        assert!(
            m.failures[0].error.contains("no report says"),
            "{:?}",
            m.failures
        );
        assert_eq!(m.failed_shards, [0]);
        // A range failed: its blocks have no verified range.
        let mut failed = range(3, 7, "waiting", "device");
        failed["error"] = json!("boom");
        let m = merged_ranges([
            range(0, 3, "waiting", "device"),
            failed,
            range(7, 10, "committed", "device"),
        ]);
        assert!(!m.complete);
        assert!(
            m.failures
                .iter()
                .any(|f| f.error.contains("blocks 3..7 of 10")),
            "{:?}",
            m.failures
        );
        // Committed earlier: every range found it unchanged.
        let m = merged_ranges([
            range(0, 3, "held", "device"),
            range(3, 7, "held", "device"),
            range(7, 10, "held", "device"),
        ]);
        assert!(m.complete, "{:?}", m.failures);
        // Held ranges of two versions of the file: never one whole file.
        let named = |first, end, d: &str| {
            let mut r = range(first, end, "held", "device");
            r["range"]["file_digest"] = json!(d);
            r
        };
        let m = merged_ranges([named(0, 3, "aa"), named(3, 7, "aa"), named(7, 10, "bb")]);
        assert!(!m.complete);
        assert!(
            m.failures[0].error.contains("2 different files"),
            "{:?}",
            m.failures
        );
        // Overlapping or short ranges never make a whole file.
        let m = merged_ranges([
            range(0, 5, "waiting", "device"),
            range(3, 7, "waiting", "device"),
            range(7, 9, "committed", "device"),
        ]);
        assert!(!m.complete);
    }

    #[test]
    fn missing_failed_and_rerun_shards_are_told() {
        let ok = json!([{"path": "a", "kind": "file", "level": "device"}]);
        let bad = json!([{"path": "b", "kind": "file", "error": "boom"}]);
        let m = merge(
            vec![
                ("r0".into(), report(0, 5, ok.clone(), 0)),
                ("r1-old".into(), report(1, 5, bad.clone(), 1)),
            ],
            None,
        )
        .unwrap();
        assert!(!m.complete);
        assert_eq!(m.missing, vec![2]);
        assert_eq!(m.failed_shards, vec![1]);
        assert_eq!(m.failures[0].error, "boom");
        // The re-run of shard 1 replaces its failed report; shard 2 arrives.
        let fixed = json!([{"path": "b", "kind": "file", "level": "cache"}]);
        let m = merge(
            vec![
                ("r1-new".into(), report(1, 9, fixed, 0)),
                ("r0".into(), report(0, 5, ok.clone(), 0)),
                ("r1-old".into(), report(1, 5, bad, 1)),
                ("r2".into(), report(2, 6, json!([]), 0)),
            ],
            None,
        )
        .unwrap();
        assert!(m.complete, "{m:?}");
        assert_eq!(m.superseded, vec![PathBuf::from("r1-old")]);
        assert_eq!(m.level.as_deref(), Some("cache"));
        assert_eq!(m.levels.get("device"), Some(&1));
        assert_eq!(m.files.len(), 2);
        assert_eq!(m.files[1]["shard"], 1);
    }

    #[test]
    fn a_stopped_shard_and_foreign_reports_are_not_complete() {
        let mut stopped = report(0, 5, json!([]), 0);
        stopped["complete"] = false.into();
        stopped["error"] = "connection reset".into();
        let m = merge(vec![("r0".into(), stopped)], None).unwrap();
        assert_eq!(m.failed_shards, vec![0]);
        assert!(m.failures[0].error.contains("connection reset"));
        let mut other = report(1, 5, json!([]), 0);
        other["shard"]["plan"] = "p2".into();
        let e = merge(
            vec![
                ("a".into(), report(0, 1, json!([]), 0)),
                ("b".into(), other),
            ],
            None,
        )
        .unwrap_err();
        assert!(e.to_string().contains("different plans"), "{e}");
        let e = merge(vec![("c".into(), json!({"files": []}))], None).unwrap_err();
        assert!(e.to_string().contains("not a shard's report"), "{e}");
    }

    #[test]
    fn a_report_that_does_not_say_what_happened_is_refused_not_believed() {
        let ok = json!([{"path": "a", "kind": "file", "level": "device"}]);
        let base = report(0, 5, ok, 0);
        let mut cases = Vec::new();
        let mut v = base.clone();
        v.as_object_mut().unwrap().remove("complete");
        cases.push(v);
        let mut v = base.clone();
        v["complete"] = "true".into();
        cases.push(v);
        let mut v = base.clone();
        v["files"] = json!([1]);
        cases.push(v);
        let mut v = base.clone();
        v.as_object_mut().unwrap().remove("failed");
        cases.push(v);
        let mut v = base.clone();
        v["failed"] = "0".into();
        cases.push(v);
        let mut v = base.clone();
        v["shard"]["of"] = u32::MAX.into();
        cases.push(v);
        for c in cases {
            assert!(merge(vec![("r".into(), c.clone())], None).is_err(), "{c}");
        }
        // Rows that failed count, whatever "failed" says.
        let mut v = report(
            0,
            5,
            json!([{"path": "b", "kind": "file", "error": "boom"}]),
            0,
        );
        v["shard"]["of"] = 1.into();
        let m = merge(vec![("r".into(), v)], None).unwrap();
        assert!(!m.complete);
        assert_eq!(m.failed, 1);
        let mut v = report(0, 5, json!([]), 0);
        v["shard"]["of"] = 1.into();
        v["errors"] = json!(["cannot read x"]);
        assert!(!merge(vec![("r".into(), v)], None).unwrap().complete);
    }
}
