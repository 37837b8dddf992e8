//! TCP reassembly for the capture: each direction's bytes in order, from
//! mirrored segments that may come duplicated, out of order or not at all.
//!
//! A connection is followed only from its SYN (the first bytes of the
//! client's direction are the Hello the follower starts from); segments of
//! any other connection are counted and dropped. Out-of-order bytes wait
//! within a bound shared by all connections ([`Reassembly::new`]'s
//! `budget`); a hole with no byte delivered for [`GAP_TIMEOUT`], or that
//! would take more than the budget, means the capture lost bytes (TCP
//! retransmits what the receiver lost, so a hole the mirror saw filled
//! fills here too): that connection is no longer followed and the report
//! says so. Retransmitted bytes already delivered are trimmed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::follow::{Budget, Conn, Side, Stop};
use crate::stats::Counters;
use crate::store::Store;

/// How long a hole may stay open before its connection is given up.
pub const GAP_TIMEOUT: Duration = Duration::from_secs(3);

/// A connection with no segment for this long is forgotten.
pub const IDLE: Duration = Duration::from_secs(300);

/// The most connections followed at once.
pub const MAX_FLOWS: usize = 4096;

/// What a segment waiting behind a hole costs against the budget besides
/// its bytes (its place in the map), so that tiny segments cannot outgrow it.
pub const SEG_COST: usize = 64;

/// One TCP segment, as parsed from a packet.
#[derive(Debug, Clone, Copy)]
pub struct Segment<'a> {
    /// Sender's address and port.
    pub from: SocketAddr,
    /// Receiver's address and port.
    pub to: SocketAddr,
    /// Sequence number.
    pub seq: u32,
    /// SYN flag.
    pub syn: bool,
    /// ACK flag.
    pub ack: bool,
    /// FIN flag.
    pub fin: bool,
    /// RST flag.
    pub rst: bool,
    /// Payload.
    pub payload: &'a [u8],
}

#[derive(Default)]
struct Half {
    /// Sequence number of the byte at offset 0 (ISN + 1).
    base: Option<u32>,
    /// Offset of the next byte to deliver.
    next: u64,
    /// Bytes past a hole: offset → bytes.
    waiting: BTreeMap<u64, Vec<u8>>,
    waiting_bytes: usize,
    /// Since when bytes wait behind a hole with no byte delivered: the
    /// hole is given up after [`GAP_TIMEOUT`] without progress (holes on
    /// a congested link open and fill all the time; one the capture
    /// missed never fills).
    hole_since: Option<Instant>,
    fin: bool,
    /// The offset the FIN said the bytes end at.
    fin_at: Option<u64>,
}

impl Half {
    /// The offset of `seq`, taken as the nearest to `next` (sequence
    /// numbers wrap every 4 GiB).
    fn offset(&self, base: u32, seq: u32) -> Option<u64> {
        let rel = seq.wrapping_sub(base);
        let near = self.next as u32;
        let delta = rel.wrapping_sub(near) as i32 as i64;
        let off = self.next as i64 + delta;
        (off >= 0).then_some(off as u64)
    }
}

struct Flow {
    client: SocketAddr,
    halves: [Half; 2],
    conn: Conn,
    seen: Instant,
    reset: bool,
}

/// All connections being followed.
pub struct Reassembly {
    flows: HashMap<(SocketAddr, SocketAddr), Flow>,
    /// Connections already counted as not followed (bounded).
    unknown: HashSet<(SocketAddr, SocketAddr)>,
    budget: Arc<Budget>,
    waiting: usize,
    store: Arc<Store>,
    counters: Arc<Counters>,
    last_sweep: Instant,
}

fn key(a: SocketAddr, b: SocketAddr) -> (SocketAddr, SocketAddr) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

impl Reassembly {
    /// Reassembly whose waiting bytes, and its connections' followers,
    /// take their memory from `budget`.
    pub fn new(budget: Arc<Budget>, store: Arc<Store>, counters: Arc<Counters>) -> Reassembly {
        Reassembly {
            flows: HashMap::new(),
            unknown: HashSet::new(),
            budget,
            waiting: 0,
            store,
            counters,
            last_sweep: Instant::now(),
        }
    }

    /// Connections followed now.
    pub fn flows(&self) -> usize {
        self.flows.len()
    }

    /// Bytes waiting behind holes now (with [`SEG_COST`] per segment).
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Handles one segment.
    pub fn segment(&mut self, s: Segment<'_>) {
        let now = Instant::now();
        if now.duration_since(self.last_sweep) > Duration::from_secs(1) {
            self.sweep(now);
        }
        let k = key(s.from, s.to);
        if !self.flows.contains_key(&k) {
            if s.syn && !s.ack && !s.rst {
                if self.flows.len() >= MAX_FLOWS {
                    self.counters.table_full.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                let conn = Conn::new(
                    Arc::clone(&self.store),
                    Arc::clone(&self.counters),
                    Arc::clone(&self.budget),
                );
                let mut halves = [Half::default(), Half::default()];
                halves[0].base = Some(s.seq.wrapping_add(1));
                self.flows.insert(
                    k,
                    Flow {
                        client: s.from,
                        halves,
                        conn,
                        seen: now,
                        reset: false,
                    },
                );
                self.unknown.remove(&k);
                return;
            }
            self.counters
                .unfollowed_segments
                .fetch_add(1, Ordering::Relaxed);
            if !s.payload.is_empty() && !self.unknown.contains(&k) {
                if self.unknown.len() >= MAX_FLOWS {
                    self.unknown.clear();
                }
                self.unknown.insert(k);
                self.counters.joined.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        let flow = self.flows.get_mut(&k).expect("checked");
        flow.seen = now;
        let (i, side) = if s.from == flow.client {
            (0, Side::Client)
        } else {
            (1, Side::Server)
        };
        if s.rst {
            flow.reset = true;
        }
        let half = &mut flow.halves[i];
        if s.syn {
            if half.base.is_none() {
                half.base = Some(s.seq.wrapping_add(1));
            }
            return;
        }
        let Some(base) = half.base else {
            if !s.payload.is_empty() {
                flow.conn.stop(Stop::Joined);
            }
            return;
        };
        let Some(mut off) = half.offset(base, s.seq) else {
            return;
        };
        if s.fin {
            half.fin = true;
            half.fin_at = Some(off + s.payload.len() as u64);
        }
        // A segment without bytes (an ACK; the one after a FIN sits one
        // past the last byte, the FIN's own number) delivers nothing.
        if s.payload.is_empty() {
            return;
        }
        let mut data = s.payload;
        if off + data.len() as u64 <= half.next {
            return;
        }
        if off < half.next {
            data = &data[(half.next - off) as usize..];
            off = half.next;
        }
        if flow.conn.stopped().is_some() {
            half.next = off + data.len() as u64;
            return;
        }
        if off > half.next {
            let had = half.waiting.get(&off).map(|v| v.len() + SEG_COST);
            let grow = match had {
                Some(n) => (data.len() + SEG_COST).saturating_sub(n),
                None => data.len() + SEG_COST,
            };
            let share = half.waiting_bytes + grow <= self.budget.per_flow();
            if !share || !self.budget.take(grow) {
                self.budget.give(half.waiting_bytes);
                self.waiting -= half.waiting_bytes;
                half.waiting.clear();
                half.waiting_bytes = 0;
                half.hole_since = None;
                flow.conn.stop(Stop::Memory);
                return;
            }
            if grow > 0 {
                half.waiting.insert(off, data.to_vec());
            }
            half.waiting_bytes += grow;
            self.waiting += grow;
            half.hole_since.get_or_insert(now);
            return;
        }
        flow.conn.feed(side, data);
        half.next += data.len() as u64;
        // What waited behind the hole just filled.
        while let Some(entry) = half.waiting.first_entry() {
            let at = *entry.key();
            if at > half.next {
                break;
            }
            let bytes = entry.remove();
            let cost = bytes.len() + SEG_COST;
            half.waiting_bytes -= cost;
            self.waiting -= cost;
            self.budget.give(cost);
            let end = at + bytes.len() as u64;
            if end > half.next {
                flow.conn.feed(side, &bytes[(half.next - at) as usize..]);
                half.next = end;
            }
        }
        // Bytes were delivered: progress, whatever still waits.
        half.hole_since = (!half.waiting.is_empty()).then_some(now);
    }

    /// Gives up holes open too long and forgets idle or closed connections.
    pub fn sweep(&mut self, now: Instant) {
        self.last_sweep = now;
        let mut freed = 0;
        self.flows.retain(|_, f| {
            for h in &mut f.halves {
                if h.hole_since
                    .is_some_and(|t| now.duration_since(t) > GAP_TIMEOUT)
                {
                    freed += h.waiting_bytes;
                    h.waiting.clear();
                    h.waiting_bytes = 0;
                    h.hole_since = None;
                    f.conn.stop(Stop::Gap);
                }
            }
            let closed = f.reset || f.halves.iter().all(|h| h.fin && h.waiting.is_empty());
            let idle = now.duration_since(f.seen) > IDLE;
            // A FIN past the last byte seen: the capture missed the end.
            let short = f
                .halves
                .iter()
                .any(|h| h.fin_at.is_some_and(|end| h.next < end));
            if closed && short && !f.reset && !idle && f.conn.stopped().is_none() {
                // Its last bytes may still come (a retransmission): wait
                // for them as for any hole.
                for h in &mut f.halves {
                    if h.fin_at.is_some_and(|end| h.next < end) {
                        h.hole_since.get_or_insert(now);
                    }
                }
                return true;
            }
            if closed || idle {
                for h in &f.halves {
                    freed += h.waiting_bytes;
                }
                if short || !f.halves.iter().all(|h| h.waiting.is_empty()) {
                    f.conn.stop(Stop::Gap);
                }
                return false;
            }
            true
        });
        self.waiting -= freed;
        self.budget.give(freed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(p: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], p))
    }

    struct Tap {
        r: Reassembly,
        c: Arc<Counters>,
    }

    impl Tap {
        fn new(budget: usize) -> Tap {
            let c = Arc::new(Counters::default());
            let s = Arc::new(Store::new(1 << 20));
            Tap {
                r: Reassembly::new(Budget::new(budget), s, Arc::clone(&c)),
                c,
            }
        }
        fn seg(&mut self, client: bool, seq: u32, syn: bool, payload: &[u8]) {
            let (from, to) = if client {
                (addr(40000), addr(7000))
            } else {
                (addr(7000), addr(40000))
            };
            self.r.segment(Segment {
                from,
                to,
                seq,
                syn,
                ack: !client || !syn,
                fin: false,
                rst: false,
                payload,
            });
        }
    }

    #[test]
    fn holes_that_keep_filling_are_not_given_up_however_long_the_congestion() {
        let mut t = Tap::new(1 << 20);
        t.seg(true, 0, true, b"");
        // Segment k+1 always comes before segment k (a loss, then its
        // retransmission), for longer than the gap timeout.
        let start = Instant::now();
        let mut k = 0u32;
        while start.elapsed() < GAP_TIMEOUT + Duration::from_millis(500) {
            t.seg(true, 1 + 100 * (k + 1), false, &[1; 100]);
            t.seg(true, 1 + 100 * k, false, &[1; 100]);
            k += 2;
            t.r.sweep(Instant::now());
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(t.c.gaps.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn an_empty_segment_after_a_fin_is_no_hole() {
        let mut t = Tap::new(1 << 20);
        t.seg(true, 0, true, b"");
        t.seg(true, 1, false, &[1; 100]);
        // FIN at 101, then an ACK numbered 102.
        t.seg(true, 102, false, b"");
        assert_eq!(t.r.waiting(), 0);
        t.r.sweep(Instant::now() + GAP_TIMEOUT + Duration::from_secs(1));
        assert_eq!(t.c.gaps.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn bytes_missing_before_a_fin_are_a_gap() {
        let mut t = Tap::new(1 << 20);
        t.seg(true, 0, true, b"");
        // The start of a 1000-byte frame (the follower waits for the rest).
        let mut start = 1000u32.to_be_bytes().to_vec();
        start.resize(100, 0);
        t.seg(true, 1, false, &start);
        // The FIN says the bytes end at 301: 200 were never seen.
        t.r.segment(Segment {
            from: addr(40000),
            to: addr(7000),
            seq: 301,
            syn: false,
            ack: true,
            fin: true,
            rst: false,
            payload: b"",
        });
        t.seg(false, 0, true, b"");
        t.r.segment(Segment {
            from: addr(7000),
            to: addr(40000),
            seq: 1,
            syn: false,
            ack: true,
            fin: true,
            rst: false,
            payload: b"",
        });
        t.r.sweep(Instant::now());
        assert_eq!(
            t.c.gaps.load(Ordering::Relaxed),
            0,
            "a retransmission may come"
        );
        t.r.sweep(Instant::now() + GAP_TIMEOUT + Duration::from_secs(1));
        assert_eq!(t.c.gaps.load(Ordering::Relaxed), 1);
        assert_eq!(t.r.flows(), 0);
    }

    #[test]
    fn a_hole_that_never_fills_is_given_up_after_the_timeout() {
        let mut t = Tap::new(1 << 20);
        t.seg(true, 0, true, b"");
        t.seg(true, 1 + 100, false, &[1; 100]);
        t.r.sweep(Instant::now() + GAP_TIMEOUT / 2);
        assert_eq!(t.c.gaps.load(Ordering::Relaxed), 0);
        t.r.sweep(Instant::now() + GAP_TIMEOUT + Duration::from_secs(1));
        assert_eq!(t.c.gaps.load(Ordering::Relaxed), 1);
        assert_eq!(t.r.waiting(), 0);
    }

    #[test]
    fn offsets_wrap_with_the_sequence_numbers() {
        let h = Half {
            next: 10,
            ..Half::default()
        };
        assert_eq!(h.offset(u32::MAX - 4, 5), Some(10));
        assert_eq!(h.offset(u32::MAX - 4, 3), Some(8));
        assert_eq!(h.offset(100, 50), None);
    }

    #[test]
    fn a_connection_seen_without_its_syn_is_counted_not_followed() {
        let mut t = Tap::new(1 << 20);
        t.seg(true, 1000, false, b"mid-stream bytes");
        t.seg(true, 1016, false, b"more");
        assert_eq!(t.c.joined.load(Ordering::Relaxed), 1);
        assert_eq!(t.r.flows(), 0);
    }

    #[test]
    fn a_hole_larger_than_the_budget_stops_the_connection_and_frees_its_bytes() {
        let mut t = Tap::new(200);
        t.seg(true, 5000, true, b"");
        t.seg(true, 5001 + 10, false, &[0; 60]);
        assert_eq!(t.r.waiting(), 60 + SEG_COST);
        t.seg(true, 5001 + 100, false, &[0; 60]);
        assert_eq!(t.r.waiting(), 0);
        assert_eq!(t.c.memory.load(Ordering::Relaxed), 1);
        assert_eq!(t.r.budget.used(), 0, "all given back");
    }
}
