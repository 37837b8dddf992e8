//! `intact catalog add PATH…`: files that reached a root by other means
//! are adopted into its catalog, so scrubs keep checking them.
//! `intact catalog init ROOT --page-size SIZE`: a root's catalog is made
//! before its first file, with the page size its CRCs cover.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use intact_transfer::{AdoptOptions, AdoptReport};

use crate::stdout::outln;

pub const CATALOG_ABOUT: &str = "\
Work with the at-rest catalog of a root (the one `intact scrub` checks).

`intact catalog add PATH...` adopts files that reached the root by other
means (a program wrote them, another tool copied them): each is read as it
is now (evicting its pages first and counting what stays resident, or
O_DIRECT with --direct) and its page CRC-32C, block XXH3-128 and whole
BLAKE3 are cataloged with the level of that read. An adopted file was
never compared with a source: `intact status` counts adopted files apart
from those that arrived by a transfer. A file already cataloged with its
size and mtime is left alone; one whose size or mtime differ from its
record changed outside intact and is refused unless --replace is given.

The root is the nearest directory at or above the first PATH that has a
catalog (ROOT/.intact, or the state `intact copy` keeps for ROOT), or
--root, whose catalog is created in ROOT/.intact if it has none. A running
server holds its root's catalog: add while it is stopped.

`intact catalog init ROOT [--page-size SIZE]` makes ROOT's catalog in
ROOT/.intact (or opens the one it has) before any file arrives, with the
page size each stored CRC-32C covers: a power of two from 512 bytes to
1 MiB, 4KiB by default. A larger page costs less (4 bytes per page: 0.1%
of the data at 4KiB, 0.006% at 64KiB, as PVFS used) but names rot, and
fetches a repair, in larger pieces. The size is fixed once a file is
cataloged. `intact serve --root ROOT` and `intact copy SRC ROOT` then write into
that catalog.

Exit status: 0 when every file named was adopted or already cataloged (add)
or the catalog has the page size asked for (init), 1 when any file was
refused or could not be read, 2 for a usage error (a page size that is not
allowed, or one asked for after files were cataloged).";

/// `intact catalog`.
#[derive(Args, Debug)]
pub struct CatalogArgs {
    #[command(subcommand)]
    pub command: CatalogCommand,
}

#[derive(Subcommand, Debug)]
pub enum CatalogCommand {
    /// Adopt files already under a root into its catalog.
    Add(AddArgs),
    /// Make a root's catalog before its first file (choose its page size).
    Init(InitArgs),
}

/// `intact catalog init`.
#[derive(Args, Debug)]
pub struct InitArgs {
    /// The root (a directory; created if missing).
    #[arg(value_name = "ROOT")]
    pub root: PathBuf,
    /// Bytes each stored page CRC-32C covers: a power of two from 512 to
    /// 1MiB (fixed once a file is cataloged).
    #[arg(long, value_name = "SIZE", default_value = "4KiB", value_parser = crate::args::parse_size)]
    pub page_size: usize,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `intact catalog add`.
#[derive(Args, Debug)]
pub struct AddArgs {
    /// Files, or directories to adopt every regular file under.
    #[arg(value_name = "PATH", num_args = 1.., required = true)]
    pub paths: Vec<PathBuf>,
    /// The root whose catalog to add to (created in ROOT/.intact if it
    /// has none); default: the nearest one above the first PATH.
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Catalog files anew whose size or mtime differ from their record.
    #[arg(long)]
    pub replace: bool,
    /// Read with O_DIRECT (each read proven by residency counts).
    #[arg(long)]
    pub direct: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &CatalogArgs) -> anyhow::Result<ExitCode> {
    match &a.command {
        CatalogCommand::Add(a) => add(a),
        CatalogCommand::Init(a) => init(a),
    }
}

fn init(a: &InitArgs) -> anyhow::Result<ExitCode> {
    if let Ok(m) = std::fs::metadata(&a.root) {
        if !m.is_dir() {
            return Err(crate::exit::usage(format!(
                "{}: not a directory",
                a.root.display()
            )));
        }
    }
    std::fs::create_dir_all(&a.root).map_err(|e| anyhow::anyhow!("{}: {e}", a.root.display()))?;
    let (journal, dir) = intact_transfer::open_or_create_catalog(&a.root)?;
    journal
        .set_page_size(a.page_size as u64)
        .map_err(|e| match e {
            intact_transfer::TransferError::Usage(m) => crate::exit::usage(m),
            e => e.into(),
        })?;
    let page = journal.page_size();
    let overhead = 4.0 / page as f64 * 100.0;
    let catalog = dir.join("journal.sqlite");
    if a.json {
        let v = serde_json::json!({
            "catalog": catalog,
            "page_size": page,
            "overhead_percent": overhead,
        });
        outln!("{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        outln!(
            "catalog {}: pages of {page} bytes (a CRC-32C each: {overhead:.3}% of the data)",
            catalog.display()
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

fn add(a: &AddArgs) -> anyhow::Result<ExitCode> {
    let (root, (journal, dir)) = match &a.root {
        Some(r) => (r.clone(), intact_transfer::open_or_create_catalog(r)?),
        None => {
            let root = intact_transfer::catalog_root_of(&a.paths[0]).ok_or_else(|| {
                crate::exit::usage(format!(
                    "{}: no catalog at or above it; give --root ROOT (a root `intact serve` or `intact copy` wrote into, or one to catalog anew)",
                    a.paths[0].display()
                ))
            })?;
            let opened = intact_transfer::open_catalog(&root)?;
            (root, opened)
        }
    };
    let opts = AdoptOptions {
        replace: a.replace,
        direct: a.direct,
    };
    let name = dir.join("journal.sqlite").display().to_string();
    let json = a.json;
    let mut print = |f: &intact_transfer::Adopted| {
        if json {
            return;
        }
        let (mark, p) = crate::summary::printable(&f.path);
        let line = match f.state {
            "adopted" => format!(
                "ADOPTED {mark}{p}: {} bytes read at level {}",
                f.bytes, f.level
            ),
            "already cataloged" => format!("ALREADY {mark}{p}: cataloged with its size and mtime"),
            s => format!(
                "{} {mark}{p}: {}",
                s.to_uppercase(),
                f.note.as_deref().unwrap_or("")
            ),
        };
        let _ = outln!("{line}");
    };
    let report = intact_transfer::catalog_add(&root, &journal, name, &a.paths, &opts, &mut print)?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        summary(&report)?;
    }
    Ok(if report.incomplete() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn summary(r: &AdoptReport) -> anyhow::Result<()> {
    outln!(
        "catalog {}: {} files adopted ({} read from the device, {} through the page cache only), {:.1} MiB read; {} already cataloged, {} refused, {} failed",
        r.catalog,
        r.adopted,
        r.at_device,
        r.adopted - r.at_device,
        r.bytes as f64 / (1024.0 * 1024.0),
        r.already,
        r.refused,
        r.failed
    )?;
    Ok(())
}
