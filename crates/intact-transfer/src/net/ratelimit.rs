//! Repeated log lines, collapsed: the first of a run is logged, the
//! repeats are counted and logged as one line per window
//! (`accept failed: Too many open files (repeated 5123 times in the last
//! 10 s)`), so a fault that recurs thousands of times a second costs a
//! line every few seconds, not a full disk.

use std::time::{Duration, Instant};

/// How long repeats of one line are counted before they are logged.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(10);

/// One source of log lines (say, the accept loop) and its current run of
/// identical lines.
pub(crate) struct Repeats {
    window: Duration,
    run: Option<Run>,
}

struct Run {
    line: String,
    since: Instant,
    repeats: u64,
}

impl Repeats {
    /// Counts repeats over `window`.
    pub fn new(window: Duration) -> Repeats {
        Repeats { window, run: None }
    }

    /// `line` happened at `now`: returns the lines to log (none while it
    /// repeats within a window).
    pub fn line(&mut self, line: String, now: Instant) -> Vec<String> {
        let mut out = Vec::new();
        match &mut self.run {
            Some(r) if r.line == line => {
                r.repeats += 1;
                if now.saturating_duration_since(r.since) >= self.window {
                    out.extend(self.flush(now));
                    // The run goes on, counted afresh.
                    self.run = Some(Run {
                        line,
                        since: now,
                        repeats: 0,
                    });
                }
                return out;
            }
            _ => {}
        }
        out.extend(self.flush(now));
        out.push(line.clone());
        self.run = Some(Run {
            line,
            since: now,
            repeats: 0,
        });
        out
    }

    /// Ends the current run (the fault cleared): its count, if any repeats
    /// were not logged yet.
    pub fn flush(&mut self, now: Instant) -> Option<String> {
        let r = self.run.take()?;
        (r.repeats > 0).then(|| {
            format!(
                "{} (repeated {} time{} in the last {:.0} s)",
                r.line,
                r.repeats,
                if r.repeats == 1 { "" } else { "s" },
                now.saturating_duration_since(r.since)
                    .as_secs_f64()
                    .max(1.0)
            )
        })
    }
}

/// Lines of one kind (the same reason, from different peers) logged at
/// most [`Kinds::PER_WINDOW`] times per window each; the rest are counted
/// and told as one line when the window ends. Hostile clients can make a
/// line per connection (a wrong key, a refused stream); they cannot make
/// more than a few per kind per window.
pub(crate) struct Kinds {
    window: Duration,
    kinds: std::collections::HashMap<String, Kind>,
}

struct Kind {
    since: Instant,
    logged: u32,
    dropped: u64,
}

impl Kinds {
    /// Lines of one kind logged per window.
    pub const PER_WINDOW: u32 = 5;
    /// Kinds tracked at once; lines of further kinds share one.
    const MAX_KINDS: usize = 256;

    /// Counts over `window`.
    pub fn new(window: Duration) -> Kinds {
        Kinds {
            window,
            kinds: std::collections::HashMap::new(),
        }
    }

    /// `line`, of kind `kind`, happened at `now`: the lines to log (the
    /// counts of kinds whose window ended first).
    pub fn line(&mut self, kind: &str, line: String, now: Instant) -> Vec<String> {
        let mut out = self.expired(now);
        let key = if self.kinds.len() >= Self::MAX_KINDS && !self.kinds.contains_key(kind) {
            "(other reasons)"
        } else {
            kind
        };
        let k = self.kinds.entry(key.to_string()).or_insert(Kind {
            since: now,
            logged: 0,
            dropped: 0,
        });
        if k.logged < Self::PER_WINDOW {
            k.logged += 1;
            out.push(line);
        } else {
            k.dropped += 1;
        }
        out
    }

    /// Counts of the kinds whose window ended by `now`.
    pub fn expired(&mut self, now: Instant) -> Vec<String> {
        let window = self.window;
        let mut out = Vec::new();
        self.kinds.retain(|kind, k| {
            let over = now.saturating_duration_since(k.since) >= window;
            if over && k.dropped > 0 {
                out.push(format!(
                    "{} more line{} like this one in the last {:.0} s: {kind}",
                    k.dropped,
                    if k.dropped == 1 { "" } else { "s" },
                    now.saturating_duration_since(k.since).as_secs_f64()
                ));
            }
            !over
        });
        out
    }
}

/// A wait that grows while a fault repeats (out of descriptors, out of
/// threads) and starts small again once it cleared.
pub(crate) struct Backoff {
    next: Duration,
    min: Duration,
    max: Duration,
}

impl Backoff {
    /// From `min`, doubling, up to `max`.
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            next: min,
            min,
            max,
        }
    }

    /// How long to wait now (the next wait is longer).
    pub fn step(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    /// The fault cleared.
    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_are_counted_and_logged_once_per_window() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut r = Repeats::new(Duration::from_secs(10));
        let e = || "accept failed: Too many open files".to_string();
        assert_eq!(r.line(e(), at(0)), vec![e()]);
        let mut logged = Vec::new();
        for i in 1..=5123u64 {
            logged.extend(r.line(e(), at(i)));
        }
        assert!(logged.is_empty(), "{logged:?}");
        // Past the window: one line with the count.
        let got = r.line(e(), at(10_001));
        assert_eq!(
            got,
            vec!["accept failed: Too many open files (repeated 5124 times in the last 10 s)"]
        );
        // Another line ends the run; its repeats since are told first.
        r.line(e(), at(10_002));
        let got = r.line("cannot start a session thread".into(), at(10_003));
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].contains("repeated 1 time in"), "{got:?}");
        assert_eq!(got[1], "cannot start a session thread");
        assert_eq!(r.flush(at(10_004)), None, "no repeats of the new line");
    }

    #[test]
    fn each_kind_gets_a_few_lines_per_window_and_a_count() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut k = Kinds::new(Duration::from_secs(10));
        let mut logged = Vec::new();
        for i in 0..2000u64 {
            logged.extend(k.line(
                "authentication failed",
                format!("127.0.0.1:{i}: refused: authentication failed"),
                at(i),
            ));
        }
        logged.extend(k.line("other", "127.0.0.1:9: refused: other".into(), at(2001)));
        assert_eq!(logged.len(), 6, "{logged:?}");
        assert!(logged[4].contains("127.0.0.1:4:"), "{logged:?}");
        let told = k.expired(at(10_000));
        assert_eq!(
            told,
            vec!["1995 more lines like this one in the last 10 s: authentication failed"]
        );
        // A new window: lines again.
        assert_eq!(
            k.line("authentication failed", "x".into(), at(10_001))
                .len(),
            1
        );
        assert_eq!(
            k.expired(at(12_001)).len(),
            0,
            "the other kind dropped none"
        );
    }

    #[test]
    fn backoff_grows_to_its_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(5), Duration::from_millis(40));
        let steps: Vec<u64> = (0..6).map(|_| b.step().as_millis() as u64).collect();
        assert_eq!(steps, [5, 10, 20, 40, 40, 40]);
        b.reset();
        assert_eq!(b.step(), Duration::from_millis(5));
    }
}
