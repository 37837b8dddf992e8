//! Test support shared by intact's test suites.
//!
//! [`skip`] is the one way a test that cannot run here says so. `cargo
//! test` hides a passing test's output, so a skipped device test would
//! otherwise show as a green `ok`. A skip therefore:
//!
//! - prints `SKIP <test>: <why>` on stderr (seen with `--nocapture`);
//! - appends the same line to the file named by `INTACT_SKIP_LOG`, which
//!   `scripts/test` sets, counts and prints at the end of the run;
//! - panics when `CI` is set: CI runs as root on a machine that has every
//!   tool the suite needs, so nothing may be skipped there.

use std::io::Write;

/// Environment variable naming the file skips are appended to.
pub const SKIP_LOG: &str = "INTACT_SKIP_LOG";

/// Records that `test` cannot run here because of `why`; the caller then
/// returns. Panics under CI (the `CI` variable set and not empty or
/// "false"), where every test must run.
pub fn skip(test: &str, why: &str) {
    let line = format!("SKIP {test}: {why}");
    eprintln!("{line}");
    if let Some(path) = std::env::var_os(SKIP_LOG) {
        // O_APPEND writes of one short line do not interleave between the
        // test threads and processes of one run.
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(format!("{line}\n").as_bytes());
        }
    }
    if in_ci() {
        panic!("{line} (CI is set: every test must run here)");
    }
}

/// Whether this run is CI's.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// Whether the process runs as root (loop devices, mounts, setpriv).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}
