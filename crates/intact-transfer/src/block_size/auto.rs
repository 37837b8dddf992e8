//! Putting the probe and Eq. 1 together for one transfer: what is probed
//! where, what is modelled instead, and the report that says which.

use std::path::Path;
use std::time::{Duration, Instant};

use intact_digest::defaults;

use super::{bytes_that_matter, choose, mib, probe, rereads_from_device, BlockSizeReport};
use super::{Cost, Stages, MIN_BYTES};
use crate::source::{Scan, SourceKind};
use crate::verify::VerifyMode;

/// Where the transfer goes.
pub(crate) enum Receiver<'a> {
    /// A local copy into this directory: its file system is probed,
    /// unless its journal already holds one of the files (`held`: its
    /// path and block size), whose size is then kept.
    Local(&'a Path, Option<(String, u64)>),
    /// A server, `rtt` away: its device is not probed here.
    Remote {
        /// The round trip the streams' connects took.
        rtt: Duration,
        /// Whether large files may be spread over the streams (then one
        /// file's blocks share all of them).
        spread: bool,
    },
}

/// Round trips from which the network is modelled: one TCP window per
/// round trip per stream (the same threshold from which files spread).
const NETWORK_FROM: Duration = crate::net::AUTO_MIN_RTT;

/// Chooses the block size for sending `scan` in `mode` over `streams` to
/// `to`, probing what it can; never fails (a probe that cannot run keeps
/// the default, and the report says why). `given` stage costs replace the
/// probe (tests only).
pub(crate) fn decide(
    scan: &Scan,
    mode: VerifyMode,
    streams: usize,
    to: Receiver<'_>,
    given: Option<Stages>,
) -> BlockSizeReport {
    let default = defaults::BLOCK_BYTES as u64;
    let files: Vec<_> = scan
        .entries
        .iter()
        .filter(|e| e.kind == SourceKind::File && e.range.is_none())
        .collect();
    let sizes: Vec<u64> = files.iter().map(|e| e.size).collect();
    let unpredicted =
        |chosen: u64, why: String, measured: Vec<String>, probe_seconds: f64| BlockSizeReport {
            chosen,
            why,
            predicted: Vec::new(),
            stages: None,
            measured,
            probe_seconds,
        };
    let keep = |why, measured, probe_seconds| unpredicted(default, why, measured, probe_seconds);
    if let Receiver::Local(_, Some((path, block))) = &to {
        return unpredicted(
            *block,
            format!(
                "the destination's journal holds {path} at {} from an earlier run: kept, so that what it holds is not sent again",
                mib(*block)
            ),
            Vec::new(),
            0.0,
        );
    }
    let matter = bytes_that_matter(&sizes);
    if matter < MIN_BYTES {
        return keep(
            format!(
                "{} in files larger than {}, under {}: every candidate cuts them about the same, the default is kept unprobed",
                mib_or_less(matter),
                mib(super::CANDIDATES[0]),
                mib(MIN_BYTES)
            ),
            Vec::new(),
            0.0,
        );
    }
    let t = Instant::now();
    if let Some(stages) = given {
        return predicted(
            stages,
            &sizes,
            (streams_for(&to, streams, &sizes), spreads(&to)),
            vec!["stage costs given, not probed (a test)".to_string()],
            t,
        );
    }
    let largest = files
        .iter()
        .max_by_key(|e| e.size)
        .expect("some bytes matter");
    let read = match probe::source(&largest.abs) {
        Ok(Some(c)) => c,
        Ok(None) => {
            return keep(
                "the source's probe times were not usable: the default is kept".to_string(),
                Vec::new(),
                t.elapsed().as_secs_f64(),
            )
        }
        Err(e) => {
            return keep(
                format!("the source could not be probed ({e}): the default is kept"),
                Vec::new(),
                t.elapsed().as_secs_f64(),
            )
        }
    };
    let mut measured = vec![format!(
        "source: read from its device and digested, {} ({})",
        show(read),
        largest.abs.display()
    )];
    let device = rereads_from_device(mode);
    let (transfer, verify, evict) = match to {
        Receiver::Local(dir, _) => match probe::destination(dir) {
            Ok(d) => {
                measured.push(format!(
                    "destination: write {}, write-back and eviction {}, re-read and digest {} ({})",
                    show(d.write),
                    show(d.evict),
                    show(d.reread),
                    dir.display()
                ));
                if device {
                    (read, d.write.then(d.evict).then(d.reread), d.evict)
                } else {
                    (read, d.write, Cost::default())
                }
            }
            Err(e) => {
                return keep(
                    format!("the destination could not be probed ({e}): the default is kept"),
                    measured,
                    t.elapsed().as_secs_f64(),
                )
            }
        },
        Receiver::Remote { rtt, .. } => {
            measured.push(
                "server: its device is not probed from here; its verify stage is modelled as a re-read as costly as this host's source read"
                    .to_string(),
            );
            let mut transfer = read;
            if rtt >= NETWORK_FROM {
                let window = send_window();
                let per_byte = rtt.as_secs_f64() / window as f64;
                measured.push(format!(
                    "network: round trip {:.1} ms, at most one {} window per round trip per stream ({:.0} MB/s)",
                    rtt.as_secs_f64() * 1e3,
                    mib_or_less(window),
                    1e-6 / per_byte
                ));
                transfer.per_byte = transfer.per_byte.max(per_byte);
            } else {
                measured.push(format!(
                    "network: round trip {:.2} ms, under {} ms: not modelled",
                    rtt.as_secs_f64() * 1e3,
                    NETWORK_FROM.as_millis()
                ));
            }
            (transfer, read, Cost::default())
        }
    };
    let stages = Stages {
        transfer,
        verify,
        evict,
    };
    let k = streams_for(&to, streams, &sizes);
    predicted(stages, &sizes, (k, spreads(&to)), measured, t)
}

/// Whether a file's blocks share the streams.
fn spreads(to: &Receiver<'_>) -> bool {
    matches!(to, Receiver::Remote { spread: true, .. })
}

/// The streams a file's blocks share: one file rides one stream unless a
/// send spreads it.
fn streams_for(to: &Receiver<'_>, streams: usize, sizes: &[u64]) -> usize {
    match to {
        Receiver::Remote { spread: true, .. } => streams,
        _ => streams.min(sizes.iter().filter(|&&s| s > 0).count()).max(1),
    }
}

/// The report of Eq. 1's choice from `stages`.
fn predicted(
    stages: Stages,
    sizes: &[u64],
    (k, spread): (usize, bool),
    measured: Vec<String>,
    t: Instant,
) -> BlockSizeReport {
    let (chosen, predicted, why) = choose(&stages, sizes, k, spread);
    BlockSizeReport {
        chosen,
        why,
        predicted,
        stages: Some(stages),
        measured,
        probe_seconds: t.elapsed().as_secs_f64(),
    }
}

/// The most a TCP send buffer grows to here (`net.ipv4.tcp_wmem`'s
/// largest value; Linux's default, 4 MiB, if unreadable).
fn send_window() -> u64 {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_wmem")
        .ok()
        .and_then(|s| s.split_whitespace().nth(2)?.parse().ok())
        .filter(|&w: &u64| w > 0)
        .unwrap_or(4 << 20)
}

/// `12 µs/block + 1.5 GB/s`.
fn show(c: Cost) -> String {
    let rate = if c.per_byte > 0.0 {
        format!("{:.0} MB/s", 1e-6 / c.per_byte)
    } else {
        "no cost per byte".to_string()
    };
    format!("{:.0} µs per block + {rate}", c.per_block * 1e6)
}

fn mib_or_less(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}
