//! The data deadline of a stream that holds open files: while it holds
//! them, the session may wait for its client at most `data_timeout` in
//! all between two pieces of data (a Block or a FileEnd), or the stream
//! ends and its files' places (open files, blocks, memory) go back to the
//! server.
//!
//! The watchdog counts any answered message as progress, so without this
//! a client could hold its share of every budget indefinitely by sending
//! a Dir entry now and then. Only time the session spends waiting for the
//! client counts: not its own work (a commit's syncfs, a whole-file
//! read), and a verifier result (the server at work for the client)
//! starts the count again, as data does.

use std::time::Duration;

use crate::TransferError;

/// How long a stream holding files has waited for its client since it
/// last sent data.
pub(super) struct DataClock {
    timeout: Option<Duration>,
    waited: Duration,
}

impl DataClock {
    pub(super) fn new(timeout: Option<Duration>) -> DataClock {
        DataClock {
            timeout,
            waited: Duration::ZERO,
        }
    }

    /// How long the session may wait for its next event before it looks
    /// at the deadline again.
    pub(super) fn tick(&self) -> Duration {
        match self.timeout {
            Some(t) => (t / 4).clamp(Duration::from_millis(100), Duration::from_secs(5)),
            None => Duration::from_secs(3600),
        }
    }

    /// The session waited `d` for its next event.
    pub(super) fn waited(&mut self, d: Duration) {
        self.waited += d;
    }

    /// Data arrived, or the server made progress for the client.
    pub(super) fn moved(&mut self) {
        self.waited = Duration::ZERO;
    }

    /// With `open` files held: an error once the session waited the
    /// deadline without data. With none, the count starts again.
    pub(super) fn check(&mut self, open: usize) -> Result<(), TransferError> {
        let Some(timeout) = self.timeout else {
            return Ok(());
        };
        if open == 0 {
            self.waited = Duration::ZERO;
        } else if self.waited >= timeout {
            return Err(TransferError::NoData {
                files: open,
                secs: timeout.as_secs(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_waiting_without_data_while_holding_files_runs_out() {
        let t = Duration::from_secs(300);
        let mut c = DataClock::new(Some(t));
        // Without files, waiting costs nothing and the count restarts.
        c.waited(2 * t);
        c.check(0).unwrap();
        c.waited(t / 2);
        c.check(3).unwrap();
        c.waited(t / 2);
        let e = c.check(3).unwrap_err();
        assert!(
            e.to_string()
                .contains("3 files open and no data sent for 300 s"),
            "{e}"
        );
        // Data (or the server's own progress) starts the count again.
        c.moved();
        c.waited(t - Duration::from_millis(1));
        c.check(3).unwrap();
        c.waited(Duration::from_millis(1));
        assert!(c.check(3).is_err());
        // No deadline: never.
        let mut off = DataClock::new(None);
        off.waited(Duration::from_secs(1 << 20));
        off.check(5).unwrap();
        assert_eq!(off.tick(), Duration::from_secs(3600));
        assert_eq!(c.tick(), Duration::from_secs(5));
    }
}
