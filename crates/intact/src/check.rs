//! `intact sum --check`: verify the files named by checksum lists.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use intact_digest::{io_reason, manifest, Algorithm, Digest};
use serde::Serialize;

use crate::args::SumArgs;
use crate::hashing::{self, Input};
use crate::sum::{plan, DEFAULT_ALGORITHM};

/// One file a list names, with the digest it must have.
struct Expected {
    input: Input,
    digest: Digest,
    /// The line named no algorithm: it came from `--algo` or the default.
    untagged: bool,
}

#[derive(Serialize)]
struct Malformed {
    list: String,
    line: usize,
    error: String,
}

#[derive(Serialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    Ok,
    Mismatch,
    Unreadable,
}

#[derive(Serialize)]
struct Checked {
    path: String,
    status: Status,
    algorithm: Algorithm,
    expected: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    actual: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Serialize, Default)]
struct Summary {
    checked: u64,
    ok: u64,
    mismatched: u64,
    unreadable: u64,
    malformed_lines: u64,
    unreadable_lists: u64,
    /// Lines skipped by `--ignore-missing` because their file does not exist.
    missing_skipped: u64,
    /// Lists none of whose files existed, with `--ignore-missing`.
    unverified_lists: u64,
    seconds: f64,
}

#[derive(Serialize)]
struct CheckReport {
    files: Vec<Checked>,
    malformed: Vec<Malformed>,
    summary: Summary,
}

pub fn run(args: &SumArgs) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let mut summary = Summary::default();
    let mut malformed = Vec::new();
    let mut expected = Vec::new();
    let lists = if args.paths.is_empty() {
        vec![PathBuf::from("-")]
    } else {
        args.paths.clone()
    };
    for list in &lists {
        let text = match read_list(list) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("intact: {}: {}", list.display(), io_reason(&e));
                summary.unreadable_lists += 1;
                continue;
            }
        };
        let before = expected.len();
        let bad_before = malformed.len();
        let skipped = parse_list(list, &text, args, &mut expected, &mut malformed);
        summary.missing_skipped += skipped;
        if expected.len() == before && malformed.len() == bad_before && skipped == 0 {
            eprintln!(
                "intact: {}: no properly formatted checksum lines found",
                list.display()
            );
            summary.unreadable_lists += 1;
        } else if expected.len() == before && skipped > 0 {
            // As sha256sum --ignore-missing: a list that verified nothing fails.
            if !args.status {
                eprintln!("intact: {}: no file was verified", list.display());
            }
            summary.unverified_lists += 1;
        }
    }
    if !args.status {
        for m in &malformed {
            eprintln!("intact: {}:{}: {}", m.list, m.line, m.error);
        }
    }
    summary.malformed_lines = malformed.len() as u64;

    let pb = hashing::Progress::new(expected.iter().map(|e| e.input.size()).sum());
    let mut files = Vec::new();
    let mut failed_as = Vec::new();
    let mut done = 0;
    hashing::for_each_hashed(
        args.jobs,
        &expected,
        |e| &e.input,
        |e| plan(args, e.digest.algorithm()),
        |e, outcome| {
            done += 1;
            pb.advance(&e.input, done);
            let checked = judge(e, outcome);
            let word = match (&checked.status, &checked.error) {
                (Status::Ok, _) => {
                    summary.ok += 1;
                    "OK"
                }
                (Status::Mismatch, _) => {
                    summary.mismatched += 1;
                    "FAILED"
                }
                (Status::Unreadable, err) => {
                    summary.unreadable += 1;
                    pb.print_err(err.as_deref().unwrap_or("unreadable"));
                    "FAILED open or read"
                }
            };
            summary.checked += 1;
            let quiet_ok = args.quiet && matches!(checked.status, Status::Ok);
            if !args.json && !args.status && !quiet_ok {
                let (escaped, name) = manifest::escape_name(e.input.name());
                let mut line = Vec::with_capacity(name.len() + 24);
                if escaped {
                    line.push(b'\\');
                }
                line.extend_from_slice(&name);
                line.extend_from_slice(b": ");
                line.extend_from_slice(word.as_bytes());
                line.push(b'\n');
                // A closed stdout shows up again at exit; checking goes on.
                let _ = pb.print_out(&line);
            }
            if matches!(checked.status, Status::Mismatch) {
                failed_as.push((e.digest.algorithm(), e.untagged));
            }
            if args.json {
                files.push(checked);
            }
        },
    )?;
    pb.finish();
    summary.seconds = hashing::secs(start.elapsed());
    if !args.status {
        warn(
            summary.malformed_lines,
            "line is",
            "lines are",
            "improperly formatted",
        );
        warn(
            summary.unreadable,
            "listed file",
            "listed files",
            "could not be read",
        );
        warn(
            summary.mismatched,
            "computed checksum",
            "computed checksums",
            "did NOT match",
        );
        if summary.ok == 0 {
            if let Some(hint) = other_algorithm_hint(&failed_as) {
                eprintln!("intact: {hint}");
            }
        }
    }
    let failed = summary.mismatched
        + summary.unreadable
        + summary.malformed_lines
        + summary.unreadable_lists
        + summary.unverified_lists
        > 0;
    if args.json {
        let report = CheckReport {
            files,
            malformed,
            summary,
        };
        hashing::write_json(&report)?;
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn read_list(list: &Path) -> std::io::Result<Vec<u8>> {
    if list.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::stdin().lock().read_to_end(&mut buf)?;
        Ok(buf)
    } else if std::fs::metadata(list)?.is_dir() {
        Err(std::io::Error::from(std::io::ErrorKind::IsADirectory))
    } else {
        std::fs::read(list)
    }
}

/// Reads the lines of one list into `expected` and `malformed`; returns
/// how many lines `--ignore-missing` skipped.
fn parse_list(
    list: &Path,
    text: &[u8],
    args: &SumArgs,
    expected: &mut Vec<Expected>,
    malformed: &mut Vec<Malformed>,
) -> u64 {
    let algo = args.algo;
    let mut skipped = 0;
    for (i, line) in text.split(|&b| b == b'\n').enumerate() {
        let bad = |error: String| Malformed {
            list: list.display().to_string(),
            line: i + 1,
            error,
        };
        let parsed = match manifest::parse_line(line) {
            Ok(Some(p)) => p,
            Ok(None) => continue,
            Err(e) => {
                malformed.push(bad(e.to_string()));
                continue;
            }
        };
        let algorithm = match (algo, parsed.tagged) {
            (Some(a), Some(t)) if a != t => {
                malformed.push(bad(format!("line is tagged {t} but --algo is {a}")));
                continue;
            }
            (Some(a), _) => a,
            (None, Some(t)) => t,
            (None, None) => DEFAULT_ALGORITHM,
        };
        match Digest::from_hex(algorithm, &parsed.hex) {
            Ok(digest) => {
                let meta = std::fs::metadata(&parsed.path);
                let missing = matches!(&meta, Err(e) if e.kind() == std::io::ErrorKind::NotFound);
                if missing && args.ignore_missing {
                    skipped += 1;
                    continue;
                }
                expected.push(Expected {
                    input: Input::File {
                        path: parsed.path,
                        size: meta.map_or(0, |m| m.len()),
                    },
                    digest,
                    untagged: parsed.tagged.is_none(),
                });
            }
            Err(e) if parsed.tagged.is_none() => {
                let mut msg = e.to_string();
                if let Some(fits) = fitting(parsed.hex.len(), algorithm) {
                    msg.push_str(&format!(
                        "; {} hex digits fit another algorithm: try {fits}",
                        parsed.hex.len()
                    ));
                }
                if algo.is_none() {
                    msg.push_str(&format!(
                        "; untagged lines are read as {DEFAULT_ALGORITHM} unless --algo says otherwise"
                    ));
                }
                malformed.push(bad(msg))
            }
            Err(e) => malformed.push(bad(e.to_string())),
        }
    }
    skipped
}

/// The other algorithms whose digests have `hex_digits` hex digits, as
/// `--algo` options ("--algo xxh128 or --algo md5"); `None` if none.
fn fitting(hex_digits: usize, used: Algorithm) -> Option<String> {
    let others: Vec<String> = Algorithm::with_hex_len(hex_digits)
        .filter(|a| *a != used)
        .map(|a| format!("--algo {a}"))
        .collect();
    (!others.is_empty()).then(|| others.join(" or "))
}

/// When no file matched: if every mismatch came from an untagged line read
/// as one algorithm, and another algorithm has digests of the same length,
/// a sentence saying which algorithm the list may be for (a sha256 list
/// checked as BLAKE3, the default, fails every line).
fn other_algorithm_hint(failed_as: &[(Algorithm, bool)]) -> Option<String> {
    let (used, _) = *failed_as.first()?;
    if !failed_as.iter().all(|&(a, untagged)| untagged && a == used) {
        return None;
    }
    let hex = 2 * used.digest_len();
    let others: Vec<&str> = Algorithm::with_hex_len(hex)
        .filter(|a| *a != used)
        .map(Algorithm::name)
        .collect();
    let fits = fitting(hex, used)?;
    Some(format!(
        "WARNING: no listed file matched; the lines were read as {used}, but their {hex}-hex-digit digests fit {} too: the list may be for {}; try {fits}",
        others.join(" and "),
        others.join(" or "),
    ))
}
fn judge(e: &Expected, outcome: hashing::Outcome) -> Checked {
    let mut c = Checked {
        path: e.input.name().to_string_lossy().into_owned(),
        status: Status::Unreadable,
        algorithm: e.digest.algorithm(),
        expected: e.digest.to_hex(),
        actual: None,
        error: None,
    };
    match outcome {
        Ok((d, _)) => {
            let actual = d.digests.whole;
            c.status = if actual.ct_eq(&e.digest) {
                Status::Ok
            } else {
                Status::Mismatch
            };
            c.actual = Some(actual.to_hex());
        }
        Err(msg) => c.error = Some(msg),
    }
    c
}

fn warn(n: u64, one: &str, many: &str, what: &str) {
    if n > 0 {
        let noun = if n == 1 { one } else { many };
        eprintln!("intact: WARNING: {n} {noun} {what}");
    }
}
