//! The mount's inode numbers: one per path under the root it has named to
//! the kernel, kept until the path goes. Paths are relative to the root
//! (the root itself is the empty path, inode 1).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The root's inode number (FUSE's).
pub const ROOT: u64 = 1;

/// Inode numbers and the paths they stand for.
#[derive(Debug)]
pub struct Inodes {
    by_ino: HashMap<u64, PathBuf>,
    by_path: HashMap<PathBuf, u64>,
    next: u64,
}

impl Default for Inodes {
    fn default() -> Self {
        let mut by_ino = HashMap::new();
        let mut by_path = HashMap::new();
        by_ino.insert(ROOT, PathBuf::new());
        by_path.insert(PathBuf::new(), ROOT);
        Inodes {
            by_ino,
            by_path,
            next: ROOT + 1,
        }
    }
}

impl Inodes {
    /// The path of `ino`, if it names one.
    pub fn path(&self, ino: u64) -> Option<&Path> {
        self.by_ino.get(&ino).map(PathBuf::as_path)
    }

    /// The inode of `path`, numbered now if it had none.
    pub fn ino(&mut self, path: &Path) -> u64 {
        if let Some(&i) = self.by_path.get(path) {
            return i;
        }
        let i = self.next;
        self.next += 1;
        self.by_ino.insert(i, path.to_path_buf());
        self.by_path.insert(path.to_path_buf(), i);
        i
    }

    /// Forgets `path` (unlinked or removed); returns its inode, if it had
    /// one. The number is not given out again.
    pub fn remove(&mut self, path: &Path) -> Option<u64> {
        let i = self.by_path.remove(path)?;
        self.by_ino.remove(&i);
        Some(i)
    }

    /// Moves `from` (and everything under it) to `to`; returns the inode
    /// that `to` named before, if any (replaced by the rename).
    pub fn rename(&mut self, from: &Path, to: &Path) -> Option<u64> {
        let replaced = self.remove(to);
        let moved: Vec<(PathBuf, u64)> = self
            .by_path
            .iter()
            .filter(|(p, _)| p.starts_with(from))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        for (p, i) in moved {
            let rest = p.strip_prefix(from).expect("under from");
            let new = if rest.as_os_str().is_empty() {
                to.to_path_buf()
            } else {
                to.join(rest)
            };
            self.by_path.remove(&p);
            self.by_path.insert(new.clone(), i);
            self.by_ino.insert(i, new);
        }
        replaced
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renamed_directory_takes_its_children_along() {
        let mut t = Inodes::default();
        let d = t.ino(Path::new("d"));
        let f = t.ino(Path::new("d/f"));
        let other = t.ino(Path::new("dx"));
        let target = t.ino(Path::new("e"));
        assert_eq!(t.rename(Path::new("d"), Path::new("e")), Some(target));
        assert_eq!(t.path(d), Some(Path::new("e")));
        assert_eq!(t.path(f), Some(Path::new("e/f")));
        assert_eq!(
            t.path(other),
            Some(Path::new("dx")),
            "a sibling with the same prefix stays"
        );
        assert_eq!(t.path(target), None);
        assert_eq!(t.ino(Path::new("e/f")), f);
    }
}
