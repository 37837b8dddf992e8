//! A crash seam for tests and the fault lab, compiled only with the
//! `fault-seam` feature (test builds and the lab's own `intact`; never a
//! release binary): with `INTACT_FAULT_KILL_AFTER_BYTES=N` in its
//! environment, a sender (bytes sent) or a server session (bytes received)
//! SIGKILLs its own process once N bytes have moved, so crash-and-resume
//! can be tested at a chosen point without timing races. Without the
//! feature, [`maybe_kill`] is an empty function the compiler removes.

/// The environment variable that arms the seam.
#[cfg(feature = "fault-seam")]
pub const KILL_AFTER_BYTES: &str = "INTACT_FAULT_KILL_AFTER_BYTES";

#[cfg(feature = "fault-seam")]
fn limit() -> Option<u64> {
    static LIMIT: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| std::env::var(KILL_AFTER_BYTES).ok()?.parse().ok())
}

/// Kills this process with SIGKILL if the seam is armed and `moved` bytes reach it.
#[cfg(feature = "fault-seam")]
pub fn maybe_kill(moved: u64) {
    if limit().is_some_and(|l| moved >= l) {
        // SAFETY: sending a signal to our own process.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}

/// Without the `fault-seam` feature: nothing.
#[cfg(not(feature = "fault-seam"))]
#[inline(always)]
pub fn maybe_kill(_moved: u64) {}
