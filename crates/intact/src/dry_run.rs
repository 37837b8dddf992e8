//! `--dry-run`: what a `copy` or `send` would transfer (and, with
//! `--delete`, remove), with sizes; nothing is written or sent.

use std::process::ExitCode;

use intact_transfer::{PruneReport, Scan, SourceKind};

use crate::summary::bytes;

/// Prints the plan of a run; exit 1 if a source could not be read.
pub fn print(scanned: &Scan, deletes: Option<&PruneReport>, send: bool, json: bool) -> ExitCode {
    let total: u64 = scanned.entries.iter().map(|e| e.size).sum();
    let kind = |k: &SourceKind| match k {
        SourceKind::File => "file",
        SourceKind::Dir => "dir",
        SourceKind::Symlink(_) => "symlink",
    };
    if json {
        let v = serde_json::json!({
            "dry_run": true,
            "entries": scanned.entries.iter().map(|e| serde_json::json!({
                "path": e.rel.to_string(),
                "kind": kind(&e.kind),
                "size": e.size,
            })).collect::<Vec<_>>(),
            "bytes": total,
            "errors": scanned.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            "skipped": scanned.skipped.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "would_delete": deletes.map(|d| d.deleted.clone()).unwrap_or_default(),
        });
        println!("{v:#}");
    } else {
        for e in &scanned.entries {
            println!("{:<7} {:>12}  {}", kind(&e.kind), e.size, e.rel);
        }
        if let Some(d) = deletes {
            for p in &d.deleted {
                println!("delete  {:>12}  {p}", "");
            }
            for p in &d.kept {
                println!("keep    {:>12}  {p} (holds excluded entries)", "");
            }
        }
        let verb = if send { "sent" } else { "copied" };
        let held = if send {
            " (at most: a real send skips what the server already holds verified)"
        } else {
            ""
        };
        let deleted = deletes.map_or(String::new(), |d| {
            format!(", {} would be deleted", d.deleted.len())
        });
        println!(
            "dry run: {} entries, {} would be {verb}{held}{deleted}; nothing was changed",
            scanned.entries.len(),
            bytes(total),
        );
    }
    for e in &scanned.errors {
        eprintln!("intact: {e}");
    }
    for e in deletes.map(|d| d.errors.as_slice()).unwrap_or_default() {
        eprintln!("intact: {e}");
    }
    if scanned.errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
