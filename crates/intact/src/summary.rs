//! What `intact copy` and `intact send` print when the work is done: the
//! errors (standard error), then either one JSON report or the human
//! summary (standard output). The summary shows what a user needs: how
//! much arrived, how fast (counting only bytes really sent), the level
//! reached, what was resent and what failed; what a resumed run found
//! already verified at the destination; and, when a run did not finish,
//! what it did and the command that finishes it. The RIVA time model
//! (Eq. 1) is for the benchmark and lives in the JSON report only.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use intact_transfer::{CopyReport, FileReport, PruneReport};

use crate::args::PipelineArgs;
use crate::hashing::print_err;
use crate::stdout::outln;

/// How much a command prints, from `-q`, `-v` and `--json`.
fn verbose_lines(p: &PipelineArgs) -> bool {
    p.verbose && !p.json && !p.quiet
}

/// Prints the report as the flags ask and returns the exit status: 0 when
/// nothing failed, 1 when any file did. `send` says whether the
/// destination is a server (whose journal a resumed run starts from);
/// `deleted` is what `copy --delete` removed, if it ran.
pub fn finish(
    report: &CopyReport,
    p: &PipelineArgs,
    pb: &indicatif::ProgressBar,
    send: bool,
    deleted: Option<&PruneReport>,
    out: &ReportOut,
) -> anyhow::Result<ExitCode> {
    for e in &report.errors {
        print_err(pb, e);
    }
    for f in &report.files {
        match &f.error {
            Some(e) => print_err(pb, e),
            None if verbose_lines(p) => {
                outln!("{}", verbose_line(f)).context("cannot write to standard output")?
            }
            None => {}
        }
    }
    for s in &report.skipped {
        print_err(pb, &format!("skipped special file {}", printable(s).1));
    }
    if !p.quiet {
        warn_below_level(report, p, pb);
    }
    for e in deleted.map(|d| d.errors.as_slice()).unwrap_or_default() {
        print_err(pb, &format!("--delete: {e}"));
    }
    if p.json || out.file.is_some() {
        let mut v = serde_json::to_value(report)?;
        // The run reached its end (an interrupted or broken one says false).
        v["complete"] = true.into();
        if let Some(d) = deleted {
            v["deleted"] = serde_json::to_value(d)?;
        }
        if report.failed > 0 {
            v["resume"] = resume_line(report).into();
        }
        out.write(v, p.json)?;
    }
    if !p.json && !p.quiet {
        if let Some(d) = deleted {
            print_deleted(d).context("cannot write to standard output")?;
        }
        print_summary(report, p).context("cannot write the summary to standard output")?;
    }
    // A failed run says what was done and how to finish it, on standard
    // error with the errors it sums up (so also with -q).
    if !p.json {
        if let Some(line) = incomplete(report, send) {
            print_err(pb, &line);
        }
    }
    Ok(if report.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Where a JSON report goes besides standard output (`send --report`),
/// and what a shard adds to it.
#[derive(Default, Clone)]
pub struct ReportOut {
    /// `"shard"`: which shard of which plan (`send --plan`); `finished`
    /// is added at each write.
    pub stamp: Option<serde_json::Value>,
    /// The report file (`--report`).
    pub file: Option<std::path::PathBuf>,
}

impl ReportOut {
    /// Adds the shard's stamp to `v`, writes it to the report file if
    /// one was asked for, and prints it if `print`.
    pub fn write(&self, mut v: serde_json::Value, print: bool) -> anyhow::Result<()> {
        if let Some(stamp) = &self.stamp {
            let mut stamp = stamp.clone();
            stamp["finished"] = intact_transfer::unix_now().into();
            v["shard"] = stamp;
        }
        if let Some(f) = &self.file {
            crate::shard::write_report(f, &v)?;
        }
        if print {
            outln!("{}", serde_json::to_string_pretty(&v)?)
                .context("cannot write the report to standard output")?;
        }
        Ok(())
    }
}

/// `name` as one line shows it, the way `intact sum` and coreutils print
/// names: a name with a backslash, newline or carriage return is escaped
/// (`\\`, `\n`, `\r`) and the line is marked with a leading backslash.
/// Returns the mark ("" or "\\") and the printable name.
pub fn printable(name: &str) -> (&'static str, String) {
    let (escaped, bytes) = intact_digest::manifest::escape_name(Path::new(name));
    let mark = if escaped { "\\" } else { "" };
    (mark, String::from_utf8_lossy(&bytes).into_owned())
}

/// One `-v` line for a file that arrived.
fn verbose_line(f: &FileReport) -> String {
    let level = f.level.map_or("-".into(), |l| l.to_string());
    let held = match (f.bytes_reverified, f.bytes_trusted, f.trusted_level) {
        (0, 0, _) => String::new(),
        (r, 0, _) => format!(", {r} B held and re-verified in place"),
        (r, t, Some(l)) => format!(
            ", {r} B held and re-verified in place, {t} B trusted from the journal at level {l}"
        ),
        (r, t, None) => format!(", {r} B re-verified in place, {t} B trusted"),
    };
    // A file the server held whole: how the source's digest it was
    // compared with was obtained (read now, or the source cache and when).
    let source = match (f.unchanged, f.source_digest) {
        (true, Some(d)) => format!(", unchanged, {d}"),
        _ => String::new(),
    };
    let (mark, name) = printable(&f.path);
    format!(
        "{mark}{} {name} ({} B, level {level}, {} B sent, {} blocks resent{}{held}{source})",
        f.kind,
        f.size,
        f.bytes_sent,
        f.blocks_resent,
        pages_alone(f.pages_resent)
    )
}

/// Files verified below what the mode aims at (riva on tmpfs, pages that
/// would not leave the cache): one warning, with the first reason.
fn warn_below_level(report: &CopyReport, p: &PipelineArgs, pb: &indicatif::ProgressBar) {
    let short: Vec<_> = report
        .files
        .iter()
        .filter(|f| f.error.is_none() && f.level.is_some_and(|l| l < p.verify.level()))
        .collect();
    if let Some(first) = short.first() {
        let (mark, name) = printable(&first.path);
        print_err(
            pb,
            &format!(
                "warning: {} file(s) verified only to level {} ({mark}{name}: {}); --require-level {} makes this an error",
                short.len(),
                first.level.expect("filtered"),
                first.note.as_deref().unwrap_or("below the mode's level"),
                p.verify.level()
            ),
        );
    }
}

/// What `copy --delete` removed, and the directories it kept because they
/// hold excluded entries, one per line.
fn print_deleted(d: &PruneReport) -> std::io::Result<()> {
    for path in &d.deleted {
        let (mark, name) = printable(path);
        outln!("{mark}deleted {name}")?;
    }
    for path in &d.kept {
        let (mark, name) = printable(path);
        outln!("{mark}kept {name} (holds excluded entries)")?;
    }
    Ok(())
}

/// The human summary: one line, and one more when the destination held
/// verified data from an earlier run.
fn print_summary(report: &CopyReport, p: &PipelineArgs) -> std::io::Result<()> {
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
    let pages: u64 = report.files.iter().map(|f| f.pages_resent).sum();
    let cached = report
        .files
        .iter()
        .fold(0u64, |n, f| n.saturating_add(f.blocks_from_cache));
    let mib = report.bytes as f64 / (1 << 20) as f64;
    outln!(
        "{ok} of {} entries ({mib:.1} MiB) in {:.2} s{}; verify {}: level {}; {resent} blocks resent{}; {} failed",
        report.files.len(),
        report.seconds,
        rate(report),
        p.verify,
        level,
        pages_alone(pages),
        report.failed
    )?;
    if cached > 0 {
        let secs: f64 = report.files.iter().map(|f| f.cache_seconds).sum();
        outln!(
            "the server repaired {cached} blocks from its recovery cache ({secs:.3} s from \
             failure to verified, as it measured), which were not sent again"
        )?;
    }
    if let Some(line) = resumed(report) {
        outln!("{line}")?;
    }
    if let Some(s) = report.spread.as_ref().filter(|s| s.files > 0) {
        outln!(
            "spread: {} {} over the streams as {} ranges ({})",
            s.files,
            if s.files == 1 { "file" } else { "files" },
            s.ranges,
            s.why
        )?;
    }
    if let Some(t) = &report.streams {
        if t.ended > t.started {
            outln!(
                "streams: {} → {} (--streams auto; their send buffers, not the link, held them back: {})",
                t.started,
                t.ended,
                t.steps.join("; ")
            )?;
        }
        if let Some(why) = &t.stopped {
            outln!("streams: stopped growing at {}: {why}", t.ended)?;
        }
    }
    if let Some(b) = &report.block_size {
        let probed = if b.stages.is_some() {
            format!("; probed in {:.2} s", b.probe_seconds)
        } else {
            String::new()
        };
        outln!(
            "block size: {} (--block-size auto: {}{probed})",
            intact_transfer::block_size_name(b.chosen),
            b.why,
        )?;
    }
    if let Some(frames) = &report.frames {
        outln!("frames: {frames}")?;
    }
    Ok(())
}

/// ` (N pages alone)` where resends sent only the bad pages of blocks.
fn pages_alone(pages: u64) -> String {
    match pages {
        0 => String::new(),
        1 => " (1 page alone)".to_string(),
        n => format!(" ({n} pages alone)"),
    }
}

/// Bytes for people: B, KiB, MiB or GiB with one decimal.
pub fn bytes(b: u64) -> String {
    const K: f64 = 1024.0;
    let f = b as f64;
    if f >= K * K * K {
        format!("{:.1} GiB", f / (K * K * K))
    } else if f >= K * K {
        format!("{:.1} MiB", f / (K * K))
    } else if f >= K {
        format!("{:.1} KiB", f / K)
    } else {
        format!("{b} B")
    }
}

/// The transfer rate, counting only bytes sent (not those the destination
/// already held), and only for a run that succeeded.
pub fn rate(report: &CopyReport) -> String {
    if report.failed > 0 || report.bytes_sent == 0 {
        return String::new();
    }
    let mib = report.bytes_sent as f64 / (1 << 20) as f64;
    format!(" ({:.0} MiB/s sent)", mib / report.seconds.max(1e-9))
}

/// For a run that found data already verified at the destination: how
/// much, which part was re-verified now and which trusted from the journal.
pub fn resumed(report: &CopyReport) -> Option<String> {
    let held = report.bytes_reverified + report.bytes_trusted;
    if held == 0 {
        return None;
    }
    let mut parts = Vec::new();
    if report.bytes_reverified > 0 {
        parts.push(format!(
            "{} re-verified in place now",
            bytes(report.bytes_reverified)
        ));
    }
    if report.bytes_trusted > 0 {
        let level = report
            .files
            .iter()
            .filter_map(|f| f.trusted_level)
            .min()
            .map_or(String::new(), |l| format!(" at level {l} or above"));
        parts.push(format!(
            "{} trusted from its journal{level}",
            bytes(report.bytes_trusted)
        ));
    }
    Some(format!(
        "resumed: {} already verified at the destination ({}), {} sent",
        bytes(held),
        parts.join(", "),
        bytes(report.bytes_sent)
    ))
}

/// Which command ran, so that a run that did not finish can say how to
/// resume it: the same command line, quoted for a POSIX shell.
pub fn command_line() -> String {
    std::env::args_os()
        .map(|a| quote(&a.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The command that resumes the run of `report`: its command line, with
/// `--block-size auto` replaced by the size this run chose (another
/// choice would not find the blocks and files held at this one).
pub fn resume_line(report: &CopyReport) -> String {
    let Some(b) = &report.block_size else {
        return command_line();
    };
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    with_block_size(&args, b.chosen)
}

/// `args`, quoted, with `--block-size auto` made `--block-size <chosen>`.
fn with_block_size(args: &[String], chosen: u64) -> String {
    let size = format!("{}KiB", chosen >> 10);
    let mut out = Vec::with_capacity(args.len());
    let mut after_flag = false;
    for a in args {
        let a = match a.as_str() {
            "auto" if after_flag => size.clone(),
            "--block-size=auto" => format!("--block-size={size}"),
            _ => a.clone(),
        };
        after_flag = a == "--block-size";
        out.push(quote(&a));
    }
    out.join(" ")
}

fn quote(s: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_./:=@,+-%".contains(c);
    if !s.is_empty() && s.chars().all(safe) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// What to do after a run in which something failed.
pub fn incomplete(report: &CopyReport, send: bool) -> Option<String> {
    if report.failed == 0 {
        return None;
    }
    let ok = report.files.iter().filter(|f| f.error.is_none()).count();
    let next = if send {
        format!(
            "what the server verified is kept; to resume, run: {}",
            resume_line(report)
        )
    } else {
        format!(
            "fix the cause and run the same command again: {}",
            resume_line(report)
        )
    };
    Some(format!(
        "incomplete: {ok} of {} entries verified, {} sent, {} failed; {next}",
        report.files.len(),
        bytes(report.bytes_sent),
        report.failed
    ))
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_resume_command_names_the_block_size_auto_chose() {
        let args: Vec<String> = ["intact", "send", "--block-size", "auto", "a b", "h:1"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            with_block_size(&args, 16 << 20),
            "intact send --block-size 16384KiB 'a b' h:1"
        );
        let args: Vec<String> = ["intact", "copy", "--block-size=auto", "auto", "d"]
            .map(String::from)
            .to_vec();
        // Only the flag's value: a path named auto stays.
        assert_eq!(
            with_block_size(&args, 1 << 20),
            "intact copy --block-size=1024KiB auto d"
        );
    }

    use super::*;

    #[test]
    fn names_with_line_breaks_are_escaped_and_marked() {
        assert_eq!(printable("a/b.dat"), ("", "a/b.dat".to_string()));
        assert_eq!(printable("a\nb"), ("\\", "a\\nb".to_string()));
        assert_eq!(printable("a\\b\r"), ("\\", "a\\\\b\\r".to_string()));
    }

    #[test]
    fn bytes_and_quotes_read_well() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(688 << 20), "688.0 MiB");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("127.0.0.1:4750:/in"), "127.0.0.1:4750:/in");
    }
}
