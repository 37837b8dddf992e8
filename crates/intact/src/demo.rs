//! `intact demo`: intact's main job on a built-in sample dataset.
//!
//! Until the transfer engine lands, the demo exercises the digest engine:
//! it makes the sample dataset, writes a checksum list with the mapped read
//! path, verifies every file against it with the plain read path, and
//! prints the report.

use std::fs;
use std::process::ExitCode;
use std::time::Instant;

use intact_digest::{manifest, Algorithm, DigestPlan, ReadStrategy};
use serde::Serialize;

use crate::args::DemoArgs;
use crate::hashing::{self, Input};
use crate::ordered::for_each_ordered;
use crate::sum::gather;

const MIB: u64 = 1 << 20;

#[derive(Serialize)]
struct Phase {
    name: &'static str,
    files: u64,
    bytes: u64,
    seconds: f64,
    mib_per_s: f64,
    failed: u64,
}

#[derive(Serialize)]
struct DemoReport {
    dataset: String,
    algorithm: Algorithm,
    phases: Vec<Phase>,
    verified: bool,
    note: &'static str,
}

const NOTE: &str = "the transfer engine (intact copy/send, device-level verification) is not \
built yet; this demo runs the digest engine that it will use";

pub fn run(args: &DemoArgs) -> anyhow::Result<ExitCode> {
    let dir = tempfile::Builder::new().prefix("intact-demo-").tempdir()?;
    let root = dir.path().join("dataset");
    let t = Instant::now();
    let made = intact_sample::make_demo_dataset(&root, args.large_mib)?;
    let make_phase = phase("make sample dataset", made.files, made.bytes, t, 0);
    if !args.json {
        println!("intact demo: sample dataset in {}", root.display());
        print_phase(&make_phase);
    }

    let pool = hashing::thread_pool(None)?;
    let algorithm = Algorithm::Blake3;
    let inputs = gather(std::slice::from_ref(&root), true);

    // Phase 1: digest every file (mapped where large), with per-page CRC-32C too.
    let plan = DigestPlan {
        pages: true,
        parallel: true,
        ..DigestPlan::whole(algorithm)
    };
    let t = Instant::now();
    let mut list = Vec::new();
    let (mut files, mut bytes, mut failed) = (0, 0, 0);
    for_each_ordered(
        &pool,
        &inputs,
        |i| hashing::hash_input(i, &plan),
        |input, outcome| {
            files += 1;
            match outcome {
                Ok((d, _)) => {
                    bytes += d.digests.len;
                    list.extend(manifest::format_line(&d.digests.whole, input.name()));
                }
                Err(e) => {
                    failed += 1;
                    eprintln!("intact: {e}");
                }
            }
        },
    );
    let sum_phase = phase("digest (blake3 + per-page crc32c)", files, bytes, t, failed);
    if !args.json {
        print_phase(&sum_phase);
    }

    // Phase 2: verify every file against the list, through plain reads.
    let plan = DigestPlan {
        strategy: ReadStrategy::Read,
        ..DigestPlan::whole(algorithm)
    };
    let t = Instant::now();
    let mut expected = Vec::new();
    for line in list.split(|&b| b == b'\n') {
        if let Some(l) = manifest::parse_line(line)? {
            let size = fs::metadata(&l.path).map_or(0, |m| m.len());
            expected.push((Input::File { path: l.path, size }, l.hex));
        }
    }
    let (mut files, mut bytes, mut failed) = (0, 0, 0);
    for_each_ordered(
        &pool,
        &expected,
        |(i, _)| hashing::hash_input(i, &plan),
        |(input, hex), outcome| {
            files += 1;
            match outcome {
                Ok((d, _)) if d.digests.whole.to_hex() == *hex => bytes += d.digests.len,
                Ok(_) => {
                    failed += 1;
                    eprintln!("intact: {}: digest mismatch", input.name().display());
                }
                Err(e) => {
                    failed += 1;
                    eprintln!("intact: {e}");
                }
            }
        },
    );
    let check_phase = phase(
        "verify against the list (plain reads)",
        files,
        bytes,
        t,
        failed,
    );
    let verified =
        sum_phase.failed == 0 && check_phase.failed == 0 && check_phase.files == made.files;
    if !args.json {
        print_phase(&check_phase);
        println!(
            "result: {}",
            if verified {
                "all files verified"
            } else {
                "FAILED"
            }
        );
        println!("note: {NOTE}");
    }
    let report = DemoReport {
        dataset: root.display().to_string(),
        algorithm,
        phases: vec![make_phase, sum_phase, check_phase],
        verified,
        note: NOTE,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(if verified {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn phase(name: &'static str, files: u64, bytes: u64, start: Instant, failed: u64) -> Phase {
    let seconds = hashing::secs(start.elapsed());
    Phase {
        name,
        files,
        bytes,
        seconds,
        mib_per_s: (bytes as f64 / MIB as f64 / seconds.max(1e-6) * 10.0).round() / 10.0,
        failed,
    }
}

fn print_phase(p: &Phase) {
    println!(
        "  {:<40} {:>6} files {:>9.1} MiB {:>8.3} s {:>9.1} MiB/s{}",
        p.name,
        p.files,
        p.bytes as f64 / MIB as f64,
        p.seconds,
        p.mib_per_s,
        if p.failed > 0 {
            format!("  {} FAILED", p.failed)
        } else {
            String::new()
        }
    );
}
