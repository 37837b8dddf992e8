//! `intact sum` without `--check`: print the digests of files.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use intact_digest::{io_reason, manifest, Algorithm, DigestPlan, ReadPath, ReadStrategy};
use serde::Serialize;
use walkdir::WalkDir;

use crate::args::SumArgs;
use crate::hashing::{self, Input};

/// Algorithm used when `--algo` is not given: intact's whole-file digest.
pub const DEFAULT_ALGORITHM: Algorithm = intact_digest::defaults::FILE_ALGORITHM;

/// The plan every file of this run is hashed with.
pub fn plan(args: &SumArgs, algorithm: Algorithm) -> DigestPlan {
    DigestPlan {
        algorithm,
        block_size: args.block_size,
        pages: args.pages,
        parallel: args.jobs != Some(1),
        strategy: if args.no_mmap {
            ReadStrategy::Read
        } else if args.mmap {
            ReadStrategy::Mmap
        } else {
            ReadStrategy::Auto
        },
    }
}

pub fn run(args: &SumArgs) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let algorithm = args.algo.unwrap_or(DEFAULT_ALGORITHM);
    let plan = plan(args, algorithm);
    let inputs = gather(&args.paths, args.recursive);
    let pb = hashing::Progress::new(inputs.iter().map(Input::size).sum());

    let mut report = SumReport {
        algorithm,
        files: Vec::new(),
        summary: Summary::default(),
    };
    let style = manifest::LineStyle {
        bsd_tag: args.tag,
        zero: args.zero,
    };
    let mut write_failed = None;
    let mut done = 0;
    hashing::for_each_hashed(
        args.jobs,
        &inputs,
        |input| input,
        |_| plan,
        |input, outcome| {
            done += 1;
            pb.advance(input, done);
            let entry = FileEntry::new(input.name(), &outcome);
            report.summary.add(&entry);
            match outcome {
                Ok((d, _)) if !args.json => {
                    let line = manifest::format_line_as(&d.digests.whole, input.name(), style);
                    if let Err(e) = pb.print_out(&line) {
                        write_failed.get_or_insert(e);
                    }
                }
                Ok(_) => {}
                Err(msg) => pb.print_err(&msg),
            }
            if args.json {
                report.files.push(entry);
            }
        },
    )?;
    pb.finish();
    if let Some(e) = write_failed {
        anyhow::bail!("writing the digests failed: {e}");
    }
    report.summary.seconds = hashing::secs(start.elapsed());
    if args.json {
        hashing::write_json(&report)?;
    }
    Ok(if report.summary.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Turns command-line paths into the list of inputs, in order.
pub fn gather(paths: &[PathBuf], recursive: bool) -> Vec<Input> {
    if paths.is_empty() {
        return vec![Input::Stdin];
    }
    let mut inputs = Vec::new();
    for path in paths {
        if path.as_os_str() == "-" {
            inputs.push(Input::Stdin);
            continue;
        }
        match std::fs::metadata(path) {
            Err(e) => inputs.push(Input::Bad {
                path: path.clone(),
                error: format!("{}: {}", path.display(), io_reason(&e)),
            }),
            Ok(m) if m.is_dir() && recursive => walk(path, &mut inputs),
            Ok(m) if m.is_dir() => inputs.push(Input::Bad {
                path: path.clone(),
                error: format!(
                    "{}: is a directory (use --recursive to hash the files under it)",
                    path.display()
                ),
            }),
            Ok(m) => inputs.push(Input::File {
                path: path.clone(),
                size: m.len(),
            }),
        }
    }
    inputs
}

fn walk(root: &Path, inputs: &mut Vec<Input>) {
    for entry in WalkDir::new(root).follow_links(false).sort_by_file_name() {
        match entry {
            Ok(e) if e.file_type().is_file() => inputs.push(Input::File {
                size: e.metadata().map_or(0, |m| m.len()),
                path: e.into_path(),
            }),
            Ok(e) if e.file_type().is_dir() => {}
            Ok(e) => {
                let kind = if e.path_is_symlink() {
                    "symlink"
                } else {
                    "special file"
                };
                eprintln!("intact: skipping {kind} {}", e.path().display());
            }
            Err(e) => {
                let path = e.path().unwrap_or(root).to_path_buf();
                let reason = e.io_error().map_or_else(|| e.to_string(), io_reason);
                inputs.push(Input::Bad {
                    error: format!("{}: {reason}", path.display()),
                    path,
                });
            }
        }
    }
}

#[derive(Serialize)]
struct SumReport {
    algorithm: Algorithm,
    files: Vec<FileEntry>,
    summary: Summary,
}

#[derive(Serialize)]
struct FileEntry {
    path: String,
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    digest: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    read_path: Option<ReadPath>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    block_size: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    blocks: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pages_crc32c: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl FileEntry {
    fn new(name: &Path, outcome: &hashing::Outcome) -> FileEntry {
        let mut e = FileEntry {
            path: name.to_string_lossy().into_owned(),
            ok: outcome.is_ok(),
            size: None,
            digest: None,
            read_path: None,
            seconds: None,
            block_size: None,
            blocks: None,
            pages_crc32c: None,
            error: None,
        };
        match outcome {
            Ok((d, took)) => {
                let g = &d.digests;
                e.size = Some(g.len);
                e.digest = Some(g.whole.to_hex());
                e.read_path = Some(d.read_path);
                e.seconds = Some(hashing::secs(*took));
                e.block_size = g.block_size;
                e.blocks = g
                    .block_size
                    .map(|_| g.blocks.iter().map(|b| b.to_hex()).collect());
                e.pages_crc32c = g
                    .pages
                    .as_ref()
                    .map(|p| p.iter().map(|c| format!("{c:08x}")).collect());
            }
            Err(msg) => e.error = Some(msg.clone()),
        }
        e
    }
}

#[derive(Serialize, Default)]
struct Summary {
    files: u64,
    failed: u64,
    bytes: u64,
    seconds: f64,
}

impl Summary {
    fn add(&mut self, e: &FileEntry) {
        self.files += 1;
        self.failed += u64::from(!e.ok);
        self.bytes += e.size.unwrap_or(0);
    }
}
