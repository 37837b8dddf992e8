//! The network path: a receiving server and a sending client over
//! intact-proto.

mod background_scrub;
pub(crate) mod bounds;
mod confine;
mod delete;
mod handshakes;
pub(crate) mod private;
mod ratelimit;
pub(crate) mod receiver;
mod root;
#[cfg(test)]
mod seam;
pub(crate) mod sender;
mod server;
mod session_dirs;
mod sessions;
mod tcp_info;
mod watchdog;
mod whole_digest;

pub use background_scrub::ScrubSchedule;
pub use bounds::ReceiveLimits;
pub use delete::{DeleteRequest, MAX_KEEP_PATHS};
pub use receiver::{receive, ReceiveOptions, SessionSummary};
pub use root::{lock_holder, RootError, RootLock, LOCK_FILE};
pub use sender::{
    delete_remote, send, send_scanned, SendOptions, Spread, SpreadReport, StreamsReport,
    AUTO_MAX_STREAMS, AUTO_MIN_RTT, AUTO_START_STREAMS, MAX_BYTES_IN_FLIGHT, MAX_FILES_IN_FLIGHT,
    MAX_RANGE_BYTES, MIN_RANGE_BYTES,
};
pub use server::{serve, wake, LocalServer, Server, ServerConfig};
pub use watchdog::{Working, WorkingNow};
