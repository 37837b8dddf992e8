//! A panic seam for the tests that check a panicking session frees its
//! places and leaves the others alone, compiled only with the `fault-seam`
//! feature (as the crash seam of `crate::fault`; never a release binary):
//! with `INTACT_FAULT_PANIC_SESSIONS=1` in the server's environment, a
//! session whose id begins with [`PANIC_ID_PREFIX`] panics right after it
//! was admitted, while it holds a session and a stream place.

use crate::net::sessions::Stream;

/// The environment variable that arms the seam.
#[cfg(feature = "fault-seam")]
pub(crate) const PANIC_SESSIONS: &str = "INTACT_FAULT_PANIC_SESSIONS";

/// Session ids that begin with this panic when the seam is armed.
#[cfg(feature = "fault-seam")]
pub(crate) const PANIC_ID_PREFIX: &[u8; 8] = b"panic!!!";

/// Panics if the seam is armed and `stream`'s session id asks for it.
#[cfg(feature = "fault-seam")]
pub(crate) fn maybe_panic(stream: &Stream) {
    static ARMED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let armed = *ARMED.get_or_init(|| std::env::var_os(PANIC_SESSIONS).is_some_and(|v| v == "1"));
    if armed && stream.id().0.starts_with(PANIC_ID_PREFIX) {
        panic!("fault seam: {PANIC_SESSIONS} asked this session to panic");
    }
}

/// Without the `fault-seam` feature: nothing.
#[cfg(not(feature = "fault-seam"))]
#[inline(always)]
pub(crate) fn maybe_panic(_stream: &Stream) {}
