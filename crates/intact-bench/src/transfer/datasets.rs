//! The datasets `intact-bench transfer` moves, as shapes: groups of
//! same-sized files, each group spread over its own directories. A shape
//! knows how many files, bytes and directories it makes, which unit its
//! CPU cost is quoted in, and how to write itself (once per shape: a
//! marker beside the tree names the exact shape it holds).

use std::path::{Path, PathBuf};

use anyhow::Context;

pub(crate) const MIB: u64 = 1 << 20;
pub(crate) const GIB: u64 = 1 << 30;
const KIB: u64 = 1 << 10;

/// The datasets' names, in the order they run (and the default set).
pub const NAMES: [&str; 5] = ["large", "medium", "small", "dirs", "mixed"];

/// The datasets `--warm` runs when none are named: the many-file ones,
/// where per-file overhead is what is measured.
pub const WARM_DEFAULT: [&str; 3] = ["small", "dirs", "mixed"];

/// A uniform dataset: `files` files of `file_size` bytes, at most 1,000
/// per directory (the `verify` and `model` benchmarks' parts).
pub(crate) struct Dataset {
    pub name: &'static str,
    pub files: u64,
    pub file_size: u64,
}

/// What a dataset's CPU seconds are divided by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Per GiB moved (few large files: the cost is per byte).
    Gib,
    /// Per 1,000 files moved (many small files: the cost is per file).
    KiloFiles,
}

impl Unit {
    /// The column header's words.
    pub fn label(self) -> &'static str {
        match self {
            Unit::Gib => "GiB",
            Unit::KiloFiles => "1,000 files",
        }
    }
}

/// Files of one size under one subdirectory, spread evenly over `dirs`
/// directories below it (named d000, d001, …; files f00000, f00001, …).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// Relative and possibly nested ("" for the dataset's top).
    pub dir: &'static str,
    pub files: u64,
    pub size: u64,
    pub dirs: u64,
}

impl Group {
    fn new(dir: &'static str, files: u64, size: u64, dirs: u64) -> Group {
        Group {
            dir,
            files,
            size,
            dirs: dirs.clamp(1, files.max(1)),
        }
    }

    /// Files per directory (the last directory may hold fewer).
    fn per_dir(&self) -> u64 {
        self.files.div_ceil(self.dirs).max(1)
    }

    /// The `i`th file's path relative to the dataset's top.
    fn path(&self, i: u64) -> PathBuf {
        Path::new(self.dir)
            .join(format!("d{:03}", i / self.per_dir()))
            .join(format!("f{i:05}"))
    }
}

/// A dataset: its name, its unit and its groups of files.
#[derive(Clone, Debug)]
pub struct Shape {
    pub name: &'static str,
    pub unit: Unit,
    pub groups: Vec<Group>,
}

impl Shape {
    /// One group at the top, over as many directories as 1,000 files per
    /// directory need, spread evenly (for a multiple of 1,000 files, the
    /// layout the uniform datasets have always had).
    pub fn uniform(name: &'static str, unit: Unit, files: u64, size: u64) -> Shape {
        Shape {
            name,
            unit,
            groups: vec![Group::new("", files, size, files.div_ceil(1000))],
        }
    }

    pub fn files(&self) -> u64 {
        self.groups.iter().map(|g| g.files).sum()
    }

    pub fn bytes(&self) -> u64 {
        self.groups.iter().map(|g| g.files * g.size).sum()
    }

    /// Directories holding files (their parents not counted).
    pub fn dirs(&self) -> u64 {
        self.groups
            .iter()
            .map(|g| g.files.div_ceil(g.per_dir()))
            .sum()
    }

    /// Every file: its path relative to the top, and its size.
    pub fn entries(&self) -> impl Iterator<Item = (PathBuf, u64)> + '_ {
        self.groups
            .iter()
            .flat_map(|g| (0..g.files).map(move |i| (g.path(i), g.size)))
    }

    /// "1 × 20 MiB, 4 × 1 MiB, 100 × 16 KiB, 1 × 0 B in 13 directories".
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self
            .groups
            .iter()
            .map(|g| format!("{} × {}", g.files, size_words(g.size)))
            .collect();
        let dirs = self.dirs();
        let noun = if dirs == 1 {
            "directory"
        } else {
            "directories"
        };
        format!("{} in {dirs} {noun}", parts.join(", "))
    }

    /// Writes the dataset under `src` unless the marker beside it says it
    /// is there already in exactly this shape; a dataset made at another
    /// scale is made again rather than measured under the wrong name.
    pub fn make(&self, src: &Path) -> anyhow::Result<()> {
        let marker = src.with_extension("complete");
        let shape = self.marker();
        if std::fs::read_to_string(&marker).is_ok_and(|m| m == shape) {
            return Ok(());
        }
        let _ = std::fs::remove_file(&marker);
        let _ = std::fs::remove_dir_all(src);
        std::fs::create_dir_all(src)?;
        let mut stream = intact_sample::SampleBytes::new(7);
        for (rel, size) in self.entries() {
            let path = src.join(rel);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            intact_sample::write_file(&path, size, &mut stream)?;
        }
        std::fs::write(marker, shape)?;
        Ok(())
    }

    /// An error unless `copy` holds as many regular files and bytes as
    /// this dataset: a run that left files out is not timed as a transfer.
    pub fn check_copy(&self, copy: &Path) -> anyhow::Result<()> {
        let (mut files, mut bytes) = (0u64, 0u64);
        walk_files(copy, |_, m| {
            files += 1;
            bytes += m.len();
            Ok(())
        })?;
        if (files, bytes) != (self.files(), self.bytes()) {
            anyhow::bail!(
                "{} holds {files} files, {bytes} bytes; the dataset has {} files, {} bytes",
                copy.display(),
                self.files(),
                self.bytes()
            );
        }
        Ok(())
    }

    fn marker(&self) -> String {
        self.groups
            .iter()
            .map(|g| format!("{}:{}x{}/{}\n", g.dir, g.files, g.size, g.dirs))
            .collect()
    }
}

/// Calls `f` with every regular file under `dir` (symlinks not followed).
pub fn walk_files(
    dir: &Path,
    mut f: impl FnMut(&Path, &std::fs::Metadata) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).with_context(|| d.display().to_string())?;
        for e in entries {
            let e = e?;
            let kind = e.file_type()?;
            if kind.is_dir() {
                stack.push(e.path());
            } else if kind.is_file() {
                f(&e.path(), &e.metadata()?)?;
            }
        }
    }
    Ok(())
}

/// Bytes in the largest unit that divides them: "1 MiB", "16 KiB", "1 B".
fn size_words(b: u64) -> String {
    for (unit, name) in [(GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")] {
        if b >= unit && b.is_multiple_of(unit) {
            return format!("{} {name}", b / unit);
        }
    }
    format!("{b} B")
}

/// The five datasets at `scale` (1.0: full size). Counts and the large
/// sizes scale; every group keeps at least one file.
pub fn standard(scale: f64) -> Vec<Shape> {
    let n = |x: f64| ((x * scale) as u64).max(1);
    vec![
        Shape::uniform("large", Unit::Gib, 1, n(4096.0) * MIB),
        Shape::uniform("medium", Unit::Gib, n(2000.0), MIB),
        Shape::uniform("small", Unit::KiloFiles, n(20000.0), 16 * KIB),
        Shape {
            name: "dirs",
            unit: Unit::KiloFiles,
            groups: vec![Group::new("", n(5000.0), 16 * KIB, 50)],
        },
        Shape {
            name: "mixed",
            unit: Unit::KiloFiles,
            groups: vec![
                Group::new("bulk", 1, n(1024.0) * MIB, 1),
                Group::new("runs/2026/raw", n(200.0), MIB, 4),
                Group::new("runs/2026/meta/obs", n(5000.0), 16 * KIB, 25),
                Group::new("runs/2026/flags", n(50.0), 0, 5),
                Group::new("etc/markers", n(5.0), 1, 1),
            ],
        },
    ]
}

/// Makes a uniform dataset (the `verify` and `model` benchmarks' parts).
pub(crate) fn make_dataset(src: &Path, d: &Dataset) -> anyhow::Result<()> {
    Shape::uniform(d.name, Unit::Gib, d.files, d.file_size).make(src)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn by_name(scale: f64, name: &str) -> Shape {
        standard(scale)
            .into_iter()
            .find(|s| s.name == name)
            .expect(name)
    }

    #[test]
    fn full_scale_shapes_are_the_issues() {
        let large = by_name(1.0, "large");
        assert_eq!((large.files(), large.bytes()), (1, 4 * GIB));
        let medium = by_name(1.0, "medium");
        assert_eq!(
            (medium.files(), medium.bytes(), medium.dirs()),
            (2000, 2000 * MIB, 2)
        );
        let small = by_name(1.0, "small");
        assert_eq!((small.files(), small.dirs()), (20_000, 20));
        let dirs = by_name(1.0, "dirs");
        assert_eq!(
            (dirs.files(), dirs.bytes(), dirs.dirs()),
            (5000, 5000 * 16 * KIB, 50)
        );
        let mixed = by_name(1.0, "mixed");
        assert_eq!(mixed.files(), 1 + 200 + 5000 + 50 + 5);
        assert_eq!(mixed.bytes(), GIB + 200 * MIB + 5000 * 16 * KIB + 5);
        assert_eq!(mixed.dirs(), 1 + 4 + 25 + 5 + 1);
    }

    #[test]
    fn units_follow_the_cost() {
        let units: Vec<Unit> = standard(1.0).iter().map(|s| s.unit).collect();
        use Unit::*;
        assert_eq!(units, [Gib, Gib, KiloFiles, KiloFiles, KiloFiles]);
        let names: Vec<&str> = standard(1.0).iter().map(|s| s.name).collect();
        assert_eq!(names, NAMES);
    }

    #[test]
    fn small_scale_keeps_every_group() {
        let mixed = by_name(0.02, "mixed");
        let counts: Vec<(u64, u64)> = mixed.groups.iter().map(|g| (g.files, g.size)).collect();
        assert_eq!(
            counts,
            [(1, 20 * MIB), (4, MIB), (100, 16 * KIB), (1, 0), (1, 1)]
        );
        // Directories never outnumber files.
        assert_eq!(mixed.dirs(), 1 + 4 + 25 + 1 + 1);
        let dirs = by_name(0.02, "dirs");
        assert_eq!((dirs.files(), dirs.dirs()), (100, 50));
        assert_eq!(
            mixed.describe(),
            "1 × 20 MiB, 4 × 1 MiB, 100 × 16 KiB, 1 × 0 B, 1 × 1 B in 32 directories"
        );
    }

    #[test]
    fn made_tree_matches_the_shape() {
        let tmp = tempfile::tempdir().unwrap();
        let shape = Shape {
            name: "t",
            unit: Unit::KiloFiles,
            groups: vec![
                Group::new("a/b", 7, 3, 3),
                Group::new("e", 2, 0, 5),
                Group::new("", 1, 1, 1),
            ],
        };
        let src = tmp.path().join("data");
        shape.make(&src).unwrap();
        let (mut files, mut bytes, mut dirs) = (0, 0, std::collections::BTreeSet::new());
        walk_files(&src, |p, m| {
            files += 1;
            bytes += m.len();
            dirs.insert(p.parent().unwrap().to_path_buf());
            Ok(())
        })
        .unwrap();
        assert_eq!((files, bytes), (shape.files(), shape.bytes()));
        assert_eq!((files, bytes, dirs.len() as u64), (10, 22, shape.dirs()));
        assert_eq!(shape.dirs(), 3 + 2 + 1);
        shape.check_copy(&src).unwrap();
        std::fs::remove_file(src.join("e/d001/f00001")).unwrap();
        assert!(shape.check_copy(&src).is_err(), "an empty file left out");
        // Made once: a second call finds the marker and leaves the tree.
        let before = std::fs::metadata(src.join("a/b/d000/f00000"))
            .unwrap()
            .modified()
            .unwrap();
        shape.make(&src).unwrap();
        let after = std::fs::metadata(src.join("a/b/d000/f00000"))
            .unwrap()
            .modified()
            .unwrap();
        assert_eq!(before, after);
    }
}
