//! A plan: the source tree scanned once and cut into shards balanced by
//! bytes, each with its entries and the server it goes to. `intact plan`
//! writes one; `intact send --plan P --shard I` sends shard I of it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use intact_transfer::{Scan, SourceEntry, SourceKind, SourceRange, TransferError};
use serde::{Deserialize, Serialize};

use crate::balance;
use crate::pathtext::PathText;
use crate::split;
use crate::ShardError;

/// What the first line of every plan says it is (v2: files larger than a
/// fair share are split into block ranges, and the plan names its block
/// size).
pub const PLAN_FORMAT: &str = "intact-plan-v2";

/// The format before split files: still read (its files are all whole).
const PLAN_FORMAT_V1: &str = "intact-plan-v1";

/// The block size of v1 plans, and the default.
pub const DEFAULT_BLOCK: u64 = 4 << 20;

fn default_block() -> u64 {
    DEFAULT_BLOCK
}

/// The context of a split id's key derivation.
const SPLIT_ID_CONTEXT: &str = "intact 2026-11 split id of a planned file";

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
    /// The block size every shard sends at: split files are cut at it.
    #[serde(default = "default_block")]
    pub block_size: u64,
    /// Files larger than a fair share (bytes ÷ shards) that were split
    /// into block ranges, each sent by another shard of one server.
    #[serde(default)]
    pub split: Vec<PathText>,
    /// Files larger than a fair share left whole (see `oversized_why`):
    /// each sits in one shard, which then carries more than its share.
    pub oversized: Vec<PathText>,
    /// Why each of `oversized` was not split.
    #[serde(default)]
    pub oversized_why: Vec<String>,
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
    /// One range of a split file: the entry sends only these blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<PlannedRange>,
}

/// Blocks `first..end` of a split file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PlannedRange {
    /// The split id (16 bytes, hex) every range of the file carries: made
    /// from a secret of this plan's, so only holders of the plan can join
    /// the file's ranges at a server.
    pub split: String,
    pub first: u64,
    pub end: u64,
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
            range: None,
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
    /// The block size the shards send at.
    pub block_size: u64,
    /// Split files larger than a fair share (`intact plan` without
    /// `--no-split`).
    pub split: bool,
    /// Random bytes the split ids are made from (so that nobody without
    /// the plan can make one).
    pub secret: [u8; 32],
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
        if !input.block_size.is_power_of_two()
            || input.block_size < intact_transfer::MIN_SPLIT_BLOCK
            || input.block_size > (16 << 20)
        {
            return Err(ShardError::Usage(format!(
                "the block size must be a power of two from {} KiB to 16 MiB",
                intact_transfer::MIN_SPLIT_BLOCK >> 10
            )));
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
        let placed = if input.split {
            split::place(entries, &items, n, input.targets.len(), input.block_size)
        } else {
            split::Placement {
                loads: vec![0; n],
                ..split::Placement::default()
            }
        };
        let items: Vec<usize> = items.into_iter().filter(|&i| !placed.is_split(i)).collect();
        let weights: Vec<u64> = items
            .iter()
            .map(|&i| entries[i].size.saturating_add(ENTRY_COST))
            .collect();
        let bins = balance::assign_from(&weights, &placed.loads);
        // Per shard: (entry, first block) — 0 for a whole entry.
        let mut members: Vec<BTreeSet<(usize, u64)>> = vec![BTreeSet::new(); n];
        let mut ranges: HashMap<(usize, u64), u64> = HashMap::new();
        let placed_items = items
            .iter()
            .enumerate()
            .map(|(k, &i)| (i, 0, bins[k]))
            .chain(placed.pieces.iter().map(|p| {
                ranges.insert((p.entry, p.first), p.end);
                (p.entry, p.first, p.shard)
            }))
            .collect::<Vec<_>>();
        for (i, first, bin) in placed_items {
            let set = &mut members[bin];
            set.insert((i, first));
            let mut rel = entries[i].rel.as_bytes();
            while let Some(up) = parent_of(rel) {
                if let Some(&d) = dir_at.get(up) {
                    set.insert((d, 0));
                }
                rel = up;
            }
        }
        let shards: Vec<Shard> = members
            .into_iter()
            .enumerate()
            .map(|(index, set)| {
                let entries: Vec<PlannedEntry> = set
                    .iter()
                    .map(|&(i, first)| {
                        let mut p = PlannedEntry::of(&entries[i]);
                        if let Some(&end) = ranges.get(&(i, first)) {
                            p.range = Some(PlannedRange {
                                split: split_id(&input.secret, &entries[i], input.block_size),
                                first,
                                end,
                            });
                        }
                        p
                    })
                    .collect();
                let files: Vec<&PlannedEntry> =
                    entries.iter().filter(|e| e.kind == "file").collect();
                Shard {
                    index: index as u32,
                    to: input.targets[index % input.targets.len()].clone(),
                    bytes: files.iter().map(|e| e.bytes(input.block_size)).sum(),
                    files: files.len() as u64,
                    entries,
                }
            })
            .collect();
        let bytes: u64 = shards.iter().map(|s| s.bytes).sum();
        let fair = bytes / n as u64;
        let whole_why: HashMap<usize, &str> = placed.whole.iter().copied().collect();
        let (oversized, oversized_why): (Vec<PathText>, Vec<String>) = entries
            .iter()
            .enumerate()
            .filter(|(i, e)| {
                e.kind == SourceKind::File && n > 1 && e.size > fair && !placed.is_split(*i)
            })
            .map(|(i, e)| {
                let why = match whole_why.get(&i) {
                    Some(why) => why.to_string(),
                    None if !input.split => "not split (--no-split)".to_string(),
                    None => "not split".to_string(),
                };
                (PathText::from(e.abs.as_path()), why)
            })
            .unzip();
        let mut split_files: Vec<usize> = placed.pieces.iter().map(|p| p.entry).collect();
        split_files.dedup();
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
            files: entries
                .iter()
                .filter(|e| e.kind == SourceKind::File)
                .count() as u64,
            imbalance: balance::imbalance(&shards.iter().map(|s| s.bytes).collect::<Vec<_>>()),
            block_size: input.block_size,
            split: split_files
                .iter()
                .map(|&i| PathText::from(entries[i].abs.as_path()))
                .collect(),
            oversized,
            oversized_why,
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
        let what = (
            &self.copy_links,
            &self.sources,
            &self.shards,
            &self.unreadable,
            &self.skipped,
        );
        let held = if self.format == PLAN_FORMAT_V1 {
            serde_json::to_vec(&what)
        } else {
            serde_json::to_vec(&(what, self.block_size))
        }
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
        if plan.format != PLAN_FORMAT && plan.format != PLAN_FORMAT_V1 {
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
                Ok(Some(e)) if kind_name(&e.kind) == p.kind && p.range.is_some() => {
                    match self.range_of(p, &e) {
                        Ok(range) => out.entries.push(SourceEntry {
                            range: Some(range),
                            ..e
                        }),
                        Err(why) => out.errors.push(changed(&abs, &why)),
                    }
                }
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
    /// The range planned entry `p` sends of the file `e` is now: refused
    /// if the file changed size or mtime since the plan (its ranges were
    /// cut for that version).
    fn range_of(&self, p: &PlannedEntry, e: &SourceEntry) -> Result<SourceRange, String> {
        let r = p.range.as_ref().expect("a range");
        if (e.size, (e.mtime.sec, e.mtime.nsec)) != (p.size, p.mtime) {
            return Err(format!(
                "it was split into ranges at size {} when the plan was made, and changed since \
                 (size {} now); make a new plan",
                p.size, e.size
            ));
        }
        let split = hex::decode(&r.split)
            .ok()
            .and_then(|b| <[u8; 16]>::try_from(b).ok())
            .ok_or("its split id is not 16 bytes of hex")?;
        let blocks = e.size.div_ceil(self.block_size);
        if r.first >= r.end || r.end > blocks {
            return Err(format!(
                "its range {}..{} is not inside its {blocks} blocks",
                r.first, r.end
            ));
        }
        Ok(SourceRange {
            split,
            first: r.first,
            end: r.end,
            block_size: self.block_size,
        })
    }

    /// Whether the plan sends ranges of split files.
    pub fn has_ranges(&self) -> bool {
        self.shards
            .iter()
            .any(|s| s.entries.iter().any(|e| e.range.is_some()))
    }

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

/// The split id of file `e`: only a holder of `secret` makes it.
fn split_id(secret: &[u8; 32], e: &SourceEntry, block: u64) -> String {
    let mut h = blake3::Hasher::new_derive_key(SPLIT_ID_CONTEXT);
    h.update(secret);
    h.update(&(e.rel.as_bytes().len() as u64).to_be_bytes());
    h.update(e.rel.as_bytes());
    for n in [e.size, e.mtime.sec as u64, u64::from(e.mtime.nsec), block] {
        h.update(&n.to_be_bytes());
    }
    hex::encode(&h.finalize().as_bytes()[..16])
}

impl PlannedEntry {
    /// The bytes this entry sends: its range's, or the whole file's.
    pub fn bytes(&self, block: u64) -> u64 {
        match &self.range {
            None => self.size,
            Some(r) => intact_transfer::range_bytes(self.size, block, r.first, r.end),
        }
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
#[path = "plan_tests.rs"]
mod tests;
