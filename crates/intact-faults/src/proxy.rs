//! A TCP proxy on loopback that corrupts or cuts the client-to-server
//! stream of every connection it carries.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

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
}

/// A running proxy; it stops accepting when dropped (connections already
/// carried end with their peers).
pub struct FlipProxy {
    port: u16,
    flipped: Arc<AtomicU64>,
    cut: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl FlipProxy {
    /// Listens on 127.0.0.1:0 and forwards to `target` with `fault`.
    pub fn start(target: String, fault: ProxyFault) -> std::io::Result<FlipProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let flipped = Arc::new(AtomicU64::new(0));
        let cut = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (f, c, s) = (Arc::clone(&flipped), Arc::clone(&cut), Arc::clone(&stop));
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
                std::thread::spawn(move || pump(c_read, s_write, Some((fault, f, c))));
                std::thread::spawn(move || pump(server, client, None));
            }
        });
        Ok(FlipProxy {
            port,
            flipped,
            cut,
            stop,
        })
    }

    /// host:port to connect to instead of the target.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Bits flipped so far, over all connections.
    pub fn flipped(&self) -> u64 {
        self.flipped.load(Ordering::SeqCst)
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

type Faulting = (ProxyFault, Arc<AtomicU64>, Arc<AtomicU64>);

fn pump(mut from: TcpStream, mut to: TcpStream, fault: Option<Faulting>) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut at = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let chunk = &mut buf[..n];
        if let Some((f, flipped, cut)) = &fault {
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
            }
            at = end;
        }
        if to.write_all(chunk).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
