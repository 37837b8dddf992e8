//! `intact copy` and `intact send`: the block pipeline, locally or to a
//! server, with the same report.

use std::process::ExitCode;

use intact_transfer::{copy, send, CopyOptions, CopyReport, SendOptions};

use crate::args::{CopyArgs, PipelineArgs, SendArgs};
use crate::hashing::{print_err, progress_bar};

/// A usage error (exit 2) when the mode cannot reach the level required.
fn unreachable_level(p: &PipelineArgs) -> Option<ExitCode> {
    let want = p.require_level?;
    (want > p.verify.level()).then(|| {
        eprintln!(
            "intact: --verify {} reaches at most level {}, so --require-level {want} cannot be met (use --verify riva)",
            p.verify,
            p.verify.level()
        );
        ExitCode::from(2)
    })
}

pub fn run(args: &CopyArgs) -> anyhow::Result<ExitCode> {
    let (dest, sources) = args.paths.split_last().expect("clap requires two paths");
    let p = &args.pipeline;
    if let Some(code) = unreachable_level(p) {
        return Ok(code);
    }
    let pb = progress_bar(total_size(sources));
    let opts = CopyOptions {
        verify: p.verify,
        block_size: p.block_size,
        streams: usize::from(p.streams),
        retries: p.retries,
        read_path: p.read_path,
        require_level: p.require_level,
        link_fault: None,
        after_write: None,
    };
    let report = copy(sources, dest, &opts, &|sent| pb.set_position(sent))?;
    pb.finish_and_clear();
    finish(&report, p, &pb)
}

pub fn run_send(args: &SendArgs) -> anyhow::Result<ExitCode> {
    let (target, sources) = args.paths.split_last().expect("clap requires two paths");
    let target = target
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("the server address is not UTF-8"))?;
    let (addr, subdir) = parse_target(target)?;
    let key = match &args.key_file {
        Some(f) => Some(intact_proto::Key::from_file(f)?),
        None => None,
    };
    let p = &args.pipeline;
    if let Some(code) = unreachable_level(p) {
        return Ok(code);
    }
    let pb = progress_bar(total_size(sources));
    let opts = SendOptions {
        verify: p.verify,
        block_size: p.block_size,
        streams: usize::from(p.streams),
        retries: p.retries,
        key,
        subdir,
        reverify: args.reverify,
        read_path: p.read_path,
        require_level: p.require_level,
    };
    let report = send(sources, &addr, &opts, &|sent| pb.set_position(sent))?;
    pb.finish_and_clear();
    finish(&report, p, &pb)
}

/// Splits HOST:PORT[:/subdir] (HOST may be [IPv6]).
fn parse_target(t: &str) -> anyhow::Result<(String, Option<intact_proto::WirePath>)> {
    let usage = || anyhow::anyhow!("'{t}' is not HOST:PORT or HOST:PORT:/subdir");
    let host_end = if t.starts_with('[') {
        t.find(']').ok_or_else(usage)? + 1
    } else {
        t.find(':').ok_or_else(usage)?
    };
    let (host, rest) = t.split_at(host_end);
    let rest = rest.strip_prefix(':').ok_or_else(usage)?;
    let (port, sub) = match rest.split_once(':') {
        Some((p, s)) => (p, Some(s)),
        None => (rest, None),
    };
    port.parse::<u16>().map_err(|_| usage())?;
    let subdir = match sub.map(|s| s.trim_start_matches('/')) {
        None | Some("") => None,
        Some(s) => Some(intact_proto::WirePath::parse(
            s.trim_end_matches('/').as_bytes(),
        )?),
    };
    Ok((format!("{host}:{port}"), subdir))
}

fn finish(
    report: &CopyReport,
    p: &PipelineArgs,
    pb: &indicatif::ProgressBar,
) -> anyhow::Result<ExitCode> {
    for e in &report.errors {
        print_err(pb, e);
    }
    for f in &report.files {
        match &f.error {
            Some(e) => print_err(pb, e),
            None if p.verbose && !p.json => {
                let level = f.level.map_or("-".into(), |l| l.to_string());
                let held = match (f.bytes_reverified, f.bytes_trusted, f.trusted_level) {
                    (0, 0, _) => String::new(),
                    (r, 0, _) => format!(", {r} B held and re-verified in place"),
                    (r, t, Some(l)) => format!(
                        ", {r} B held and re-verified in place, {t} B trusted from the journal at level {l}"
                    ),
                    (r, t, None) => format!(", {r} B re-verified in place, {t} B trusted"),
                };
                println!(
                    "{} {} ({} B, level {level}, {} B sent, {} blocks resent{held})",
                    f.kind, f.path, f.size, f.bytes_sent, f.blocks_resent
                );
            }
            None => {}
        }
    }
    for s in &report.skipped {
        print_err(pb, &format!("skipped special file {s}"));
    }
    // Files verified below what the mode aims at (riva on tmpfs, pages
    // that would not leave the cache): one warning, with the first reason.
    let short: Vec<_> = report
        .files
        .iter()
        .filter(|f| f.error.is_none() && f.level.is_some_and(|l| l < p.verify.level()))
        .collect();
    if let Some(first) = short.first() {
        print_err(
            pb,
            &format!(
                "warning: {} file(s) verified only to level {} ({}: {}); --require-level {} makes this an error",
                short.len(),
                first.level.expect("filtered"),
                first.path,
                first.note.as_deref().unwrap_or("below the mode's level"),
                p.verify.level()
            ),
        );
    }
    if p.json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        let ok = report.files.iter().filter(|f| f.error.is_none()).count();
        // The level every verified file reached, at least.
        let level = report
            .files
            .iter()
            .filter(|f| f.error.is_none())
            .filter_map(|f| f.level)
            .min()
            .map_or("-".to_string(), |l| l.to_string());
        let resent: u64 = report.files.iter().map(|f| f.blocks_resent).sum();
        let mib = report.bytes as f64 / (1 << 20) as f64;
        println!(
            "{ok} of {} entries ({mib:.1} MiB) in {:.2} s ({:.0} MiB/s); verify {}: level {}; {resent} blocks resent; {} failed",
            report.files.len(),
            report.seconds,
            mib / report.seconds.max(1e-9),
            p.verify,
            level,
            report.failed
        );
        if report.bytes_reverified + report.bytes_trusted > 0 {
            let trusted_level = report
                .files
                .iter()
                .filter_map(|f| f.trusted_level)
                .min()
                .map_or(String::new(), |l| format!(" (recorded level {l} or above)"));
            println!(
                "held by the receiver from an earlier run: {} B re-verified in place now, {} B trusted from its journal{trusted_level}; {} B sent",
                report.bytes_reverified, report.bytes_trusted, report.bytes_sent
            );
        }
        if let Some(m) = &report.model {
            println!(
                "riva model (Eq. 1): {:.2} s predicted vs {:.2} s measured, error {:.1}% (per block: transfer {:.1} ms, checksum {:.1} ms, eviction {:.2} ms; {} blocks over {} streams)",
                m.predicted_seconds,
                m.measured_seconds,
                m.error_percent,
                m.transfer_per_block * 1e3,
                m.checksum_per_block * 1e3,
                m.evict_per_block * 1e3,
                m.blocks,
                m.streams
            );
        }
    }
    Ok(if report.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Bytes of regular files under the sources, for the progress bar.
fn total_size(sources: &[std::path::PathBuf]) -> u64 {
    sources
        .iter()
        .flat_map(|s| walkdir::WalkDir::new(s).into_iter().filter_map(Result::ok))
        .filter(|e| e.file_type().is_file())
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::parse_target;

    #[test]
    fn targets_parse() {
        assert_eq!(parse_target("localhost:4750").unwrap().0, "localhost:4750");
        let (a, s) = parse_target("127.0.0.1:9:/in/box/").unwrap();
        assert_eq!(
            (a.as_str(), s.unwrap().to_string()),
            ("127.0.0.1:9", "in/box".to_string())
        );
        assert_eq!(parse_target("[::1]:80").unwrap().0, "[::1]:80");
        for bad in ["host", "host:x", "host:99999", "h:1:/../x", "[::1"] {
            assert!(parse_target(bad).is_err(), "{bad}");
        }
    }
}
