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
