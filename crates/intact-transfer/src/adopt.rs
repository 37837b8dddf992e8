//! `intact catalog add`: files that reached a root by other means (a
//! program wrote them, another tool copied them) are adopted into its
//! catalog, so that scrubs keep checking them. Their checksums (page
//! CRC-32C, block XXH3-128, whole BLAKE3) come from a read of the file as
//! it is now, through [`DeviceReader`] (evict-then-read or a proven
//! direct read), and the level of that read is recorded with them; the
//! row says the file was adopted, never compared with a source (mode
//! `none`). A file already cataloged is left alone when it still has its
//! cataloged size and mtime, and refused when it has not (it changed
//! outside intact: `--replace` catalogs it as it is now); a file being
//! received is refused.

use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use intact_cache::{DeviceReader, ReadPath};
use intact_digest::{defaults, hash, page_crc_blob, AlignedBuf};
use intact_proto::WirePath;
use serde::Serialize;

use crate::journal::{BlockRecord, Journal, VerifiedAt, STATE_DIR};
use crate::verify::{VerifyLevel, VerifyMode};
use crate::{Destination, TransferError};

/// How to adopt.
#[derive(Debug, Clone, Default)]
pub struct AdoptOptions {
    /// Catalog a file anew even where its row says otherwise.
    pub replace: bool,
    /// Read with `O_DIRECT` (proven by residency counts).
    pub direct: bool,
}

/// What became of one file.
#[derive(Debug, Clone, Serialize)]
pub struct Adopted {
    /// Path under the root.
    pub path: String,
    /// `adopted`, `already cataloged`, `refused` or `failed`.
    pub state: &'static str,
    /// The level of the read its checksums came from.
    pub level: VerifyLevel,
    /// Bytes read.
    pub bytes: u64,
    /// Why it was refused or failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// What `catalog add` did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AdoptReport {
    /// The catalog written.
    pub catalog: String,
    /// Files adopted now.
    pub adopted: u64,
    /// Of those, files whose every read came from the device.
    pub at_device: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Files already cataloged with their size and mtime: left alone.
    pub already: u64,
    /// Files refused (changed since cataloged, being received, not under
    /// the root, not a regular file).
    pub refused: u64,
    /// Files that could not be read.
    pub failed: u64,
    /// Every file named or found.
    pub files: Vec<Adopted>,
}

impl AdoptReport {
    /// Whether anything named could not be adopted.
    pub fn incomplete(&self) -> bool {
        self.refused + self.failed > 0
    }
}

/// Adopts the regular files at or under `paths` (each under `root`)
/// into `journal` (the catalog of `root`, named `catalog`).
pub fn catalog_add(
    root: &Path,
    journal: &Journal,
    catalog: String,
    paths: &[PathBuf],
    opts: &AdoptOptions,
    progress: &mut dyn FnMut(&Adopted),
) -> Result<AdoptReport, TransferError> {
    let dest = Destination::open(root)?;
    let root_real = std::fs::canonicalize(root).map_err(|e| TransferError::Destination {
        path: root.display().to_string(),
        source: e,
    })?;
    let mut report = AdoptReport {
        catalog,
        ..AdoptReport::default()
    };
    let mut buf = AlignedBuf::new(defaults::BLOCK_BYTES);
    for p in paths {
        for (shown, rel) in files_under(&root_real, p) {
            let a = match rel {
                Err(why) => refused(shown, why),
                Ok(rel) => adopt_one(&dest, journal, &rel, opts, &mut buf)?,
            };
            match a.state {
                "adopted" => {
                    report.adopted += 1;
                    report.at_device += u64::from(a.level == VerifyLevel::Device);
                }
                "already cataloged" => report.already += 1,
                "refused" => report.refused += 1,
                _ => report.failed += 1,
            }
            report.bytes += a.bytes;
            progress(&a);
            report.files.push(a);
        }
    }
    journal.flush()?;
    Ok(report)
}

fn refused(path: String, why: String) -> Adopted {
    Adopted {
        path,
        state: "refused",
        level: VerifyLevel::None,
        bytes: 0,
        note: Some(why),
    }
}

/// The files `p` names (itself, or the regular files under it, symlinks
/// never followed), each as shown and as its path under `root`, or why
/// it cannot be cataloged there.
fn files_under(root: &Path, p: &Path) -> Vec<(String, Result<WirePath, String>)> {
    let shown = p.display().to_string();
    // The parent is resolved, never the name itself (a symlink there is
    // refused, not followed).
    let real = match (p.parent(), p.file_name()) {
        (Some(parent), Some(name)) => {
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            std::fs::canonicalize(parent).map(|d| d.join(name))
        }
        _ => std::fs::canonicalize(p),
    };
    let real = match real {
        Ok(r) => r,
        Err(e) => return vec![(shown, Err(e.to_string()))],
    };
    let meta = match std::fs::symlink_metadata(&real) {
        Ok(m) => m,
        Err(e) => return vec![(shown, Err(e.to_string()))],
    };
    if meta.is_dir() {
        let mut out = Vec::new();
        let walk = walkdir::WalkDir::new(&real)
            .follow_links(false)
            .sort_by_file_name()
            .into_iter()
            .filter_entry(|e| e.file_name() != STATE_DIR);
        for e in walk {
            match e {
                Ok(e) if e.file_type().is_file() => {
                    out.push((e.path().display().to_string(), relative(root, e.path())))
                }
                Ok(_) => {}
                Err(e) => out.push((shown.clone(), Err(e.to_string()))),
            }
        }
        return out;
    }
    if !meta.is_file() {
        return vec![(
            shown,
            Err("not a regular file (symlinks are never followed)".into()),
        )];
    }
    vec![(shown, relative(root, &real))]
}

fn relative(root: &Path, real: &Path) -> Result<WirePath, String> {
    let rel = real
        .strip_prefix(root)
        .map_err(|_| format!("not under the root {}", root.display()))?;
    let hidden = rel.components().any(|c| match c {
        Component::Normal(n) => {
            n == STATE_DIR || n.to_string_lossy().starts_with(".intact-partial-")
        }
        _ => false,
    });
    if hidden {
        return Err("intact's own state or a partial file: not data".into());
    }
    WirePath::from_relative(rel).map_err(|e| e.to_string())
}

/// Reads and catalogs one file.
fn adopt_one(
    dest: &Destination,
    journal: &Journal,
    rel: &WirePath,
    opts: &AdoptOptions,
    buf: &mut AlignedBuf,
) -> Result<Adopted, TransferError> {
    let mut a = Adopted {
        path: rel.to_string(),
        state: "failed",
        level: VerifyLevel::None,
        bytes: 0,
        note: None,
    };
    let Some(file) = dest.open_final(rel) else {
        a.state = "refused";
        a.note = Some("not a regular file (symlinks are never followed)".into());
        return Ok(a);
    };
    let stat = |f: &std::fs::File| {
        f.metadata().map(|m| {
            (
                m.len(),
                m.mtime(),
                m.mtime_nsec() as u32,
                m.ctime(),
                m.ctime_nsec(),
            )
        })
    };
    let before = match stat(&file) {
        Ok(s) => s,
        Err(e) => {
            a.note = Some(e.to_string());
            return Ok(a);
        }
    };
    let (size, mtime) = (before.0, (before.1, before.2));
    if let Some(row) = journal.lookup(rel.as_bytes())? {
        let same = (row.size, row.mtime_sec, row.mtime_nsec) == (size, mtime.0, mtime.1);
        if !row.done {
            a.state = "refused";
            a.note = Some("a transfer into it is unfinished".into());
            return Ok(a);
        }
        if same && !opts.replace {
            a.state = "already cataloged";
            return Ok(a);
        }
        if !same && !opts.replace {
            a.state = "refused";
            a.note = Some(
                "cataloged with another size or mtime: changed outside intact (--replace catalogs it as it is now)"
                    .into(),
            );
            return Ok(a);
        }
    }
    let path = if opts.direct {
        ReadPath::Direct
    } else {
        ReadPath::Evict
    };
    let mut reader = match DeviceReader::new(&file, path) {
        Ok(r) => r,
        Err(e) => {
            a.note = Some(e.to_string());
            return Ok(a);
        }
    };
    let bs = defaults::BLOCK_BYTES as u64;
    let mut whole = blake3::Hasher::new();
    let mut blocks = Vec::new();
    let mut all_device = size > 0;
    for index in 0..size.div_ceil(bs) {
        let offset = index * bs;
        let len = (size - offset).min(bs) as usize;
        match reader.read(&file, offset, len, buf) {
            Ok(o) => all_device &= o.device,
            Err(e) => {
                a.note = Some(format!("reading at {offset}: {e}"));
                return Ok(a);
            }
        }
        let data = &buf[..len];
        whole.update(data);
        blocks.push(BlockRecord {
            index,
            digest: hash(defaults::BLOCK_ALGORITHM, data).as_bytes().to_vec(),
            verified: VerifiedAt::now(VerifyMode::None, VerifyLevel::None),
            pages: Some(page_crc_blob(data, journal.page_size())),
        });
        a.bytes += len as u64;
    }
    if stat(&file).ok() != Some(before) {
        a.note = Some("it changed while it was read: not cataloged".into());
        return Ok(a);
    }
    let level = if all_device {
        VerifyLevel::Device
    } else {
        VerifyLevel::Cache
    };
    journal.adopt(
        rel.as_bytes(),
        size,
        mtime,
        bs as u32,
        &blocks,
        level,
        *whole.finalize().as_bytes(),
    )?;
    a.state = "adopted";
    a.level = level;
    Ok(a)
}
