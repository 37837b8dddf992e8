//! Running commands repeatedly and taking medians.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};

/// A command line to time.
#[derive(Clone, Debug)]
pub struct Cmd {
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl Cmd {
    pub fn new(program: impl Into<PathBuf>, args: &[&str]) -> Cmd {
        Cmd {
            program: program.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Runs once, returns standard output; fails if the command fails.
    pub fn output(&self) -> anyhow::Result<String> {
        // Stderr is captured: some tools (xxhsum) draw progress on it.
        let out = Command::new(&self.program)
            .args(&self.args)
            .output()
            .with_context(|| format!("running {}", self.display()))?;
        if !out.status.success() {
            bail!(
                "{} exited with {}: {}",
                self.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs once with output discarded; returns wall-clock seconds.
    pub fn time(&self) -> anyhow::Result<f64> {
        let start = Instant::now();
        let status = Command::new(&self.program)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .with_context(|| format!("running {}", self.display()))?;
        let secs = start.elapsed().as_secs_f64();
        if !status.success() {
            bail!("{} exited with {status}", self.display());
        }
        Ok(secs)
    }

    pub fn display(&self) -> String {
        let mut s = self.program.display().to_string();
        for a in &self.args {
            s.push(' ');
            s.push_str(a);
        }
        s
    }
}

/// Times each command `runs` times, interleaved (A B A B …) so that load
/// changes hit all of them alike; returns each command's median seconds.
pub fn medians(cmds: &[&Cmd], runs: usize) -> anyhow::Result<Vec<f64>> {
    let mut times = vec![Vec::with_capacity(runs); cmds.len()];
    for _ in 0..runs {
        for (i, c) in cmds.iter().enumerate() {
            times[i].push(c.time()?);
        }
    }
    Ok(times.into_iter().map(median).collect())
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Whether `program` can be found on PATH.
pub fn have(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
}

/// The release `intact` binary, built if it is not there yet.
pub fn intact_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let bin = exe.with_file_name("intact");
    let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["build", "--release", "--quiet", "-p", "intact"])
        .status()
        .context("building the release intact binary")?;
    if !status.success() || !bin.is_file() {
        bail!(
            "could not build {} (is intact-bench a release build?)",
            bin.display()
        );
    }
    Ok(bin)
}

/// CPU seconds (user + system) of this process's children that have been
/// waited for, so far: the difference around a run is that run's CPU.
pub fn children_cpu() -> f64 {
    rusage_cpu(libc::RUSAGE_CHILDREN)
}

/// CPU seconds in a `/proc/…/stat` text: the task's own (utime + stime)
/// and its reaped children's (cutime + cstime).
pub fn stat_cpu(stat: &str) -> Option<(f64, f64)> {
    // Fields after the command's closing parenthesis start at field 3;
    // utime, stime, cutime and cstime are fields 14 to 17.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<f64> = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    if f.len() < 4 {
        return None;
    }
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(((f[0] + f[1]) / hz, (f[2] + f[3]) / hz))
}

/// CPU seconds of process `pid`, its own and its reaped children's, once
/// it has reaped all of them (a server whose sessions just ended; at
/// most 2 s is waited).
pub fn settled_cpu(pid: u32) -> anyhow::Result<(f64, f64)> {
    // Children of any of its threads (a server may fork from any).
    let unreaped = || -> anyhow::Result<bool> {
        for t in std::fs::read_dir(format!("/proc/{pid}/task"))?.flatten() {
            let kids = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            if !kids.trim().is_empty() {
                return Ok(true);
            }
        }
        Ok(false)
    };
    let mut tries = 0;
    while unreaped()? {
        tries += 1;
        if tries > 200 {
            anyhow::bail!("process {pid} still has children after 2 s: its CPU is not settled");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    stat_cpu(&stat).ok_or_else(|| anyhow::anyhow!("/proc/{pid}/stat: too few fields"))
}

/// CPU seconds (user and system) of this process's threads so far.
pub fn self_cpu() -> f64 {
    rusage_cpu(libc::RUSAGE_SELF)
}

/// CPU seconds and context switches (voluntary and not) of this process's
/// children waited for so far.
pub struct Usage {
    pub cpu: f64,
    pub switches: f64,
}

pub fn children_rusage() -> Usage {
    // SAFETY: getrusage only writes the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Usage {
        cpu: secs(ru.ru_utime) + secs(ru.ru_stime),
        switches: (ru.ru_nvcsw + ru.ru_nivcsw) as f64,
    }
}

fn rusage_cpu(who: libc::c_int) -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(who, &mut ru) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

/// One timed run: wall-clock seconds and CPU seconds of its processes.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub wall: f64,
    pub cpu: f64,
}

/// Measures one run: wall time from [`Meter::go`] to [`Meter::stop`],
/// CPU of the children waited for between [`Meter::start`] and
/// [`Meter::finish`] (a server started before the clock and reaped after
/// it is charged too).
pub struct Meter {
    cpu0: f64,
    t0: Instant,
    wall: Option<f64>,
}

impl Meter {
    pub fn start() -> Meter {
        Meter {
            cpu0: children_cpu(),
            t0: Instant::now(),
            wall: None,
        }
    }

    /// Starts the clock (again).
    pub fn go(&mut self) {
        self.t0 = Instant::now();
    }

    /// Stops the clock.
    pub fn stop(&mut self) {
        self.wall = Some(self.t0.elapsed().as_secs_f64());
    }

    /// The sample; `extra_cpu` is CPU measured elsewhere (an sshd's
    /// sessions, which this process does not wait for).
    pub fn finish(self, extra_cpu: f64) -> Sample {
        Sample {
            wall: self.wall.unwrap_or_else(|| self.t0.elapsed().as_secs_f64()),
            cpu: children_cpu() - self.cpu0 + extra_cpu,
        }
    }
}

/// Minimum, median and maximum of some runs.
#[derive(Clone, Copy, Debug)]
pub struct Spread {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(v: &[f64]) -> Spread {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        Spread {
            min: s.first().copied().unwrap_or(f64::NAN),
            median: median(s.clone()),
            max: s.last().copied().unwrap_or(f64::NAN),
        }
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.2} / {:.2} / {:.2}", self.min, self.median, self.max)
    }
}

/// Lower quartile, median and upper quartile of a sample (the nearest
/// ranks).
pub struct Quartiles {
    pub low: f64,
    pub median: f64,
    pub high: f64,
}

impl Quartiles {
    pub fn of(v: &[f64]) -> Quartiles {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        let at = |q: f64| {
            s.get(((s.len().max(1) - 1) as f64 * q).round() as usize)
                .copied()
                .unwrap_or(f64::NAN)
        };
        Quartiles {
            low: at(0.25),
            median: median(s.clone()),
            high: at(0.75),
        }
    }
}

impl std::fmt::Display for Quartiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:+.1} / {:+.1} / {:+.1}",
            self.low, self.median, self.high
        )
    }
}

/// Runs `f(i)` for each of `n` commands `rounds` times, interleaved:
/// forward order in even rounds, reverse order in odd ones, so that a
/// change in the machine's load and any order effect hit all of them
/// alike. Returns each command's results in run order.
pub fn interleaved<T>(
    n: usize,
    rounds: usize,
    mut f: impl FnMut(usize) -> anyhow::Result<T>,
) -> anyhow::Result<Vec<Vec<T>>> {
    let mut out: Vec<Vec<T>> = (0..n).map(|_| Vec::with_capacity(rounds)).collect();
    for r in 0..rounds {
        let order: Vec<usize> = if r % 2 == 0 {
            (0..n).collect()
        } else {
            (0..n).rev().collect()
        };
        for i in order {
            check_stop()?;
            out[i].push(f(i)?);
        }
    }
    Ok(out)
}

static STOP: std::sync::OnceLock<std::sync::Arc<std::sync::atomic::AtomicBool>> =
    std::sync::OnceLock::new();

/// From now on SIGINT and SIGTERM set a flag instead of killing the
/// benchmark, so that it stops between runs and removes what it set up
/// (a RAM disk, a namespace) on the way out.
pub fn stop_on_signals() {
    let flag = STOP.get_or_init(Default::default);
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register(sig, flag.clone());
    }
}

/// An error if a stop was asked for.
pub fn check_stop() -> anyhow::Result<()> {
    if STOP
        .get()
        .is_some_and(|f| f.load(std::sync::atomic::Ordering::Relaxed))
    {
        bail!("interrupted");
    }
    Ok(())
}

/// The command line this process was started with, for the tables' footers.
pub fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("intact-bench {}", args.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaved_alternates_the_order() {
        let mut order = Vec::new();
        let out = interleaved(3, 3, |i| {
            order.push(i);
            Ok(i * 10)
        })
        .unwrap();
        assert_eq!(order, [0, 1, 2, 2, 1, 0, 0, 1, 2]);
        assert_eq!(out, [vec![0; 3], vec![10; 3], vec![20; 3]]);
    }

    #[test]
    fn spread_is_min_median_max() {
        let s = Spread::of(&[3.0, 1.0, 2.0, 10.0]);
        assert_eq!((s.min, s.median, s.max), (1.0, 2.5, 10.0));
        assert_eq!(s.to_string(), "1.00 / 2.50 / 10.00");
    }
}
