//! Where `intact copy SRC... DST` puts things, decided the way `cp` and
//! `rsync` users expect, before anything is written:
//!
//! - DST is an existing directory, or ends in '/', or there are several
//!   sources, or a source is a directory: every source goes into the
//!   directory DST (created if missing) under its own name; `SRC/` (a
//!   trailing slash) puts a directory's contents there instead (rsync).
//! - One source that is not a directory and a DST that is not a
//!   directory: the copy is a file named DST (a new name, or replacing
//!   the file DST, as `cp` does), in DST's directory, which must exist.
//! - A directory is never copied into itself, and a file never onto itself.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use intact_transfer::{Placement, SourceSpec};

/// The destination root and the sources placed under it.
#[derive(Debug)]
pub struct Plan {
    /// The directory everything is written under.
    pub root: PathBuf,
    /// The sources, each with where it goes.
    pub sources: Vec<SourceSpec>,
}

/// A command line that cannot be carried out as asked; the message says
/// what is wrong and what to do (exit status 2).
#[derive(Debug)]
pub struct Refused(pub String);

fn show(p: &Path) -> String {
    p.display().to_string()
}

/// Whether `src` is a directory as the copy will see it: a symlink counts
/// as what it points to only with -L or a trailing slash.
fn is_dir(spec: &SourceSpec, copy_links: bool) -> bool {
    let follow = copy_links || spec.place == Placement::Contents;
    let m = if follow {
        fs::metadata(&spec.path)
    } else {
        fs::symlink_metadata(&spec.path)
    };
    m.is_ok_and(|m| m.is_dir())
}

/// Decides where each source goes (see the module docs).
pub fn plan(sources: &[PathBuf], dest: &Path, copy_links: bool) -> Result<Plan, Refused> {
    let specs: Vec<SourceSpec> = sources.iter().map(|s| SourceSpec::from_arg(s)).collect();
    let slash = dest.as_os_str().as_bytes().ends_with(b"/");
    let dest_meta = fs::metadata(dest);
    let dest_is_dir = dest_meta.as_ref().is_ok_and(|m| m.is_dir());
    // Something is there that is not a directory (a file, a link to one,
    // a dangling link).
    let dest_is_other = !dest_is_dir && fs::symlink_metadata(dest).is_ok();
    if let Err(e) = &dest_meta {
        if e.kind() == std::io::ErrorKind::NotADirectory {
            let blocker = first_non_dir(dest).unwrap_or_else(|| dest.to_path_buf());
            return Err(Refused(format!(
                "cannot copy to '{}': '{}' is a file, not a directory; name a destination whose parent directories are directories",
                show(dest),
                show(&blocker)
            )));
        }
    }
    let single_file = specs.len() == 1
        && specs[0].place == Placement::OwnName
        && !is_dir(&specs[0], copy_links)
        && fs::symlink_metadata(&specs[0].path).is_ok();

    let plan = if !dest_is_dir && !slash && single_file {
        let name = dest.file_name().ok_or_else(|| {
            Refused(format!(
                "cannot copy to '{}': it does not name a file; name a directory or a new file",
                show(dest)
            ))
        })?;
        let parent = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if !parent.is_dir() {
            return Err(Refused(format!(
                "cannot copy '{}' to '{}': the directory '{}' does not exist; create it first, or end DST with '/' to make '{}' a directory holding the copy",
                show(&specs[0].path),
                show(dest),
                show(&parent),
                show(dest)
            )));
        }
        Plan {
            root: parent,
            sources: vec![SourceSpec {
                path: specs[0].path.clone(),
                place: Placement::Named(PathBuf::from(name)),
            }],
        }
    } else if dest_is_other {
        let what = match specs.iter().find(|s| is_dir(s, copy_links)) {
            Some(d) => format!("the directory '{}'", show(&d.path)),
            None => format!("{} sources", specs.len()),
        };
        return Err(Refused(format!(
            "cannot copy {what} to '{}': it is a file, not a directory; name a directory (one that does not exist is created), or move '{}' out of the way",
            show(dest),
            show(dest)
        )));
    } else {
        Plan {
            root: dest.to_path_buf(),
            sources: specs,
        }
    };
    not_into_itself(&plan, copy_links)?;
    Ok(plan)
}

/// The first existing component of `p` that is not a directory.
fn first_non_dir(p: &Path) -> Option<PathBuf> {
    let mut at = PathBuf::new();
    for c in p.components() {
        at.push(c);
        match fs::metadata(&at) {
            Ok(m) if !m.is_dir() => return Some(at),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
    None
}

/// `p` made absolute with symlinks resolved as far as it exists; the
/// rest appended as written.
fn resolved(p: &Path) -> PathBuf {
    let mut existing = p.to_path_buf();
    let mut rest = Vec::new();
    loop {
        if let Ok(c) = fs::canonicalize(&existing) {
            let mut out = c;
            for r in rest.iter().rev() {
                out.push(r);
            }
            return out;
        }
        match (existing.file_name(), existing.parent()) {
            (Some(n), Some(parent)) => {
                rest.push(n.to_os_string());
                existing = if parent.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    parent.to_path_buf()
                };
            }
            _ => return p.to_path_buf(),
        }
    }
}

/// Refuses a directory copied into itself (or a place inside it) and a
/// file copied onto itself.
fn not_into_itself(plan: &Plan, copy_links: bool) -> Result<(), Refused> {
    let root = resolved(&plan.root);
    for s in &plan.sources {
        let target = match &s.place {
            Placement::Contents => root.clone(),
            Placement::Named(n) => root.join(n),
            Placement::OwnName => {
                let name = s.path.file_name().map(|n| n.to_os_string()).or_else(|| {
                    fs::canonicalize(&s.path)
                        .ok()
                        .and_then(|c| c.file_name().map(|n| n.to_os_string()))
                });
                match name {
                    Some(n) => root.join(n),
                    None => continue,
                }
            }
        };
        if is_dir(s, copy_links) {
            let Ok(src) = fs::canonicalize(&s.path) else {
                continue;
            };
            // Compare whole components (data2 is not inside data).
            let inside = target.components().collect::<Vec<Component>>();
            if inside.starts_with(&src.components().collect::<Vec<_>>()) {
                return Err(Refused(format!(
                    "cannot copy the directory '{}' into '{}', which is {} it: the copy would copy itself; choose a destination outside '{}'",
                    show(&s.path),
                    show(&target),
                    if target == src { "the same as" } else { "inside" },
                    show(&s.path)
                )));
            }
        } else if let (Ok(a), Ok(b)) =
            (fs::symlink_metadata(&s.path), fs::symlink_metadata(&target))
        {
            if a.dev() == b.dev() && a.ino() == b.ino() {
                return Err(Refused(format!(
                    "'{}' and '{}' are the same file; name another destination",
                    show(&s.path),
                    show(&target)
                )));
            }
        }
    }
    Ok(())
}

/// A note for each source that is a symlink and will be copied as a link
/// (no -L, no trailing slash), so that nothing is followed or not
/// followed silently.
pub fn symlink_notes(sources: &[PathBuf], copy_links: bool) -> Vec<String> {
    if copy_links {
        return Vec::new();
    }
    sources
        .iter()
        .map(|s| SourceSpec::from_arg(s))
        .filter(|s| s.place != Placement::Contents)
        .filter(|s| fs::symlink_metadata(&s.path).is_ok_and(|m| m.file_type().is_symlink()))
        .map(|s| {
            let p = show(&s.path);
            format!(
                "note: '{p}' is a symlink and is copied as a link; -L copies what it points to, '{p}/' the contents of the directory it points to"
            )
        })
        .collect()
}
