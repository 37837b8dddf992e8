//! `--dry-run`: what a `copy` or `send` would transfer (and, with
//! `--delete`, remove), with sizes; nothing is written or sent.

use std::process::ExitCode;

use anyhow::Context;
use intact_transfer::{PruneReport, Scan, SourceKind};

use crate::args::PipelineArgs;
use crate::stdout::outln;
use crate::summary::{bytes, printable};

/// Prints the plan of a run (with -q, only the errors); exit 1 if a source
/// could not be read.
pub fn print(
    scanned: &Scan,
    deletes: Option<&PruneReport>,
    send: bool,
    p: &PipelineArgs,
) -> anyhow::Result<ExitCode> {
    if p.json {
        print_json(scanned, deletes)
    } else if !p.quiet {
        print_lines(scanned, deletes, send)
    } else {
        Ok(())
    }
    .context("cannot write to standard output")?;
    for e in &scanned.errors {
        eprintln!("intact: {e}");
    }
    for e in deletes.map(|d| d.errors.as_slice()).unwrap_or_default() {
        eprintln!("intact: {e}");
    }
    Ok(if scanned.errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn kind(k: &SourceKind) -> &'static str {
    match k {
        SourceKind::File => "file",
        SourceKind::Dir => "dir",
        SourceKind::Symlink(_) => "symlink",
    }
}

fn total(scanned: &Scan) -> u64 {
    scanned.entries.iter().map(|e| e.size).sum()
}

/// The plan as one JSON object.
fn print_json(scanned: &Scan, deletes: Option<&PruneReport>) -> std::io::Result<()> {
    let v = serde_json::json!({
        "dry_run": true,
        "entries": scanned.entries.iter().map(|e| serde_json::json!({
            "path": e.rel.to_string(),
            "kind": kind(&e.kind),
            "size": e.size,
        })).collect::<Vec<_>>(),
        "bytes": total(scanned),
        "errors": scanned.errors.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
        "skipped": scanned.skipped.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "would_delete": deletes.map(|d| d.deleted.clone()).unwrap_or_default(),
    });
    outln!("{v:#}")
}

/// The plan for people: one line per entry (names escaped as `-v` prints
/// them), what would be deleted, and a last line with the totals.
fn print_lines(scanned: &Scan, deletes: Option<&PruneReport>, send: bool) -> std::io::Result<()> {
    for e in &scanned.entries {
        let (mark, name) = printable(&e.rel.to_string());
        outln!("{mark}{:<7} {:>12}  {name}", kind(&e.kind), e.size)?;
    }
    if let Some(d) = deletes {
        for path in &d.deleted {
            let (mark, name) = printable(path);
            outln!("{mark}delete  {:>12}  {name}", "")?;
        }
        for path in &d.kept {
            let (mark, name) = printable(path);
            outln!("{mark}keep    {:>12}  {name} (holds excluded entries)", "")?;
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
    outln!(
        "dry run: {} entries, {} would be {verb}{held}{deleted}; nothing was changed",
        scanned.entries.len(),
        bytes(total(scanned)),
    )
}
