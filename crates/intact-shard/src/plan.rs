//! A plan: the source tree scanned once and cut into shards balanced by
//! bytes, each with its entries and the server it goes to. `intact plan`
//! writes one; `intact send --plan P --shard I` sends shard I of it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use intact_transfer::{Scan, SourceEntry, SourceKind, TransferError};
use serde::{Deserialize, Serialize};

use crate::balance;
use crate::pathtext::PathText;
use crate::ShardError;

/// What the first line of every plan says it is.
pub const PLAN_FORMAT: &str = "intact-plan-v1";

/// What one entry weighs beyond its bytes when shards are balanced: the
/// work a file costs whatever its size (its round trips, its commit), so
/// that many empty files are spread too.
pub const ENTRY_COST: u64 = 64 << 10;

/// A transfer cut into shards.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    /// [`PLAN_FORMAT`].
    pub format: String,
    /// Names this plan: the first 16 hex digits of the BLAKE3 of what the
    /// shards hold. Every shard's report carries it, so that reports of
    /// different plans are never merged.
    pub id: String,
    /// When it was made, seconds since the epoch.
    pub created: i64,
    /// The sources as named on the command line.
    pub sources: Vec<PathText>,
    /// Symlinks are followed (`-L`).
    pub copy_links: bool,
    /// Bytes of regular files in all shards.
    pub bytes: u64,
    /// Regular files in all shards.
    pub files: u64,
    /// The heaviest shard's bytes over the mean shard's.
    pub imbalance: f64,
    /// Files larger than a fair share (bytes ÷ shards): each sits whole in
    /// one shard, which then carries more than its share (files are not
    /// split across shards).
    pub oversized: Vec<PathText>,
    /// Sources or entries the scan could not read: shard 0 reports each
    /// as a failure, so that no merged report calls the transfer complete.
    pub unreadable: Vec<Unreadable>,
    /// Special files (devices, fifos, sockets) left out, as a scan leaves
    /// them out; shard 0 reports them.
    pub skipped: Vec<PathText>,
    /// The shards, by index.
    pub shards: Vec<Shard>,
}

/// A source the plan's scan could not read, and why.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Unreadable {
    /// The source path.
    pub path: PathText,
    /// Why.
    pub error: String,
}

impl Unreadable {
    /// A scan's error: its path (empty where it names none) and the
    /// reason without the path.
    fn of(e: &TransferError) -> Unreadable {
        let (path, error) = match e {
            TransferError::Source { path, source } => (path.as_path(), source.to_string()),
            TransferError::SourceChanged { path, what } => (path.as_path(), what.to_string()),
            other => (Path::new(""), other.to_string()),
        };
        Unreadable {
            path: PathText::from(path),
            error,
        }
    }
}

/// One shard: what it sends, and where.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Shard {
    /// Its index, 0..shards.
    pub index: u32,
    /// The server: HOST:PORT or HOST:PORT:/subdir.
    pub to: String,
    /// Bytes of regular files.
    pub bytes: u64,
    /// Regular files.
    pub files: u64,
    /// Entries in transfer order (a directory before its contents); a
    /// directory appears in every shard that sends something under it.
    pub entries: Vec<PlannedEntry>,
}

/// An entry as the scan saw it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlannedEntry {
    /// Where it goes, relative to the server's root (or subdirectory).
    pub path: PathText,
    /// Where it is read from.
    pub source: PathText,
    /// `file`, `dir` or `symlink`.
    pub kind: String,
    /// A symlink's target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<PathText>,
    /// Permission bits.
    pub mode: u32,
    /// Modification time at the scan, seconds and nanoseconds.
    pub mtime: (i64, u32),
    /// Size at the scan (files).
    pub size: u64,
}

impl PlannedEntry {
    fn of(e: &SourceEntry) -> PlannedEntry {
        let (kind, target) = match &e.kind {
            SourceKind::File => ("file", None),
            SourceKind::Dir => ("dir", None),
            SourceKind::Symlink(t) => ("symlink", Some(PathText::from(&t[..]))),
        };
        PlannedEntry {
            path: PathText::from(e.rel.as_bytes()),
            source: PathText::from(e.abs.as_path()),
            kind: kind.to_string(),
            target,
            mode: e.mode,
            mtime: (e.mtime.sec, e.mtime.nsec),
            size: e.size,
        }
    }
}

/// What to plan.
pub struct PlanInput<'a> {
    /// The sources as named on the command line.
    pub sources: &'a [PathBuf],
    /// Their scan.
    pub scan: &'a Scan,
    /// How many shards.
    pub shards: u32,
    /// The servers; shard I goes to `targets[I % len]`.
    pub targets: &'a [String],
    /// Symlinks were followed (`-L`).
    pub copy_links: bool,
    /// Seconds since the epoch.
    pub now: i64,
}

/// The parent of a relative path's bytes, if it has one.
fn parent_of(rel: &[u8]) -> Option<&[u8]> {
    rel.iter().rposition(|&b| b == b'/').map(|i| &rel[..i])
}

impl Plan {
    /// Cuts `input.scan` into `input.shards` shards balanced by bytes
    /// (see [`crate::balance`]): every file, symlink and empty directory
    /// goes to one shard, with the directories above it.
    pub fn make(input: &PlanInput) -> Result<Plan, ShardError> {
        let n = input.shards as usize;
        if n == 0 || input.targets.is_empty() {
            return Err(ShardError::Usage(
                "a plan needs at least one shard and one server".into(),
            ));
        }
        let entries = &input.scan.entries;
        // Two sources with the same name (`a/x b/x`, or `a/ b/` both
        // holding `x`) would send one destination path twice, from two
        // shards at once.
        let mut named: HashMap<&[u8], &SourceEntry> = HashMap::with_capacity(entries.len());
        for e in entries {
            if let Some(first) = named.insert(e.rel.as_bytes(), e) {
                if !(first.kind == SourceKind::Dir && e.kind == SourceKind::Dir) {
                    return Err(ShardError::Usage(format!(
                        "{} and {} would both arrive as {}; name sources that do not overlap",
                        first.abs.display(),
                        e.abs.display(),
                        e.rel
                    )));
                }
            }
        }
        // A directory named by two sources (merged, as rsync merges them)
        // is the first one scanned: it comes before everything under it.
        let mut dir_at: HashMap<&[u8], usize> = HashMap::new();
        for (i, e) in entries.iter().enumerate() {
            if e.kind == SourceKind::Dir {
                dir_at.entry(e.rel.as_bytes()).or_insert(i);
            }
        }
        let has_child: BTreeSet<&[u8]> = entries
            .iter()
            .filter_map(|e| parent_of(e.rel.as_bytes()))
            .collect();
        // The items balanced: everything but directories that hold
        // something, and but the second of two empty directories of one name.
        let items: Vec<usize> = (0..entries.len())
            .filter(|&i| {
                let rel = entries[i].rel.as_bytes();
                entries[i].kind != SourceKind::Dir
                    || (!has_child.contains(rel) && dir_at.get(rel) == Some(&i))
            })
            .collect();
        let weights: Vec<u64> = items
            .iter()
            .map(|&i| entries[i].size.saturating_add(ENTRY_COST))
            .collect();
        let bins = balance::assign(&weights, n);
        let mut members: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
        for (k, &i) in items.iter().enumerate() {
            let set = &mut members[bins[k]];
            set.insert(i);
            let mut rel = entries[i].rel.as_bytes();
            while let Some(up) = parent_of(rel) {
                if let Some(&d) = dir_at.get(up) {
                    set.insert(d);
                }
                rel = up;
            }
        }
        let shards: Vec<Shard> = members
            .into_iter()
            .enumerate()
            .map(|(index, set)| {
                let files: Vec<&SourceEntry> = set
                    .iter()
                    .map(|&i| &entries[i])
                    .filter(|e| e.kind == SourceKind::File)
                    .collect();
                Shard {
                    index: index as u32,
                    to: input.targets[index % input.targets.len()].clone(),
                    bytes: files.iter().map(|e| e.size).sum(),
                    files: files.len() as u64,
                    entries: set.iter().map(|&i| PlannedEntry::of(&entries[i])).collect(),
                }
            })
            .collect();
        let bytes: u64 = shards.iter().map(|s| s.bytes).sum();
        let fair = bytes / n as u64;
        let oversized = entries
            .iter()
            .filter(|e| e.kind == SourceKind::File && n > 1 && e.size > fair)
            .map(|e| PathText::from(e.abs.as_path()))
            .collect();
        let mut plan = Plan {
            format: PLAN_FORMAT.to_string(),
            id: String::new(),
            created: input.now,
            sources: input
                .sources
                .iter()
                .map(|s| PathText::from(s.as_path()))
                .collect(),
            copy_links: input.copy_links,
            bytes,
            files: shards.iter().map(|s| s.files).sum(),
            imbalance: balance::imbalance(&shards.iter().map(|s| s.bytes).collect::<Vec<_>>()),
            oversized,
            unreadable: input.scan.errors.iter().map(Unreadable::of).collect(),
            skipped: input
                .scan
                .skipped
                .iter()
                .map(|p| PathText::from(p.as_path()))
                .collect(),
            shards,
        };
        plan.id = plan.digest();
        Ok(plan)
    }

    /// The plan's name: what its shards hold, hashed.
    fn digest(&self) -> String {
        let held = serde_json::to_vec(&(
            &self.copy_links,
            &self.sources,
            &self.shards,
            &self.unreadable,
            &self.skipped,
        ))
        .expect("a plan serialises");
        blake3::hash(&held).to_hex()[..16].to_string()
    }

    /// Reads a plan, refusing one that is not a plan, not of this format,
    /// or was changed after it was written (its id no longer matches).
    pub fn load(path: &Path) -> Result<Plan, ShardError> {
        let bad = |why: String| ShardError::Plan {
            path: path.to_path_buf(),
            why,
        };
        let text = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        let plan: Plan =
            serde_json::from_slice(&text).map_err(|e| bad(format!("not an intact plan ({e})")))?;
        if plan.format != PLAN_FORMAT {
            return Err(bad(format!(
                "format '{}', not '{PLAN_FORMAT}' (made by another version of intact?)",
                plan.format
            )));
        }
        if plan.shards.is_empty()
            || plan
                .shards
                .iter()
                .enumerate()
                .any(|(i, s)| s.index as usize != i)
        {
            return Err(bad("its shards are not numbered 0, 1, 2, …".into()));
        }
        if plan.digest() != plan.id {
            return Err(bad(format!(
                "its shards no longer match its id {} (edited after it was made?); make a new plan",
                plan.id
            )));
        }
        Ok(plan)
    }

    /// Writes the plan to `path` (through a temporary name and a rename,
    /// so a shard never reads half a plan).
    pub fn save(&self, path: &Path) -> Result<(), ShardError> {
        let err = |e: std::io::Error| ShardError::Plan {
            path: path.to_path_buf(),
            why: e.to_string(),
        };
        let mut text = serde_json::to_vec_pretty(self).expect("a plan serialises");
        text.push(b'\n');
        write_whole(path, &text).map_err(err)
    }

    /// Shard `index`, or an error naming how many there are.
    pub fn shard(&self, index: u32) -> Result<&Shard, ShardError> {
        self.shards
            .get(index as usize)
            .ok_or(ShardError::NoSuchShard {
                index,
                shards: self.shards.len() as u32,
            })
    }

    /// What shard `index` sends, as the sources are now: each entry looked
    /// at again (a file modified since the plan is sent as it is now; one
    /// gone, or of another kind, fails). Shard 0 also carries the plan's
    /// unreadable sources, as failures, and its skipped special files.
    pub fn scan(&self, index: u32) -> Result<Scan, ShardError> {
        let shard = self.shard(index)?;
        let roots: Vec<PathBuf> = self.sources.iter().map(PathText::to_path_buf).collect();
        let mut checked: HashSet<PathBuf> = HashSet::new();
        let mut out = Scan::default();
        for p in &shard.entries {
            let abs = p.source.to_path_buf();
            if let Err(why) = self.beneath(&roots, &abs, &mut checked) {
                out.errors.push(changed(&abs, &why));
                continue;
            }
            match intact_transfer::restat(&abs, &p.path.to_path_buf(), self.copy_links) {
                Ok(Some(e)) if kind_name(&e.kind) == p.kind => out.entries.push(e),
                Ok(Some(e)) => out.errors.push(changed(
                    &abs,
                    &format!(
                        "it was a {} when the plan was made and is a {} now; make a new plan",
                        p.kind,
                        kind_name(&e.kind)
                    ),
                )),
                Ok(None) => out.errors.push(changed(
                    &abs,
                    "it is no longer a file, directory or symlink",
                )),
                Err(e) => out.errors.push(e),
            }
        }
        if index == 0 {
            for u in &self.unreadable {
                let why = format!("could not be read when the plan was made: {}", u.error);
                out.errors.push(match u.path.as_bytes() {
                    [] => TransferError::Usage(why),
                    _ => changed(&u.path.to_path_buf(), &why),
                });
            }
            out.skipped = self.skipped.iter().map(PathText::to_path_buf).collect();
        }
        Ok(out)
    }
}

impl Plan {
    /// Whether `abs` is under one of the plan's sources and, unless
    /// symlinks are followed, no directory between that source and it is
    /// a symlink now (a tree changed since the plan must not lead a shard,
    /// perhaps run as root, outside it). `checked`: directories already
    /// found to be directories.
    fn beneath(
        &self,
        roots: &[PathBuf],
        abs: &Path,
        checked: &mut HashSet<PathBuf>,
    ) -> Result<(), String> {
        let Some(root) = roots.iter().find(|r| abs.starts_with(r)) else {
            return Err("not under any of the plan's sources".into());
        };
        if self.copy_links {
            return Ok(());
        }
        let mut dir = root.clone();
        let below: Vec<_> = abs
            .strip_prefix(root)
            .map_err(|e| e.to_string())?
            .components()
            .collect();
        for c in below.iter().take(below.len().saturating_sub(1)) {
            dir.push(c);
            if checked.contains(&dir) {
                continue;
            }
            match std::fs::symlink_metadata(&dir) {
                Ok(m) if m.is_dir() => {
                    checked.insert(dir.clone());
                }
                Ok(_) => {
                    return Err(format!(
                        "{} is no longer a directory (a symlink now?); make a new plan",
                        dir.display()
                    ))
                }
                Err(e) => return Err(format!("{}: {e}", dir.display())),
            }
        }
        Ok(())
    }
}

fn kind_name(k: &SourceKind) -> &'static str {
    match k {
        SourceKind::File => "file",
        SourceKind::Dir => "dir",
        SourceKind::Symlink(_) => "symlink",
    }
}

fn changed(path: &Path, why: &str) -> TransferError {
    TransferError::Source {
        path: path.to_path_buf(),
        source: std::io::Error::other(why.to_string()),
    }
}

/// Writes `bytes` to `path` through a temporary name beside it (unique
/// to this process) and a rename: a reader sees the old file or the new
/// one, never half of one, and two writers never share the temporary.
pub fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> (tempfile::TempDir, Scan) {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        for (name, size) in [
            ("big", 900_000),
            ("d/a", 300_000),
            ("d/e/b", 200_000),
            ("d/c", 1),
            ("z", 0),
        ] {
            let p = src.join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, vec![7u8; size]).unwrap();
        }
        std::fs::create_dir_all(src.join("empty")).unwrap();
        std::os::unix::fs::symlink("big", src.join("link")).unwrap();
        let scan = intact_transfer::scan(&[src]);
        (t, scan)
    }

    #[test]
    fn every_entry_goes_to_one_shard_with_the_directories_above_it() {
        let (t, scan) = tree();
        let targets = vec!["h:1".to_string(), "h:2".to_string()];
        let plan = Plan::make(&PlanInput {
            sources: &[t.path().join("src")],
            scan: &scan,
            shards: 3,
            targets: &targets,
            copy_links: false,
            now: 0,
        })
        .unwrap();
        assert_eq!(plan.files, 5);
        assert_eq!(plan.bytes, 1_400_001);
        assert_eq!(
            plan.shards
                .iter()
                .map(|s| s.to.as_str())
                .collect::<Vec<_>>(),
            ["h:1", "h:2", "h:1"]
        );
        // Each non-directory, and the empty directory, in exactly one shard.
        let mut owners: HashMap<String, u32> = HashMap::new();
        for s in &plan.shards {
            let names: Vec<String> = s.entries.iter().map(|e| e.path.lossy()).collect();
            for e in &s.entries {
                let name = e.path.lossy();
                if e.kind != "dir" || name.ends_with("empty") {
                    assert!(
                        owners.insert(name.clone(), s.index).is_none(),
                        "{name} twice"
                    );
                }
                // Its directories come before it in the same shard.
                let mut up = name.as_str();
                while let Some((p, _)) = up.rsplit_once('/') {
                    let at = names.iter().position(|n| n == p).expect("parent in shard");
                    assert!(at < names.iter().position(|n| *n == name).unwrap());
                    up = p;
                }
            }
        }
        assert_eq!(owners.len(), 7, "{owners:?}");
        // The big file is alone in its shard (it is over a fair share).
        assert_eq!(plan.oversized.len(), 1);
        let big = owners["src/big"];
        assert_eq!(plan.shards[big as usize].files, 1);
        // Round trip, and an edit is caught.
        let file = t.path().join("plan.json");
        plan.save(&file).unwrap();
        let back = Plan::load(&file).unwrap();
        assert_eq!(back.id, plan.id);
        let text = std::fs::read_to_string(&file)
            .unwrap()
            .replace("\"h:2\"", "\"h:3\"");
        std::fs::write(&file, text).unwrap();
        let e = Plan::load(&file).unwrap_err().to_string();
        assert!(e.contains("no longer match"), "{e}");
    }

    #[test]
    fn a_shard_sends_what_is_there_now_and_fails_what_changed_kind() {
        let (t, scan) = tree();
        let targets = vec!["h:1".to_string()];
        let plan = Plan::make(&PlanInput {
            sources: &[t.path().join("src")],
            scan: &scan,
            shards: 1,
            targets: &targets,
            copy_links: false,
            now: 0,
        })
        .unwrap();
        let src = t.path().join("src");
        std::fs::write(src.join("d/a"), b"now shorter").unwrap();
        std::fs::remove_file(src.join("z")).unwrap();
        std::fs::create_dir(src.join("z")).unwrap();
        let s = plan.scan(0).unwrap();
        let a = s
            .entries
            .iter()
            .find(|e| e.rel.to_string() == "src/d/a")
            .unwrap();
        assert_eq!(a.size, 11);
        assert_eq!(s.errors.len(), 1, "{:?}", s.errors);
        assert!(
            s.errors[0].to_string().contains("was a file"),
            "{}",
            s.errors[0]
        );
        assert!(plan
            .scan(1)
            .unwrap_err()
            .to_string()
            .contains("shards 0 to 0"));
        // A directory swapped for a symlink (to outside the tree) since the
        // plan: what is under it is not read through it.
        let outside = t.path().join("outside");
        std::fs::create_dir_all(outside.join("e")).unwrap();
        std::fs::write(outside.join("e/b"), b"secret").unwrap();
        std::fs::rename(src.join("d"), t.path().join("d-moved")).unwrap();
        std::os::unix::fs::symlink(&outside, src.join("d")).unwrap();
        let s = plan.scan(0).unwrap();
        assert!(!s.entries.iter().any(|e| e.rel.to_string() == "src/d/e/b"));
        assert!(
            s.errors
                .iter()
                .any(|e| e.to_string().contains("no longer a directory")),
            "{:?}",
            s.errors
        );
    }

    #[test]
    fn sources_that_overlap_are_refused() {
        let (t, _) = tree();
        let src = t.path().join("src");
        let other = t.path().join("other/src");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("big"), b"x").unwrap();
        let scan = intact_transfer::scan(&[src.clone(), other.clone()]);
        let e = Plan::make(&PlanInput {
            sources: &[src, other],
            scan: &scan,
            shards: 2,
            targets: &["h:1".to_string()],
            copy_links: false,
            now: 0,
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("would both arrive as src/big"), "{e}");
    }
}
