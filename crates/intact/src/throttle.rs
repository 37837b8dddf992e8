//! `--bwlimit`: keeps the bytes sent at or under a rate, averaged over
//! blocks, by making the transfer wait after a block that came early.

use std::time::{Duration, Instant};

/// A rate limit measured from the start of the transfer.
#[derive(Debug, Clone, Copy)]
pub struct Throttle {
    bytes_per_second: u64,
    start: Instant,
}

impl Throttle {
    /// A limit of `bytes_per_second`; None for no limit (0 or absent).
    pub fn new(bytes_per_second: Option<u64>) -> Option<Throttle> {
        bytes_per_second.filter(|&r| r > 0).map(|r| Throttle {
            bytes_per_second: r,
            start: Instant::now(),
        })
    }

    /// Called with the bytes sent so far (by any stream): waits until the
    /// time by which that many bytes are allowed.
    pub fn wait(&self, sent: u64) {
        let due = self.start + Duration::from_secs_f64(sent as f64 / self.bytes_per_second as f64);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
    }
}
