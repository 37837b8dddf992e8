//! `intact demo`: intact's main job on a built-in sample dataset.
//!
//! Makes the sample dataset in a temporary directory, starts a server on
//! 127.0.0.1:0 receiving into a second temporary directory, sends the
//! dataset to it with the default verification, prints the report, then
//! checks the received tree against the source independently of the
//! transfer (BLAKE3 of every file, both sides) and removes everything.

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use intact_digest::{digest_file, DigestPlan};
use intact_transfer::{send, CopyReport, LocalServer, SendOptions, ServerConfig, VerifyMode};
use serde::Serialize;

use crate::args::DemoArgs;
use crate::stdout::outln;

const MIB: f64 = (1 << 20) as f64;

/// The verification the demo uses: intact's default.
const DEMO_VERIFY: VerifyMode = VerifyMode::DEFAULT;

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
    /// Whether every received file was confirmed evicted from the page
    /// cache before it was hashed (never on tmpfs: nothing to evict to).
    evicted_first: bool,
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
        outln!(
            "intact demo: made {} files ({:.1} MiB) in {}",
            made.files,
            made.bytes as f64 / MIB,
            src.display()
        )?;
    }

    let server = LocalServer::start(ServerConfig::local(&recv))?;
    let addr = server.addr();
    if !args.json {
        outln!("intact demo: server on {addr}, sending with --verify {DEMO_VERIFY}")?;
    }
    let opts = SendOptions {
        verify: DEMO_VERIFY,
        ..SendOptions::default()
    };
    let transfer = send(std::slice::from_ref(&src), &addr, &opts, &|_| {});
    server.stop()?;
    let transfer = transfer?;

    let t = Instant::now();
    let compared = compare_trees(&src, &recv.join("dataset"))?;
    let (compared, mismatched, evicted, in_memory) = (
        compared.files,
        compared.mismatched,
        compared.evicted,
        compared.in_memory,
    );
    let check = Check {
        files_compared: compared,
        mismatched,
        evicted_first: evicted,
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
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        let files = transfer.files.iter().filter(|f| f.kind == "file").count();
        let resent: u64 = transfer.files.iter().map(|f| f.blocks_resent).sum();
        let level = transfer
            .files
            .iter()
            .filter(|f| f.kind == "file")
            .filter_map(|f| f.level)
            .min()
            .map_or("-".to_string(), |l| l.to_string());
        let resident: u64 = transfer.files.iter().map(|f| f.pages_resident).sum();
        // On tmpfs nothing is evicted, so there is no eviction to report on.
        let evict_note = if transfer.files.iter().any(|f| f.evict_seconds > 0.0) {
            format!(" ({resident} pages stayed cached after eviction)")
        } else {
            String::new()
        };
        outln!(
            "  transfer: {files} files, {:.1} MiB in {:.2} s ({:.0} MiB/s), {} failed, {resent} blocks resent, level reached by every file: {level}{evict_note}",
            transfer.bytes as f64 / MIB,
            transfer.seconds,
            transfer.bytes as f64 / MIB / transfer.seconds.max(1e-9),
            transfer.failed,
        )?;
        if let Some(note) = transfer.files.iter().find_map(|f| f.note.as_deref()) {
            outln!("  why not 'device' everywhere: {note}")?;
        }
        let how = if evicted {
            "received files evicted from the cache first"
        } else if in_memory {
            "received files read from memory: their file system has no device"
        } else {
            "received files read through the page cache: not all could be evicted"
        };
        outln!(
            "  independent check (BLAKE3 of every file, source vs received, {how}): {compared} compared, {mismatched} mismatched, {:.2} s",
            check.seconds
        )?;
        outln!(
            "result: {}",
            if verified {
                "all files arrived verified"
            } else {
                "FAILED"
            }
        )?;
        outln!(
            "levels: 'device' = every block re-read from the disk after its cached copy was evicted (at both ends); 'cache' = re-read through the page cache; 'network' = checked as it crossed the link"
        )?;
    }
    Ok(if verified {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// What the independent check found.
struct Compared {
    files: u64,
    mismatched: u64,
    /// Every received file was confirmed evicted before it was hashed.
    evicted: bool,
    /// The received files' file system keeps its data in memory.
    in_memory: bool,
}

/// Hashes every regular file under `a` and the same path under `b`. The
/// received files are evicted from the page cache first, so that what the
/// disk holds is read, except where their file system keeps its data in
/// memory (tmpfs): there is no disk there, and eviction would only retry
/// and back off for nothing.
fn compare_trees(a: &Path, b: &Path) -> anyhow::Result<Compared> {
    let plan = DigestPlan::whole(intact_digest::defaults::FILE_ALGORITHM);
    let in_memory = std::fs::File::open(b)
        .ok()
        .and_then(|d| intact_cache::backing(&d).ok())
        .is_some_and(|k| k.in_memory());
    let mut out = Compared {
        files: 0,
        mismatched: 0,
        evicted: !in_memory,
        in_memory,
    };
    for e in walkdir::WalkDir::new(a) {
        let e = e?;
        if !e.file_type().is_file() {
            continue;
        }
        let other = b.join(e.path().strip_prefix(a)?);
        out.files += 1;
        // Read what the disk holds, not what the transfer left cached.
        if !in_memory {
            let gone = std::fs::File::open(&other)
                .ok()
                .and_then(|f| intact_cache::evict(&f, 0, f.metadata().ok()?.len()).ok())
                .is_some_and(|ev| ev.resident == 0);
            out.evicted &= gone;
        }
        let x = digest_file(e.path(), &plan)?.digests.whole;
        match digest_file(&other, &plan) {
            Ok(y) if y.digests.whole.ct_eq(&x) => {}
            _ => out.mismatched += 1,
        }
    }
    Ok(out)
}
