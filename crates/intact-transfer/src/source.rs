//! The sending side's view of the tree: what to send, in what order.

use std::fs::{self, File};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use intact_proto::WirePath;
use walkdir::WalkDir;

use crate::dest::Mtime;
use crate::select::Filter;
use crate::TransferError;

/// What a source entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symlink, sent as a link with this target.
    Symlink(Vec<u8>),
}

/// One thing to transfer.
#[derive(Debug, Clone)]
pub struct SourceEntry {
    /// Where it goes under the destination root.
    pub rel: WirePath,
    /// Where it is.
    pub abs: PathBuf,
    /// What it is.
    pub kind: SourceKind,
    /// Permission bits.
    pub mode: u32,
    /// Modification time.
    pub mtime: Mtime,
    /// Size in bytes (files).
    pub size: u64,
    /// One range of a split file (a plan's shard sends it; see
    /// `intact plan`); None: the whole file.
    pub range: Option<SourceRange>,
}

/// Blocks `first..end` of a split file, cut at `block_size` (the plan's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceRange {
    /// The split id every range of the file carries.
    pub split: [u8; 16],
    /// First block.
    pub first: u64,
    /// One past the last block.
    pub end: u64,
    /// The block size the ranges are cut at.
    pub block_size: u64,
}

/// The bytes of blocks `first..end` of a file of `size` bytes cut at
/// `block` (0 past its end; no overflow for any numbers).
pub fn range_bytes(size: u64, block: u64, first: u64, end: u64) -> u64 {
    let at = |b: u64| b.saturating_mul(block).min(size);
    at(end).saturating_sub(at(first))
}

impl SourceEntry {
    /// The bytes this entry sends: its range's, or the whole file's.
    pub fn bytes(&self) -> u64 {
        match &self.range {
            None => self.size,
            Some(r) => range_bytes(self.size, r.block_size, r.first, r.end),
        }
    }
}

/// The result of scanning the sources.
#[derive(Debug, Default)]
pub struct Scan {
    /// Entries in transfer order (a directory before its contents).
    pub entries: Vec<SourceEntry>,
    /// Sources or entries that could not be read.
    pub errors: Vec<TransferError>,
    /// Special files (devices, fifos, sockets) that were skipped.
    pub skipped: Vec<PathBuf>,
}

/// Where one source goes under the destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Under its own name: `a/d` becomes `DIR/d/...` (no trailing slash).
    OwnName,
    /// Under this name instead (a single file copied to a new name).
    Named(PathBuf),
    /// Only its contents, straight into the destination: `a/d/` (a
    /// trailing slash, as with rsync) puts `d`'s entries into `DIR/`.
    Contents,
}

/// One source named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceSpec {
    /// The path as given.
    pub path: PathBuf,
    /// Where it goes.
    pub place: Placement,
}

impl SourceSpec {
    /// A source as typed: a trailing `/` means its contents (rsync's
    /// rule), otherwise it goes under its own name.
    pub fn from_arg(path: &Path) -> SourceSpec {
        let contents = path.as_os_str().as_bytes().ends_with(b"/") && path.parent().is_some();
        SourceSpec {
            path: path.to_path_buf(),
            place: if contents {
                Placement::Contents
            } else {
                Placement::OwnName
            },
        }
    }
}

/// How to scan.
#[derive(Debug, Clone, Default)]
pub struct ScanOptions {
    /// Follow symlinks, on the command line and in the tree, and send what
    /// they point to (rsync's `-L`). Off: every symlink is sent as a link,
    /// a source named on the command line too (unless it is named with a
    /// trailing slash, which asks for the contents of what it points to).
    pub copy_links: bool,
    /// Which entries to take.
    pub filter: Filter,
}

/// Scans `sources` with the default options. Each goes under the
/// destination by its own name, like `rsync -r SRC... DIR`: a file `a/x`
/// becomes `DIR/x`, a directory `a/d` becomes `DIR/d/...`, and `a/d/`
/// (trailing slash) puts `d`'s contents into `DIR/`. Symlinks are sent as
/// links, never followed.
pub fn scan(sources: &[PathBuf]) -> Scan {
    let specs: Vec<SourceSpec> = sources.iter().map(|s| SourceSpec::from_arg(s)).collect();
    scan_with(&specs, &ScanOptions::default())
}

/// Scans `sources` as `opts` says (see [`scan`] and [`ScanOptions`]).
pub fn scan_with(sources: &[SourceSpec], opts: &ScanOptions) -> Scan {
    let mut out = Scan::default();
    for spec in sources {
        let src = &spec.path;
        let base = match &spec.place {
            Placement::OwnName => match base_name(src) {
                Ok(b) => Some(b),
                Err(e) => {
                    out.errors.push(e);
                    continue;
                }
            },
            Placement::Named(n) => Some(n.clone()),
            Placement::Contents => None,
        };
        let contents = base.is_none();
        let rel_of = |p: &Path| -> PathBuf {
            let rel_in = p.strip_prefix(src).expect("walkdir stays under its root");
            match &base {
                Some(b) if rel_in.as_os_str().is_empty() => b.clone(),
                Some(b) => b.join(rel_in),
                None => rel_in.to_path_buf(),
            }
        };
        let filter = &opts.filter;
        let walk = WalkDir::new(src)
            .follow_links(opts.copy_links)
            .follow_root_links(opts.copy_links || contents)
            .sort_by_file_name()
            .into_iter()
            .filter_entry(|item| {
                if item.depth() == 0 && contents {
                    return true;
                }
                if item.depth() > 0 && is_intact_state(item) {
                    return false;
                }
                let rel = rel_of(item.path());
                filter.is_empty()
                    || filter.takes(rel.as_os_str().as_bytes(), item.file_type().is_dir())
            });
        // Listed in order first (directories read only), then looked at
        // (one stat each) on several threads: the stats of a tree of many
        // small files are most of its scan, and nothing else runs yet.
        let mut listed: Vec<Listed> = Vec::new();
        for item in walk {
            let item = match item {
                Ok(i) => i,
                Err(e) => {
                    let path = e.path().unwrap_or(src).to_path_buf();
                    let source = e
                        .into_io_error()
                        .unwrap_or_else(|| std::io::Error::other("walk failed (a symlink loop?)"));
                    out.errors.push(TransferError::Source { path, source });
                    continue;
                }
            };
            if item.depth() == 0 && contents {
                if !item.file_type().is_dir() {
                    out.errors.push(TransferError::Source {
                        path: src.clone(),
                        source: std::io::Error::other(
                            "named with a trailing '/' (its contents), but it is not a directory",
                        ),
                    });
                }
                continue;
            }
            let rel = rel_of(item.path());
            let follow = opts.copy_links || (item.depth() == 0 && contents);
            listed.push((item.into_path(), rel, follow));
            if listed.len() >= LIST_CHUNK {
                look_at_listed(&mut listed, &mut out);
            }
        }
        look_at_listed(&mut listed, &mut out);
    }
    out
}

/// A path the walk listed: where it is, where it goes, and whether a
/// symlink there counts as what it points to.
type Listed = (PathBuf, PathBuf, bool);

/// Fewer paths than this are looked at on the calling thread.
const PARALLEL_STATS: usize = 256;

/// Paths listed at most before they are looked at (bounds what the list
/// holds beside the entries, and how long a listed path waits).
const LIST_CHUNK: usize = 16 * 1024;

/// Looks at every path in `listed`, in order, into `out`; empties it.
fn look_at_listed(listed: &mut Vec<Listed>, out: &mut Scan) {
    for ((abs, _, _), looked) in listed.iter().zip(look_at(listed)) {
        match looked {
            Ok(Some(e)) => out.entries.push(e),
            Ok(None) => out.skipped.push(abs.clone()),
            Err(e) => out.errors.push(e),
        }
    }
    listed.clear();
}

/// [`entry`] of each listed `(abs, rel, follow)`, in order.
fn look_at(listed: &[Listed]) -> Vec<Result<Option<SourceEntry>, TransferError>> {
    let one = |(abs, rel, follow): &Listed| entry(abs, rel, *follow);
    if listed.len() < PARALLEL_STATS {
        return listed.iter().map(one).collect();
    }
    use rayon::prelude::*;
    listed.par_iter().with_min_len(64).map(one).collect()
}

/// A directory that holds a server's own state (`ROOT/.intact`, with its
/// journal) inside a tree being scanned: never a source, so that a
/// server's root can be copied on. (Named on the command line itself it
/// is scanned, and refused by the receiver: the name is reserved.)
fn is_intact_state(item: &walkdir::DirEntry) -> bool {
    item.file_type().is_dir()
        && item.file_name() == crate::journal::STATE_DIR
        && item.path().join("journal.sqlite").is_file()
}

/// Where a source entry at `path` comes from, as a receiver's catalog
/// keeps it: `host:/absolute/path` (the path made absolute against the
/// working directory, symlinks in it not resolved; cut to the protocol's
/// limit).
pub fn origin(path: &Path) -> Vec<u8> {
    static HERE: std::sync::OnceLock<(Vec<u8>, Option<PathBuf>)> = std::sync::OnceLock::new();
    let (host, cwd) = HERE.get_or_init(|| {
        let uname = rustix::system::uname();
        let mut host = uname.nodename().to_bytes().to_vec();
        host.push(b':');
        (host, std::env::current_dir().ok())
    });
    let abs = match cwd {
        Some(c) if path.is_relative() => c.join(path),
        _ => path.to_path_buf(),
    };
    let mut out = host.clone();
    out.extend_from_slice(abs.as_os_str().as_bytes());
    out.truncate(intact_proto::MAX_ORIGIN);
    out
}

fn base_name(src: &Path) -> Result<PathBuf, TransferError> {
    let name = match src.file_name() {
        Some(n) => n.to_os_string(),
        None => fs::canonicalize(src)
            .map_err(|e| TransferError::Source {
                path: src.to_path_buf(),
                source: e,
            })?
            .file_name()
            .ok_or_else(|| TransferError::Source {
                path: src.to_path_buf(),
                source: std::io::Error::other("has no name to copy it under (the root directory?)"),
            })?
            .to_os_string(),
    };
    Ok(PathBuf::from(name))
}

/// The entry at `abs` as it is now, to go to `rel` under the destination
/// (what a scan makes of one path): `None` for a special file. `follow`:
/// a symlink counts as what it points to (`-L`). A shard of a plan
/// (intact-shard) looks again at what the plan listed, so that it sends
/// what is there when it runs.
pub fn restat(abs: &Path, rel: &Path, follow: bool) -> Result<Option<SourceEntry>, TransferError> {
    entry(abs, rel, follow)
}

fn entry(abs: &Path, rel: &Path, follow: bool) -> Result<Option<SourceEntry>, TransferError> {
    let err = |e: std::io::Error| TransferError::Source {
        path: abs.to_path_buf(),
        source: e,
    };
    let meta = if follow {
        fs::metadata(abs)
    } else {
        fs::symlink_metadata(abs)
    }
    .map_err(err)?;
    let ft = meta.file_type();
    let kind = if ft.is_file() {
        SourceKind::File
    } else if ft.is_dir() {
        SourceKind::Dir
    } else if ft.is_symlink() {
        SourceKind::Symlink(
            fs::read_link(abs)
                .map_err(err)?
                .as_os_str()
                .as_bytes()
                .to_vec(),
        )
    } else {
        return Ok(None);
    };
    Ok(Some(SourceEntry {
        rel: WirePath::from_relative(rel)?,
        abs: abs.to_path_buf(),
        size: if kind == SourceKind::File {
            meta.len()
        } else {
            0
        },
        kind,
        mode: meta.mode() & 0o7777,
        mtime: Mtime {
            sec: meta.mtime(),
            nsec: meta.mtime_nsec() as u32,
        },
        range: None,
    }))
}

/// The error of a failed read of `e`: a short read means it shrank.
pub(crate) fn source_read_error(e: &SourceEntry, err: std::io::Error) -> TransferError {
    if err.kind() == std::io::ErrorKind::UnexpectedEof {
        TransferError::SourceChanged {
            path: e.abs.clone(),
            what: "it shrank",
        }
    } else {
        TransferError::Source {
            path: e.abs.clone(),
            source: err,
        }
    }
}

/// Fails if `e` changed (its size or mtime) since it was scanned.
pub(crate) fn check_unchanged(
    source: &File,
    e: &SourceEntry,
) -> Result<std::fs::Metadata, TransferError> {
    let m = source.metadata().map_err(|err| TransferError::Source {
        path: e.abs.clone(),
        source: err,
    })?;
    if m.len() != e.size {
        return Err(TransferError::SourceChanged {
            path: e.abs.clone(),
            what: "its size changed",
        });
    }
    if m.mtime() != e.mtime.sec || m.mtime_nsec() as u32 != e.mtime.nsec {
        return Err(TransferError::SourceChanged {
            path: e.abs.clone(),
            what: "it was modified",
        });
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree large enough to be looked at on several threads comes out
    /// in the walk's order, a FIFO among the files skipped in its place.
    #[test]
    fn a_large_scan_keeps_the_walk_order() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let mut want = vec!["src".to_string()];
        for d in 0..3 {
            let sub = format!("src/d{d}");
            fs::create_dir_all(dir.path().join(&sub)).unwrap();
            want.push(sub.clone());
            for f in 0..(PARALLEL_STATS / 2) {
                let rel = format!("{sub}/f{f:04}");
                fs::write(dir.path().join(&rel), rel.as_bytes()).unwrap();
                want.push(rel);
            }
        }
        let fifo = src.join("d1/f0007.fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let scan = scan(std::slice::from_ref(&src));
        assert!(scan.errors.is_empty(), "{:?}", scan.errors);
        let got: Vec<String> = scan.entries.iter().map(|e| e.rel.to_string()).collect();
        assert_eq!(got, want);
        assert_eq!(scan.skipped, vec![fifo]);
        for e in scan.entries.iter().filter(|e| e.kind == SourceKind::File) {
            assert_eq!(e.size, e.rel.to_string().len() as u64, "{}", e.rel);
        }
    }
}
