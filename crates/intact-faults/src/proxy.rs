//! A TCP proxy on loopback that corrupts or cuts the client-to-server
//! stream of every connection it carries, or kills one end of the
//! transfer from outside at a chosen byte (a crash without any hook in
//! the program that crashes).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the proxy does to each connection's client-to-server bytes.
#[derive(Debug, Clone)]
pub enum ProxyFault {
    /// Flip the lowest bit of the bytes at these stream offsets.
    FlipAt(Vec<u64>),
    /// Flip the lowest bit of one byte in every `n`.
    FlipEvery(u64),
    /// Close both directions after this many bytes.
    CutAfter(u64),
    /// After this many bytes, swallow everything the client sends: the
    /// server hears nothing more while the client's writes still succeed.
    StallAfter(u64),
    /// Once this many client bytes have passed (all connections together),
    /// forward nothing more and SIGKILL the process `victim` names: the
    /// sender (it dies mid-send) or the server (it dies with exactly that
    /// much received).
    KillAfter(u64, Victim),
}

/// The process a [`ProxyFault::KillAfter`] kills, named once it has been
/// spawned (the proxy must exist first: the process is given its address),
/// and the client bytes counted so far.
#[derive(Debug, Clone, Default)]
pub struct Victim(Arc<(AtomicI32, AtomicU64, AtomicBool)>);

impl Victim {
    /// No process yet.
    pub fn new() -> Victim {
        Victim::default()
    }

    /// Names the process to kill.
    pub fn set(&self, pid: u32) {
        self.0 .0.store(pid as i32, Ordering::SeqCst);
    }

    /// Whether the proxy killed it.
    pub fn killed(&self) -> bool {
        self.0 .2.load(Ordering::SeqCst)
    }

    /// Counts `n` more client bytes; true when they reach `limit`, at most
    /// once: the caller then kills.
    fn passes(&self, n: u64, limit: u64) -> Option<u64> {
        let before = self.0 .1.fetch_add(n, Ordering::SeqCst);
        (before < limit && before + n >= limit).then_some(limit - before)
    }

    /// SIGKILLs the named process (waiting up to 10 s for it to be named).
    fn kill(&self) {
        let end = Instant::now() + Duration::from_secs(10);
        let mut pid = self.0 .0.load(Ordering::SeqCst);
        while pid <= 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
            pid = self.0 .0.load(Ordering::SeqCst);
        }
        if pid > 0 {
            // Marked before the signal: the test wakes as soon as the
            // process is reaped, and a proxy thread preempted between the
            // kill and a later store would make it look alive.
            self.0 .2.store(true, Ordering::SeqCst);
            // SAFETY: a signal to a process this test spawned and named.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// A running proxy; it stops accepting when dropped (connections already
/// carried end with their peers).
pub struct FlipProxy {
    ip: std::net::IpAddr,
    port: u16,
    flipped: Arc<AtomicU64>,
    forwarded: Arc<AtomicU64>,
    /// The same, per connection, in the order accepted.
    connections: Arc<Mutex<Vec<Arc<AtomicU64>>>>,
    cut: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl FlipProxy {
    /// Listens on 127.0.0.1:0 and forwards to `target` with `fault`.
    pub fn start(target: String, fault: ProxyFault) -> std::io::Result<FlipProxy> {
        FlipProxy::start_on("127.0.0.1:0", target, fault)
    }

    /// Listens on `listen` (e.g. a namespace's address, port 0) and
    /// forwards to `target` with `fault`.
    pub fn start_on(listen: &str, target: String, fault: ProxyFault) -> std::io::Result<FlipProxy> {
        let listener = TcpListener::bind(listen)?;
        let ip = listener.local_addr()?.ip();
        let port = listener.local_addr()?.port();
        let flipped = Arc::new(AtomicU64::new(0));
        let forwarded = Arc::new(AtomicU64::new(0));
        let cut = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (f, c, s) = (Arc::clone(&flipped), Arc::clone(&cut), Arc::clone(&stop));
        let fw = Arc::clone(&forwarded);
        let connections: Arc<Mutex<Vec<Arc<AtomicU64>>>> = Arc::default();
        let conns = Arc::clone(&connections);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (c_read, s_write) = match (client.try_clone(), server.try_clone()) {
                    (Ok(a), Ok(b)) => (a, b),
                    _ => continue,
                };
                let (fault, f, c) = (fault.clone(), Arc::clone(&f), Arc::clone(&c));
                let this = Arc::new(AtomicU64::new(0));
                conns
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(Arc::clone(&this));
                let fw = (Arc::clone(&fw), this);
                std::thread::spawn(move || pump(c_read, s_write, Some((fault, f, c, fw))));
                std::thread::spawn(move || pump(server, client, None));
            }
        });
        Ok(FlipProxy {
            ip,
            port,
            flipped,
            forwarded,
            connections,
            cut,
            stop,
        })
    }

    /// host:port to connect to instead of the target.
    pub fn addr(&self) -> String {
        format!("{}:{}", self.ip, self.port)
    }

    /// Bits flipped so far, over all connections.
    pub fn flipped(&self) -> u64 {
        self.flipped.load(Ordering::SeqCst)
    }

    /// Client-to-server bytes forwarded so far, over all connections: what
    /// the transfer put on the wire, counted outside the program.
    pub fn forwarded(&self) -> u64 {
        self.forwarded.load(Ordering::SeqCst)
    }

    /// Client-to-server bytes forwarded so far on each connection, in the
    /// order they were accepted.
    pub fn forwarded_per_connection(&self) -> Vec<u64> {
        self.connections
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .collect()
    }

    /// Connections cut or stalled so far.
    pub fn cut(&self) -> u64 {
        self.cut.load(Ordering::SeqCst)
    }
}

impl Drop for FlipProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so that it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// The fault, and the counts of bits flipped, connections cut and bytes
/// forwarded (over all connections, and on this one).
type Faulting = (
    ProxyFault,
    Arc<AtomicU64>,
    Arc<AtomicU64>,
    (Arc<AtomicU64>, Arc<AtomicU64>),
);

fn pump(mut from: TcpStream, mut to: TcpStream, fault: Option<Faulting>) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut at = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let chunk = &mut buf[..n];
        if let Some((f, flipped, cut, _)) = &fault {
            let end = at + n as u64;
            match f {
                ProxyFault::FlipAt(offsets) => {
                    for &o in offsets.iter().filter(|&&o| o >= at && o < end) {
                        chunk[(o - at) as usize] ^= 1;
                        flipped.fetch_add(1, Ordering::SeqCst);
                    }
                }
                ProxyFault::FlipEvery(every) => {
                    let mut o = at.div_ceil(*every) * every;
                    while o < end {
                        chunk[(o - at) as usize] ^= 1;
                        flipped.fetch_add(1, Ordering::SeqCst);
                        o += every;
                    }
                }
                ProxyFault::CutAfter(limit) if end > *limit => {
                    let keep = limit.saturating_sub(at) as usize;
                    let _ = to.write_all(&chunk[..keep]);
                    cut.fetch_add(1, Ordering::SeqCst);
                    break;
                }
                ProxyFault::CutAfter(_) => {}
                ProxyFault::StallAfter(limit) if end > *limit => {
                    let keep = limit.saturating_sub(at) as usize;
                    let _ = to.write_all(&chunk[..keep]);
                    cut.fetch_add(1, Ordering::SeqCst);
                    // Swallow until the client goes away (the server side
                    // closing ends the other pump, which shuts the client).
                    while matches!(from.read(&mut buf), Ok(n) if n > 0) {}
                    break;
                }
                ProxyFault::StallAfter(_) => {}
                ProxyFault::KillAfter(limit, victim) => {
                    if let Some(keep) = victim.passes(n as u64, *limit) {
                        let _ = to.write_all(&chunk[..keep as usize]);
                        victim.kill();
                        cut.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                    if victim.killed() {
                        // Another connection reached the limit first.
                        break;
                    }
                }
            }
            at = end;
        }
        if to.write_all(chunk).is_err() {
            break;
        }
        if let Some((.., (all, this))) = &fault {
            all.fetch_add(n as u64, Ordering::SeqCst);
            this.fetch_add(n as u64, Ordering::SeqCst);
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
