//! `intact copy` and `intact send`: the block pipeline, locally or to a
//! server, with the same report.

use std::process::ExitCode;

use intact_transfer::{
    copy_scanned, scan_with, send_scanned, CopyOptions, CopyReport, PruneReport, SendOptions,
    SourceSpec,
};

use crate::args::{CopyArgs, PipelineArgs, SendArgs};
use crate::delete::Coverage;
use crate::dry_run;
use crate::hashing::{print_err, progress_bar};
use crate::interrupt::Watch;
use crate::resolve::{self, Refused};
use crate::summary;
use crate::throttle::Throttle;
use crate::tree_args::subcommand_matches;

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
    let scan_opts = args.tree.scan_options(subcommand_matches().as_ref());
    let plan = match resolve::plan(sources, dest, scan_opts.copy_links) {
        Ok(plan) => plan,
        Err(Refused(why)) => {
            eprintln!("intact: {why}");
            return Ok(ExitCode::from(2));
        }
    };
    for note in resolve::symlink_notes(sources, scan_opts.copy_links) {
        eprintln!("intact: {note}");
    }
    let scanned = scan_with(&plan.sources, &scan_opts);
    let coverage = args.delete.then(|| Coverage::of(&plan.sources, &scanned));
    if args.tree.dry_run {
        let deletes = coverage
            .as_ref()
            .map(|c| c.prune(&plan.root, &scan_opts.filter, true));
        return Ok(dry_run::print(&scanned, deletes.as_ref(), false, p.json));
    }
    let pb = progress_bar(scanned.entries.iter().map(|e| e.size).sum());
    let watch = Watch::start(pb.clone(), false, p.json)?;
    let throttle = Throttle::new(args.tree.bwlimit);
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
    let report = copy_scanned(scanned, &plan.root, &opts, &|sent| {
        pb.set_position(sent);
        watch.sent(sent);
        if let Some(t) = &throttle {
            t.wait(sent);
        }
    })?;
    watch.finished();
    pb.finish_and_clear();
    // Only after everything was copied and verified.
    let deleted = match &coverage {
        Some(_) if report.failed > 0 => {
            print_err(
                &pb,
                &format!(
                    "--delete: nothing was deleted, because {} entries failed",
                    report.failed
                ),
            );
            None
        }
        Some(c) => Some(c.prune(&plan.root, &scan_opts.filter, false)),
        None => None,
    };
    finish(&report, p, &pb, false, deleted.as_ref())
}

pub fn run_send(args: &SendArgs) -> anyhow::Result<ExitCode> {
    if args.delete {
        eprintln!(
            "intact: send --delete is not built yet: the server cannot list or remove files; nothing was sent. Use `intact copy --delete` for a local destination."
        );
        return Ok(ExitCode::from(2));
    }
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
    let scan_opts = args.tree.scan_options(subcommand_matches().as_ref());
    for note in resolve::symlink_notes(sources, scan_opts.copy_links) {
        eprintln!("intact: {note}");
    }
    let specs: Vec<SourceSpec> = sources.iter().map(|s| SourceSpec::from_arg(s)).collect();
    let scanned = scan_with(&specs, &scan_opts);
    if args.tree.dry_run {
        return Ok(dry_run::print(&scanned, None, true, p.json));
    }
    let pb = progress_bar(scanned.entries.iter().map(|e| e.size).sum());
    let watch = Watch::start(pb.clone(), true, p.json)?;
    let throttle = Throttle::new(args.tree.bwlimit);
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
    let result = send_scanned(scanned, &addr, &opts, &|sent| {
        pb.set_position(sent);
        watch.sent(sent);
        if let Some(t) = &throttle {
            t.wait(sent);
        }
    });
    watch.finished();
    pb.finish_and_clear();
    match result {
        Ok(report) => finish(&report, p, &pb, true, None),
        // The run stopped as a whole (the connection was lost): say what
        // was done and how to go on.
        Err(e) => {
            let sent = watch.sent_so_far();
            eprintln!("intact: {e}");
            if sent > 0 {
                eprintln!(
                    "intact: incomplete: {} sent before it stopped; what the server verified is kept; to resume, run: {}",
                    summary::bytes(sent),
                    summary::command_line()
                );
            }
            if p.json {
                let v = serde_json::json!({
                    "complete": false,
                    "error": e.to_string(),
                    "bytes_sent": sent,
                    "resume": summary::command_line(),
                });
                println!("{v:#}");
            }
            Ok(ExitCode::FAILURE)
        }
    }
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
    send: bool,
    deleted: Option<&PruneReport>,
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
    for e in deleted.map(|d| d.errors.as_slice()).unwrap_or_default() {
        print_err(pb, &format!("--delete: {e}"));
    }
    if p.json {
        let mut v = serde_json::to_value(report)?;
        if let Some(d) = deleted {
            v["deleted"] = serde_json::to_value(d)?;
        }
        if report.failed > 0 {
            v["resume"] = summary::command_line().into();
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        if let Some(d) = deleted {
            for path in &d.deleted {
                println!("deleted {path}");
            }
            for path in &d.kept {
                println!("kept {path} (holds excluded entries)");
            }
        }
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
            "{ok} of {} entries ({mib:.1} MiB) in {:.2} s{}; verify {}: level {}; {resent} blocks resent; {} failed",
            report.files.len(),
            report.seconds,
            summary::rate(report),
            p.verify,
            level,
            report.failed
        );
        if let Some(line) = summary::resumed(report) {
            println!("{line}");
        }
        if let Some(line) = summary::incomplete(report, send) {
            print_err(pb, &line);
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
