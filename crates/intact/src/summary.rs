//! What `intact copy` and `intact send` print when the work is done: the
//! errors (standard error), then either one JSON report or the human
//! summary (standard output). The summary shows what a user needs: how
//! much arrived, how fast, the level reached, what was resent and what
//! failed. The RIVA time model (Eq. 1) is for the benchmark and lives in
//! the JSON report only.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use intact_transfer::{CopyReport, FileReport};

use crate::args::PipelineArgs;
use crate::hashing::print_err;
use crate::stdout::outln;

/// How much a command prints, from `-q`, `-v` and `--json`.
fn verbose_lines(p: &PipelineArgs) -> bool {
    p.verbose && !p.json && !p.quiet
}

/// Prints the report as the flags ask and returns the exit status: 0 when
/// nothing failed, 1 when any file did.
pub fn finish(
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
    if p.json {
        outln!("{}", serde_json::to_string_pretty(report)?)
            .context("cannot write the report to standard output")?;
    } else if !p.quiet {
        print_summary(report, p).context("cannot write the summary to standard output")?;
    }
    Ok(if report.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `name` as one line shows it, the way `intact sum` and coreutils print
/// names: a name with a backslash, newline or carriage return is escaped
/// (`\\`, `\n`, `\r`) and the line is marked with a leading backslash.
/// Returns the mark ("" or "\\") and the printable name.
fn printable(name: &str) -> (&'static str, String) {
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
    let (mark, name) = printable(&f.path);
    format!(
        "{mark}{} {name} ({} B, level {level}, {} B sent, {} blocks resent{held})",
        f.kind, f.size, f.bytes_sent, f.blocks_resent
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

/// The human summary: one line, and one more when the receiver held bytes
/// from an earlier run.
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
    let mib = report.bytes as f64 / (1 << 20) as f64;
    outln!(
        "{ok} of {} entries ({mib:.1} MiB) in {:.2} s ({:.0} MiB/s); verify {}: level {}; {resent} blocks resent; {} failed",
        report.files.len(),
        report.seconds,
        mib / report.seconds.max(1e-9),
        p.verify,
        level,
        report.failed
    )?;
    if report.bytes_reverified + report.bytes_trusted > 0 {
        let trusted_level = report
            .files
            .iter()
            .filter_map(|f| f.trusted_level)
            .min()
            .map_or(String::new(), |l| format!(" (recorded level {l} or above)"));
        outln!(
            "held by the receiver from an earlier run: {} B re-verified in place now, {} B trusted from its journal{trusted_level}; {} B sent",
            report.bytes_reverified, report.bytes_trusted, report.bytes_sent
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn names_with_line_breaks_are_escaped_and_marked() {
        assert_eq!(printable("a/b.dat"), ("", "a/b.dat".to_string()));
        assert_eq!(printable("a\nb"), ("\\", "a\\nb".to_string()));
        assert_eq!(printable("a\\b\r"), ("\\", "a\\\\b\\r".to_string()));
    }
}
