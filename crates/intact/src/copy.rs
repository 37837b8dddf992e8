//! `intact copy`: local copies through the verified block pipeline.

use std::process::ExitCode;

use intact_transfer::{copy, CopyOptions};

use crate::args::CopyArgs;
use crate::hashing::{print_err, progress_bar};

pub fn run(args: &CopyArgs) -> anyhow::Result<ExitCode> {
    let (dest, sources) = args.paths.split_last().expect("clap requires two paths");
    let total: u64 = sources.iter().map(|s| walk_size(s)).sum();
    let pb = progress_bar(total);
    let opts = CopyOptions {
        verify: args.verify,
        block_size: args.block_size,
        streams: usize::from(args.streams),
        retries: args.retries,
        link_fault: None,
    };
    let report = copy(sources, dest, &opts, &|sent| pb.set_position(sent))?;
    pb.finish_and_clear();
    for e in &report.errors {
        print_err(&pb, e);
    }
    for f in &report.files {
        match &f.error {
            Some(e) => print_err(&pb, e),
            None if args.verbose && !args.json => {
                let level = f
                    .level
                    .map_or("-".into(), |l| format!("{l:?}").to_lowercase());
                println!(
                    "{} {} ({} B, level {level}, {} blocks resent)",
                    f.kind, f.path, f.size, f.blocks_resent
                );
            }
            None => {}
        }
    }
    for s in &report.skipped {
        print_err(&pb, &format!("skipped special file {s}"));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let ok = report.files.iter().filter(|f| f.error.is_none()).count();
        let resent: u64 = report.files.iter().map(|f| f.blocks_resent).sum();
        let mib = report.bytes as f64 / (1 << 20) as f64;
        println!(
            "copied {ok} of {} entries ({mib:.1} MiB) in {:.2} s ({:.0} MiB/s); verify {}: level {}; {resent} blocks resent; {} failed",
            report.files.len(),
            report.seconds,
            mib / report.seconds.max(1e-9),
            args.verify,
            format!("{:?}", args.verify.level()).to_lowercase(),
            report.failed
        );
    }
    Ok(if report.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Bytes of regular files under `path`, for the progress bar.
fn walk_size(path: &std::path::Path) -> u64 {
    walkdir::WalkDir::new(path)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}
