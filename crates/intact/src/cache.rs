//! `intact cache`: the recovery cache near a destination.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use intact_netcache::capture::{self, CaptureOptions};
use intact_netcache::relay::Relay;
use intact_netcache::service::Service;
use intact_netcache::{Counters, Store};
use signal_hook::consts::{SIGINT, SIGTERM};

use crate::stdout::outln;

pub const CACHE_ABOUT: &str = "\
A recovery cache near the destination (Nazarov & Arslan): it keeps the
blocks of transfers passing by, so that a block the receiver finds bad
(on arrival, or on the device re-read) is repaired from here, over a short
fast link, instead of crossing the slow path from the sender again.
Blocks are kept in memory (--memory) or in a directory (--store).

Feeding it: --capture IFACE reads the packets a switch mirrors onto IFACE
(e.g. tc's `action mirred egress mirror` in front of the receiver, both
directions), rebuilds each TCP connection and reads intact's frames from
it; --relay HOST:PORT --relay-listen ADDR has senders connect here instead
and forwards every byte to the receiver at HOST:PORT, unchanged.

What it keeps: only whole blocks that carry their BLAKE3 (senders add it
when the receiver runs `intact serve --recovery-cache`, for files not kept
out with `send --cache-exclude`) and whose bytes hash to it. It holds no
key and needs none: capture works only for sessions sent with
--no-encrypt (frames still authenticated); encrypted sessions pass the
relay unfollowed. It drops a file's blocks once the receiver reports the
file verified, and evicts the least recently used beyond --memory.

Nothing it serves is trusted: the receiver takes a block only if it hashes
to the BLAKE3 that came from the sender over their authenticated channel.

Receivers ask at --listen. Every 10 s (--status-every) a line goes to
stderr; on SIGINT or SIGTERM the report goes to stdout (--json for a
script). The report counts what the cache could not see (packets the
kernel dropped, packets cut short, connections joined late, encrypted or
broken by a hole) and says complete: false when there were any: repairs of
those blocks come from the sender.";

/// `intact cache`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("feed").required(true).multiple(true).args(["capture", "relay"]))]
pub struct CacheArgs {
    /// Capture the packets mirrored onto this interface (needs
    /// CAP_NET_RAW; the interface is put in promiscuous mode).
    #[arg(long, value_name = "IFACE")]
    pub capture: Option<String>,

    /// Relay: forward connections made to --relay-listen to the receiver
    /// at HOST:PORT, keeping their blocks.
    #[arg(long, value_name = "HOST:PORT", requires = "relay_listen")]
    pub relay: Option<String>,

    /// Where senders connect to the relay.
    #[arg(long, value_name = "ADDR:PORT", requires = "relay")]
    pub relay_listen: Option<String>,

    /// Where receivers ask for blocks (`serve --recovery-cache`).
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: String,

    /// Memory for blocks (K, M, G suffixes); the least recently used go
    /// first beyond it. Not with --store.
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = crate::args::parse_size)]
    pub memory: usize,

    /// Keep blocks in this directory instead of memory (one file per
    /// block, named by its BLAKE3; made mode 700 if missing; blocks left
    /// by an earlier run are served again, each hashed again when read).
    #[arg(long, value_name = "DIR", conflicts_with = "memory")]
    pub store: Option<std::path::PathBuf>,

    /// The most --store holds (K, M, G suffixes).
    #[arg(long, value_name = "SIZE", default_value = "16GiB", value_parser = crate::args::parse_size, requires = "store")]
    pub store_size: usize,

    /// Memory of the kernel's capture ring.
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = crate::args::parse_size)]
    pub ring: usize,

    /// Memory for following connections, all together (for the capture,
    /// and again for the relay): frames not yet whole, and bytes waiting
    /// behind holes while TCP connections are rebuilt. A connection that
    /// would pass it is no longer followed (the report counts it).
    #[arg(long, value_name = "SIZE", default_value = "256MiB", value_parser = crate::args::parse_size)]
    pub reassembly: usize,

    /// Seconds between status lines on stderr (0: none).
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    pub status_every: u64,

    /// The final report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &CacheArgs) -> anyhow::Result<ExitCode> {
    let store = match &args.store {
        Some(dir) => match Store::on_disk(dir, args.store_size as u64) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                eprintln!("intact cache: --store {}: {e}", dir.display());
                return Ok(ExitCode::FAILURE);
            }
        },
        None => Arc::new(Store::new(args.memory as u64)),
    };
    let counters = Arc::new(Counters::default());
    let stop = Arc::new(AtomicBool::new(false));
    // Misses wait for a block still in the capture's queue; the relay's
    // are final.
    let miss_wait = if args.capture.is_some() {
        intact_netcache::service::MISS_WAIT
    } else {
        Duration::ZERO
    };
    let service = match Service::start(
        &args.listen,
        Arc::clone(&store),
        Arc::clone(&counters),
        miss_wait,
    ) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("intact cache: cannot listen on {}: {e}", args.listen);
            return Ok(ExitCode::from(2));
        }
    };
    let relay = match (&args.relay, &args.relay_listen) {
        (Some(up), Some(listen)) => {
            let budget = intact_netcache::follow::Budget::new(args.reassembly);
            match Relay::start(
                listen,
                up.clone(),
                Arc::clone(&store),
                Arc::clone(&counters),
                budget,
            ) {
                Ok(r) => Some(r),
                Err(e) => {
                    eprintln!("intact cache: cannot listen on {listen}: {e}");
                    return Ok(ExitCode::from(2));
                }
            }
        }
        _ => None,
    };
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    let flag = Arc::clone(&stop);
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            flag.store(true, Ordering::SeqCst);
        }
    });
    let capturing = match &args.capture {
        Some(iface) => {
            let opts = CaptureOptions {
                iface: iface.clone(),
                ring: args.ring,
                reassembly: args.reassembly,
            };
            match capture::open(&opts) {
                Ok(c) => Some(c),
                Err(e) => {
                    eprintln!("intact cache: {e}");
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
        None => None,
    };
    let capture = capturing.map(|c| {
        let (store, counters, stop) =
            (Arc::clone(&store), Arc::clone(&counters), Arc::clone(&stop));
        std::thread::spawn(move || {
            let r = capture::run(c, store, counters, &stop);
            stop.store(true, Ordering::SeqCst);
            r
        })
    });
    let mut fed = Vec::new();
    if let Some(i) = &args.capture {
        fed.push(format!("capturing on {i}"));
    }
    if let Some(r) = &relay {
        fed.push(format!(
            "relaying {} to {}",
            r.addr(),
            args.relay.as_deref().unwrap_or("")
        ));
    }
    let kept = match &args.store {
        Some(dir) => format!(
            "blocks in {} (at most {} MiB; {} already there)",
            dir.display(),
            args.store_size >> 20,
            store.stats().blocks
        ),
        None => format!("{} MiB of memory for blocks", args.memory >> 20),
    };
    eprintln!(
        "intact cache: {}; serving receivers on {}; {kept}",
        fed.join(", "),
        service.addr(),
    );
    let mut last = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
        if args.status_every > 0 && last.elapsed() >= Duration::from_secs(args.status_every) {
            last = Instant::now();
            eprintln!("intact cache: {}", counters.report(store.stats()));
        }
    }
    let mut code = ExitCode::SUCCESS;
    if let Some(t) = capture {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                eprintln!("intact cache: {e}");
                code = ExitCode::FAILURE;
            }
            Err(_) => code = ExitCode::FAILURE,
        }
    }
    drop(relay);
    drop(service);
    let report = counters.report(store.stats());
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        outln!("intact cache: {report}")?;
    }
    Ok(code)
}
