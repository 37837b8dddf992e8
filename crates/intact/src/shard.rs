//! Scale-out: `intact plan` (scan once, cut into shards), the shard side
//! of `intact send --plan`, and `intact report merge`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use intact_shard::{merge, Merged, Plan, PlanInput, ShardError, ShardIndex};
use intact_transfer::{scan_with, Scan, SourceSpec};

use crate::copy::parse_target;
use crate::exit::usage;
use crate::stdout::outln;
use crate::summary::{bytes, printable};
use crate::tree_args::{subcommand_matches, SelectArgs};

pub const PLAN_ABOUT: &str = "\
Scan the sources once and cut them into N shards balanced by bytes
(largest file first, each to the shard holding least), each bound for one
of the servers given with --to (shard I to the (I mod M)-th of M servers;
give one server whose root is on a parallel file system to have every
shard write there). The plan is a JSON file; each shard is then sent by
`intact send --plan PLAN --shard I`, on any host that sees the sources
under the same paths, typically as one task of a Slurm job array, an MPI
rank or a Kubernetes Indexed Job (the shard index is then read from the
engine's variable; see `intact send --help`). `intact report merge` joins
the shards' reports.

Every file, symlink and empty directory goes to exactly one shard, with
the directories above it (a directory appears in each shard that sends
something under it). A file larger than a fair share (bytes ÷ N) is
split into block ranges, each sent by another shard of one server (the
ranges meet in that server's partial file, so a file is split only among
the shards that go to the same server: give fewer servers than shards);
the server commits the file under its name once every range has
verified, and `intact report merge` counts it once, when its ranges'
reports show it whole and committed. Split files need --verify riva,
block, fiver or none. With --no-split, or where a server has only one
shard, such a file fills a shard alone and the plan says so.
A shard looks at its entries again when it runs and sends what is there
then; an entry gone or changed in kind fails. Sources that could not be
read are reported as failures of shard 0, so no merged report calls the
transfer complete.

Exit status: 0 if the plan was written and every source was read; 1 if
some source could not be read (the plan is written without it); 2 for
usage errors (an existing PLAN without --force, a bad server address).";

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Files and directories to send, each arriving under its own name
    /// (`DIR/`, with a trailing slash: its contents), as with `send`.
    #[arg(value_name = "SRC", num_args = 1.., required = true)]
    pub sources: Vec<PathBuf>,

    /// How many shards.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub shards: u32,

    /// The servers, HOST:PORT or HOST:PORT:/subdir, comma-separated (or
    /// --to repeated); shard I goes to the (I mod M)-th of the M given.
    #[arg(long, value_name = "HOST:PORT", value_delimiter = ',', required = true)]
    pub to: Vec<String>,

    /// Where to write the plan.
    #[arg(short, long, value_name = "PLAN")]
    pub output: PathBuf,

    /// Replace PLAN if it exists (never do this while shards of it run).
    #[arg(long)]
    pub force: bool,

    /// Print the plan's summary as JSON (the shards without their entries).
    #[arg(long)]
    pub json: bool,

    /// The block size every shard sends at, and split files are cut at:
    /// a power of two from 4KiB to 16MiB (`intact send --plan` uses it).
    #[arg(long, value_name = "SIZE", default_value = "4MiB", value_parser = crate::args::parse_size)]
    pub block_size: usize,

    /// Never split a file across shards (one larger than a fair share
    /// then fills a shard alone).
    #[arg(long)]
    pub no_split: bool,

    #[command(flatten)]
    pub select: SelectArgs,
}

pub const REPORT_ABOUT: &str = "\
Work with the JSON reports of `intact send --plan ... --report FILE`:
`merge` joins them into one; `shards PLAN` prints how many shards a plan
has.";

#[derive(Debug, Args)]
pub struct ReportArgs {
    #[command(subcommand)]
    pub command: ReportCommand,
}

#[derive(Debug, Subcommand)]
pub enum ReportCommand {
    /// One report of the shards' reports: totals, per-file rows, failures, levels.
    #[command(long_about = MERGE_ABOUT)]
    Merge(MergeArgs),
    /// Print how many shards a plan has (for scripts that start one task per shard).
    Shards {
        /// The plan.
        #[arg(value_name = "PLAN")]
        plan: PathBuf,
    },
}

const MERGE_ABOUT: &str = "\
Merge the JSON reports of a plan's shards into one: totals, the level
every verified file reached (and how many files reached each level), every
failure with its shard, and each file's row with its shard. The reports
must all belong to one plan; of two reports of the same shard (a re-run
after a failure) the later counts. With --plan, every entry the plan gives
a shard must also have a row in that shard's report.

Exit status: 0 if every shard of the plan reported, every run ended and
nothing failed; 1 if a shard is missing, stopped or failed anything (the
report says which); 2 for usage errors (a file that is not a shard's
report, reports of different plans).";

#[derive(Debug, Args)]
pub struct MergeArgs {
    /// The shards' report files.
    #[arg(value_name = "REPORT", num_args = 1.., required = true)]
    pub reports: Vec<PathBuf>,

    /// The plan: check that every planned entry was reported.
    #[arg(long, value_name = "PLAN")]
    pub plan: Option<PathBuf>,

    /// Print the merged report as JSON (with every file's row).
    #[arg(long)]
    pub json: bool,
}

/// A shard error as the command line shows it: a plan or report that
/// cannot be read or is not one, an index outside the plan, reports of
/// different plans: all input the command cannot be run on (exit 2).
fn shard_err(e: ShardError) -> anyhow::Error {
    usage(e.to_string())
}

pub fn run_plan(args: &PlanArgs) -> anyhow::Result<ExitCode> {
    for t in &args.to {
        parse_target(t)?;
    }
    if !args.force && std::fs::symlink_metadata(&args.output).is_ok() {
        return Err(usage(format!(
            "{} exists; give another -o, or --force to replace it (never while shards of it run)",
            args.output.display()
        )));
    }
    let opts = args.select.scan_options(subcommand_matches().as_ref());
    // Absolute (symlinks not resolved, a trailing '/' kept): the shards
    // run elsewhere, from other working directories.
    let sources = args
        .sources
        .iter()
        .map(std::path::absolute)
        .collect::<Result<Vec<_>, _>>()
        .context("cannot make the sources' paths absolute")?;
    let specs: Vec<SourceSpec> = sources.iter().map(|s| SourceSpec::from_arg(s)).collect();
    let scan = scan_with(&specs, &opts);
    let plan = Plan::make(&PlanInput {
        sources: &sources,
        scan: &scan,
        shards: args.shards,
        targets: &args.to,
        copy_links: opts.copy_links,
        now: intact_transfer::unix_now(),
        block_size: args.block_size as u64,
        split: !args.no_split,
        secret: {
            let mut s = [0u8; 32];
            getrandom::fill(&mut s)
                .map_err(|e| anyhow::anyhow!("no random bytes for the plan's split ids: {e}"))?;
            s
        },
    })
    .map_err(shard_err)?;
    plan.save(&args.output)?;
    for u in &plan.unreadable {
        let (mark, name) = printable(&u.path.lossy());
        eprintln!(
            "intact: {mark}{name}: {} (left out of the plan; shard 0 reports it)",
            u.error
        );
    }
    for s in &plan.skipped {
        let (mark, name) = printable(&s.lossy());
        eprintln!("intact: skipped special file {mark}{name}");
    }
    if args.json {
        let mut v = serde_json::to_value(&plan)?;
        for s in v["shards"].as_array_mut().into_iter().flatten() {
            let n = s["entries"].as_array().map_or(0, Vec::len);
            s["entries"] = n.into();
        }
        v["plan"] = args.output.display().to_string().into();
        outln!("{v:#}")?;
    } else {
        print_plan(&plan, &args.output)?;
    }
    Ok(if plan.unreadable.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn print_plan(plan: &Plan, out: &Path) -> anyhow::Result<()> {
    outln!(
        "plan {}: {} files, {} in {} shards (heaviest {:.2}× the mean) written to {}",
        plan.id,
        plan.files,
        bytes(plan.bytes),
        plan.shards.len(),
        plan.imbalance,
        out.display()
    )?;
    for s in &plan.shards {
        outln!(
            "  shard {} -> {}: {} files, {}",
            s.index,
            s.to,
            s.files,
            bytes(s.bytes)
        )?;
    }
    if !plan.split.is_empty() {
        outln!(
            "{} file(s) larger than a fair share split into block ranges of {} blocks",
            plan.split.len(),
            bytes(plan.block_size)
        )?;
    }
    if let Some(first) = plan.oversized.first() {
        let (mark, name) = printable(&first.lossy());
        let why = plan.oversized_why.first().map_or("", String::as_str);
        outln!(
            "note: {} file(s) larger than a fair share ({} each) fill a shard alone (e.g. {mark}{name}: {why})",
            plan.oversized.len(),
            bytes(plan.bytes / plan.shards.len() as u64)
        )?;
    }
    Ok(())
}

/// The shard a `send --plan` runs: its plan, index and what it sends.
pub struct ShardJob {
    pub plan: Plan,
    pub index: ShardIndex,
    pub scan: Scan,
}

/// Loads the plan and finds the shard's index (`--shard`, else the
/// engine's variable) and entries.
pub fn shard_job(plan: &Path, given: Option<u32>) -> anyhow::Result<ShardJob> {
    let plan = Plan::load(plan).map_err(shard_err)?;
    let index = intact_shard::shard_index(given, |k| std::env::var(k).ok()).map_err(shard_err)?;
    let scan = plan.scan(index.index).map_err(shard_err)?;
    Ok(ShardJob { plan, index, scan })
}

impl ShardJob {
    /// The server this shard sends to.
    pub fn target(&self) -> &str {
        &self.plan.shards[self.index.index as usize].to
    }

    /// What the shard's report says of it (`"shard"`; the time it
    /// ended is added when the report is written).
    pub fn stamp(&self) -> serde_json::Value {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default();
        serde_json::json!({
            "plan": self.plan.id,
            "index": self.index.index,
            "of": self.plan.shards.len(),
            "to": self.target(),
            "index_from": self.index.from,
            "host": host,
        })
    }
}

/// The report file of `--report FILE`: `{shard}` in its name becomes the
/// shard's index.
pub fn report_path(file: &Path, shard: Option<u32>) -> PathBuf {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let Some(i) = shard else {
        return file.to_path_buf();
    };
    let (bytes, mark) = (file.as_os_str().as_bytes(), b"{shard}");
    let mut out = Vec::with_capacity(bytes.len() + 8);
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at..].starts_with(mark) {
            out.extend_from_slice(i.to_string().as_bytes());
            at += mark.len();
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// Writes a report through a temporary name and a rename: a merge never
/// reads half a report.
pub fn write_report(file: &Path, v: &serde_json::Value) -> anyhow::Result<()> {
    let mut text = serde_json::to_vec_pretty(v)?;
    text.push(b'\n');
    intact_shard::write_whole(file, &text)
        .with_context(|| format!("cannot write the report {}", file.display()))
}

pub fn run_report(args: &ReportArgs) -> anyhow::Result<ExitCode> {
    match &args.command {
        ReportCommand::Merge(m) => run_merge(m),
        ReportCommand::Shards { plan } => {
            let plan = Plan::load(plan).map_err(shard_err)?;
            outln!("{}", plan.shards.len())?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn run_merge(args: &MergeArgs) -> anyhow::Result<ExitCode> {
    let plan = match &args.plan {
        Some(p) => Some(Plan::load(p).map_err(shard_err)?),
        None => None,
    };
    let mut reports = Vec::with_capacity(args.reports.len());
    for path in &args.reports {
        let text = std::fs::read(path)
            .map_err(|e| usage(format!("cannot read the report {}: {e}", path.display())))?;
        let v: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
            usage(format!(
                "{} is not a JSON report ({e}); give the files `intact send --plan ... --report FILE` wrote",
                path.display()
            ))
        })?;
        reports.push((path.clone(), v));
    }
    let m = merge(reports, plan.as_ref()).map_err(shard_err)?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&m)?)?;
    } else {
        print_merged(&m)?;
    }
    Ok(if m.complete {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn print_merged(m: &Merged) -> anyhow::Result<()> {
    for f in &m.failures {
        let (mark, name) = printable(&f.path);
        if f.path.is_empty() {
            eprintln!("intact: shard {}: {}", f.shard, f.error);
        } else {
            eprintln!("intact: shard {}: {mark}{name}: {}", f.shard, f.error);
        }
    }
    for p in &m.superseded {
        eprintln!(
            "intact: {} left out: a later report of the same shard was given",
            p.display()
        );
    }
    let levels: Vec<String> = m
        .levels
        .iter()
        .map(|(l, n)| format!("{n} at {l}"))
        .collect();
    outln!(
        "plan {}: {} of {} shards reported; {} entries ({}), {} sent in {:.2} s (slowest shard); level {}{}; {} failed",
        m.plan,
        m.runs.len(),
        m.shards,
        m.entries,
        bytes(m.bytes),
        bytes(m.bytes_sent),
        m.seconds,
        m.level.as_deref().unwrap_or("-"),
        if levels.len() > 1 { format!(" ({})", levels.join(", ")) } else { String::new() },
        m.failed
    )?;
    if !m.missing.is_empty() {
        let list: Vec<String> = m.missing.iter().map(u32::to_string).collect();
        outln!(
            "missing: shard(s) {} sent no report; run them, then merge again",
            list.join(", ")
        )?;
    }
    if !m.failed_shards.is_empty() {
        let list: Vec<String> = m.failed_shards.iter().map(u32::to_string).collect();
        outln!(
            "incomplete: shard(s) {} failed or stopped; run each again (it resumes), then merge again",
            list.join(", ")
        )?;
    }
    Ok(())
}
