//! `intact demo`: intact's main job on a built-in sample dataset.
//!
//! Makes the sample dataset in a temporary directory, starts a server on
//! 127.0.0.1:0 receiving into a second temporary directory, sends the
//! dataset to it with the default verification, prints the report, then
//! checks the received tree against the source independently of the
//! transfer (BLAKE3 of every file, both sides) and removes everything.

use std::net::TcpListener;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use intact_digest::{digest_file, DigestPlan};
use intact_transfer::{send, serve, wake, CopyReport, SendOptions, ServerConfig, VerifyMode};
use serde::Serialize;

use crate::args::DemoArgs;

const MIB: f64 = (1 << 20) as f64;

/// The verification the demo uses: intact's default (the strongest built).
const DEMO_VERIFY: VerifyMode = VerifyMode::Block;

#[derive(Serialize)]
struct DemoReport {
    dataset_files: u64,
    dataset_bytes: u64,
    make_seconds: f64,
    transfer: CopyReport,
    independent_check: Check,
    verified: bool,
}

#[derive(Serialize)]
struct Check {
    files_compared: u64,
    mismatched: u64,
    seconds: f64,
}

pub fn run(args: &DemoArgs) -> anyhow::Result<ExitCode> {
    let dir = tempfile::Builder::new().prefix("intact-demo-").tempdir()?;
    let src = dir.path().join("dataset");
    let recv = dir.path().join("received");
    let t = Instant::now();
    let made = intact_sample::make_demo_dataset(&src, args.large_mib)?;
    let make_seconds = t.elapsed().as_secs_f64();
    if !args.json {
        println!(
            "intact demo: made {} files ({:.1} MiB) in {}",
            made.files,
            made.bytes as f64 / MIB,
            src.display()
        );
    }

    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let shutdown = Arc::new(AtomicBool::new(false));
    let cfg = ServerConfig {
        root: recv.clone(),
        key: None,
        max_connections: 16,
        idle_timeout: Duration::from_secs(60),
    };
    let server = {
        let shutdown = Arc::clone(&shutdown);
        std::thread::spawn(move || serve(listener, cfg, shutdown, Arc::new(|_| {})))
    };
    if !args.json {
        println!("intact demo: server on {addr}, sending with --verify {DEMO_VERIFY}");
    }
    let opts = SendOptions {
        verify: DEMO_VERIFY,
        block_size: intact_digest::defaults::BLOCK_BYTES,
        streams: 4,
        retries: 3,
        key: None,
        subdir: None,
        reverify: false,
    };
    let transfer = send(
        std::slice::from_ref(&src),
        &addr.to_string(),
        &opts,
        &|_| {},
    );
    shutdown.store(true, Ordering::SeqCst);
    wake(addr);
    server.join().expect("server thread")?;
    let transfer = transfer?;

    let t = Instant::now();
    let (compared, mismatched) = compare_trees(&src, &recv.join("dataset"))?;
    let check = Check {
        files_compared: compared,
        mismatched,
        seconds: t.elapsed().as_secs_f64(),
    };
    let verified = transfer.failed == 0 && mismatched == 0 && compared == made.files;
    if args.json {
        let report = DemoReport {
            dataset_files: made.files,
            dataset_bytes: made.bytes,
            make_seconds,
            transfer,
            independent_check: check,
            verified,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let files = transfer.files.iter().filter(|f| f.kind == "file").count();
        let resent: u64 = transfer.files.iter().map(|f| f.blocks_resent).sum();
        println!(
            "  transfer: {files} files, {:.1} MiB in {:.2} s ({:.0} MiB/s), {} failed, {resent} blocks resent, level reached: {}",
            transfer.bytes as f64 / MIB,
            transfer.seconds,
            transfer.bytes as f64 / MIB / transfer.seconds.max(1e-9),
            transfer.failed,
            format!("{:?}", DEMO_VERIFY.level()).to_lowercase()
        );
        println!(
            "  independent check (BLAKE3 of every file, source vs received): {compared} compared, {mismatched} mismatched, {:.2} s",
            check.seconds
        );
        println!(
            "result: {}",
            if verified {
                "all files arrived verified"
            } else {
                "FAILED"
            }
        );
        println!(
            "note: level 'cache' means the copy was re-read through the page cache; device-level verification (riva) is not built yet"
        );
    }
    Ok(if verified {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Hashes every regular file under `a` and the same path under `b`.
fn compare_trees(a: &Path, b: &Path) -> anyhow::Result<(u64, u64)> {
    let plan = DigestPlan::whole(intact_digest::defaults::FILE_ALGORITHM);
    let (mut compared, mut mismatched) = (0, 0);
    for e in walkdir::WalkDir::new(a) {
        let e = e?;
        if !e.file_type().is_file() {
            continue;
        }
        let other = b.join(e.path().strip_prefix(a)?);
        compared += 1;
        let x = digest_file(e.path(), &plan)?.digests.whole;
        match digest_file(&other, &plan) {
            Ok(y) if y.digests.whole.ct_eq(&x) => {}
            _ => mismatched += 1,
        }
    }
    Ok((compared, mismatched))
}
