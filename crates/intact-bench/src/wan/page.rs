//! `intact-bench wan --page FILE`: the run's tables as a block of a
//! markdown page, regenerated in place between two marker lines (the rest
//! of the page is left as it is), so that the benchmark page says what the
//! last run of each link measured and nobody copies figures by hand.
//!
//! One section per link, each naming the run that measured it: a run
//! replaces the sections of the links it measured and keeps the others
//! as they were, so that links measured on different days (a long link
//! alone) make one page. Per link: what the link carried (iperf3, raw
//! TCP), then per item one table of every way, each row saying what that
//! tool verifies and whether it encrypts, its time, throughput, CPU
//! seconds and CPU utilisation beside it (the RIVA paper's Fig. 11), and
//! how much faster intact's default was than each peer; the chart and
//! the CSV linked.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::runner::Spread;

/// The line the generated block starts with.
pub const BEGIN: &str =
    "<!-- intact-bench wan --page: begin (generated; edit the benchmark, not this block) -->";
/// The line it ends with.
pub const END: &str = "<!-- intact-bench wan --page: end -->";

/// Which link: the wide-area one at a round trip, or the same hosts
/// unshaped (no delay line, no rate limit: what loopback measures between
/// two hosts). Sections are in this order: unshaped first, then by round
/// trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LinkKind {
    Unshaped,
    Wan { rtt_ms: u64 },
}

impl LinkKind {
    /// The heading of its section.
    pub fn heading(self) -> String {
        match self {
            LinkKind::Unshaped => UNSHAPED_HEADING.to_string(),
            LinkKind::Wan { .. } => format!("### {}", self.described()),
        }
    }

    /// The link a heading names.
    fn of_heading(line: &str) -> Option<LinkKind> {
        if line == UNSHAPED_HEADING {
            return Some(LinkKind::Unshaped);
        }
        line.strip_prefix("### 1 Gbit/s, ")
            .and_then(|r| r.strip_suffix(" ms round trip"))
            .and_then(|r| r.parse::<u64>().ok())
            .map(|rtt_ms| LinkKind::Wan { rtt_ms })
    }

    /// In a sentence or a title: "30 ms" or "unshaped".
    pub fn label(self) -> String {
        match self {
            LinkKind::Unshaped => "unshaped".to_string(),
            LinkKind::Wan { rtt_ms } => format!("{rtt_ms} ms"),
        }
    }

    /// In a chart's title: "1 Gbit/s, 30 ms round trip" or "unshaped veth
    /// link (no rate limit, no added delay)".
    pub fn described(self) -> String {
        match self {
            LinkKind::Unshaped => "unshaped veth link (no rate limit, no added delay)".to_string(),
            LinkKind::Wan { rtt_ms } => format!("1 Gbit/s, {rtt_ms} ms round trip"),
        }
    }

    /// In file names: "wan-30ms" or "wan-unshaped".
    pub fn stem(self) -> String {
        match self {
            LinkKind::Unshaped => "wan-unshaped".to_string(),
            LinkKind::Wan { rtt_ms } => format!("wan-{rtt_ms}ms"),
        }
    }
}

/// The heading of the unshaped link's section.
const UNSHAPED_HEADING: &str =
    "### Unshaped: veth through the switch, no rate limit, no added delay";

/// One link's results.
pub struct Link {
    pub kind: LinkKind,
    /// What was measured of the link and the setup, a line each.
    pub facts: Vec<String>,
    pub items: Vec<Item>,
    /// This link's CSV, if written.
    pub csv: Option<PathBuf>,
}

/// One item (a file or a dataset) sent over a link.
pub struct Item {
    pub title: String,
    pub rows: Vec<Row>,
    /// Ways that failed in some runs: why, a line each.
    pub failures: Vec<String>,
    pub chart: Option<PathBuf>,
}

/// One way's figures on an item.
pub struct Row {
    pub way: String,
    /// intact's default way (the one the peers are compared with).
    pub default: bool,
    /// What it verifies, in a few words.
    pub verifies: &'static str,
    /// Whether (and how) its data is encrypted on the link.
    pub encrypts: String,
    pub secs: Spread,
    pub cpu: Spread,
    /// CPU seconds over wall seconds, the median of the runs' own.
    pub busy: f64,
    pub mbit: f64,
    /// Median throughput over iperf3's on the same link.
    pub of_iperf: Option<f64>,
    pub runs_ok: usize,
    pub runs: usize,
}

/// The line that starts what follows the links' sections.
const TRAILER: &str = "What each tool verifies, in full:";
/// The line that names links not measured.
const PENDING: &str = "Not measured yet";

/// The markdown of the block (markers included): the sections of `links`,
/// measured by `command` on `date`, and the `kept` sections of links this
/// run did not measure (an earlier run's, verbatim, each naming the run
/// that measured it), in [`LinkKind`]'s order (unshaped, then by round
/// trip). Links to charts and CSV are made relative to `page_dir`.
/// `pending`: the links the run has not measured yet (the block is
/// rewritten after each link), every one named, with those whose section
/// is an earlier run's; `legend`: what each tool verifies, in full, a
/// paragraph each.
pub fn render(
    run: (&str, &str),
    page_dir: &Path,
    links: &[Link],
    kept: &[Kept],
    pending: &[LinkKind],
    legend: &[&str],
) -> String {
    let (command, date) = run;
    let mut s = String::new();
    let _ = writeln!(s, "{BEGIN}");
    let _ = writeln!(s);
    let _ = writeln!(s, "## The wide area, every link and peer");
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "Generated by `intact-bench wan --page`; everything between the markers is its output. \
         Each link's section names the run that measured it: a run replaces the sections of the \
         links it measures and keeps the others. \
         Times are wall seconds of one transfer (min / median / max of the runs, interleaved \
         in alternating order); CPU is both ends' CPU seconds (median); CPU use is each run's CPU \
         seconds over its wall seconds (cores kept busy, both ends together; median); \"default vs\" is how many \
         times faster intact's default way was than that way, by the medians."
    );
    /// A link's section: this run's, or an earlier run's kept.
    enum Part<'a> {
        New(&'a Link),
        Old(&'a Kept),
    }
    let mut order: Vec<(LinkKind, Part<'_>)> = links
        .iter()
        .map(|l| (l.kind, Part::New(l)))
        .chain(
            kept.iter()
                .filter(|k| links.iter().all(|l| l.kind != k.kind))
                .map(|k| (k.kind, Part::Old(k))),
        )
        .collect();
    order.sort_by_key(|(kind, _)| *kind);
    for (_, part) in order {
        let _ = writeln!(s);
        match part {
            Part::New(link) => section(&mut s, link, (command, date), page_dir),
            Part::Old(old) => {
                let _ = writeln!(s, "{}", old.text);
            }
        }
    }
    if !pending.is_empty() {
        let names = |kinds: &[&LinkKind]| {
            kinds
                .iter()
                .map(|k| k.label())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let older: Vec<&LinkKind> = pending
            .iter()
            .filter(|kind| kept.iter().any(|k| k.kind == **kind))
            .collect();
        let older = match older.len() {
            0 => String::new(),
            1 => format!(
                " (the section of {} above is an earlier run's)",
                names(&older)
            ),
            _ => format!(
                " (the sections of {} above are an earlier run's)",
                names(&older)
            ),
        };
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "{PENDING} by this run (it was still going, or was cut short, when this was written): \
             {}{older}.",
            names(&pending.iter().collect::<Vec<_>>())
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "{TRAILER}");
    let _ = writeln!(s);
    for l in legend {
        let _ = writeln!(s, "- {l}");
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "{END}");
    s
}

/// One link's section.
fn section(s: &mut String, link: &Link, (command, date): (&str, &str), page_dir: &Path) {
    let _ = writeln!(s, "{}", link.kind.heading());
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "Measured on {date} by `{}`.",
        one_line(command).replace('`', "'")
    );
    let _ = writeln!(s);
    for f in &link.facts {
        let _ = writeln!(s, "- {}", one_line(f).replace('<', "&lt;"));
    }
    if let Some(csv) = &link.csv {
        let _ = writeln!(
            s,
            "- every run: [{}]({})",
            file_name(csv),
            target(rel(page_dir, csv))
        );
    }
    for item in &link.items {
        let _ = writeln!(s);
        let _ = writeln!(s, "#### {}, {}", item.title, link.kind.label());
        let _ = writeln!(s);
        if let Some(chart) = &item.chart {
            let _ = writeln!(s, "![{}]({})", item.title, target(rel(page_dir, chart)));
            let _ = writeln!(s);
        }
        table(s, &item.rows);
        for why in &item.failures {
            let _ = writeln!(s, "- failed: {}", one_line(why).replace('<', "&lt;"));
        }
    }
}

/// A link's section as an earlier run wrote it, kept verbatim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    pub kind: LinkKind,
    pub text: String,
}

/// The links' sections in the generated block of `doc` (none where it has
/// no block). A section runs from its heading to the next one, or to what
/// follows the sections. A block written before sections named their run
/// ("Regenerated by `…`" once, at its top) gives each section that line,
/// and says what that older generator computed differently.
pub fn sections(doc: &str) -> Vec<Kept> {
    let (Some(start), Some(end)) = (doc.find(BEGIN), doc.find(END)) else {
        return Vec::new();
    };
    if end < start {
        return Vec::new();
    }
    let block = &doc[start + BEGIN.len()..end];
    // The older block's one run, for its sections (from its top only: a
    // section's failure lines quote tools).
    let older = older_run(block.split("\n### ").next().unwrap_or(""));
    let mut out: Vec<Kept> = Vec::new();
    let mut current: Option<(LinkKind, Vec<&str>)> = None;
    let finish = |cur: Option<(LinkKind, Vec<&str>)>, out: &mut Vec<Kept>| {
        if let Some((kind, mut lines)) = cur {
            // Verbatim but for the blank lines between sections.
            while lines.last().is_some_and(|l| l.is_empty()) {
                lines.pop();
            }
            let mut text = lines.join("\n");
            if let Some(run) = older.as_ref().filter(|_| !text.contains("\nMeasured on ")) {
                let head = kind.heading();
                text = text.replacen(&head, &format!("{head}\n\n{run}"), 1);
            }
            out.push(Kept { kind, text });
        }
    };
    for line in block.lines() {
        if let Some(kind) = LinkKind::of_heading(line) {
            finish(current.take(), &mut out);
            current = Some((kind, vec![line]));
        } else if line.starts_with(TRAILER) || line.starts_with(PENDING) {
            finish(current.take(), &mut out);
        } else if let Some((_, lines)) = current.as_mut() {
            lines.push(line);
        }
    }
    finish(current.take(), &mut out);
    out
}

/// "Measured on DATE by `COMMAND`." from the top of a block written
/// before sections named their run (its heading carried the date, its
/// first paragraph the command), with what the first such generator
/// (c786798, which described CPU use as "CPU seconds over wall seconds")
/// computed differently from this one; the later ones (53e11fe on)
/// computed as this one does.
fn older_run(top: &str) -> Option<String> {
    let first = top.contains("CPU use is CPU seconds over wall seconds");
    let date = top
        .split("(generated ")
        .nth(1)?
        .split(')')
        .next()?
        .to_string();
    let command = top.split("Regenerated by `").nth(1)?.split('`').next()?;
    if !first {
        return Some(format!("Measured on {date} by `{command}`."));
    }
    Some(format!(
        "Measured on {date} by `{command}`, by an older generator: its CPU use is \
         the median CPU over the median time (not the median of each run's own), and an rclone \
         row's cipher is ssh's default, which rclone's own SSH client may not use (not recorded)."
    ))
}

/// One item's table.
fn table(s: &mut String, rows: &[Row]) {
    let default = rows.iter().find(|r| r.default).map(|r| r.secs.median);
    let _ = writeln!(
        s,
        "| way | verifies | encrypts | seconds | Mbit/s | ÷ iperf3 | CPU s | CPU use | default vs |"
    );
    let _ = writeln!(s, "|---|---|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let runs = if r.runs_ok == r.runs {
            String::new()
        } else {
            format!(" ({} of {} runs)", r.runs_ok, r.runs)
        };
        let versus = match default {
            Some(d) if !r.default && d > 0.0 => format!("{:.2}×", r.secs.median / d),
            _ => "–".to_string(),
        };
        let way = format!("`{}`", cell(&r.way).replace('`', "'"));
        let _ = writeln!(
            s,
            "| {}{runs} | {} | {} | {:.2} / {:.2} / {:.2} | {:.0} | {} | {:.2} | {:.2} | {versus} |",
            if r.default { format!("**{way}**") } else { way },
            cell(r.verifies),
            cell(&r.encrypts),
            r.secs.min,
            r.secs.median,
            r.secs.max,
            r.mbit,
            r.of_iperf.map_or("–".into(), |v| format!("{v:.2}")),
            r.cpu.median,
            r.busy,
        );
    }
}

/// Today's date (UTC), YYYY-MM-DD, as `date` gives it.
pub fn today() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%F"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|d| d.trim().to_string())
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| "on an unknown date".into())
}

/// `text` as one table cell: on one line, its `|` escaped.
fn cell(text: &str) -> String {
    one_line(text).replace('|', "\\|")
}

/// `text` on one line: control bytes (a tool's NUL, its newlines) as
/// spaces, at most 400 characters.
pub fn one_line(text: &str) -> String {
    text.chars()
        .take(400)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// A link target: in angle brackets where it has a space.
fn target(p: String) -> String {
    if p.contains(' ') {
        format!("<{p}>")
    } else {
        p
    }
}

fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(
        || p.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// `target` as a link from a page in `dir`: relative where both are under
/// one directory, else as given.
fn rel(dir: &Path, target: &Path) -> String {
    // Both exist when a page is written: canonical paths resolve `..`
    // and symlinks (a test's paths may not exist: absolute, as given).
    let abs = |p: &Path| {
        std::fs::canonicalize(p)
            .or_else(|_| std::path::absolute(p))
            .unwrap_or_else(|_| p.to_path_buf())
    };
    let (dir, target) = (abs(dir), abs(target));
    let common = dir
        .components()
        .zip(target.components())
        .take_while(|(a, b)| a == b)
        .count();
    if common <= 1 {
        return target.display().to_string();
    }
    let mut out = PathBuf::new();
    for _ in dir.components().skip(common) {
        out.push("..");
    }
    for c in target.components().skip(common) {
        out.push(c);
    }
    out.display().to_string()
}

/// `doc` with its generated block replaced by `block` (which carries its
/// own markers), or `block` appended after a blank line where `doc` has
/// none. Err: a begin marker without its end, or the markers twice, so
/// that nothing written by hand is ever replaced.
pub fn splice(doc: &str, block: &str) -> Result<String, String> {
    let begins = doc.matches(BEGIN).count();
    let ends = doc.matches(END).count();
    match (begins, ends) {
        (0, 0) => {
            let mut out = doc.trim_end_matches('\n').to_string();
            if !out.is_empty() {
                out.push_str("\n\n");
            }
            out.push_str(block);
            Ok(out)
        }
        (1, 1) => {
            let start = doc.find(BEGIN).expect("counted");
            let end = doc.find(END).expect("counted");
            if end < start {
                return Err("the end marker comes before the begin marker".into());
            }
            let after = &doc[end + END.len()..];
            let after = after
                .strip_prefix("\r\n")
                .or_else(|| after.strip_prefix('\n'))
                .unwrap_or(after);
            Ok(format!("{}{block}{after}", &doc[..start]))
        }
        _ => Err(format!(
            "{begins} begin and {ends} end markers: expected one of each (or none)"
        )),
    }
}

/// Whether the block of the page at `path` can be regenerated (a page
/// with broken markers cannot: see [`splice`]), before a run that would
/// otherwise find out after its first link. Nothing is written.
pub fn check(path: &Path) -> anyhow::Result<()> {
    match std::fs::read_to_string(path) {
        Ok(doc) => splice(&doc, "")
            .map(|_| ())
            .map_err(|why| anyhow::anyhow!("{}: {why}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(anyhow::anyhow!("{}: {e}", path.display())),
    }
}

/// Regenerates the block in the page at `path` (made if missing) with
/// `block`, given the sections the page's block holds now (see
/// [`sections`]; `render` keeps those of links the run did not measure).
pub fn write(path: &Path, block: impl FnOnce(&[Kept]) -> String) -> anyhow::Result<()> {
    let doc = match std::fs::read_to_string(path) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(anyhow::anyhow!("{}: {e}", path.display())),
    };
    let block = block(&sections(&doc));
    let new = splice(&doc, &block).map_err(|why| anyhow::anyhow!("{}: {why}", path.display()))?;
    let tmp = path.with_extension("md.tmp");
    std::fs::write(&tmp, new)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

#[cfg(test)]
mod tests;
