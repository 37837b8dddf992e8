//! `intact sum --check`: verify the files named by checksum lists.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use intact_digest::{io_reason, manifest, Algorithm, Digest};
use serde::Serialize;

use crate::args::SumArgs;
use crate::hashing::{self, Input};
use crate::ordered::for_each_ordered;
use crate::sum::{plan, DEFAULT_ALGORITHM};

/// One file a list names, with the digest it must have.
struct Expected {
    input: Input,
    digest: Digest,
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
        parse_list(list, &text, args.algo, &mut expected, &mut malformed);
        if expected.len() == before && malformed.len() == bad_before {
            eprintln!(
                "intact: {}: no properly formatted checksum lines found",
                list.display()
            );
            summary.unreadable_lists += 1;
        }
    }
    for m in &malformed {
        eprintln!("intact: {}:{}: {}", m.list, m.line, m.error);
    }
    summary.malformed_lines = malformed.len() as u64;

    let pool = hashing::thread_pool(args.jobs)?;
    let pb = hashing::progress_bar(expected.iter().map(|e| e.input.size()).sum());
    let mut files = Vec::new();
    let mut done = 0;
    for_each_ordered(
        &pool,
        &expected,
        |e| hashing::hash_input(&e.input, &plan(args, e.digest.algorithm())),
        |e, outcome| {
            done += 1;
            hashing::advance(&pb, &e.input, done);
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
                    hashing::print_err(&pb, err.as_deref().unwrap_or("unreadable"));
                    "FAILED open or read"
                }
            };
            summary.checked += 1;
            let quiet_ok = args.quiet && matches!(checked.status, Status::Ok);
            if !args.json && !quiet_ok {
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
                let _ = hashing::print_out(&pb, &line);
            }
            if args.json {
                files.push(checked);
            }
        },
    );
    pb.finish_and_clear();
    summary.seconds = hashing::secs(start.elapsed());
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
    let failed = summary.mismatched
        + summary.unreadable
        + summary.malformed_lines
        + summary.unreadable_lists
        > 0;
    if args.json {
        let report = CheckReport {
            files,
            malformed,
            summary,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
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

fn parse_list(
    list: &Path,
    text: &[u8],
    algo: Option<Algorithm>,
    expected: &mut Vec<Expected>,
    malformed: &mut Vec<Malformed>,
) {
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
                let size = std::fs::metadata(&parsed.path).map_or(0, |m| m.len());
                expected.push(Expected {
                    input: Input::File {
                        path: parsed.path,
                        size,
                    },
                    digest,
                });
            }
            Err(e) if algo.is_none() && parsed.tagged.is_none() => malformed.push(bad(format!(
                "{e}; untagged lines are read as {DEFAULT_ALGORITHM} unless --algo says otherwise"
            ))),
            Err(e) => malformed.push(bad(e.to_string())),
        }
    }
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
