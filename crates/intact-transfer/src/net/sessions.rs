//! The server's sessions: one per client run (`intact send` opens several
//! TCP streams with one session id), admitted under two limits, clients
//! at once and streams per client, and logged once, with their totals,
//! when their last stream ends.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use intact_proto::SessionId;

use crate::net::bounds::{Budgets, Shares};
use crate::net::ratelimit::{Kinds, REPEAT_WINDOW};
use crate::net::SessionSummary;
use crate::profile::Profile;
use crate::report::human_bytes;

/// Where a server's log lines go.
pub type Log = Arc<dyn Fn(String) + Send + Sync>;

/// What a server admits at once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Clients (sessions).
    pub sessions: usize,
    /// Streams of one client.
    pub streams_per_session: usize,
}

/// The sessions a server is serving now.
pub(crate) struct Sessions {
    limits: Limits,
    budgets: Budgets,
    open: Mutex<HashMap<SessionId, Open>>,
    log: Log,
    verbose: bool,
    kinds: Mutex<Kinds>,
}

/// One session while any of its streams runs.
struct Open {
    peer: IpAddr,
    streams: usize,
    streams_seen: usize,
    streams_failed: usize,
    total: SessionSummary,
    started: Instant,
    shares: Shares,
    /// Where its streams' receivers sum their stage times.
    profile: Arc<Profile>,
}

/// One admitted stream. [`Stream::end`] reports how it went; a stream
/// dropped without that (its thread panicked) counts as failed, so its
/// session still ends and frees its place.
pub(crate) struct Stream {
    sessions: Arc<Sessions>,
    id: SessionId,
    shares: Shares,
    profile: Arc<Profile>,
    peer: String,
    ended: bool,
}

impl Sessions {
    /// No sessions yet; each gets its places in `budgets`; lines go to
    /// `log` (`verbose`: one per stream too).
    pub fn new(limits: Limits, budgets: Budgets, log: Log, verbose: bool) -> Sessions {
        Sessions {
            limits,
            budgets,
            open: Mutex::new(HashMap::new()),
            log,
            verbose,
            kinds: Mutex::new(Kinds::new(REPEAT_WINDOW)),
        }
    }

    /// Logs a line (and the counts of lines of a kind held back whose
    /// window ended).
    pub fn log(&self, line: String) {
        for l in self.kinds().expired(Instant::now()) {
            (self.log)(l);
        }
        (self.log)(line)
    }

    /// Logs a line that a client can cause once per connection (a refusal,
    /// a stream that failed), of kind `kind` (its reason, without the
    /// peer): a few per kind per window, then a count.
    pub fn log_kind(&self, kind: &str, line: String) {
        let lines = self.kinds().line(kind, line, Instant::now());
        for l in lines {
            (self.log)(l);
        }
    }

    fn kinds(&self) -> std::sync::MutexGuard<'_, Kinds> {
        self.kinds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a line per stream and per refused connection is wanted.
    pub fn verbose(&self) -> bool {
        self.verbose
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Open>> {
        // Counters only: a panic elsewhere cannot leave them inconsistent.
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a stream of session `id` from `peer`, or says why not (the
    /// reason goes to the client).
    pub fn admit(
        self: &Arc<Self>,
        id: SessionId,
        peer: std::net::SocketAddr,
    ) -> Result<Stream, String> {
        let mut open = self.lock();
        let Limits {
            sessions,
            streams_per_session,
        } = self.limits;
        let full = open.len() >= sessions;
        let (shares, profile) = match open.get_mut(&id) {
            Some(s) if s.streams >= streams_per_session => {
                return Err(format!(
                    "this server takes at most {streams_per_session} streams per client; send with --streams {streams_per_session} or fewer"
                ));
            }
            Some(s) => {
                s.streams += 1;
                s.streams_seen += 1;
                (s.shares.clone(), Arc::clone(&s.profile))
            }
            None if full => {
                return Err(format!(
                    "busy: already serving {sessions} client{} (the server's --max-sessions); try again later",
                    if sessions == 1 { "" } else { "s" }
                ));
            }
            None => {
                let shares = self.budgets.session();
                let profile = Arc::new(Profile::default());
                open.insert(
                    id,
                    Open {
                        peer: peer.ip(),
                        streams: 1,
                        streams_seen: 1,
                        streams_failed: 0,
                        total: SessionSummary::default(),
                        started: Instant::now(),
                        shares: shares.clone(),
                        profile: Arc::clone(&profile),
                    },
                );
                (shares, profile)
            }
        };
        Ok(Stream {
            sessions: Arc::clone(self),
            id,
            shares,
            profile,
            peer: peer.to_string(),
            ended: false,
        })
    }

    /// Sessions with a stream running.
    #[cfg(test)]
    pub fn running(&self) -> usize {
        self.lock().len()
    }

    fn stream_ended(&self, id: SessionId, peer: &str, outcome: Result<SessionSummary, String>) {
        let mut open = self.lock();
        let Some(s) = open.get_mut(&id) else {
            return;
        };
        match outcome {
            Ok(sum) => {
                for (path, why) in &sum.failures {
                    self.log(format!("{peer} session {id}: failed {path:?}: {why}"));
                }
                if sum.deleted > 0 {
                    self.log(format!(
                        "{peer} session {id}: --delete removed {} entries",
                        sum.deleted
                    ));
                }
                let unnamed = sum.failed.saturating_sub(sum.failures.len() as u64);
                if unnamed > 0 {
                    self.log(format!(
                        "{peer} session {id}: {unnamed} more files failed (not named here)"
                    ));
                }
                if self.verbose {
                    self.log(format!(
                        "{peer}: stream of session {id} done: {} files verified, {} failed, {} blocks asked again, {} bytes",
                        sum.verified, sum.failed, sum.blocks_rejected, sum.bytes
                    ));
                }
                s.total.verified += sum.verified;
                s.total.failed += sum.failed;
                s.total.blocks_rejected += sum.blocks_rejected;
                s.total.bytes += sum.bytes;
                s.total.cache_repairs += sum.cache_repairs;
                s.total.cache_misses += sum.cache_misses;
                s.total.cache_micros += sum.cache_micros;
                s.total.cache_ask_micros += sum.cache_ask_micros;
                s.total.source_repairs += sum.source_repairs;
                s.total.source_micros += sum.source_micros;
            }
            Err(why) => {
                s.streams_failed += 1;
                self.log_kind(&why, format!("{peer}: stream of session {id} ended: {why}"));
            }
        }
        s.streams -= 1;
        if s.streams > 0 {
            return;
        }
        let s = open.remove(&id).expect("present");
        drop(open);
        let t = &s.total;
        let failed_streams = match s.streams_failed {
            0 => String::new(),
            n => format!(", {n} of them ended early"),
        };
        self.log(format!(
            "{} session {id}: {} files verified, {} failed, {} blocks asked again, {} received in {:.1} s over {} stream{}{failed_streams}",
            s.peer,
            t.verified,
            t.failed,
            t.blocks_rejected,
            human_bytes(t.bytes),
            s.started.elapsed().as_secs_f64(),
            s.streams_seen,
            if s.streams_seen == 1 { "" } else { "s" },
        ));
        if t.cache_repairs + t.cache_misses > 0 {
            self.log(format!(
                "{} session {id}: repairs: {} blocks from a recovery cache ({:.3} s from failure \
                 to verified; {:.3} s asking caches), {} not found there; {} blocks from the \
                 sender ({:.3} s from failure to verified)",
                s.peer,
                t.cache_repairs,
                t.cache_micros as f64 / 1e6,
                t.cache_ask_micros as f64 / 1e6,
                t.cache_misses,
                t.source_repairs,
                t.source_micros as f64 / 1e6,
            ));
        }
        if self.verbose {
            self.log(format!(
                "{} session {id}: receiver stages (thread-seconds): {}",
                s.peer,
                s.profile.line()
            ));
        }
    }
}

impl Stream {
    /// Its session's id.
    pub fn id(&self) -> SessionId {
        self.id
    }

    /// Its session's places in the server's budgets.
    pub fn shares(&self) -> &Shares {
        &self.shares
    }

    /// Where its session's receivers sum their stage times.
    pub fn profile(&self) -> &Arc<Profile> {
        &self.profile
    }

    /// The stream ended: with its receiver's summary, or an error.
    pub fn end(mut self, outcome: Result<SessionSummary, String>) {
        self.ended = true;
        self.sessions.stream_ended(self.id, &self.peer, outcome);
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if !self.ended {
            self.sessions.stream_ended(
                self.id,
                &self.peer,
                Err("its thread panicked (a bug in intact; please report it)".into()),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions(limits: Limits) -> (Arc<Sessions>, Arc<Mutex<Vec<String>>>) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l = Arc::clone(&lines);
        let log: Log = Arc::new(move |s| l.lock().unwrap().push(s));
        let budgets = Budgets::new(&crate::net::bounds::ReceiveLimits::default(), 1 << 30, 4);
        (Arc::new(Sessions::new(limits, budgets, log, false)), lines)
    }

    #[test]
    fn clients_and_their_streams_are_limited_separately() {
        let (s, lines) = sessions(Limits {
            sessions: 1,
            streams_per_session: 2,
        });
        let peer = "127.0.0.1:5000".parse().unwrap();
        let (a, b) = (SessionId([1; 16]), SessionId([2; 16]));
        let a1 = s.admit(a, peer).unwrap();
        let a2 = s.admit(a, peer).unwrap();
        let refused = |r: Result<Stream, String>| r.err().expect("refused");
        assert!(refused(s.admit(a, peer)).contains("--streams 2"));
        assert!(refused(s.admit(b, peer)).contains("busy"));
        a1.end(Ok(SessionSummary {
            verified: 2,
            bytes: 3 << 20,
            ..Default::default()
        }));
        assert!(lines.lock().unwrap().is_empty(), "one line per session");
        drop(a2); // as if its thread panicked
        let got = lines.lock().unwrap().clone();
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].contains("panicked"), "{got:?}");
        assert!(
            got[1].contains("2 files verified") && got[1].contains("3.0 MiB"),
            "{got:?}"
        );
        assert!(got[1].contains("1 of them ended early"), "{got:?}");
        assert_eq!(s.running(), 0);
        s.admit(b, peer).unwrap().end(Ok(SessionSummary::default()));
    }

    #[test]
    fn sizes_read_as_people_read_them() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(5 << 30), "5.0 GiB");
    }
}
