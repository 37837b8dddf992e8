//! What the cache counts, and the report it prints.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::follow::Stop;
use crate::store::StoreStats;

/// Counters shared by the capture (or relay), the followers and the
/// service; read for the report at any time.
#[derive(Default, Debug)]
pub struct Counters {
    /// Mirrored packets the capture handed to the cache (addressed to
    /// other hosts).
    pub packets: AtomicU64,
    /// Packets to or from the cache's own host, not followed.
    pub own_packets: AtomicU64,
    /// Packets the kernel dropped before the cache read them
    /// (PACKET_STATISTICS): each may be a block the cache never saw.
    pub kernel_drops: AtomicU64,
    /// Packets the capture interface dropped before any socket saw them
    /// (its backlog was full), since the capture began.
    pub iface_drops: AtomicU64,
    /// Packets cut short by the capture's snapshot length.
    pub truncated: AtomicU64,
    /// TCP segments that belong to no followed connection.
    pub unfollowed_segments: AtomicU64,
    /// Connections followed from their first byte.
    pub streams: AtomicU64,
    /// Connections that could not be (fully) followed, by reason.
    pub encrypted: AtomicU64,
    /// ... a frame did not decode.
    pub malformed: AtomicU64,
    /// ... the server refused them.
    pub refused: AtomicU64,
    /// ... bytes went missing.
    pub gaps: AtomicU64,
    /// ... seen only after their start.
    pub joined: AtomicU64,
    /// ... following them would have passed the memory budget.
    pub memory: AtomicU64,
    /// Connections that were not intact's (not counted as missed).
    pub not_intact: AtomicU64,
    /// ... more connections than the cache follows at once.
    pub table_full: AtomicU64,
    /// Whole blocks kept (their bytes hashed to the BLAKE3 that came with them).
    pub cached: AtomicU64,
    /// Their bytes.
    pub cached_bytes: AtomicU64,
    /// Blocks whose bytes did not hash to the BLAKE3 that came with them.
    pub rejected: AtomicU64,
    /// Blocks without a BLAKE3 (the receiver has no recovery cache, or
    /// the sender keeps the file out with `--cache-exclude`).
    pub uncacheable: AtomicU64,
    /// Resends of single pages (not a whole block: nothing to keep).
    pub partial: AtomicU64,
    /// Blocks larger than the store's whole bound.
    pub too_large: AtomicU64,
    /// Requests answered with a block.
    pub served: AtomicU64,
    /// Their bytes.
    pub served_bytes: AtomicU64,
    /// Requests for a block the cache does not hold (after waiting
    /// [`crate::service::MISS_WAIT`] for it).
    pub missed: AtomicU64,
    /// Requests answered only after waiting for the block to arrive.
    pub late_hits: AtomicU64,
    /// Microseconds between the kernel's timestamp of the last packet
    /// handled and the moment it was handled: how far behind the wire
    /// the capture runs.
    pub lag_micros: AtomicU64,
    /// The largest such lag seen.
    pub max_lag_micros: AtomicU64,
}

impl Counters {
    pub(crate) fn stopped(&self, why: Stop) {
        let c = match why {
            Stop::Encrypted => &self.encrypted,
            Stop::Malformed => &self.malformed,
            Stop::Refused => &self.refused,
            Stop::Gap => &self.gaps,
            Stop::Joined => &self.joined,
            Stop::NotIntact => &self.not_intact,
            Stop::Memory => &self.memory,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// A snapshot for the report.
    pub fn report(&self, store: StoreStats) -> Report {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let not_followed = g(&self.encrypted)
            + g(&self.memory)
            + g(&self.malformed)
            + g(&self.gaps)
            + g(&self.joined)
            + g(&self.table_full);
        Report {
            packets: g(&self.packets),
            own_packets: g(&self.own_packets),
            kernel_drops: g(&self.kernel_drops),
            iface_drops: g(&self.iface_drops),
            truncated: g(&self.truncated),
            unfollowed_segments: g(&self.unfollowed_segments),
            streams: g(&self.streams),
            not_followed,
            encrypted: g(&self.encrypted),
            malformed: g(&self.malformed),
            refused: g(&self.refused),
            gaps: g(&self.gaps),
            joined: g(&self.joined),
            table_full: g(&self.table_full),
            not_intact: g(&self.not_intact),
            memory: g(&self.memory),
            cached: g(&self.cached),
            cached_bytes: g(&self.cached_bytes),
            rejected: g(&self.rejected),
            uncacheable: g(&self.uncacheable),
            partial: g(&self.partial),
            too_large: g(&self.too_large),
            served: g(&self.served),
            served_bytes: g(&self.served_bytes),
            missed: g(&self.missed),
            late_hits: g(&self.late_hits),
            lag_ms: g(&self.lag_micros) as f64 / 1000.0,
            max_lag_ms: g(&self.max_lag_micros) as f64 / 1000.0,
            complete: g(&self.kernel_drops) == 0
                && g(&self.iface_drops) == 0
                && g(&self.truncated) == 0
                && not_followed == 0,
            store,
        }
    }
}

/// The cache's report (`intact cache --json`, and its status lines).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// Mirrored packets handled (addressed to other hosts).
    pub packets: u64,
    /// Packets of the cache's own host (or broadcast), not followed.
    pub own_packets: u64,
    /// Packets the kernel dropped before the cache read them.
    pub kernel_drops: u64,
    /// Packets the capture interface dropped (full backlog).
    pub iface_drops: u64,
    /// Packets cut short by the snapshot length.
    pub truncated: u64,
    /// TCP segments of no followed connection.
    pub unfollowed_segments: u64,
    /// Connections seen from their start.
    pub streams: u64,
    /// Connections not (fully) followed, all reasons.
    pub not_followed: u64,
    /// ... encrypted.
    pub encrypted: u64,
    /// ... a frame did not decode.
    pub malformed: u64,
    /// ... refused by the server (not counted in `not_followed`).
    pub refused: u64,
    /// ... bytes missing.
    pub gaps: u64,
    /// ... seen only after their start.
    pub joined: u64,
    /// ... the connection table was full.
    pub table_full: u64,
    /// Connections of other protocols (ignored).
    pub not_intact: u64,
    /// ... over the memory budget for following connections.
    pub memory: u64,
    /// Whole blocks kept.
    pub cached: u64,
    /// Their bytes.
    pub cached_bytes: u64,
    /// Blocks refused: their bytes did not hash to their BLAKE3.
    pub rejected: u64,
    /// Blocks that came without a BLAKE3.
    pub uncacheable: u64,
    /// Page resends (not whole blocks).
    pub partial: u64,
    /// Blocks larger than the whole bound.
    pub too_large: u64,
    /// Blocks served to receivers.
    pub served: u64,
    /// Their bytes.
    pub served_bytes: u64,
    /// Requests for blocks not held.
    pub missed: u64,
    /// Requests answered after waiting for their block to arrive.
    pub late_hits: u64,
    /// How far behind the wire the capture ran at its last packet (ms).
    pub lag_ms: f64,
    /// The most it ran behind (ms).
    pub max_lag_ms: f64,
    /// True only if nothing was dropped, cut short or left unfollowed:
    /// the cache saw every block that crossed the link. False: some
    /// repairs will come from the source.
    pub complete: bool,
    /// The store.
    pub store: StoreStats,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} blocks cached ({} MiB held of {} MiB), {} rejected, {} without a BLAKE3, \
             {} served, {} missed; {} connections, {} not followed",
            self.cached,
            self.store.bytes >> 20,
            self.store.bound >> 20,
            self.rejected,
            self.uncacheable,
            self.served,
            self.missed,
            self.streams,
            self.not_followed,
        )?;
        let why: Vec<String> = [
            (self.encrypted, "encrypted"),
            (self.malformed, "a frame did not decode"),
            (self.gaps, "bytes missing"),
            (self.joined, "seen only after their start"),
            (self.table_full, "too many at once"),
            (self.memory, "over the memory for following"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, w)| format!("{n} {w}"))
        .collect();
        if !why.is_empty() {
            write!(f, " ({})", why.join(", "))?;
        }
        if self.packets > 0 || self.kernel_drops > 0 {
            write!(
                f,
                "; {} packets, {} dropped by the kernel's ring and {} by the interface, {} truncated, \
                 {:.1} ms behind (at most {:.1})",
                self.packets,
                self.kernel_drops,
                self.iface_drops,
                self.truncated,
                self.lag_ms,
                self.max_lag_ms
            )?;
        }
        if !self.complete {
            write!(f, " — INCOMPLETE: some blocks were not seen")?;
        }
        Ok(())
    }
}
