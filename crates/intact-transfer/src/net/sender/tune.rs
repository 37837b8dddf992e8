//! Growing a send's streams while their socket buffers, not the link,
//! hold them back (`--streams auto`).
//!
//! Why: one TCP stream keeps at most its send buffer in flight
//! (`net.ipv4.tcp_wmem`, 4 MiB at most by default), so it carries at most
//! that buffer per round trip: about 230 Mbit/s at 89 ms here, and a
//! 10 Gbit/s link at 30 ms (37.5 MB in flight) needs at least nine such
//! windows, some fifteen at the 680 Mbit/s one stream gets at 30 ms here.
//! How many streams a link needs is its bandwidth-delay product over one
//! window, and neither the bandwidth nor the far end's window is known
//! before data moves.
//!
//! How: the kernel measures it. Since Linux 4.10 `TCP_INFO` reports, per
//! socket, how long it was busy delivering data and how much of that time
//! it ran out of data to send because its send buffer was full
//! (`tcpi_sndbuf_limited`), and its smoothed and its least round trip.
//! Every [`interval`] the tuner sums those over the streams that have run
//! a whole interval, the smoothed round trip taken as its mean over the
//! interval (read every 20 ms tick: a queue that comes and goes with the
//! congestion control's cycles counts for the time it stands, and one
//! late packet of a jittery path for little). Where the buffers held them
//! back for at least [`GROW_SHARE`] of their busy time *and* their round
//! trip is still
//! within [`QUEUE_SHARE`] of the least one (no standing queue at the
//! bottleneck: the link has room), a further window would be used, and it
//! connects `ceil(streams × share)` more streams of the same session (so
//! 4 streams held back half of the time become 6, then more while it
//! lasts), up to the options' `max_streams` and the entries still queued.
//! The round trip is what tells a link the windows cannot fill from one
//! they already fill: at 89 ms here, one stream is held back by its
//! buffer half of the time with its round trip 0.5 ms above the least,
//! while four streams, which fill the link, are still held back a fifth
//! of the time but queue 25 ms at the bottleneck (more streams there only
//! made the send slower, 11.2 → 13.6 s with twelve). A stream the server
//! refuses (its `--max-streams-per-session`) ends the growth, with the
//! server's reason in the report. Time held back by the receiver's
//! window (`tcpi_rwnd_limited`) is shown in each growth step's line but
//! never grown for: a receiver that reads slowly is not helped by more
//! streams.
//!
//! Where this never runs: local copies, fixed `--streams N`, and round
//! trips under [`super::AUTO_MIN_RTT`] (one window is plenty there).

use std::net::TcpStream;
use std::time::{Duration, Instant};

use intact_proto::{Key, SessionSecret};

use super::SenderLink;

/// `--streams auto` starts with this many streams.
pub const AUTO_START_STREAMS: usize = 4;
/// And grows to at most this many.
pub const AUTO_MAX_STREAMS: usize = 16;
/// The share of their busy time the streams' send buffers must have held
/// them back for a step to add streams. At 89 ms and 1 Gbit/s, four
/// streams are held back about a fifth of the time (while their round
/// trip shows the link full), one stream about half.
pub const GROW_SHARE: f64 = 0.10;
/// The streams' smoothed round trip may exceed their least one by at most
/// this share of it (and [`QUEUE_FLOOR`]) for a step to add streams: more
/// and the bottleneck holds a standing queue, so the link is full.
pub const QUEUE_SHARE: f64 = 0.05;
/// The least queue [`QUEUE_SHARE`] allows: the round trip's own jitter.
const QUEUE_FLOOR: Duration = Duration::from_millis(1);
/// The streams must have been busy delivering for at least this share of
/// the interval for a sample to count: idle streams are held back by the
/// source or by the receiver's verdicts, not by their windows.
const BUSY_SHARE: f64 = 0.5;

/// Time between two looks at the sockets: ten round trips (slow start
/// reaches a 4 MiB window in about eight), at least half a second.
pub fn interval(rtt: Duration) -> Duration {
    (rtt * 10).max(Duration::from_millis(500))
}

/// One socket's busy and held-back times so far, microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Chrono {
    /// Busy delivering data (the times below included).
    pub busy_us: u64,
    /// Out of data to send because the send buffer was full.
    pub sndbuf_us: u64,
    /// Held back by the receiver's advertised window.
    pub rwnd_us: u64,
    /// Smoothed round trip now.
    pub srtt_us: u64,
    /// The least round trip seen.
    pub min_rtt_us: u64,
}

/// The socket's [`Chrono`] from `TCP_INFO`; None where the kernel does not
/// report it (before Linux 4.10) or the socket is gone.
pub fn chrono(socket: &TcpStream) -> Option<Chrono> {
    // tcpi_sndbuf_limited is the last field used (Linux 4.10 and later).
    let end_of_sndbuf = std::mem::offset_of!(libc::tcp_info, tcpi_sndbuf_limited) + 8;
    let info = crate::net::tcp_info::tcp_info(socket, end_of_sndbuf)?;
    Some(Chrono {
        busy_us: info.tcpi_busy_time,
        sndbuf_us: info.tcpi_sndbuf_limited,
        rwnd_us: info.tcpi_rwnd_limited,
        srtt_us: u64::from(info.tcpi_rtt),
        min_rtt_us: u64::from(info.tcpi_min_rtt),
    })
}

/// What the streams that ran a whole interval did in it, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    /// Streams counted.
    pub streams: usize,
    /// Microseconds of the interval, times the streams counted.
    pub span_us: u64,
    /// Their [`Chrono`] growth over the interval.
    pub busy_us: u64,
    pub sndbuf_us: u64,
    pub rwnd_us: u64,
    /// Their smoothed round trips (each its mean over the interval),
    /// summed.
    pub srtt_us: u64,
    /// Their least round trips, summed.
    pub min_rtt_us: u64,
}

impl Sample {
    /// The streams' mean queue: smoothed round trip over the least.
    pub fn queue(&self) -> Duration {
        Duration::from_micros(
            self.srtt_us.saturating_sub(self.min_rtt_us) / self.streams.max(1) as u64,
        )
    }

    /// Whether that queue is short enough for the link to have room.
    pub fn link_has_room(&self) -> bool {
        let least = Duration::from_micros(self.min_rtt_us / self.streams.max(1) as u64);
        self.queue() <= least.mul_f64(QUEUE_SHARE).max(QUEUE_FLOOR)
    }

    /// Share of the busy time the send buffers held the streams back.
    pub fn sndbuf_share(&self) -> f64 {
        self.sndbuf_us as f64 / self.busy_us.max(1) as f64
    }

    /// Share of the busy time the receiver's window held them back.
    pub fn rwnd_share(&self) -> f64 {
        self.rwnd_us as f64 / self.busy_us.max(1) as f64
    }
}

/// Streams to add after `sample`, with `streams` running, at most `max`,
/// and `queued` entries not yet taken by any stream (a new stream only
/// helps with work no stream has begun).
pub fn to_add(sample: &Sample, streams: usize, max: usize, queued: usize) -> usize {
    if sample.streams == 0 || (sample.busy_us as f64) < BUSY_SHARE * sample.span_us as f64 {
        return 0;
    }
    let share = sample.sndbuf_share();
    if share < GROW_SHARE || !sample.link_has_room() {
        return 0;
    }
    let want = (streams as f64 * share).ceil() as usize;
    want.min(max.saturating_sub(streams)).min(queued)
}

/// How the streams of a send grew, for the report.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct StreamsReport {
    /// Streams connected before any data moved.
    pub started: usize,
    /// Streams at the end.
    pub ended: usize,
    /// The most `--streams auto` would open.
    pub max: usize,
    /// Each growth: when, what the sockets said, how many were added.
    pub steps: Vec<String>,
    /// Why the streams stopped growing, where something other than the
    /// sockets' own measure stopped them (the server's limit, a failed
    /// connect, a kernel without the measure).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

/// Where more streams of the session come from.
pub(crate) struct Grow<'a> {
    pub(crate) addr: &'a str,
    pub(crate) key: Option<&'a Key>,
    pub(crate) session: &'a SessionSecret,
    /// The fastest connect (one round trip).
    pub(crate) rtt: Duration,
}

/// A stream's socket as the tuner watches it.
struct Watched {
    socket: TcpStream,
    since: Instant,
    last: Chrono,
    /// The smoothed round trips read since the last sample: their sum,
    /// µs, and how many.
    srtt_sum_us: u64,
    srtt_reads: u64,
}

/// The tuner of one send: looks at the sockets every [`interval`] and
/// connects more streams while their buffers hold them back.
pub(crate) struct Tuner<'a> {
    grow: Grow<'a>,
    max: usize,
    every: Duration,
    start: Instant,
    next: Instant,
    watched: Vec<Watched>,
    done: bool,
    pub(crate) report: StreamsReport,
}

impl<'a> Tuner<'a> {
    /// A tuner for `links` (already connected), growing to `max`.
    pub(crate) fn new(grow: Grow<'a>, links: &[SenderLink<'_>], max: usize) -> Tuner<'a> {
        let now = Instant::now();
        let every = interval(grow.rtt);
        let mut t = Tuner {
            grow,
            max,
            every,
            start: now,
            next: now + every,
            watched: Vec::new(),
            done: false,
            report: StreamsReport {
                started: links.len(),
                ended: links.len(),
                max,
                ..StreamsReport::default()
            },
        };
        for l in links {
            t.watch(l);
        }
        t
    }

    fn watch(&mut self, link: &SenderLink<'_>) {
        let Some(socket) = link.tcp.as_ref().and_then(|t| t.socket.try_clone().ok()) else {
            return;
        };
        match chrono(&socket) {
            Some(last) => self.watched.push(Watched {
                socket,
                since: Instant::now(),
                last,
                srtt_sum_us: 0,
                srtt_reads: 0,
            }),
            None => self.stop("this kernel does not report TCP_INFO's send-buffer time".into()),
        }
    }

    fn stop(&mut self, why: String) {
        if !self.done {
            self.done = true;
            self.report.stopped = Some(why);
        }
    }

    /// Looks at the sockets if an interval has passed and returns the
    /// streams it connected (none most of the time). `queued`: entries no
    /// stream has taken yet.
    pub(crate) fn poll(&mut self, queued: usize) -> Vec<SenderLink<'static>> {
        let now = Instant::now();
        if self.done {
            return Vec::new();
        }
        if now < self.next {
            for w in &mut self.watched {
                if let Some(c) = chrono(&w.socket) {
                    w.srtt_sum_us += c.srtt_us;
                    w.srtt_reads += 1;
                }
            }
            return Vec::new();
        }
        self.next = now + self.every;
        let mut sample = Sample::default();
        for w in &mut self.watched {
            let Some(c) = chrono(&w.socket) else { continue };
            let sum = std::mem::take(&mut w.srtt_sum_us) + c.srtt_us;
            let srtt = sum / (std::mem::take(&mut w.srtt_reads) + 1);
            let whole = now.duration_since(w.since) >= self.every;
            if whole {
                sample.streams += 1;
                sample.span_us += self.every.as_micros() as u64;
                sample.busy_us += c.busy_us.saturating_sub(w.last.busy_us);
                sample.sndbuf_us += c.sndbuf_us.saturating_sub(w.last.sndbuf_us);
                sample.rwnd_us += c.rwnd_us.saturating_sub(w.last.rwnd_us);
                sample.srtt_us += srtt;
                sample.min_rtt_us += c.min_rtt_us;
            }
            w.last = c;
        }
        let streams = self.report.ended;
        let add = to_add(&sample, streams, self.max, queued);
        if add == 0 {
            return Vec::new();
        }
        // A stream that cannot join within this gives up, and the send
        // goes on with the streams it has.
        let limit = (self.grow.rtt * 10).max(Duration::from_secs(3));
        let links = super::connect_n_timed(
            self.grow.addr,
            self.grow.key,
            self.grow.session,
            add,
            Some(limit),
        );
        let mut added = Vec::new();
        for l in links {
            match l.and_then(|(conn, _, _)| SenderLink::tcp(conn)) {
                Ok(link) => added.push(link),
                Err(e) => self.stop(format!(
                    "stream {} could not join: {e}",
                    streams + added.len() + 1
                )),
            }
        }
        for l in &added {
            self.watch(l);
        }
        self.report.ended += added.len();
        let (noun, their) = match streams {
            1 => ("stream", "its"),
            _ => ("streams", "their"),
        };
        self.report.steps.push(format!(
            "at {:.1} s: {streams} {noun} held back by {their} send buffers {:.0}% of {their} busy time (by the receiver's window {:.0}%), round trip {:.1} ms over its least: {} more",
            now.duration_since(self.start).as_secs_f64(),
            sample.sndbuf_share() * 100.0,
            sample.rwnd_share() * 100.0,
            sample.queue().as_secs_f64() * 1e3,
            added.len()
        ));
        if self.report.ended >= self.max {
            self.done = true;
        }
        added
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `streams` streams busy `busy` of the interval, held back by their
    /// buffers `sndbuf` of that, at 89 ms with a queue of `queue_ms`.
    fn queued(streams: usize, busy: f64, sndbuf: f64, queue_ms: u64) -> Sample {
        let span = 1_000_000 * streams as u64;
        Sample {
            streams,
            span_us: span,
            busy_us: (busy * span as f64) as u64,
            sndbuf_us: (sndbuf * busy * span as f64) as u64,
            rwnd_us: 0,
            srtt_us: (89_000 + queue_ms * 1000) * streams as u64,
            min_rtt_us: 89_000 * streams as u64,
        }
    }

    fn sample(streams: usize, busy: f64, sndbuf: f64) -> Sample {
        queued(streams, busy, sndbuf, 0)
    }

    #[test]
    fn a_standing_queue_means_the_link_is_full_and_no_stream_is_added() {
        // As measured at 89 ms: four streams fill the link, held back a
        // fifth of the time and queueing 25 ms; one stream, half the time
        // with no queue to speak of.
        assert_eq!(to_add(&queued(4, 1.0, 0.2, 25), 4, 16, 100), 0);
        assert_eq!(to_add(&queued(1, 1.0, 0.5, 0), 1, 16, 100), 1);
        // 5% of the least round trip is tolerated, more is not.
        assert_eq!(to_add(&queued(4, 1.0, 0.5, 4), 4, 16, 100), 2);
        assert_eq!(to_add(&queued(4, 1.0, 0.5, 5), 4, 16, 100), 0);
    }

    #[test]
    fn streams_grow_with_the_share_their_buffers_held_them_back() {
        // Four streams held back a fifth of the time: one more.
        assert_eq!(to_add(&sample(4, 1.0, 0.2), 4, 16, 100), 1);
        // Half the time: two more; nearly always: double.
        assert_eq!(to_add(&sample(4, 1.0, 0.5), 4, 16, 100), 2);
        assert_eq!(to_add(&sample(4, 1.0, 0.95), 4, 16, 100), 4);
        // Below the threshold, or idle streams: none.
        assert_eq!(to_add(&sample(4, 1.0, 0.05), 4, 16, 100), 0);
        assert_eq!(to_add(&sample(4, 0.3, 0.9), 4, 16, 100), 0);
        assert_eq!(to_add(&Sample::default(), 4, 16, 100), 0);
        // Bounded by the maximum and by the work left to take.
        assert_eq!(to_add(&sample(4, 1.0, 0.95), 15, 16, 100), 1);
        assert_eq!(to_add(&sample(4, 1.0, 0.95), 16, 16, 100), 0);
        assert_eq!(to_add(&sample(4, 1.0, 0.95), 4, 16, 1), 1);
        assert_eq!(to_add(&sample(4, 1.0, 0.95), 4, 16, 0), 0);
    }

    #[test]
    fn a_socket_reports_its_busy_time() {
        // Whether this kernel has the measure (4.10 and later) at all.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        std::io::Write::write_all(&mut s, &[7; 1 << 16]).unwrap();
        let got = chrono(&s).expect("TCP_INFO with tcpi_sndbuf_limited");
        assert!(got.sndbuf_us <= got.busy_us, "{got:?}");
        drop(c);
    }
}
