//! What `sum` and `sum --check` share: inputs, the thread pool, hashing one
//! input, and the progress bar.

use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use intact_digest::{digest_file, digest_reader, DigestPlan, FileDigests, MIN_PARALLEL_LEN};

use crate::ordered::for_each_ordered;

/// One thing to hash.
#[derive(Debug)]
pub enum Input {
    /// Standard input (named `-`).
    Stdin,
    /// A file, with its size when known (for progress).
    File { path: PathBuf, size: u64 },
    /// Something that cannot be hashed, with the reason; reported in order.
    Bad { path: PathBuf, error: String },
}

impl Input {
    /// The name printed for this input.
    pub fn name(&self) -> &Path {
        match self {
            Input::Stdin => Path::new("-"),
            Input::File { path, .. } | Input::Bad { path, .. } => path,
        }
    }

    /// Bytes this input is expected to have (0 when unknown).
    pub fn size(&self) -> u64 {
        match self {
            Input::File { size, .. } => *size,
            _ => 0,
        }
    }
}

/// The result of hashing one input: digests and elapsed time, or an error message.
pub type Outcome = Result<(FileDigests, Duration), String>;

/// Hashes one input as `plan` says.
pub fn hash_input(input: &Input, plan: &DigestPlan) -> Outcome {
    let start = Instant::now();
    let digests = match input {
        Input::Stdin => digest_reader(io::stdin().lock(), Path::new("-"), plan),
        Input::File { path, .. } => digest_file(path, plan),
        Input::Bad { error, .. } => return Err(error.clone()),
    };
    digests
        .map(|d| (d, start.elapsed()))
        .map_err(|e| e.to_string())
}

/// Whether hashing `input` by `plan` could use more than one thread.
fn may_split(input: &Input, plan: &DigestPlan) -> bool {
    let splits = plan.algorithm.splits_within_file() || plan.block_size.is_some() || plan.pages;
    let large = match input {
        Input::Stdin => true,
        _ => input.size() >= MIN_PARALLEL_LEN as u64,
    };
    plan.parallel && splits && large
}

/// Hashes every item's input by the plan `plan_for` gives it, and hands the
/// outcomes to `consume` in item order, on the calling thread.
///
/// One item that cannot use more than one thread is hashed right here:
/// starting a pool (threads, their stacks and malloc arenas, the cgroup
/// files `available_parallelism` reads) cost about as much CPU as
/// `xxhsum` spends on a whole 4 KiB file (`intact-bench hash --strategies`).
/// Everything else runs on a pool of `jobs` threads.
pub fn for_each_hashed<T: Sync>(
    jobs: Option<u16>,
    items: &[T],
    input_of: impl Fn(&T) -> &Input + Sync,
    plan_for: impl Fn(&T) -> DigestPlan + Sync,
    mut consume: impl FnMut(&T, Outcome),
) -> anyhow::Result<()> {
    if let [item] = items {
        let plan = plan_for(item);
        if !may_split(input_of(item), &plan) {
            let serial = DigestPlan {
                parallel: false,
                ..plan
            };
            consume(item, hash_input(input_of(item), &serial));
            return Ok(());
        }
    }
    let pool = thread_pool(jobs)?;
    for_each_ordered(
        &pool,
        items,
        |item| hash_input(input_of(item), &plan_for(item)),
        consume,
    );
    Ok(())
}

/// A rayon pool of `jobs` threads (all cores when `None`).
fn thread_pool(jobs: Option<u16>) -> anyhow::Result<rayon::ThreadPool> {
    let n = match jobs {
        Some(n) => usize::from(n),
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    Ok(rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("intact-hash-{i}"))
        .build()?)
}

/// A progress bar over `total` bytes on standard error; draws nothing
/// unless standard error is a terminal.
///
/// Off a terminal it is a hidden bar, without a style: parsing the
/// template is start-up work a script's `intact sum FILE` never shows.
pub fn progress_bar(total: u64) -> ProgressBar {
    if !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(
        "{bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} {msg}",
    );
    pb.set_style(style.unwrap_or_else(|_| ProgressStyle::default_bar()));
    pb
}

/// The progress of `sum` and `sum --check`: a bar when standard error is
/// a terminal, nothing at all otherwise.
///
/// Even a hidden indicatif bar allocates its state, a default style
/// (parsing its template) and a random hash key (a `getrandom` call):
/// ~18k instructions of a ~350k-instruction `intact sum` of one small
/// file (callgrind), all for a bar that never draws.
pub struct Progress(Option<ProgressBar>);

impl Progress {
    /// Progress over `total` bytes.
    pub fn new(total: u64) -> Progress {
        Progress(io::stderr().is_terminal().then(|| progress_bar(total)))
    }

    /// Notes the `done`-th finished input.
    pub fn advance(&self, input: &Input, done: usize) {
        if let Some(pb) = &self.0 {
            pb.inc(input.size());
            pb.set_message(format!("{done} files"));
        }
    }

    /// Writes `bytes` to standard output without tearing the bar.
    pub fn print_out(&self, bytes: &[u8]) -> io::Result<()> {
        let write = || write_stdout(bytes);
        match &self.0 {
            Some(pb) => pb.suspend(write),
            None => write(),
        }
    }

    /// Writes a message to standard error without tearing the bar.
    pub fn print_err(&self, msg: &str) {
        match &self.0 {
            Some(pb) => print_err(pb, msg),
            None => eprintln!("intact: {msg}"),
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(pb) = &self.0 {
            pb.finish_and_clear();
        }
    }
}

/// Writes `bytes` to standard output (line-buffered: a text that ends in a
/// newline goes out now); a closed pipe is returned as an error (`sum`
/// and `check` then exit 1, as coreutils do with SIGPIPE ignored).
pub fn write_stdout(bytes: &[u8]) -> io::Result<()> {
    io::stdout().lock().write_all(bytes)
}

/// Writes `report` to standard output as pretty JSON and a newline; a
/// reader gone is an error (exit 1), never a panic, as for the digest
/// lines.
pub fn write_json(report: &impl serde::Serialize) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(report)? + "\n";
    write_stdout(json.as_bytes()).map_err(|e| anyhow::anyhow!("writing the report failed: {e}"))
}

/// Writes a message to standard error without tearing the progress bar.
pub fn print_err(pb: &ProgressBar, msg: &str) {
    pb.suspend(|| eprintln!("intact: {msg}"));
}

/// Seconds as a float, rounded to microseconds for reports.
pub fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e6
}
