//! The capture: mirrored packets from an interface (AF_PACKET, TPACKET_V3
//! mapped ring, through `netring`), parsed (Ethernet, IPv4 or IPv6, TCP,
//! through `etherparse`) and handed to [`crate::tcp::Reassembly`].
//!
//! The interface is put in promiscuous mode: mirrored packets carry the
//! addresses of the hosts they were meant for. Every packet the kernel
//! dropped because the ring was full is counted (PACKET_STATISTICS), as
//! is every packet cut short, and how far behind the kernel's timestamps
//! the capture runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use etherparse::{NetSlice, SlicedPacket, TransportSlice};

use crate::stats::Counters;
use crate::store::Store;
use crate::tcp::{Reassembly, Segment};

/// Why the capture could not run.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// Opening the ring (no such interface, no CAP_NET_RAW, no memory).
    #[error("capturing on {iface}: {source}")]
    Open {
        /// The interface.
        iface: String,
        /// What the capture library said.
        source: netring::Error,
    },
    /// Reading the ring.
    #[error("reading packets on {iface}: {source}")]
    Read {
        /// The interface.
        iface: String,
        /// What the capture library said.
        source: netring::Error,
    },
}

/// How to capture.
#[derive(Debug, Clone)]
pub struct CaptureOptions {
    /// The interface the switch mirrors onto.
    pub iface: String,
    /// Bytes of the kernel's ring (a power of two of 1 MiB blocks).
    pub ring: usize,
    /// Bytes that may wait behind holes in all connections together.
    pub reassembly: usize,
}

/// Ring block size: large enough for a 64 KiB GSO packet with headers.
const RING_BLOCK: usize = 1 << 20;

/// A capture whose ring is set up: packets are kept from now on.
pub struct Capturing {
    cap: netring::Capture,
    opts: CaptureOptions,
}

/// Sets up the ring on `opts.iface` (packets are kept from now on).
pub fn open(opts: &CaptureOptions) -> Result<Capturing, CaptureError> {
    let blocks = (opts.ring / RING_BLOCK).max(4);
    let cap = netring::Capture::builder()
        .interface(&opts.iface)
        .block_size(RING_BLOCK)
        .block_count(blocks)
        .block_timeout_ms(10)
        .promiscuous(true)
        .poll_timeout(Duration::from_millis(100))
        .build()
        .map_err(|source| CaptureError::Open {
            iface: opts.iface.clone(),
            source,
        })?;
    Ok(Capturing {
        cap,
        opts: opts.clone(),
    })
}

/// Captures until `stop` is set.
pub fn run(
    capturing: Capturing,
    store: Arc<Store>,
    counters: Arc<Counters>,
    stop: &AtomicBool,
) -> Result<(), CaptureError> {
    let Capturing { mut cap, opts } = capturing;
    let mut tcp = Reassembly::new(opts.reassembly, store, Arc::clone(&counters));
    let mut polled = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        let mut last = None;
        if let Some(batch) = cap
            .next_batch_blocking(Duration::from_millis(100))
            .map_err(|source| CaptureError::Read {
                iface: opts.iface.clone(),
                source,
            })?
        {
            for pkt in &batch {
                counters.packets.fetch_add(1, Ordering::Relaxed);
                if pkt.len() < pkt.original_len() {
                    counters.truncated.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                last = Some(pkt.timestamp().to_system_time());
                handle(pkt.data(), &mut tcp);
            }
        }
        if let Some(t) = last {
            let lag = SystemTime::now()
                .duration_since(t)
                .unwrap_or_default()
                .as_micros() as u64;
            counters.lag_micros.store(lag, Ordering::Relaxed);
            counters.max_lag_micros.fetch_max(lag, Ordering::Relaxed);
        }
        if polled.elapsed() > Duration::from_millis(250) {
            polled = Instant::now();
            account_drops(&cap, &counters);
            tcp.sweep(polled);
        }
    }
    account_drops(&cap, &counters);
    Ok(())
}

fn account_drops(cap: &netring::Capture, counters: &Counters) {
    // `stats` reads and resets the kernel's counters: add what it says.
    if let Ok(s) = cap.stats() {
        counters
            .kernel_drops
            .fetch_add(u64::from(s.drops), Ordering::Relaxed);
    }
}

/// Parses one Ethernet frame and hands a TCP segment on.
pub fn handle(frame: &[u8], tcp: &mut Reassembly) {
    let Ok(p) = SlicedPacket::from_ethernet(frame) else {
        return;
    };
    let (src, dst) = match &p.net {
        Some(NetSlice::Ipv4(ip)) => (
            std::net::IpAddr::from(ip.header().source_addr()),
            std::net::IpAddr::from(ip.header().destination_addr()),
        ),
        Some(NetSlice::Ipv6(ip)) => (
            std::net::IpAddr::from(ip.header().source_addr()),
            std::net::IpAddr::from(ip.header().destination_addr()),
        ),
        _ => return,
    };
    let Some(TransportSlice::Tcp(t)) = &p.transport else {
        return;
    };
    tcp.segment(Segment {
        from: (src, t.source_port()).into(),
        to: (dst, t.destination_port()).into(),
        seq: t.sequence_number(),
        syn: t.syn(),
        ack: t.ack(),
        fin: t.fin(),
        rst: t.rst(),
        payload: t.payload(),
    });
}
