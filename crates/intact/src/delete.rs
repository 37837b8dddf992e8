//! `copy --delete`: which destination directories the sources cover, and
//! what in them the sources still have; the removal itself is
//! [`intact_transfer::prune`], run only after the copy succeeded.

use std::collections::HashSet;
use std::path::Path;

use intact_transfer::{
    prune, DeleteRequest, Filter, Placement, PruneReport, Scan, SourceKind, SourceSpec,
};

/// What the sources cover: the directories to prune (relative to the
/// destination root; empty for the root itself) and every path they have.
pub struct Coverage {
    scopes: Vec<Vec<u8>>,
    keep: HashSet<Vec<u8>>,
}

impl Coverage {
    /// The directories `sources` put into the destination (a directory
    /// under its own name, or the root for `DIR/`) and the scan's paths.
    pub fn of(sources: &[SourceSpec], scanned: &Scan) -> Coverage {
        let mut scopes = Vec::new();
        for s in sources {
            match &s.place {
                Placement::Contents => scopes.push(Vec::new()),
                Placement::OwnName => {
                    if let Some(e) = scanned
                        .entries
                        .iter()
                        .find(|e| e.abs == s.path && e.kind == SourceKind::Dir)
                    {
                        scopes.push(e.rel.as_bytes().to_vec());
                    }
                }
                Placement::Named(_) => {}
            }
        }
        let keep = scanned
            .entries
            .iter()
            .map(|e| e.rel.as_bytes().to_vec())
            .collect();
        Coverage { scopes, keep }
    }

    /// The request `send --delete` makes of the server (paths relative to
    /// the send's subdirectory).
    pub fn request(&self, filter: &Filter, dry_run: bool) -> DeleteRequest {
        let mut keep: Vec<Vec<u8>> = self.keep.iter().cloned().collect();
        keep.sort();
        DeleteRequest {
            scopes: self.scopes.clone(),
            keep,
            filter: filter.clone(),
            dry_run,
        }
    }

    /// Removes (or with `dry_run` lists) what the destination holds under
    /// the covered directories and the sources do not have.
    pub fn prune(&self, root: &Path, filter: &Filter, dry_run: bool) -> PruneReport {
        prune(root, &self.scopes, &self.keep, filter, dry_run)
    }
}
