//! Timing one whole process: wall clock, CPU seconds and peak RSS, from
//! the kernel's accounting of exactly that child (`wait4`).

use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};

use crate::runner::Cmd;

/// What one run of a command cost.
#[derive(Debug, Clone, Copy)]
pub struct Cost {
    /// Wall-clock seconds from spawn to exit.
    pub wall: f64,
    /// User plus system CPU seconds of the process and its threads.
    pub cpu: f64,
    /// Peak resident set size, in MiB.
    pub max_rss_mib: f64,
}

/// Runs `cmd` once with its output discarded and returns its cost; fails
/// if it fails.
// The child is reaped by wait4 (for its rusage), which clippy cannot see.
#[allow(clippy::zombie_processes)]
pub fn run(cmd: &Cmd) -> anyhow::Result<Cost> {
    let start = Instant::now();
    let child = Command::new(&cmd.program)
        .args(&cmd.args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("running {}", cmd.display()))?;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // The child is reaped here, not by `Child` (dropping it does not wait).
    let rc = loop {
        // SAFETY: pid is our child; status and usage are valid for writes.
        let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if rc == -1 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        break rc;
    };
    let wall = start.elapsed().as_secs_f64();
    if rc != pid {
        bail!(
            "waiting for {}: {}",
            cmd.display(),
            std::io::Error::last_os_error()
        );
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("{} failed (wait status {status})", cmd.display());
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(Cost {
        wall,
        cpu: secs(usage.ru_utime) + secs(usage.ru_stime),
        max_rss_mib: usage.ru_maxrss as f64 / 1024.0,
    })
}
