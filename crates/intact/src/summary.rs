//! The last lines of `copy` and `send`: how much really moved, what a
//! resumed run found already verified at the destination, and, when a run
//! did not finish, what it did and the command that finishes it.

use intact_transfer::CopyReport;

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
            command_line()
        )
    } else {
        format!(
            "fix the cause and run the same command again: {}",
            command_line()
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
    use super::*;

    #[test]
    fn bytes_and_quotes_read_well() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(688 << 20), "688.0 MiB");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("127.0.0.1:4750:/in"), "127.0.0.1:4750:/in");
    }
}
