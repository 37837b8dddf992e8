//! What the testbed benchmarks share (`cache`, `wan`): the link's
//! physical limit measured by raw TCP and by iperf3 from the source's
//! namespace to the destination's, and an intact server run in the
//! destination's namespace.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;
use intact_faults::{Host, Netbed};
use intact_transfer::{send, CopyReport, LocalServer, SendOptions, ServerConfig};

const MIB: u64 = 1 << 20;

/// iperf3 from the source to the destination (4 streams, 5 s; `scripts/setup
/// --bench` installs it): bits/s received.
pub fn iperf3(bed: &Netbed) -> anyhow::Result<f64> {
    // A port in the destination's own namespace, where nothing else
    // listens on it (ephemeral ports start far above).
    let mut server = bed
        .destination
        .command("iperf3")
        .args(["-s", "-1", "-p", "5201", "-B", "10.91.2.1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("iperf3 (scripts/setup --bench installs it)")?;
    let mut out = None;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let o = bed
            .source
            .command("iperf3")
            .args(["-c", "10.91.2.1", "-p", "5201", "-P", "4", "-t", "5", "-J"])
            .output()?;
        if o.status.success() {
            out = Some(o.stdout);
            break;
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    let json: serde_json::Value =
        serde_json::from_slice(&out.context("iperf3's client never connected")?)?;
    json["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .context("iperf3 gave no sum_received")
}

/// `program` run in the namespace named `ns` (None: this one).
pub fn netns_command(ns: Option<&str>, program: &str) -> std::process::Command {
    match ns {
        None => std::process::Command::new(program),
        Some(ns) => {
            let mut c = std::process::Command::new("ip");
            c.args(["netns", "exec", ns, program]);
            c
        }
    }
}

/// A free TCP port on `host`'s address, in its namespace.
pub fn free_port(host: &Host) -> anyhow::Result<u16> {
    let ip = host.ip;
    host.spawn(move || -> std::io::Result<u16> {
        Ok(TcpListener::bind((ip, 0))?.local_addr()?.port())
    })?
    .join()
    .map_err(|_| anyhow::anyhow!("port probe panicked"))?
    .map_err(Into::into)
}

/// Whether something accepts TCP connections on `host`'s address at
/// `port` now (asked from inside its namespace).
pub fn listening(host: &Host, port: u16) -> anyhow::Result<bool> {
    let ip = host.ip;
    host.spawn(move || {
        let addr = std::net::SocketAddr::from((ip.parse::<std::net::Ipv4Addr>().ok()?, port));
        Some(TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok())
    })?
    .join()
    .map_err(|_| anyhow::anyhow!("connect probe panicked"))?
    .ok_or_else(|| anyhow::anyhow!("{} is not an IPv4 address", host.ip))
}

/// Raw TCP from the source to the destination over `streams` connections,
/// `mib` MiB in all: the link's limit as iperf3 would give it. Bits/s.
pub fn raw_tcp(bed: &Netbed, mib: u64, streams: u64) -> anyhow::Result<f64> {
    let (tx, rx) = mpsc::channel();
    let sink = bed.destination.spawn(move || -> std::io::Result<()> {
        let l = TcpListener::bind("10.91.2.1:0")?;
        tx.send(l.local_addr()?.port()).unwrap();
        let mut readers = Vec::new();
        for _ in 0..streams {
            let (mut c, _) = l.accept()?;
            // A link that stopped carrying (its line cut) ends the probe.
            c.set_read_timeout(Some(Duration::from_secs(120)))?;
            readers.push(std::thread::spawn(move || {
                let mut buf = vec![0; 1 << 20];
                while c.read(&mut buf).map(|n| n > 0).unwrap_or(false) {}
                let _ = c.write_all(b"k");
            }));
        }
        for r in readers {
            let _ = r.join();
        }
        Ok(())
    })?;
    let port = rx.recv()?;
    let secs = bed
        .source
        .spawn(move || -> std::io::Result<f64> {
            let t = Instant::now();
            let senders: Vec<_> = (0..streams)
                .map(|_| {
                    std::thread::spawn(move || -> std::io::Result<()> {
                        let mut c = TcpStream::connect(("10.91.2.1", port))?;
                        c.set_write_timeout(Some(Duration::from_secs(120)))?;
                        c.set_read_timeout(Some(Duration::from_secs(120)))?;
                        let buf = vec![0x5a; 1 << 20];
                        for _ in 0..mib / streams {
                            c.write_all(&buf)?;
                        }
                        c.shutdown(std::net::Shutdown::Write)?;
                        c.read_exact(&mut [0])
                    })
                })
                .collect();
            for s in senders {
                s.join().map_err(|_| std::io::Error::other("panicked"))??;
            }
            Ok(t.elapsed().as_secs_f64())
        })?
        .join()
        .map_err(|_| anyhow::anyhow!("the raw sender panicked"))??;
    sink.join()
        .map_err(|_| anyhow::anyhow!("the raw sink panicked"))??;
    Ok((mib / streams * streams * MIB * 8) as f64 / secs)
}

/// A server in the destination's namespace, stopped there.
pub struct Dest {
    pub addr: String,
    stop: mpsc::Sender<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Dest {
    pub fn start(host: &Host, cfg: ServerConfig) -> anyhow::Result<Dest> {
        let (tx, rx) = mpsc::channel();
        let (stop, wait) = mpsc::channel::<()>();
        let ip = host.ip;
        let thread = host.spawn(move || {
            let srv = LocalServer::start_on(cfg, &format!("{ip}:0")).expect("server");
            tx.send(srv.addr()).unwrap();
            let _ = wait.recv();
            let _ = srv.stop();
        })?;
        Ok(Dest {
            addr: rx.recv()?,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Dest {
    fn drop(&mut self) {
        let _ = self.stop.send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `intact send` of `sources` to `to` with `opts`, run from `host`'s
/// namespace.
pub fn send_from(
    host: &Host,
    sources: Vec<std::path::PathBuf>,
    to: String,
    opts: SendOptions,
) -> anyhow::Result<CopyReport> {
    Ok(host
        .spawn(move || send(&sources, &to, &opts, &|_| {}))?
        .join()
        .map_err(|_| anyhow::anyhow!("the sender panicked"))??)
}
