//! `intact scrub ROOT` and `intact status ROOT`: the at-rest catalog
//! checked against the device, and read as one screen.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use intact_transfer::{open_catalog_if_free, Replica, ScrubOptions, ScrubReport};

use crate::stdout::outln;

pub const SCRUB_ABOUT: &str = "\
Re-read every file intact cataloged under ROOT from the device and hold it
against the checksums its arrival left there: the CRC-32C of every page
(4 KiB unless `intact catalog init --page-size` chose another; computed
from the received bytes before their digest was checked),
the XXH3-128 of every block and the BLAKE3 of the whole file.

Reads evict the file's pages first and count what stays resident (or use
O_DIRECT with --direct), so a file's level is `device` only when every read
came from the device; on tmpfs, or where pages would not leave, it is
`cache`. Rot is reported by file and byte range with the checksums that
failed. A file whose size or mtime changed is reported as changed by
another program, never as rot. A scrub that is interrupted goes on where
it stopped the next time (--restart starts over).

With --repair-from, rotten pages are fetched from a replica (a directory
with the same tree, or an `intact serve --allow-fetch` server), checked
against the catalog before anything is written, written in place, synced
and re-read the same way; only then is the file called repaired, and its
mtime is set back to the cataloged one.

The catalog is ROOT/.intact/journal.sqlite for a root `intact serve`
receives into, or the state `intact copy` keeps for copies into ROOT. A
running server holds its root's catalog: scrub while it is stopped.

Exit status: 0 when every file scrubbed is clean, changed or repaired, 1
when any is rotten (and not repaired), missing or unreadable, 2 for a usage
error.";

pub const STATUS_ABOUT: &str = "\
What intact's catalog of ROOT holds: files and bytes cataloged, the levels
they reached at arrival, what their last scrub found and at which level,
files never scrubbed, and, when every file's last scrub read all of it
from the device, the oldest such scrub (every file has been read back
since then).

Exit status: 0 when the catalog was shown; 1 if it could not be read;
2 for usage errors (no catalog at ROOT among them).";

/// `intact scrub`.
#[derive(Args, Debug)]
pub struct ScrubArgs {
    /// The root whose catalog to scrub.
    pub root: PathBuf,
    /// Print the report as JSON (every file scrubbed, with its verdict).
    #[arg(long)]
    pub json: bool,
    /// Only files last scrubbed longer ago than this (e.g. 7d, 12h, 30m,
    /// 90s); never-scrubbed files are always due.
    #[arg(long, value_name = "AGE", value_parser = parse_age)]
    pub older_than: Option<Duration>,
    /// At most this many bytes read per second (500 = 500 KiB/s, 10M, 1G).
    #[arg(long, value_name = "RATE", value_parser = crate::tree_args::parse_rate)]
    pub rate: Option<u64>,
    /// Start a new pass instead of going on with an interrupted one.
    #[arg(long)]
    pub restart: bool,
    /// Read with O_DIRECT (each read proven by residency counts) instead
    /// of evict-then-read.
    #[arg(long)]
    pub direct: bool,
    /// Repair rot from a replica: a directory holding the same tree, or an
    /// intact server started with --allow-fetch (HOST:PORT, or
    /// HOST:PORT:/subdir). Only the rotten pages are fetched; they are
    /// checked against the catalog, written, and re-read before the file
    /// is called repaired.
    #[arg(long, value_name = "DIR|HOST:PORT")]
    pub repair_from: Option<PathBuf>,
    /// Pre-shared key file for a --repair-from server (as for `intact send`).
    #[arg(long, value_name = "F", requires = "repair_from")]
    pub key_file: Option<PathBuf>,
}

/// `intact status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The root whose catalog to show.
    pub root: PathBuf,
    /// Print it as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Parses an age: a number with s, m, h, d or w (a bare number is seconds).
pub fn parse_age(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not an age (examples: 7d, 12h, 30m, 90s)"))?;
    let secs = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 604_800,
        other => return Err(format!("unknown age unit '{other}' (use s, m, h, d or w)")),
    };
    n.checked_mul(secs)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("'{s}' is too large"))
}

pub fn run(a: &ScrubArgs) -> anyhow::Result<ExitCode> {
    let opts = ScrubOptions {
        older_than: a.older_than,
        rate: a.rate,
        restart: a.restart,
        direct: a.direct,
        ..ScrubOptions::default()
    };
    let mut replica = match &a.repair_from {
        Some(from) => Some(replica(from, a.key_file.as_deref())?),
        None => None,
    };
    let bar = std::io::IsTerminal::is_terminal(&std::io::stderr())
        .then(|| crate::hashing::progress_bar(0));
    let mut progress = |p: intact_transfer::ScrubProgress| {
        if let Some(pb) = &bar {
            pb.set_length(p.bytes_total);
            pb.set_position(p.bytes);
            pb.set_message(format!("{}/{} files", p.files, p.files_total));
        }
    };
    let report = intact_transfer::scrub(&a.root, &opts, replica.as_mut(), a.json, &mut progress)
        .map_err(usage_or_error)?;
    if let Some(r) = replica {
        r.close();
    }
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        print_report(&report)?;
    }
    Ok(if report.damaged() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// The replica `from` names: an existing directory, else HOST:PORT[:/subdir].
fn replica(from: &Path, key: Option<&Path>) -> anyhow::Result<Replica> {
    if from.is_dir() {
        return Ok(Replica::local(from)?);
    }
    let text = from
        .to_str()
        .ok_or_else(|| crate::exit::usage("--repair-from is neither a directory nor HOST:PORT"))?;
    let (addr, subdir) = crate::copy::parse_target(text).map_err(|_| {
        crate::exit::usage(format!(
            "--repair-from '{text}' is neither a directory nor HOST:PORT[:/subdir]"
        ))
    })?;
    let key = match key {
        Some(f) => Some(intact_proto::Key::from_file(f)?),
        None => None,
    };
    let mut r = Replica::remote(&addr, subdir, key.as_ref());
    r.connect_now()?;
    Ok(r)
}

fn print_report(r: &ScrubReport) -> anyhow::Result<()> {
    for f in &r.reports {
        let (mark, name) = crate::summary::printable(&f.path);
        let path = format!("{mark}{name}");
        match f.state {
            "rot" | "repaired" => {
                for range in &f.rot {
                    outln!(
                        "ROT {path}: bytes {}..{} ({} bytes): {} mismatch, read at level {}",
                        range.offset,
                        range.offset + range.len,
                        range.len,
                        range.failed.join(" and "),
                        f.level
                    )?;
                }
                if let (Some(src), None) = (&f.source, &f.repair) {
                    let (m, s) = crate::summary::printable(src);
                    outln!("    it came from {m}{s} (as its sender named it)")?;
                }
                if let Some(rep) = &f.repair {
                    match &rep.error {
                        None => outln!(
                            "REPAIRED {path}: {} bytes from {}, re-read at level {} and found good",
                            rep.bytes,
                            rep.from,
                            rep.level
                        )?,
                        Some(why) => outln!("NOT REPAIRED {path}: {why}")?,
                    }
                }
            }
            state => outln!(
                "{} {path}: {}",
                state.to_uppercase(),
                f.note.as_deref().unwrap_or("")
            )?,
        }
    }
    let mib = r.bytes as f64 / (1024.0 * 1024.0);
    outln!(
        "scrubbed {} files, {:.1} MiB in {:.1} s{}: {} clean, {} rotten, {} repaired, {} changed by another program, {} missing, {} unreadable",
        r.files,
        mib,
        r.seconds,
        if r.resumed { " (went on with an interrupted pass)" } else { "" },
        r.clean,
        r.rotten,
        r.repaired,
        r.changed,
        r.missing,
        r.unreadable
    )?;
    if r.files > 0 {
        outln!(
            "read at level device: {} files; below device (page cache): {}",
            r.at_device,
            r.below_device
        )?;
    }
    if let Some(from) = &r.replica {
        outln!(
            "repair from {from}: {} files repaired, {} bytes written, {} bytes fetched",
            r.repaired,
            r.repaired_bytes,
            r.fetched_bytes
        )?;
    }
    if r.replaced > 0 {
        outln!(
            "{} files were replaced by a transfer while they were read: not judged",
            r.replaced
        )?;
    }
    if r.stopped {
        outln!("stopped before the end: the next scrub goes on from here")?;
    }
    Ok(())
}

pub fn status(a: &StatusArgs) -> anyhow::Result<ExitCode> {
    let (journal, dir) = open_catalog_if_free(&a.root).map_err(usage_or_error)?;
    let s = journal.catalog_summary()?;
    let m = journal.mount_summary()?;
    if a.json {
        let v = serde_json::json!({
            "catalog": dir.join("journal.sqlite"),
            "page_size": journal.page_size(),
            "files": s.files,
            "bytes": s.bytes,
            "partial_files": s.partial,
            "arrival_levels": s.arrival_levels.iter().map(|(k, n)| (k.clone(), *n)).collect::<std::collections::BTreeMap<_, _>>(),
            "adopted_levels": s.adopted_levels.iter().map(|(k, n)| (k.clone(), *n)).collect::<std::collections::BTreeMap<_, _>>(),
            "last_scrub": s.scrub_states.iter().map(|(k, n)| (k.clone(), *n)).collect::<std::collections::BTreeMap<_, _>>(),
            "last_scrub_levels": s.scrub_levels.iter().map(|(k, n)| (k.clone(), *n)).collect::<std::collections::BTreeMap<_, _>>(),
            "rot_bytes": s.rot_bytes,
            "repairs": s.repairs,
            "repaired_bytes": s.repaired_bytes,
            "last_repair": s.last_repair,
            "never_scrubbed": s.never_scrubbed,
            "not_read_back": s.not_read_back,
            "every_file_read_back_since": s.every_file_read_back_since,
            "mount_bad_pages": m.read_pages,
            "mount_bad_bytes": m.read_bytes,
            "mount_bad_pages_found_by_writes": m.other_pages,
            "mount_last_bad_page": m.last,
            "written_through_mount": m.written,
        });
        outln!("{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let list = |v: &[(String, u64)]| {
        if v.is_empty() {
            "-".to_string()
        } else {
            v.iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    outln!(
        "catalog:          {} ({}-byte pages)",
        dir.join("journal.sqlite").display(),
        journal.page_size()
    )?;
    outln!(
        "cataloged:        {} files, {:.1} MiB ({} partial)",
        s.files,
        s.bytes as f64 / (1024.0 * 1024.0),
        s.partial
    )?;
    outln!("level at arrival: {}", list(&s.arrival_levels))?;
    if !s.adopted_levels.is_empty() {
        outln!(
            "adopted:          {} (catalog add: level of the read, never compared with a source)",
            list(&s.adopted_levels)
        )?;
    }
    outln!("last scrub found: {}", list(&s.scrub_states))?;
    outln!("last scrub level: {}", list(&s.scrub_levels))?;
    outln!(
        "rot found:        {} bytes not repaired (at each file's last scrub)",
        s.rot_bytes
    )?;
    outln!(
        "repaired:         {} repairs, {} bytes{}",
        s.repairs,
        s.repaired_bytes,
        s.last_repair.map_or(String::new(), |t| format!(
            ", the last {} ago",
            age(intact_transfer::unix_now().saturating_sub(t))
        ))
    )?;
    if m.read_pages + m.other_pages + m.written > 0 {
        outln!(
            "intact mount:     {} bad pages refused to readers ({} bytes), {} found by writes{}; {} files last written through it (level none)",
            m.read_pages,
            m.read_bytes,
            m.other_pages,
            m.last.map_or(String::new(), |t| format!(
                ", the last {} ago",
                age(intact_transfer::unix_now().saturating_sub(t))
            )),
            m.written
        )?;
    }
    match s.every_file_read_back_since {
        Some(t) => outln!(
            "every file read back from the device and checked since {} ({} ago)",
            t,
            age(intact_transfer::unix_now().saturating_sub(t))
        )?,
        None => outln!(
            "not read back:    {} files by their last scrub ({} never scrubbed)",
            s.not_read_back,
            s.never_scrubbed
        )?,
    }
    Ok(ExitCode::SUCCESS)
}

/// A root without a catalog is a usage error (exit 2); the rest are not.
fn usage_or_error(e: intact_transfer::TransferError) -> anyhow::Error {
    match e {
        intact_transfer::TransferError::Usage(m) => crate::exit::usage(m),
        e => e.into(),
    }
}

fn age(secs: i64) -> String {
    match secs {
        s if s < 120 => format!("{s} s"),
        s if s < 7200 => format!("{} min", s / 60),
        s if s < 172_800 => format!("{} h", s / 3600),
        s => format!("{} d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_age;
    use std::time::Duration;

    #[test]
    fn ages_parse_with_their_units() {
        assert_eq!(parse_age("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_age("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_age("12h"), Ok(Duration::from_secs(12 * 3600)));
        assert!(parse_age("soon").is_err());
        assert!(parse_age("3y").is_err());
    }
}
