//! `intact-bench cache`: the recovery-cache paper's Tables I and II
//! (Nazarov & Arslan) on its testbed (Fig. 4) in network namespaces: a
//! source behind a 1 Gbit/s link (tbf), a switch that mirrors the source's
//! traffic with the destination onto the cache's link, a destination whose
//! device flips a bit under one written block (a loop-mounted ext4 on the
//! disk), and a cache capturing the mirror (`intact cache --capture`'s
//! code, in this process).
//!
//! Four ways to recover from one damaged block, interleaved:
//! - (a) regular: the whole file sent again by the source (the paper's
//!   "regular": a file-level checksum fails, the file comes again);
//! - (b) the paper's scheme: the whole file sent again from the cache's
//!   host over its fast link (emulated: the cache's host sends a copy of
//!   the file it holds; the paper's cache rebuilds it from its capture);
//! - (c) intact without a cache: the receiver's device re-read (riva)
//!   finds the block, and the source sends its bad page again;
//! - (d) intact with the cache: the block comes from the cache.
//!
//! Recovery time: (a), (b) the second transfer; (c), (d) the receiver's
//! own measure from the block's failure to its verified repair (in the
//! sender's report). Total: the first transfer plus the recovery for (a)
//! and (b), the faulted transfer for (c) and (d). CPU: this process (all
//! four hosts).
//!
//! The source's link is the paper's WAN: 1 Gbit/s with a 30 ms round
//! trip (`--rtt-ms`), made by the lab's user-space delay line (two TUN
//! devices; this kernel has no netem), its queue one bandwidth-delay
//! product. Before the runs, raw TCP over that link (four streams, as
//! intact sends) and iperf3 (where installed) give the link's physical
//! limit, and the line's own
//! account (packets it wrote late, queue drops) is printed after each
//! size so that a line that fell behind is seen. `--rtt-ms 0` is the
//! earlier testbed: a veth pair shaped by tbf, no added delay.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use intact_faults::{Host, LoopFs, Netbed, Wan};
use intact_netcache::capture::{self, CaptureOptions};
use intact_netcache::service::Service;
use intact_netcache::{Counters, RecoveryCaches, Store};
use intact_proto::Key;
use intact_transfer::{
    CopyReport, ReceiveOptions, SendOptions, ServerConfig, VerifyMode, WriteHook,
};

use crate::linkbed::{iperf3, raw_tcp, send_from, Dest};
use crate::runner::{interleaved, self_cpu, stop_on_signals, Spread};

const MIB: u64 = 1 << 20;

#[derive(clap::Args, Clone)]
pub struct CacheArgs {
    /// Where the source files and the destination's loop-mounted ext4 go
    /// (a real disk).
    #[arg(long, default_value = "/var/tmp/intact-bench")]
    dir: PathBuf,
    /// File sizes, MiB.
    #[arg(long, value_delimiter = ',', default_value = "100,1024")]
    sizes: Vec<u64>,
    /// Runs per way, interleaved in alternating order.
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// Block size, MiB.
    #[arg(long, default_value_t = 4)]
    block_mib: u64,
    /// Round trip added to the source's 1 Gbit/s link, ms (0: a veth
    /// shaped by tbf, no delay line).
    #[arg(long, default_value_t = 30)]
    rtt_ms: u64,
    /// MTU of the testbed's links with a round trip (9000: jumbo frames,
    /// as research networks carry; at 1500 the user-space delay line
    /// falls behind on two cores, which it reports).
    #[arg(long, default_value_t = 9000)]
    mtu: u32,
}

const WAYS: [&str; 4] = [
    "(a) whole file from the source",
    "(b) whole file from the cache",
    "(c) intact: block from the source",
    "(d) intact: block from the cache",
];

struct Run {
    recovery: f64,
    total: f64,
    cpu: f64,
}

pub fn run(a: &CacheArgs) -> anyhow::Result<()> {
    stop_on_signals();
    if let Err(why) = intact_faults::netbed_usable().and(intact_faults::usable()) {
        bail!("cannot build the testbed here: {why}");
    }
    let bs = (a.block_mib * MIB) as usize;
    std::fs::create_dir_all(&a.dir)?;
    let biggest = a.sizes.iter().copied().max().unwrap_or(100);
    let bed = if a.rtt_ms == 0 {
        Netbed::new()?
    } else {
        Netbed::with_wan(Wan {
            rtt: Duration::from_millis(a.rtt_ms),
            rate: 1_000_000_000,
            loss: 0.0,
            mtu: a.mtu,
        })?
    };
    let lfs = Arc::new(LoopFs::new(&a.dir, biggest * 3 + 256)?);
    // The cache: capture on the mirror, serve on its link.
    let store = Arc::new(Store::new((biggest * 2 + 64) * MIB));
    let counters = Arc::new(Counters::default());
    let stopping = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let cache = {
        let (store, counters, stopping) = (store.clone(), counters.clone(), stopping.clone());
        bed.cache.spawn(move || -> anyhow::Result<()> {
            let cap = capture::open(&CaptureOptions {
                iface: Netbed::MIRROR_IFACE.into(),
                ring: 256 << 20,
                reassembly: 256 << 20,
            })?;
            let svc = Service::start(
                "10.91.3.1:0",
                store.clone(),
                counters.clone(),
                intact_netcache::service::MISS_WAIT,
            )?;
            tx.send(svc.addr()).unwrap();
            capture::run(cap, store, counters, &stopping)?;
            Ok(())
        })?
    };
    let cache_addr = rx.recv().context("the cache did not start")?;
    // The destination's device flips one bit under block `armed` the first
    // time it is written after arming.
    let armed = Arc::new(AtomicU64::new(u64::MAX));
    let hook: WriteHook = {
        let (lfs, armed) = (Arc::clone(&lfs), Arc::clone(&armed));
        Arc::new(move |f: &File, _p: &str, i: u64, offset: u64, _l: usize| {
            if armed
                .compare_exchange(i, u64::MAX, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                lfs.flip_bit_under(f, offset + 12345).expect("flip");
            }
        })
    };
    let key = Key::generate()?;
    // One root per server (a root has one server).
    let roots = [lfs.mnt().join("recv"), lfs.mnt().join("recv-cached")];
    for r in &roots {
        std::fs::create_dir_all(r)?;
    }
    let cfg = |root: &PathBuf, recovery: Option<RecoveryCaches>| ServerConfig {
        key: Some(key.clone()),
        encrypt: false,
        receive: ReceiveOptions {
            after_write: Some(hook.clone()),
            recovery,
            ..ReceiveOptions::default()
        },
        ..ServerConfig::local(root)
    };
    let plain = Dest::start(&bed.destination, cfg(&roots[0], None))?;
    let with_cache = Dest::start(
        &bed.destination,
        cfg(
            &roots[1],
            Some(RecoveryCaches::new(vec![cache_addr.to_string()])),
        ),
    )?;
    let link = if a.rtt_ms == 0 {
        "–1 Gbit/s tbf, no added delay–".to_string()
    } else {
        format!(
            "–1 Gbit/s, {} ms round trip, MTU {} (user-space delay line, queue one BDP)–",
            a.rtt_ms, a.mtu
        )
    };
    println!(
        "intact-bench cache: the paper's testbed in namespaces (source {link} switch, mirror to the cache, destination on a loop ext4 on {}); riva, {} MiB blocks, 4 streams, frames authenticated not encrypted; one bit flipped on the device under the middle block; {} interleaved runs per way",
        a.dir.display(),
        a.block_mib,
        a.runs
    );
    let probe = raw_tcp(&bed, 512, 4)?;
    println!(
        "the link's limit: raw TCP, 4 streams, 512 MiB source → destination: {:.0} Mbit/s",
        probe / 1e6
    );
    match iperf3(&bed) {
        Ok(bps) => println!(
            "the link's limit: iperf3, 4 streams, 5 s source → destination: {:.0} Mbit/s",
            bps / 1e6
        ),
        Err(why) => println!("iperf3 not measured: {why}"),
    }
    if let Some(line) = &bed.wan {
        println!("delay line after the probes: {}", line.summary());
    }
    for &mib in &a.sizes {
        let src = a.dir.join(format!("cache-src-{mib}.dat"));
        if std::fs::metadata(&src).map(|m| m.len()).ok() != Some(mib * MIB) {
            std::fs::write(&src, intact_sample::bytes((mib * MIB) as usize, mib))?;
        }
        let bad = (mib * MIB / bs as u64) / 2;
        let sender = |from: &Host, to: &str, fault: bool| -> anyhow::Result<(f64, CopyReport)> {
            for r in &roots {
                let _ = std::fs::remove_file(r.join(src.file_name().unwrap()));
            }
            if fault {
                armed.store(bad, Ordering::SeqCst);
            }
            let (src, to, key) = (src.clone(), to.to_string(), key.clone());
            let t = Instant::now();
            let o = SendOptions {
                verify: VerifyMode::Riva,
                block_size: bs,
                streams: 4,
                key: Some(key),
                ..SendOptions::default()
            };
            let report = send_from(from, vec![src], to, o)?;
            let secs = t.elapsed().as_secs_f64();
            armed.store(u64::MAX, Ordering::SeqCst);
            if report.failed != 0 {
                bail!("a transfer failed: {report:?}");
            }
            Ok((secs, report))
        };
        let drops0 = counters.kernel_drops.load(Ordering::SeqCst);
        let runs = interleaved(4, a.runs, |way| {
            let cpu0 = self_cpu();
            let r = match way {
                0 | 1 => {
                    let (first, _) = sender(&bed.source, &plain.addr, false)?;
                    let from = if way == 0 { &bed.source } else { &bed.cache };
                    let (again, _) = sender(from, &plain.addr, false)?;
                    Run {
                        recovery: again,
                        total: first + again,
                        cpu: 0.0,
                    }
                }
                _ => {
                    let to = if way == 2 {
                        &plain.addr
                    } else {
                        &with_cache.addr
                    };
                    let (total, rep) = sender(&bed.source, to, true)?;
                    let f = rep
                        .files
                        .iter()
                        .find(|f| f.kind == "file")
                        .context("no file")?;
                    let (n, secs) = if way == 2 {
                        (f.blocks_from_source, f.source_repair_seconds)
                    } else {
                        (f.blocks_from_cache, f.cache_seconds)
                    };
                    if n != 1 {
                        bail!("{}: {n} blocks repaired that way, not 1: {f:?}", WAYS[way]);
                    }
                    Run {
                        recovery: secs,
                        total,
                        cpu: 0.0,
                    }
                }
            };
            Ok(Run {
                cpu: self_cpu() - cpu0,
                ..r
            })
        })?;
        // The capture may still be working through the last run's tail:
        // let it settle (and any hole time out) before its account.
        std::thread::sleep(intact_netcache::tcp::GAP_TIMEOUT + Duration::from_secs(1));
        let drops = counters.kernel_drops.load(Ordering::SeqCst) - drops0;
        println!();
        println!(
            "{mib} MiB ({} blocks), seconds min / median / max:",
            mib * MIB / bs as u64
        );
        println!(
            "{:<36} {:>22} {:>22} {:>20}",
            "way", "recovery", "total", "CPU s (all hosts)"
        );
        let med = |v: &[Run], f: fn(&Run) -> f64| Spread::of(&v.iter().map(f).collect::<Vec<_>>());
        for (way, v) in runs.iter().enumerate() {
            println!(
                "{:<36} {:>22} {:>22} {:>20}",
                WAYS[way],
                fmt3(med(v, |r| r.recovery)),
                fmt3(med(v, |r| r.total)),
                fmt3(med(v, |r| r.cpu)),
            );
        }
        let m = |way: usize, f: fn(&Run) -> f64| med(&runs[way], f).median;
        println!(
            "(b) vs (a): recovery −{:.0} %, total −{:.0} % (the paper: ≈ 50 %, ≈ 20 %)",
            100.0 * (1.0 - m(1, |r| r.recovery) / m(0, |r| r.recovery)),
            100.0 * (1.0 - m(1, |r| r.total) / m(0, |r| r.total)),
        );
        println!(
            "recovery (a) ÷ (d): {:.0}×; (c) ÷ (d): {:.2}×; (a) ÷ (c): {:.0}×",
            m(0, |r| r.recovery) / m(3, |r| r.recovery),
            m(2, |r| r.recovery) / m(3, |r| r.recovery),
            m(0, |r| r.recovery) / m(2, |r| r.recovery),
        );
        println!(
            "capture: {drops} packets dropped by the kernel during these runs; {}",
            counters.report(store.stats())
        );
        if let Some(line) = &bed.wan {
            println!("delay line so far: {}", line.summary());
            if let Ok([s, w]) = line.kernel_drops() {
                println!("its TUN devices dropped {s} (source) and {w} (switch) packets unread");
            }
        }
        for r in &roots {
            let _ = std::fs::remove_file(r.join(src.file_name().unwrap()));
        }
    }
    drop(plain);
    drop(with_cache);
    stopping.store(true, Ordering::SeqCst);
    cache
        .join()
        .map_err(|_| anyhow::anyhow!("the capture panicked"))??;
    drop(bed);
    Ok(())
}

fn fmt3(s: Spread) -> String {
    format!("{:.3} / {:.3} / {:.3}", s.min, s.median, s.max)
}
