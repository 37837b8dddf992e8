//! A network testbed of the recovery-cache paper (Nazarov & Arslan,
//! Fig. 4), made of network namespaces joined by veth pairs and deleted
//! on drop: a source host, a switch, a destination host and a cache host.
//!
//! ```text
//!  source 10.91.1.1 ── 1 Gbit/s (tbf) ── switch ── destination 10.91.2.1
//!                                           │
//!                                           └──── cache 10.91.3.1
//! ```
//!
//! The switch routes between the three links. On its destination link,
//! tc's `mirred egress mirror` copies every packet between the source's
//! subnet and the destination, both directions (data towards the
//! destination, results back), onto the cache link, as the paper's P4
//! switch mirrors the transfer. Traffic between the destination and the
//! cache (repairs) is not mirrored.
//!
//! [`Netbed::new`] joins source and switch with a veth pair shaped by
//! `tbf` and no added delay. [`Netbed::with_wan`] joins them with the
//! user-space [`DelayLine`] instead (this kernel has no `netem`): two TUN
//! devices, the rate, the queue, the one-way delay each way and any loss
//! kept by the line, which also says whether it fell behind.
//! [`Netbed::unshaped`] shapes nothing and mirrors nothing: veth pairs
//! through the switch, as fast as the kernel moves packets.
//!
//! Root only. [`Host::spawn`] runs a closure on a thread that has entered
//! a host's namespace: sockets it (and the threads it starts) makes live
//! there.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::delayline::{DelayLine, Shape, TunEnd};

/// One host (network namespace) of the testbed.
#[derive(Debug)]
pub struct Host {
    /// The namespace's name (`ip netns exec NAME …`).
    pub name: String,
    /// Its address.
    pub ip: &'static str,
}

impl Host {
    /// Runs `f` on a new thread inside this namespace.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> io::Result<std::thread::JoinHandle<T>> {
        let ns = File::open(format!("/run/netns/{}", self.name))?;
        std::thread::Builder::new().spawn(move || {
            // SAFETY: setns on a descriptor this thread owns; it moves only
            // this thread into the namespace.
            let r = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns: {}", io::Error::last_os_error());
            drop(ns);
            f()
        })
    }

    /// `program` run inside this namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// Caps the send buffer a TCP socket of this host may grow to
    /// (`net.ipv4.tcp_wmem`'s largest value, per namespace), as a host
    /// with smaller buffers, or one on a faster link, has it: each stream
    /// then carries at most `bytes` per round trip. Gone with the
    /// namespace.
    pub fn cap_send_buffer(&self, bytes: u64) -> io::Result<()> {
        let out = self
            .command("sysctl")
            .args(["-w", &format!("net.ipv4.tcp_wmem=4096 16384 {bytes}")])
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "sysctl net.ipv4.tcp_wmem in {}: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }
}

/// The four hosts; the namespaces are deleted on drop.
#[derive(Debug)]
pub struct Netbed {
    /// The sender's host.
    pub source: Host,
    /// The switch (routes; shapes and mirrors, except when unshaped).
    pub switch: Host,
    /// The receiver's host.
    pub destination: Host,
    /// The cache's host; its interface [`Netbed::MIRROR_IFACE`] gets the
    /// mirrored packets (none in [`Netbed::unshaped`]).
    pub cache: Host,
    /// The delay line between source and switch ([`Netbed::with_wan`]).
    pub wan: Option<DelayLine>,
}

/// The source's link as a wide-area one.
#[derive(Debug, Clone, Copy)]
pub struct Wan {
    /// Round-trip time added (half each way).
    pub rtt: Duration,
    /// Bits per second each way.
    pub rate: u64,
    /// Probability of losing a packet, each way.
    pub loss: f64,
    /// The MTU of every link of the bed: 1500 as on the Internet, 9000
    /// (jumbo frames) as research networks carry. Each packet costs the
    /// delay line two system calls and a pass through the switch's stack,
    /// so jumbo frames let it keep 1 Gbit/s on fewer cores.
    pub mtu: u32,
}

/// How the source's link is made.
#[derive(Clone, Copy)]
enum Links {
    /// A veth pair shaped to 1 Gbit/s by `tbf`.
    Tbf,
    /// Through a delay line.
    Wan(Wan),
    /// A veth pair, nothing shaped.
    Unshaped { mtu: u32 },
}

fn run(cmd: &mut Command) -> io::Result<()> {
    let out = cmd.output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

fn ip(ns: &str, args: &[&str]) -> io::Result<()> {
    run(Command::new("ip").args(["-n", ns]).args(args))
}

fn tc(ns: &str, args: &[&str]) -> io::Result<()> {
    run(Command::new("tc").args(["-n", ns]).args(args))
}

/// Deletes the hosts of testbeds whose process is gone: Drop removes a
/// bed on every path a process survives, but not when the process is
/// killed (a test run stopped by a signal). A bed's names carry its
/// process id ("intact-bed-PID-N-ROLE"), so only beds of processes that
/// no longer exist are touched. Best effort.
fn sweep_dead_beds() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(pid) = name
            .strip_prefix("intact-bed-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run(Command::new("ip").args(["netns", "del", name]));
        }
    }
}

/// Whether a testbed can be made here (root, `ip`, `tc`, namespaces).
pub fn netbed_usable() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("network namespaces need root".into());
    }
    for tool in ["ip", "tc"] {
        if Command::new(tool).arg("-V").output().is_err() {
            return Err(format!("`{tool}` (iproute2) is not installed"));
        }
    }
    Ok(())
}

impl Netbed {
    /// The cache host's interface towards the switch.
    pub const MIRROR_IFACE: &'static str = "cache0";

    /// Makes the four hosts and their links; the source's link is a veth
    /// pair shaped to 1 Gbit/s by `tbf`, without added delay.
    pub fn new() -> io::Result<Netbed> {
        Self::build(Links::Tbf)
    }

    /// As [`Netbed::new`], the source's link going through a
    /// [`DelayLine`] shaped by `wan`.
    pub fn with_wan(wan: Wan) -> io::Result<Netbed> {
        Self::build(Links::Wan(wan))
    }

    /// As [`Netbed::new`], nothing shaped: the source's link is a veth
    /// pair like the others, without `tbf` or a delay line, every link at
    /// `mtu`, and the switch mirrors nothing to the cache host (the
    /// copies would cost the switch as much again). What loopback
    /// measures, between two hosts.
    pub fn unshaped(mtu: u32) -> io::Result<Netbed> {
        Self::build(Links::Unshaped { mtu })
    }

    fn build(links: Links) -> io::Result<Netbed> {
        let wan = match links {
            Links::Wan(w) => Some(w),
            _ => None,
        };
        sweep_dead_beds();
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let tag = format!("intact-bed-{}-{n}", std::process::id());
        let host = |role: &str, ip: &'static str| Host {
            name: format!("{tag}-{role}"),
            ip,
        };
        let bed = Netbed {
            source: host("src", "10.91.1.1"),
            switch: host("sw", ""),
            destination: host("dst", "10.91.2.1"),
            cache: host("cache", "10.91.3.1"),
            wan: None,
        };
        // From here on Drop deletes what exists.
        for h in [&bed.source, &bed.switch, &bed.destination, &bed.cache] {
            run(Command::new("ip").args(["netns", "add", &h.name]))?;
            ip(&h.name, &["link", "set", "lo", "up"])?;
        }
        let mut bed = bed;
        let sw = bed.switch.name.clone();
        if let Some(w) = wan {
            let half = w.rtt / 2;
            let shape = Shape {
                loss: w.loss,
                ..Shape::wan(w.rate, half)
            };
            let end = |h: &Host, dev: &str| TunEnd {
                netns: h.name.clone(),
                ifname: dev.into(),
            };
            bed.wan = Some(DelayLine::start(
                end(&bed.source, "src0"),
                end(&bed.switch, "sw1"),
                shape,
                Shape {
                    seed: shape.seed + 1,
                    ..shape
                },
            )?);
            // A TUN device drops what its reader has not taken once its
            // queue is full: a long queue lets the line catch up.
            for (ns, dev) in [(&bed.source.name, "src0"), (&sw, "sw1")] {
                ip(ns, &["link", "set", dev, "txqueuelen", "10000"])?;
            }
        }
        for (h, subnet, dev, swdev) in [
            (&bed.source, 1, "src0", "sw1"),
            (&bed.destination, 2, "dst0", "sw2"),
            (&bed.cache, 3, Self::MIRROR_IFACE, "sw3"),
        ] {
            if subnet != 1 || wan.is_none() {
                ip(
                    &h.name,
                    &[
                        "link", "add", dev, "type", "veth", "peer", "name", swdev, "netns", &sw,
                    ],
                )?;
            }
            ip(
                &h.name,
                &["addr", "add", &format!("{}/24", h.ip), "dev", dev],
            )?;
            ip(&h.name, &["link", "set", dev, "up"])?;
            ip(
                &sw,
                &["addr", "add", &format!("10.91.{subnet}.2/24"), "dev", swdev],
            )?;
            ip(&sw, &["link", "set", swdev, "up"])?;
            ip(
                &h.name,
                &[
                    "route",
                    "add",
                    "default",
                    "via",
                    &format!("10.91.{subnet}.2"),
                ],
            )?;
        }
        run(bed
            .switch
            .command("sysctl")
            .args(["-qw", "net.ipv4.ip_forward=1"]))?;
        // Every link of the bed carries the WAN's MTU, so that nothing on
        // the path fragments.
        let mtu = match links {
            Links::Wan(w) => Some(w.mtu),
            Links::Unshaped { mtu } => Some(mtu),
            Links::Tbf => None,
        };
        if let Some(mtu) = mtu {
            let mtu = mtu.to_string();
            for (ns, dev) in [
                (&bed.source.name, "src0"),
                (&sw, "sw1"),
                (&sw, "sw2"),
                (&sw, "sw3"),
                (&bed.destination.name, "dst0"),
                (&bed.cache.name, Self::MIRROR_IFACE),
            ] {
                ip(ns, &["link", "set", dev, "mtu", &mtu])?;
            }
        }
        // The slow link: 1 Gbit/s each way between source and switch (the
        // delay line shapes its own).
        for (ns, dev) in [(&bed.source.name, "src0"), (&sw, "sw1")] {
            if !matches!(links, Links::Tbf) {
                break;
            }
            tc(
                ns,
                &[
                    "qdisc", "add", "dev", dev, "root", "tbf", "rate", "1gbit", "burst", "256kb",
                    "latency", "10ms",
                ],
            )?;
        }
        if matches!(links, Links::Unshaped { .. }) {
            return Ok(bed);
        }
        // The mirror, both directions of the source's traffic with the
        // destination.
        tc(&sw, &["qdisc", "add", "dev", "sw2", "clsact"])?;
        for (hook, field) in [("egress", "src"), ("ingress", "dst")] {
            tc(
                &sw,
                &[
                    "filter",
                    "add",
                    "dev",
                    "sw2",
                    hook,
                    "protocol",
                    "ip",
                    "u32",
                    "match",
                    "ip",
                    field,
                    "10.91.1.0/24",
                    "action",
                    "mirred",
                    "egress",
                    "mirror",
                    "dev",
                    "sw3",
                ],
            )?;
        }
        Ok(bed)
    }
}

impl Drop for Netbed {
    fn drop(&mut self) {
        // The line's devices go with its descriptors, before their
        // namespaces.
        self.wan.take();
        for h in [&self.source, &self.switch, &self.destination, &self.cache] {
            let _ = Command::new("ip").args(["netns", "del", &h.name]).output();
        }
    }
}
