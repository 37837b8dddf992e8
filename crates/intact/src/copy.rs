//! `intact copy` and `intact send`: the block pipeline, locally or to a
//! server, with the same report.

use std::process::ExitCode;

use intact_transfer::{
    copy_scanned, delete_remote, scan_with, send_scanned, CopyOptions, SendOptions, SourceSpec,
};

use crate::args::{CopyArgs, PipelineArgs, SendArgs};
use crate::delete::Coverage;
use crate::dry_run;
use crate::exit::usage;
use crate::hashing::{print_err, progress_bar};
use crate::interrupt::Watch;
use crate::resolve::{self, Refused};
use crate::summary::{self, finish, ReportOut};
use crate::throttle::Throttle;
use crate::tree_args::subcommand_matches;

/// A usage error (exit 2) when the mode cannot reach the level required.
fn unreachable_level(p: &PipelineArgs) -> Option<ExitCode> {
    let want = p.require_level?;
    (want > p.verify.level()).then(|| {
        eprintln!(
            "intact: --verify {} reaches at most level {}, so --require-level {want} cannot be met (use --verify {})",
            p.verify,
            p.verify.level(),
            if want == intact_transfer::VerifyLevel::Media { "flash" } else { "riva" }
        );
        ExitCode::from(2)
    })
}

/// Where the quick check finds the digests of sources already read.
fn source_cache(p: &PipelineArgs) -> intact_transfer::SourceCacheSetting {
    if p.no_source_cache {
        intact_transfer::SourceCacheSetting::Off
    } else {
        intact_transfer::SourceCacheSetting::User
    }
}

pub fn run(args: &CopyArgs) -> anyhow::Result<ExitCode> {
    let (dest, sources) = (&args.dest, &args.sources[..]);
    let p = &args.pipeline;
    if let Some(code) = unreachable_level(p) {
        return Ok(code);
    }
    let scan_opts = args.tree.scan_options(subcommand_matches().as_ref());
    let plan =
        resolve::plan(sources, dest, scan_opts.copy_links).map_err(|Refused(why)| usage(why))?;
    symlink_notes(sources, scan_opts.copy_links, p);
    let scanned = scan_with(&plan.sources, &scan_opts);
    let coverage = args.delete.then(|| Coverage::of(&plan.sources, &scanned));
    if args.tree.dry_run {
        let deletes = coverage
            .as_ref()
            .map(|c| c.prune(&plan.root, &scan_opts.filter, true));
        return dry_run::print(&scanned, deletes.as_ref(), false, p);
    }
    let pb = progress_bar(scanned.entries.iter().map(|e| e.size).sum());
    let watch = Watch::start(pb.clone(), false, p.json, None)?;
    let throttle = Throttle::new(args.tree.bwlimit);
    let opts = CopyOptions {
        verify: p.verify,
        block_size: p.block_size.bytes(),
        block_auto: p.block_size.auto(),
        // A local copy has no windows to grow past: auto is its start.
        streams: p.streams.start(),
        retries: p.retries,
        read_path: p.read_path,
        require_level: p.require_level,
        reverify: p.reverify,
        source_cache: source_cache(p),
        flash: args.flash.settings(),
        verifiers: args.flash.verifiers(),
        ..CopyOptions::default()
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
            nothing_deleted(&pb, report.failed);
            None
        }
        Some(c) => Some(c.prune(&plan.root, &scan_opts.filter, false)),
        None => None,
    };
    finish(
        &report,
        p,
        &pb,
        false,
        deleted.as_ref(),
        &ReportOut::default(),
    )
}

/// The block size a shard sends at: its plan's (split files are cut at
/// it); an explicit other `--block-size` is a usage error, as is a mode
/// that cannot verify a range when the plan splits files.
fn shard_block_size(
    plan: &intact_shard::Plan,
    p: &crate::args::PipelineArgs,
    matches: Option<&clap::ArgMatches>,
) -> anyhow::Result<usize> {
    let given = matches.and_then(|m| m.value_source("block_size"))
        == Some(clap::parser::ValueSource::CommandLine);
    if given && p.block_size != crate::block_size::BlockSize::Fixed(plan.block_size as usize) {
        return Err(usage(format!(
            "the plan was made for --block-size {} (its split files are cut at it); leave --block-size out",
            plan.block_size
        )));
    }
    if plan.has_ranges() && !p.verify.verifies_ranges() {
        return Err(usage(format!(
            "the plan splits files into ranges, which --verify {} cannot verify one by one; use riva, block, fiver or none",
            p.verify
        )));
    }
    Ok(plan.block_size as usize)
}

pub fn run_send(args: &SendArgs) -> anyhow::Result<ExitCode> {
    let shard = match &args.plan {
        Some(plan) => {
            let sel = &args.tree.select;
            if sel.copy_links || !sel.include.is_empty() || !sel.exclude.is_empty() {
                return Err(usage(
                    "-L, --include and --exclude are decided when the plan is made (`intact plan`), not by a shard",
                ));
            }
            Some(crate::shard::shard_job(plan, args.shard)?)
        }
        None => None,
    };
    let (sources, target) = match (&shard, args.operands.split_last()) {
        (Some(s), _) => (&[][..], s.target().to_string()),
        (None, Some((t, sources))) if !sources.is_empty() => (
            sources,
            t.to_str()
                .ok_or_else(|| usage("the server address is not UTF-8; give it as HOST:PORT"))?
                .to_string(),
        ),
        (None, _) => {
            return Err(usage(
                "name what to send and then the server: intact send SRC... HOST:PORT",
            ))
        }
    };
    let (addr, subdir) = parse_target(&target)?;
    let out = ReportOut {
        stamp: shard.as_ref().map(crate::shard::ShardJob::stamp),
        file: args
            .report
            .as_ref()
            .map(|f| crate::shard::report_path(f, shard.as_ref().map(|s| s.index.index))),
    };
    if out.file.is_some() && !args.tree.dry_run {
        // Until its end overwrites it: a run killed, or ended by an error
        // before it sent anything, leaves a report that says so (an older
        // report of the same shard must not stand for this run).
        let v = serde_json::json!({
            "complete": false,
            "error": "started, and did not reach its end (killed, or stopped by an error before sending)",
            "resume": summary::command_line(),
        });
        out.write(v, false)?;
    }
    let key = match &args.key_file {
        Some(f) => Some(intact_proto::Key::from_file(f)?),
        None => None,
    };
    let p = &args.pipeline;
    if let Some(code) = unreachable_level(p) {
        return Ok(code);
    }
    let matches = subcommand_matches();
    let scan_opts = args.tree.scan_options(matches.as_ref());
    symlink_notes(sources, scan_opts.copy_links, p);
    let block_size = match &shard {
        Some(s) => shard_block_size(&s.plan, p, matches.as_ref())?,
        None => p.block_size.bytes(),
    };
    let specs: Vec<SourceSpec> = sources.iter().map(|s| SourceSpec::from_arg(s)).collect();
    let scanned = match shard {
        Some(s) => s.scan,
        None => scan_with(&specs, &scan_opts),
    };
    let coverage = args.delete.then(|| Coverage::of(&specs, &scanned));
    // The rest (test seams of the library's `fault-hooks` feature, which
    // this binary never turns on) as the library's defaults.
    #[allow(clippy::needless_update)]
    let opts = SendOptions {
        verify: p.verify,
        block_size,
        // With a plan, `shard_block_size` refused auto above.
        block_auto: p.block_size.auto(),
        streams: p.streams.start(),
        max_streams: p.streams.max(),
        retries: p.retries,
        key,
        subdir,
        reverify: p.reverify,
        read_path: p.read_path,
        require_level: p.require_level,
        source_cache: source_cache(p),
        cache_filter: crate::tree_args::ordered_filter(
            matches.as_ref(),
            ("cache_include", &args.cache_include),
            ("cache_exclude", &args.cache_exclude),
        ),
        spread: args.spread,
        ..SendOptions::default()
    };
    if args.tree.dry_run {
        // Nothing is sent; the server says what it would delete against
        // the source's tree as it is now.
        let deletes = match &coverage {
            Some(c) => {
                let req = c.request(&scan_opts.filter, true);
                match delete_remote(&addr, &opts, &req) {
                    Ok(d) => Some(d),
                    Err(e) => {
                        eprintln!("intact: --delete: {e}");
                        return Ok(ExitCode::FAILURE);
                    }
                }
            }
            None => None,
        };
        return dry_run::print(&scanned, deletes.as_ref(), true, p);
    }
    let pb = progress_bar(scanned.entries.iter().map(|e| e.size).sum());
    let watch = Watch::start(pb.clone(), true, p.json, Some(out.clone()))?;
    let throttle = Throttle::new(args.tree.bwlimit);
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
        Ok(report) => {
            // Only after every entry was sent and verified.
            let deleted = match &coverage {
                Some(_) if report.failed > 0 => {
                    nothing_deleted(&pb, report.failed);
                    None
                }
                Some(c) => {
                    let req = c.request(&scan_opts.filter, false);
                    match delete_remote(&addr, &opts, &req) {
                        Ok(d) => Some(d),
                        Err(e) => {
                            print_err(&pb, &format!("--delete: {e}"));
                            let code = finish(&report, p, &pb, true, None, &out)?;
                            return Ok(if code == ExitCode::SUCCESS {
                                ExitCode::FAILURE
                            } else {
                                code
                            });
                        }
                    }
                }
                None => None,
            };
            finish(&report, p, &pb, true, deleted.as_ref(), &out)
        }
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
            if p.json || out.file.is_some() {
                let v = serde_json::json!({
                    "complete": false,
                    "error": e.to_string(),
                    "bytes_sent": sent,
                    "resume": summary::command_line(),
                });
                out.write(v, p.json)?;
            }
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Says, unless -q, that a symlink named on the command line is copied as
/// a link (see [`resolve::symlink_notes`]).
fn symlink_notes(sources: &[std::path::PathBuf], copy_links: bool, p: &PipelineArgs) {
    if p.quiet {
        return;
    }
    for note in resolve::symlink_notes(sources, copy_links) {
        eprintln!("intact: {note}");
    }
}

/// Splits HOST:PORT[:/subdir] (HOST may be [IPv6]). Anything else is a
/// usage error (exit 2) that says what was expected.
pub(crate) fn parse_target(t: &str) -> anyhow::Result<(String, Option<intact_proto::WirePath>)> {
    let usage_of = |what: &str| {
        usage(format!(
            "'{t}' is not HOST:PORT or HOST:PORT:/subdir ({what}); the last argument of send is the server, e.g. 127.0.0.1:4750 or [::1]:4750:/inbox"
        ))
    };
    let host_end = if t.starts_with('[') {
        t.find(']')
            .ok_or_else(|| usage_of("an IPv6 address needs its closing ']'"))?
            + 1
    } else {
        t.find(':').ok_or_else(|| usage_of("no port"))?
    };
    let (host, rest) = t.split_at(host_end);
    if host.is_empty() || host == "[]" {
        return Err(usage_of("no host"));
    }
    let rest = rest.strip_prefix(':').ok_or_else(|| usage_of("no port"))?;
    let (port, sub) = match rest.split_once(':') {
        Some((p, s)) => (p, Some(s)),
        None => (rest, None),
    };
    match port.parse::<u16>() {
        Ok(0) => return Err(usage_of("port 0 is no server's port")),
        Ok(_) => {}
        Err(_) => {
            return Err(usage_of(&format!(
                "the port '{port}' is not a number from 1 to 65535"
            )))
        }
    }
    let subdir = match sub.map(|s| s.trim_start_matches('/')) {
        None | Some("") => None,
        Some(s) => Some(
            intact_proto::WirePath::parse(s.trim_end_matches('/').as_bytes()).map_err(|e| {
                usage(format!(
                    "the subdirectory in '{t}' cannot be used: {e}; give a relative path without '..', e.g. HOST:PORT:/inbox"
                ))
            })?,
        ),
    };
    Ok((format!("{host}:{port}"), subdir))
}

/// `--delete` after a run in which some entry failed: nothing is deleted.
fn nothing_deleted(pb: &indicatif::ProgressBar, failed: u64) {
    print_err(
        pb,
        &format!("--delete: nothing was deleted, because {failed} entries failed"),
    );
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
        for bad in [
            "host",
            "host:x",
            "host:99999",
            "h:1:/../x",
            "[::1",
            ":4750",
            ":notaport",
            "h:0",
        ] {
            let e = parse_target(bad).unwrap_err();
            assert_eq!(
                crate::exit::status_of(&e),
                std::process::ExitCode::from(2),
                "{bad}"
            );
        }
    }
}
