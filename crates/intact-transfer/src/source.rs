//! The sending side's view of the tree: what to send, in what order.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use intact_proto::WirePath;
use walkdir::WalkDir;

use crate::dest::Mtime;
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

/// Scans `sources`. Each goes under the destination by its own name, like
/// `cp -r SRC... DIR`: a file `a/x` becomes `DIR/x`, a directory `a/d`
/// becomes `DIR/d/...`. Symlinks are recorded, never followed (a source
/// named on the command line is followed if it is itself a symlink to a
/// directory, as cp -r does).
pub fn scan(sources: &[PathBuf]) -> Scan {
    let mut out = Scan::default();
    for src in sources {
        let base = match base_name(src) {
            Ok(b) => b,
            Err(e) => {
                out.errors.push(e);
                continue;
            }
        };
        for item in WalkDir::new(src)
            .follow_links(false)
            .follow_root_links(true)
            .sort_by_file_name()
        {
            let item = match item {
                Ok(i) => i,
                Err(e) => {
                    let path = e.path().unwrap_or(src).to_path_buf();
                    let source = e
                        .into_io_error()
                        .unwrap_or_else(|| std::io::Error::other("walk failed"));
                    out.errors.push(TransferError::Source { path, source });
                    continue;
                }
            };
            let rel_in = item
                .path()
                .strip_prefix(src)
                .expect("walkdir stays under its root");
            let rel = base.join(rel_in);
            match entry(item.path(), &rel, item.depth() == 0) {
                Ok(Some(e)) => out.entries.push(e),
                Ok(None) => out.skipped.push(item.path().to_path_buf()),
                Err(e) => out.errors.push(e),
            }
        }
    }
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

fn entry(abs: &Path, rel: &Path, is_root: bool) -> Result<Option<SourceEntry>, TransferError> {
    let err = |e: std::io::Error| TransferError::Source {
        path: abs.to_path_buf(),
        source: e,
    };
    let meta = if is_root {
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
    }))
}
