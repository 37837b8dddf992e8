//! `intact-bench wan`: one large file over a long fat link, the wide-area
//! issue's first target: default `riva`, encryption on, against iperf3's
//! throughput on the same link.
//!
//! The link is the lab's: a source namespace behind the user-space delay
//! line (1 Gbit/s, `--rtt-ms` round trip, its queue one bandwidth-delay
//! product), a switch, a destination namespace. The hosts keep Linux's
//! default socket buffer limits (`tcp_wmem`/`tcp_rmem` at most 4/6 MiB),
//! as an untuned data transfer node would: one TCP stream then carries
//! about half of 1 Gbit/s at 30 ms, whatever the tool. The switch mirrors
//! the source's traffic to the testbed's idle cache host, as in every
//! wide-area bed of the lab.
//!
//! `--unshaped` measures first the same hosts joined without the delay
//! line and without `tbf` (veth pairs through the switch, no rate limit,
//! no added delay, nothing mirrored): what loopback measures, between two
//! hosts. Its section comes first on the page.
//!
//! Ways, interleaved in alternating order, each a fresh send of the file
//! to a server in the destination's namespace (riva, 4 MiB blocks, 4
//! streams, a pre-shared key, frames encrypted):
//! - `--spread never`: each file rides one stream (intact before the
//!   wide-area issue);
//! - `--spread auto` (the default): the file is cut into block ranges
//!   that all four streams carry;
//! - the peers (unless `--no-peers`): rsync over ssh from the source's
//!   namespace to an sshd in the destination's, with ssh's default cipher
//!   and with AES-128-GCM; rsync checks a whole-file checksum the
//!   receiver computes over the bytes it wrote, from memory.
//!
//! `--datasets` sends `intact-bench transfer`'s datasets as trees the
//! same ways (each copy checked for its files and bytes), so that many
//! files over the long link are measured against rsync too.
//!
//! Before the runs, iperf3 (4 streams) and raw TCP (4 streams) through the
//! same link give its physical limit; the ratio printed is intact's
//! median throughput over iperf3's. The source and the destination are a
//! file and an ext4 on a loop device on the disk (`--dir`), or both on a
//! RAM-backed ext4 (`--ram`), which takes the disk out.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use intact_faults::{LoopFs, Netbed, Wan};
use intact_proto::Key;
use intact_transfer::{SendOptions, ServerConfig, Spread as SpreadWhen, VerifyMode};

use crate::linkbed::{iperf3, raw_tcp, send_from, Dest};
use crate::loop_ext4::LoopExt4;
use crate::peers::{Gridftp, Resolver, Xrootd, GRIDFTP_VERIFIES, XROOTD_VERIFIES};
use crate::runner::{interleaved, self_cpu, stop_on_signals};
use crate::transfer::datasets::{self, Shape};
use crate::transfer::sshd::{Across, Sshd};

mod page;
mod summary;
mod way;

use page::LinkKind;

use way::{digest_of, line_cpu, Run, Way, AUTO_BLOCK, RCLONE_VERIFIES, WHAT};

const MIB: u64 = 1 << 20;

#[derive(clap::Args, Clone)]
pub struct WanArgs {
    /// Where the source file and the destination's loop-mounted ext4 go
    /// (a real disk).
    #[arg(long, default_value = "/var/tmp/intact-bench")]
    dir: PathBuf,
    /// Put the source and the destination on one RAM-backed ext4 instead.
    #[arg(long)]
    ram: bool,
    /// File sizes, MiB (one file each; 0: none).
    #[arg(long, value_delimiter = ',', default_value = "1024,4096")]
    sizes: Vec<u64>,
    /// Datasets of `intact-bench transfer` to send as trees too (medium:
    /// 2,000 × 1 MiB; small: 20,000 × 16 KiB; mixed; large; dirs).
    #[arg(long, value_delimiter = ',')]
    datasets: Vec<String>,
    /// Scale of the datasets (1.0: full size).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Runs per way, interleaved in alternating order.
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// Round trips of the 1 Gbit/s link, ms: one testbed after another,
    /// each measured in full (e.g. 0,30,89; given without a value: none,
    /// for `--unshaped` alone).
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "30")]
    rtt_ms: Vec<u64>,
    /// Also measure, first, the same hosts linked without the delay line
    /// and without a rate limit (veth pairs through the switch: what
    /// loopback measures between two hosts).
    #[arg(long)]
    unshaped: bool,
    /// MTU of the testbed's links (see `intact-bench cache --mtu`).
    #[arg(long, default_value_t = 9000)]
    mtu: u32,
    /// Leave out the peers (rsync and rclone over ssh, xrdcp, GridFTP).
    #[arg(long)]
    no_peers: bool,
    /// Also send with `--spread auto` and these fixed stream counts
    /// (beside the default, `--streams auto`), e.g. 4,6,8.
    #[arg(long, value_delimiter = ',')]
    streams: Vec<usize>,
    /// Also send with `--spread auto --streams auto` and these block
    /// sizes, KiB (beside the default, 4096), e.g. 1024,16384.
    #[arg(long, value_delimiter = ',', value_name = "KIB")]
    block_kib: Vec<usize>,
    /// Also send with `--spread auto --streams auto --block-size auto`.
    #[arg(long)]
    block_auto: bool,
    /// Cap the source host's TCP send buffers at this many bytes
    /// (`net.ipv4.tcp_wmem`'s largest value; Linux's default is 4 MiB),
    /// as a host with smaller buffers, or one on a faster link, has it:
    /// four streams then leave the link partly idle.
    #[arg(long, value_name = "BYTES")]
    sender_wmem: Option<u64>,
    /// Also write every run as a CSV row (DIR/wan-RTTms[-wmemK].csv, or
    /// DIR/wan-unshaped[-wmemK].csv) and each item's chart, throughput
    /// beside CPU seconds, as a PNG (the same stem, then -ITEM.png).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Regenerate the block of this markdown page between its markers
    /// (appended if it has none; nothing else of the page is touched)
    /// from this run's tables: per link and item, each way with what it
    /// verifies, whether it encrypts, time, CPU and CPU use, and the
    /// charts and CSV of `--out`, which it needs. The sections of links
    /// this run does not measure stay as an earlier run wrote them, each
    /// naming its run (a section from before sections named their run is
    /// given that line).
    #[arg(long, value_name = "FILE", requires = "out")]
    page: Option<PathBuf>,
}

pub fn run(a: &WanArgs) -> anyhow::Result<()> {
    stop_on_signals();
    if let Err(why) = intact_faults::netbed_usable().and(intact_faults::usable()) {
        bail!("cannot build the testbed here: {why}");
    }
    let sizes: Vec<u64> = a.sizes.iter().copied().filter(|&m| m > 0).collect();
    let shapes: Vec<Shape> = datasets::standard(a.scale)
        .into_iter()
        .filter(|s| a.datasets.iter().any(|d| d == s.name))
        .collect();
    if shapes.len() != a.datasets.len() {
        bail!(
            "unknown dataset among {:?} (known: {:?})",
            a.datasets,
            datasets::NAMES
        );
    }
    let command = crate::runner::command_line();
    let date = page::today();
    // A page the run could not write to fails now, not after hours.
    if let Some(path) = &a.page {
        page::check(path)?;
    }
    let kinds: Vec<LinkKind> = a
        .unshaped
        .then_some(LinkKind::Unshaped)
        .into_iter()
        .chain(a.rtt_ms.iter().map(|&rtt_ms| LinkKind::Wan { rtt_ms }))
        .collect();
    if kinds.is_empty() {
        bail!("no link to measure: give --rtt-ms values or --unshaped");
    }
    let mut links = Vec::new();
    for &kind in &kinds {
        links.push(run_link(a, kind, &sizes, &shapes)?);
        // After each link, so that a run cut short keeps what it measured
        // (the page says which links are still to come).
        if let (Some(path), Some(_)) = (&a.page, &a.out) {
            let dir = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            let pending = &kinds[links.len()..];
            let legend = [WHAT, RCLONE_VERIFIES, XROOTD_VERIFIES, GRIDFTP_VERIFIES];
            page::write(path, |kept| {
                page::render((&command, &date), dir, &links, kept, pending, &legend)
            })?;
            println!("\npage: {} (its generated block)", path.display());
        }
    }
    Ok(())
}

/// Prints `line` and keeps it for the page (which puts it on one line).
fn note(facts: &mut Vec<String>, line: String) {
    println!("{line}");
    facts.push(line);
}

/// Every item over one link: its own testbed, servers and peers.
fn run_link(
    a: &WanArgs,
    kind: LinkKind,
    sizes: &[u64],
    shapes: &[Shape],
) -> anyhow::Result<page::Link> {
    // What the page says of this link beside its tables.
    let mut facts: Vec<String> = Vec::new();
    // MiB the source and two copies (intact's, rsync's) need at most.
    let biggest = sizes.iter().copied().max().unwrap_or(0)
        + shapes
            .iter()
            .map(|s| s.bytes().div_ceil(MIB) + s.files() / 64)
            .sum::<u64>();
    let bed = match kind {
        LinkKind::Unshaped => Netbed::unshaped(a.mtu)?,
        LinkKind::Wan { rtt_ms } => Netbed::with_wan(Wan {
            rtt: Duration::from_millis(rtt_ms),
            rate: 1_000_000_000,
            loss: 0.0,
            mtu: a.mtu,
        })?,
    };
    if let Some(bytes) = a.sender_wmem {
        bed.source.cap_send_buffer(bytes)?;
    }
    let buffers = match a.sender_wmem {
        Some(b) => format!(
            "the source's TCP send buffers capped at {} KiB (tcp_wmem), the destination's Linux's defaults",
            b >> 10
        ),
        None => "in namespaces with Linux's default socket buffer limits".to_string(),
    };
    // The file systems: the source's directory and the destination's root.
    let (_ram, _lfs, src_dir, root, place) = if a.ram {
        let ram = LoopExt4::in_ram(biggest * 3 + 512)?;
        let m = ram.mount.clone();
        (
            Some(ram),
            None,
            m.join("src"),
            m.join("recv"),
            "both on a RAM-backed ext4".to_string(),
        )
    } else {
        std::fs::create_dir_all(&a.dir)?;
        let lfs = Arc::new(LoopFs::new(&a.dir, biggest * 2 + 256)?);
        let root = lfs.mnt().join("recv");
        (
            None,
            Some(lfs),
            a.dir.clone(),
            root,
            format!(
                "source a file in {}, destination an ext4 on a loop device there",
                a.dir.display()
            ),
        )
    };
    std::fs::create_dir_all(&src_dir)?;
    std::fs::create_dir_all(&root)?;
    let key = Key::generate()?;
    let rsync_dst = root.join("rsync");
    std::fs::create_dir_all(&rsync_dst)?;
    let rclone_dst = root.join("rclone");
    let ftp_dst = root.join("gridftp");
    let _resolver = if a.no_peers {
        None
    } else {
        Some(Resolver::for_hosts(&[&bed.source, &bed.destination])?)
    };
    let sshd = if a.no_peers {
        None
    } else {
        let dir = a.dir.join("sshd-wan");
        std::fs::create_dir_all(&a.dir)?;
        match Sshd::start_on(
            &dir,
            Some(Across {
                server: &bed.destination,
                client: &bed.source,
            }),
        ) {
            Ok(s) => Some(s),
            Err(why) => {
                note(&mut facts, format!("rsync over ssh not measured: {why}"));
                None
            }
        }
    };
    let mut ways = vec![
        (
            "intact riva, --spread never".to_string(),
            Way::Intact(SpreadWhen::Never, Some(4), None),
        ),
        (
            "intact riva, --spread auto --streams auto (default)".to_string(),
            Way::Intact(SpreadWhen::Auto, None, None),
        ),
    ];
    for &kib in &a.block_kib {
        ways.push((
            format!("intact riva, --streams auto --block-size {kib}KiB"),
            Way::Intact(SpreadWhen::Auto, None, Some(kib << 10)),
        ));
    }
    if a.block_auto {
        ways.push((
            "intact riva, --streams auto --block-size auto".to_string(),
            Way::Intact(SpreadWhen::Auto, None, Some(AUTO_BLOCK)),
        ));
    }
    for &n in &a.streams {
        ways.push((
            format!("intact riva, --spread auto --streams {n}"),
            Way::Intact(SpreadWhen::Auto, Some(n), None),
        ));
    }
    if let Some(s) = &sshd {
        ways.push((
            format!("rsync -a -e ssh ({})", s.default_cipher),
            Way::Rsync(None),
        ));
        ways.push((
            "rsync -a -e \"ssh -c aes128-gcm@openssh.com\"".to_string(),
            Way::Rsync(Some("aes128-gcm@openssh.com")),
        ));
        // rclone's copies are checked by MD5 only where it gets one.
        let probe = root.join("rclone-probe");
        std::fs::write(&probe, b"probe\n")?;
        match s.rclone_md5(&probe) {
            // md5sum of "probe\n".
            Ok(md5) if md5 == "1b234f2ba0a6ac3f3a0603acb23a4b57" => {
                ways.push(("rclone copy, sftp".to_string(), Way::Rclone))
            }
            Ok(other) => note(
                &mut facts,
                format!("rclone not measured: its MD5 of a probe is {other}, wrong"),
            ),
            Err(why) => note(&mut facts, format!("rclone not measured: {why:#}")),
        }
        let _ = std::fs::remove_file(&probe);
    }
    let across = || Across {
        server: &bed.destination,
        client: &bed.source,
    };
    let mut xrootd = None;
    let mut gridftp = None;
    if !a.no_peers {
        match Xrootd::start(&a.dir.join("xrootd-wan"), &root.join("xrootd"), across()) {
            Ok(x) => {
                xrootd = Some(x);
                ways.push(("xrdcp --cksum adler32, 4 streams".to_string(), Way::Xrdcp));
            }
            Err(why) => note(&mut facts, format!("xrdcp not measured: {why:#}")),
        }
        match Gridftp::start(&a.dir.join("gridftp-wan"), across()) {
            Ok(g) => {
                gridftp = Some(g);
                ways.push((
                    "globus-url-copy -p 4 -verify-checksum".to_string(),
                    Way::Gridftp,
                ));
            }
            Err(why) => note(&mut facts, format!("GridFTP not measured: {why:#}")),
        }
    }
    let dest = Dest::start(
        &bed.destination,
        ServerConfig {
            key: Some(key.clone()),
            encrypt: true,
            ..ServerConfig::local(&root)
        },
    )?;
    let path = match kind {
        LinkKind::Unshaped => format!(
            "source – veth (no rate limit, no added delay, MTU {}) – switch – veth – destination, nothing mirrored",
            a.mtu
        ),
        LinkKind::Wan { rtt_ms } => format!(
            "source – a user-space delay line (1 Gbit/s, {rtt_ms} ms round trip, its queue one bandwidth-delay product, MTU {}) – switch – destination, the switch mirroring the source's traffic to an idle fourth host",
            a.mtu
        ),
    };
    println!(
        "intact-bench wan: {path}, {buffers}; {place}; riva, 4 MiB blocks, --streams auto (4, growing to 16 while their send buffers hold them back) unless a way says otherwise, frames encrypted; {} interleaved runs per way",
        a.runs
    );
    facts.insert(
        0,
        format!(
            "the link is emulated: {path}, each a network namespace, the hosts {buffers}; {place}; intact: riva, 4 MiB blocks, --streams auto, frames encrypted with a pre-shared key, unless a way says otherwise; runs per way: {}, interleaved in alternating order",
            a.runs
        ),
    );
    let mut fact = |line: String| note(&mut facts, line);
    let tcp = raw_tcp(&bed, 512, 4)?;
    fact(format!(
        "the link's limit: raw TCP, 4 streams, 512 MiB: {:.0} Mbit/s",
        tcp / 1e6
    ));
    let one = raw_tcp(&bed, 256, 1)?;
    fact(format!(
        "one TCP stream, 256 MiB: {:.0} Mbit/s (what a file riding one stream can get)",
        one / 1e6
    ));
    let iperf = match iperf3(&bed) {
        Ok(bps) => {
            fact(format!(
                "the link's limit: iperf3, 4 streams, 5 s: {:.0} Mbit/s",
                bps / 1e6
            ));
            Some(bps)
        }
        Err(why) => {
            fact(format!("iperf3 not measured: {why}"));
            None
        }
    };
    if let Some(line) = &bed.wan {
        fact(format!("delay line after the probes: {}", line.summary()));
    }
    // What is sent: one file per size, then one tree per dataset.
    let mut items: Vec<(String, PathBuf, u64, Option<&Shape>)> = Vec::new();
    for &mib in sizes {
        let src = src_dir.join(format!("wan-src-{mib}.dat"));
        if std::fs::metadata(&src).map(|m| m.len()).ok() != Some(mib * MIB) {
            std::fs::write(&src, intact_sample::bytes((mib * MIB) as usize, mib))?;
        }
        items.push((format!("{mib} MiB, one file"), src, mib * MIB, None));
    }
    for shape in shapes {
        let src = src_dir.join(format!("wan-{}", shape.name)).join("data");
        shape.make(&src)?;
        items.push((shape.describe(), src, shape.bytes(), Some(shape)));
    }
    let clear = |p: &std::path::Path| {
        let _ = std::fs::remove_file(p);
        let _ = std::fs::remove_dir_all(p);
    };
    let stem = match a.sender_wmem {
        Some(b) => format!("{}-wmem{}k", kind.stem(), b >> 10),
        None => kind.stem(),
    };
    let mut csv = match &a.out {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            let mut w = csv::Writer::from_path(dir.join(format!("{stem}.csv")))?;
            w.write_record([
                "rtt_ms",
                "rate_mbit",
                "sender_wmem",
                "item",
                "way",
                "run",
                "seconds",
                "mbit_s",
                "cpu_s",
                "line_cpu_s",
                "ranges",
                "streams",
                "iperf3_mbit",
                "failed",
            ])?;
            Some(w)
        }
        None => None,
    };
    let mut items_done = Vec::new();
    for (title, src, bytes, shape) in &items {
        let (src, bytes) = (src.clone(), *bytes);
        let name = src.file_name().unwrap();
        let dst = root.join(name);
        let rsync_copy = rsync_dst.join(name);
        let rclone_copy = rclone_dst.join(name);
        let xrd_copy = xrootd.as_ref().map(|x| x.copy_of(&src));
        let ftp_copy = ftp_dst.join(name);
        let copies = [&dst, &rsync_copy, &rclone_copy, &ftp_copy];
        let want = match shape {
            None => Some(digest_of(&src)?),
            Some(_) => None,
        };
        let runs = interleaved(ways.len(), a.runs, |way| {
            for c in copies.iter().copied().chain(xrd_copy.as_ref()) {
                clear(c);
            }
            let sshd = || sshd.as_ref().expect("the ssh ways need the sshd");
            let line0 = line_cpu();
            let peer = match ways[way].1 {
                Way::Intact(..) => None,
                Way::Rsync(cipher) => Some(
                    sshd()
                        .timed_rsync(&src, &rsync_dst, cipher)
                        .map(|s| (s, &rsync_copy)),
                ),
                Way::Rclone => {
                    // A tree's contents go into the directory named.
                    let into = if shape.is_some() {
                        &rclone_copy
                    } else {
                        &rclone_dst
                    };
                    Some(sshd().timed_rclone(&src, into).map(|s| (s, &rclone_copy)))
                }
                Way::Xrdcp => {
                    let x = xrootd.as_mut().expect("the xrdcp way needs the xrootd");
                    let copy = xrd_copy.as_ref().expect("with the xrootd");
                    Some(x.timed_copy(&src).map(|s| (s, copy)))
                }
                Way::Gridftp => {
                    let g = gridftp.as_mut().expect("the GridFTP way needs its server");
                    Some(g.timed_copy(&src, &ftp_dst).map(|s| (s, &ftp_copy)))
                }
            };
            if let Some(peer) = peer {
                // A peer that fails is reported, not fatal to the others.
                let checked = peer.and_then(|(sample, copy)| {
                    match shape {
                        Some(shape) => shape.check_copy(copy)?,
                        // Untimed: the copy's bytes are the source's.
                        None if Some(digest_of(copy)?) != want => {
                            bail!("{} holds other bytes than the source", copy.display())
                        }
                        None => {}
                    }
                    Ok(sample)
                });
                return Ok(match checked {
                    Ok(sample) => Run {
                        secs: sample.wall,
                        cpu: sample.cpu,
                        line: line_cpu() - line0,
                        ranges: 0,
                        streams: 0,
                        steps: Vec::new(),
                        failed: None,
                        frames: String::new(),
                    },
                    Err(e) => Run {
                        secs: f64::NAN,
                        cpu: f64::NAN,
                        line: 0.0,
                        ranges: 0,
                        streams: 0,
                        steps: Vec::new(),
                        failed: Some(format!("{e:#}")),
                        frames: String::new(),
                    },
                });
            }
            let Way::Intact(spread, streams, block) = ways[way].1 else {
                unreachable!("every other way is a peer")
            };
            let (src, to, key) = (src.clone(), dest.addr.clone(), key.clone());
            let cpu0 = self_cpu();
            let t = Instant::now();
            let o = SendOptions {
                verify: VerifyMode::Riva,
                key: Some(key),
                spread,
                streams: streams.unwrap_or(intact_transfer::AUTO_START_STREAMS),
                max_streams: streams.unwrap_or(intact_transfer::AUTO_MAX_STREAMS),
                block_size: block
                    .filter(|&b| b != AUTO_BLOCK)
                    .unwrap_or(intact_digest::defaults::BLOCK_BYTES),
                block_auto: block == Some(AUTO_BLOCK),
                ..SendOptions::default()
            };
            let o_streams = o.streams;
            let report = send_from(&bed.source, vec![src], to, o)?;
            let secs = t.elapsed().as_secs_f64();
            if report.failed != 0 {
                bail!("a transfer failed: {report:?}");
            }
            let below = report.files.iter().find(|f| {
                f.kind == "file" && f.level != Some(intact_transfer::VerifyLevel::Device)
            });
            if let Some(f) = below {
                bail!("a file did not reach level device: {f:?}");
            }
            if let Some(shape) = shape {
                shape.check_copy(&dst)?;
            }
            if !report
                .frames
                .as_deref()
                .unwrap_or("")
                .starts_with("encrypted")
            {
                bail!("frames were not encrypted: {:?}", report.frames);
            }
            let line = line_cpu() - line0;
            Ok(Run {
                secs,
                cpu: self_cpu() - cpu0 - line,
                line,
                ranges: report.spread.map_or(0, |s| s.ranges),
                streams: report.streams.as_ref().map_or(o_streams, |t| t.ended),
                steps: report
                    .block_size
                    .map(|b| format!("block size {} KiB: {}", b.chosen >> 10, b.why))
                    .into_iter()
                    .chain(report.streams.map_or(Vec::new(), |t| t.steps))
                    .collect(),
                failed: None,
                frames: report.frames.unwrap_or_default(),
            })
        })?;
        for c in copies.iter().copied().chain(xrd_copy.as_ref()) {
            clear(c);
        }
        let item = summary::summarise(
            &summary::Context {
                a,
                kind,
                stem: &stem,
                iperf,
                cipher: sshd.as_ref().map(|s| s.default_cipher.as_str()),
                wan: bed.wan.as_ref(),
            },
            &ways,
            title,
            bytes,
            &runs,
            csv.as_mut(),
        )?;
        items_done.push(item);
    }
    println!("\n{WHAT}; {RCLONE_VERIFIES}; {XROOTD_VERIFIES}; {GRIDFTP_VERIFIES}.");
    if bed.wan.is_some() {
        println!("CPU: intact's both ends run in this process: its CPU seconds less the delay line's threads (named delayline-…, read from /proc/self/task), shown apart as line CPU (median); the peers': the client's processes and the server's (the sshd sessions, xrootd, GridFTP's sessions) meanwhile.");
    } else {
        println!("CPU: intact's both ends run in this process: its CPU seconds; the peers': the client's processes and the server's (the sshd sessions, xrootd, GridFTP's sessions) meanwhile. No delay line: no line CPU.");
    }
    drop(xrootd);
    drop(gridftp);
    drop(sshd);
    drop(dest);
    drop(bed);
    Ok(page::Link {
        kind,
        facts,
        items: items_done,
        csv: a.out.as_ref().map(|d| d.join(format!("{stem}.csv"))),
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::WanArgs;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        wan: WanArgs,
    }

    #[test]
    fn rtt_ms_without_a_value_measures_no_wide_area_link() {
        let c = Cli::try_parse_from(["wan", "--rtt-ms", "--unshaped"]).unwrap();
        assert!(c.wan.rtt_ms.is_empty());
        assert!(c.wan.unshaped);
        let c = Cli::try_parse_from(["wan", "--unshaped", "--rtt-ms", "30,89"]).unwrap();
        assert_eq!(c.wan.rtt_ms, [30, 89]);
        assert!(c.wan.unshaped);
        let c = Cli::try_parse_from(["wan"]).unwrap();
        assert_eq!(c.wan.rtt_ms, [30]);
        assert!(!c.wan.unshaped);
    }
}
