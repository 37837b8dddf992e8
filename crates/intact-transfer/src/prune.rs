//! `--delete`: removes what the destination holds and the source no
//! longer has, inside the directories a transfer covered.
//!
//! Call it only after the transfer succeeded. Every step goes through
//! directory file descriptors opened with `O_NOFOLLOW`, so a symlink is
//! removed as a link and never followed, and nothing outside the
//! destination root is touched. Entries an `--exclude` rule matches are
//! protected (rsync's default), and so is intact's own state at the top
//! of the root (`.intact/`) and the hidden partial data of files the
//! source still has (`.intact-partial-*`).

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};
use rustix::io::Errno;

use crate::keep_set::Keeps;
use crate::select::Filter;
use crate::TransferError;

/// What [`prune`] removed (or, in a dry run, would remove).
#[derive(Debug, Default, serde::Serialize)]
pub struct PruneReport {
    /// Paths relative to the root, contents before their directory;
    /// directories end in '/'.
    pub deleted: Vec<String>,
    /// Directories not in the source that were kept because they hold
    /// protected (excluded) entries.
    pub kept: Vec<String>,
    /// What could not be removed.
    #[serde(serialize_with = "as_strings")]
    pub errors: Vec<TransferError>,
}

fn as_strings<S: serde::Serializer>(e: &[TransferError], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(e.iter().map(|e| e.to_string()))
}

/// Removes, under each of `scopes` (paths relative to `root`; empty for
/// the root itself), every entry whose relative path is not in `keep`
/// and that `filter` does not protect. With `dry_run`, lists them only.
pub fn prune(
    root: &Path,
    scopes: &[Vec<u8>],
    keep: &dyn Keeps,
    filter: &Filter,
    dry_run: bool,
) -> PruneReport {
    prune_under(root, b"", scopes, keep, filter, dry_run, &mut |_| true)
}

/// [`prune`] below `base`, a directory under `root` reached without
/// following any symlink (empty: the root itself); `scopes`, `keep`, the
/// filter and the report are relative to `base` (`send --delete` to
/// `HOST:PORT:/subdir`). A `base` that is not there has nothing to prune.
/// A scope inside another is walked once, as part of the outer one.
///
/// `allow(n)` is asked before each line of `n` bytes goes into the report
/// (a server charges them to the client's memory share); when it says no,
/// pruning stops there, removes nothing more, and the report's last error
/// says so.
pub fn prune_under(
    root: &Path,
    base: &[u8],
    scopes: &[Vec<u8>],
    keep: &dyn Keeps,
    filter: &Filter,
    dry_run: bool,
    allow: &mut dyn FnMut(usize) -> bool,
) -> PruneReport {
    let mut p = Pruner {
        keep,
        filter,
        dry_run,
        report: PruneReport::default(),
        allow,
        stopped: false,
    };
    let top = match rfs::open(
        root,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        // Nothing there yet (a dry run to a new destination).
        Err(Errno::NOENT) => return p.report,
        Err(e) => {
            p.err(&root.display().to_string(), e);
            return p.report;
        }
    };
    let root_fd = match open_under(&top, base) {
        Ok(Some(fd)) => fd,
        Ok(None) => return p.report,
        Err(e) => {
            p.err(&String::from_utf8_lossy(base), e);
            return p.report;
        }
    };
    for scope in outermost(scopes) {
        if p.stopped {
            break;
        }
        match open_under(&root_fd, scope) {
            Ok(Some(fd)) => p.walk(&fd, scope),
            Ok(None) => {}
            Err(e) => p.err(&String::from_utf8_lossy(scope), e),
        }
    }
    p.report
}

/// The scopes no other scope contains (component-wise; the empty scope,
/// the base itself, contains all), each once, in order.
fn outermost(scopes: &[Vec<u8>]) -> Vec<&[u8]> {
    let mut sorted: Vec<&[u8]> = scopes.iter().map(|s| s.as_slice()).collect();
    sorted.sort();
    sorted.dedup();
    let mut out: Vec<&[u8]> = Vec::new();
    for s in sorted {
        // Sorted, so an ancestor comes before its descendants.
        let inside = out
            .iter()
            .any(|o| o.is_empty() || (s.starts_with(o) && s.get(o.len()) == Some(&b'/')));
        if !inside {
            out.push(s);
        }
    }
    out
}

/// Opens the directory at `rel` under `root` without following any
/// symlink; None if it is not there.
fn open_under(root: &OwnedFd, rel: &[u8]) -> Result<Option<OwnedFd>, Errno> {
    let mut fd = rfs::openat(
        root,
        ".",
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    for c in rel.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
        fd = match open_dir(&fd, OsStr::from_bytes(c)) {
            Ok(d) => d,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
    }
    Ok(Some(fd))
}

fn open_dir(dir: &OwnedFd, name: &OsStr) -> Result<OwnedFd, Errno> {
    rfs::openat(
        dir,
        name,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    let mut out = rel.to_vec();
    if !out.is_empty() {
        out.push(b'/');
    }
    out.extend_from_slice(name);
    out
}

struct Pruner<'a> {
    keep: &'a dyn Keeps,
    filter: &'a Filter,
    dry_run: bool,
    report: PruneReport,
    allow: &'a mut dyn FnMut(usize) -> bool,
    /// `allow` said no: nothing more is removed or reported.
    stopped: bool,
}

impl Pruner<'_> {
    fn err(&mut self, path: &str, e: Errno) {
        if self.room(path.len()) {
            self.report.errors.push(TransferError::Destination {
                path: path.to_string(),
                source: e.into(),
            });
        }
    }

    /// Whether a report line of `n` bytes may be kept; the first refusal
    /// stops the pruning and says so in the report.
    fn room(&mut self, n: usize) -> bool {
        if self.stopped {
            return false;
        }
        if (self.allow)(n) {
            return true;
        }
        self.stopped = true;
        self.report.errors.push(TransferError::Remote(format!(
            "--delete stopped after {} entries: its report outgrew what the server lets this client hold; nothing after them was removed",
            self.report.deleted.len()
        )));
        false
    }

    /// The names in `dir` (without "." and ".."), each with whether it is
    /// a directory (never following a symlink).
    fn list(&mut self, dir: &OwnedFd, rel: &[u8]) -> Vec<(Vec<u8>, bool)> {
        let mut out = Vec::new();
        let entries = match rfs::Dir::read_from(dir) {
            Ok(d) => d,
            Err(e) => {
                self.err(&String::from_utf8_lossy(rel), e);
                return out;
            }
        };
        for e in entries {
            let e = match e {
                Ok(e) => e,
                Err(err) => {
                    self.err(&String::from_utf8_lossy(rel), err);
                    break;
                }
            };
            let name = e.file_name().to_bytes().to_vec();
            if name == b"." || name == b".." {
                continue;
            }
            let is_dir = match rfs::statat(dir, OsStr::from_bytes(&name), AtFlags::SYMLINK_NOFOLLOW)
            {
                Ok(st) => rfs::FileType::from_raw_mode(st.st_mode) == rfs::FileType::Directory,
                Err(Errno::NOENT) => continue,
                Err(err) => {
                    self.err(&String::from_utf8_lossy(&join(rel, &name)), err);
                    continue;
                }
            };
            out.push((name, is_dir));
        }
        out.sort();
        out
    }

    /// Looks through a directory the source has.
    fn walk(&mut self, dir: &OwnedFd, rel: &[u8]) {
        for (name, is_dir) in self.list(dir, rel) {
            if self.stopped {
                return;
            }
            let child = join(rel, &name);
            let reserved = (rel.is_empty() && name == crate::journal::STATE_DIR.as_bytes())
                || name.starts_with(b".intact-partial-");
            if reserved || !self.filter.takes(&child, is_dir) {
                continue;
            }
            if self.keep.keeps(&child) {
                if is_dir {
                    match open_dir(dir, OsStr::from_bytes(&name)) {
                        Ok(fd) => self.walk(&fd, &child),
                        Err(e) => self.err(&String::from_utf8_lossy(&child), e),
                    }
                }
                continue;
            }
            self.remove(dir, &name, &child, is_dir);
        }
    }

    /// Removes one entry the source does not have; true if it is gone.
    fn remove(&mut self, dir: &OwnedFd, name: &[u8], rel: &[u8], is_dir: bool) -> bool {
        let os = OsStr::from_bytes(name);
        let shown = String::from_utf8_lossy(rel).into_owned();
        if !self.room(shown.len() + 1) {
            return false;
        }
        if !is_dir {
            if !self.dry_run {
                if let Err(e) = rfs::unlinkat(dir, os, AtFlags::empty()) {
                    self.err(&shown, e);
                    return false;
                }
            }
            self.report.deleted.push(shown);
            return true;
        }
        let fd = match open_dir(dir, os) {
            Ok(fd) => fd,
            Err(e) => {
                self.err(&shown, e);
                return false;
            }
        };
        let mut emptied = true;
        for (n, d) in self.list(&fd, rel) {
            if self.stopped {
                return false;
            }
            let child = join(rel, &n);
            if !self.filter.takes(&child, d) {
                emptied = false;
                continue;
            }
            emptied &= self.remove(&fd, &n, &child, d);
        }
        if !emptied {
            self.report.kept.push(format!("{shown}/"));
            return false;
        }
        if !self.dry_run {
            if let Err(e) = rfs::unlinkat(dir, os, AtFlags::REMOVEDIR) {
                self.err(&shown, e);
                return false;
            }
        }
        self.report.deleted.push(format!("{shown}/"));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::select::{Rule, RuleKind};
    use std::collections::HashSet;
    use std::fs;

    #[test]
    fn removes_only_what_the_source_lacks_and_never_follows_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("dst");
        let outside = dir.path().join("outside");
        fs::create_dir_all(root.join("d/gone/deeper")).unwrap();
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("precious"), b"keep").unwrap();
        fs::write(root.join("d/kept.dat"), b"k").unwrap();
        fs::write(root.join("d/old.dat"), b"o").unwrap();
        fs::write(root.join("d/gone/deeper/x"), b"x").unwrap();
        fs::write(root.join("d/skip.tmp"), b"t").unwrap();
        fs::write(root.join("top.dat"), b"not in scope").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("d/link")).unwrap();
        let keep: HashSet<Vec<u8>> = [&b"d"[..], b"d/kept.dat"]
            .iter()
            .map(|s| s.to_vec())
            .collect();
        let filter = Filter::new(vec![Rule::new(RuleKind::Exclude, "*.tmp")]);
        let dry = prune(&root, &[b"d".to_vec()], &keep, &filter, true);
        assert!(dry.errors.is_empty(), "{:?}", dry.errors);
        assert!(root.join("d/old.dat").exists(), "a dry run removes nothing");
        let r = prune(&root, &[b"d".to_vec()], &keep, &filter, false);
        assert_eq!(r.deleted, dry.deleted);
        assert_eq!(
            r.deleted,
            [
                "d/gone/deeper/x",
                "d/gone/deeper/",
                "d/gone/",
                "d/link",
                "d/old.dat"
            ]
        );
        assert!(root.join("d/kept.dat").exists() && root.join("d/skip.tmp").exists());
        assert!(root.join("top.dat").exists());
        assert_eq!(fs::read(outside.join("precious")).unwrap(), b"keep");
    }
}
