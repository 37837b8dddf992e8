//! The capture: mirrored packets from an interface (AF_PACKET, TPACKET_V3
//! mapped ring, through `netring`), parsed (Ethernet, IPv4 or IPv6, TCP,
//! through `etherparse`) and handed to [`crate::tcp::Reassembly`].
//!
//! The interface is put in promiscuous mode: mirrored packets carry the
//! addresses of the hosts they were meant for, and only those packets
//! (addressed to another host) are followed; the cache host's own traffic
//! on the interface (receivers asking it for blocks) is not. Every packet the kernel
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
    /// Memory for following connections, all together: bytes waiting
    /// behind holes and frames not yet complete.
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
    let base = iface_rx_dropped(&opts.iface);
    let budget = crate::follow::Budget::new(opts.reassembly);
    let mut tcp = Reassembly::new(budget, store, Arc::clone(&counters));
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
                // Mirrored packets are addressed to other hosts; the
                // cache's own traffic (its service, anything else this
                // host sends or receives) is not the transfer's.
                if pkt.direction() != netring::PacketDirection::OtherHost {
                    counters.own_packets.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
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
            account_drops(&cap, &counters, &opts.iface, base);
            tcp.sweep(polled);
        }
    }
    account_drops(&cap, &counters, &opts.iface, base);
    Ok(())
}

fn account_drops(cap: &netring::Capture, counters: &Counters, iface: &str, base: Option<u64>) {
    // `stats` reads and resets the kernel's counters: add what it says.
    if let Ok(s) = cap.stats() {
        counters
            .kernel_drops
            .fetch_add(u64::from(s.drops), Ordering::Relaxed);
    }
    if let (Some(base), Some(now)) = (base, iface_rx_dropped(iface)) {
        counters
            .iface_drops
            .store(now.saturating_sub(base), Ordering::Relaxed);
    }
}

/// The first fields of the kernel's `struct rtnl_link_stats` (all
/// `__u32`), which `getifaddrs` points an AF_PACKET entry's data at.
#[repr(C)]
struct LinkStatsHead {
    rx_packets: u32,
    tx_packets: u32,
    rx_bytes: u32,
    tx_bytes: u32,
    rx_errors: u32,
    tx_errors: u32,
    rx_dropped: u32,
}

/// The interface's count of received packets it dropped before any
/// socket saw them (a full backlog: a mirror faster than the cache's
/// CPU), from the kernel's link statistics in this thread's network
/// namespace.
pub fn iface_rx_dropped(iface: &str) -> Option<u64> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list freed below; each entry's
    // fields are valid until then, and `ifa_data` of an AF_PACKET entry
    // points to the link's `rtnl_link_stats`.
    unsafe {
        if libc::getifaddrs(&mut head) != 0 {
            return None;
        }
        let mut found = None;
        let mut p = head;
        while !p.is_null() {
            let a = &*p;
            if !a.ifa_addr.is_null()
                && i32::from((*a.ifa_addr).sa_family) == libc::AF_PACKET
                && !a.ifa_data.is_null()
                && std::ffi::CStr::from_ptr(a.ifa_name).to_bytes() == iface.as_bytes()
            {
                let stats = &*(a.ifa_data as *const LinkStatsHead);
                found = Some(u64::from(stats.rx_dropped));
            }
            p = a.ifa_next;
        }
        libc::freeifaddrs(head);
        found
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
