//! A crash seam for tests and the fault lab: with
//! `INTACT_FAULT_KILL_AFTER_BYTES=N` in its environment, a sender (bytes
//! sent) or a server session (bytes received) SIGKILLs its own process once
//! N bytes have moved, so crash-and-resume can be tested at a chosen point
//! without timing races. Unset (always, in normal use) it costs one branch.

use std::sync::OnceLock;

/// The environment variable that arms the seam.
pub const KILL_AFTER_BYTES: &str = "INTACT_FAULT_KILL_AFTER_BYTES";

fn limit() -> Option<u64> {
    static LIMIT: OnceLock<Option<u64>> = OnceLock::new();
    *LIMIT.get_or_init(|| std::env::var(KILL_AFTER_BYTES).ok()?.parse().ok())
}

/// Kills this process with SIGKILL if the seam is armed and `moved` bytes reach it.
pub fn maybe_kill(moved: u64) {
    if limit().is_some_and(|l| moved >= l) {
        // SAFETY: sending a signal to our own process.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}
