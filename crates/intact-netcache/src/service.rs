//! The cache's service to receivers: a block by its BLAKE3.
//!
//! The exchange (TCP, one request at a time per connection): both sides
//! first send [`MAGIC`]; then the receiver sends a 32-byte key and the
//! cache answers `0` (not held) or `1`, a 4-byte big-endian length and
//! the block. A request is a fixed 32 bytes, so nothing a client sends
//! makes the cache allocate; at most [`MAX_CLIENTS`] connections are
//! served at once, [`PER_PEER`] from one address (others are closed at
//! once); one idle for [`IDLE`] is closed, as is one whose request is not
//! whole [`REQUEST_TIME`] after its first byte. No key protects this: what the cache serves was
//! seen on the wire, and the receiver takes a block only if it hashes to
//! the BLAKE3 its sender sent it over their authenticated channel.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::stats::Counters;
use crate::store::Store;

/// Sent first by both sides.
pub const MAGIC: &[u8; 8] = b"intactC1";

/// Connections served at once.
pub const MAX_CLIENTS: usize = 64;

/// A connection with no request for this long is closed.
pub const IDLE: Duration = Duration::from_secs(60);

/// A request begun must be whole within this long.
pub const REQUEST_TIME: Duration = Duration::from_secs(5);

/// Connections one peer address may hold at once.
pub const PER_PEER: usize = 8;

/// A running service.
pub struct Service {
    addr: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Service {
    /// Listens on `listen` and serves `store`.
    pub fn start(listen: &str, store: Arc<Store>, counters: Arc<Counters>) -> io::Result<Service> {
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("cache-service".into())
            .spawn(move || accept_loop(listener, store, counters, flag))?;
        Ok(Service {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, store: Arc<Store>, c: Arc<Counters>, stop: Arc<AtomicBool>) {
    let open = Arc::new(AtomicUsize::new(0));
    let peers: Arc<Mutex<HashMap<IpAddr, usize>>> = Arc::default();
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((s, peer)) => {
                if open.fetch_add(1, Ordering::SeqCst) >= MAX_CLIENTS {
                    open.fetch_sub(1, Ordering::SeqCst);
                    continue;
                }
                {
                    let mut p = peers.lock().unwrap_or_else(|e| e.into_inner());
                    let n = p.entry(peer.ip()).or_insert(0);
                    if *n >= PER_PEER {
                        open.fetch_sub(1, Ordering::SeqCst);
                        continue;
                    }
                    *n += 1;
                }
                let leave = {
                    let (open, peers) = (Arc::clone(&open), Arc::clone(&peers));
                    move || {
                        open.fetch_sub(1, Ordering::SeqCst);
                        let mut p = peers.lock().unwrap_or_else(|e| e.into_inner());
                        if let Some(n) = p.get_mut(&peer.ip()) {
                            *n -= 1;
                            if *n == 0 {
                                p.remove(&peer.ip());
                            }
                        }
                    }
                };
                let (store, c, stop) = (Arc::clone(&store), Arc::clone(&c), Arc::clone(&stop));
                let on_failure = leave.clone();
                let spawned = std::thread::Builder::new()
                    .name("cache-client".into())
                    .spawn(move || {
                        let _ = serve(s, &store, &c, &stop);
                        leave();
                    });
                if spawned.is_err() {
                    // The thread never ran: give its places back here.
                    on_failure();
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn serve(mut s: TcpStream, store: &Store, c: &Counters, stop: &AtomicBool) -> io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_millis(500)))?;
    s.set_write_timeout(Some(IDLE))?;
    s.write_all(MAGIC)?;
    let mut magic = [0u8; 8];
    read_full(&mut s, &mut magic, stop)?;
    if &magic != MAGIC {
        return Ok(());
    }
    loop {
        let mut key = [0u8; 32];
        read_full(&mut s, &mut key, stop)?;
        match store.get(&key) {
            Some(data) => {
                let mut head = [1u8; 5];
                head[1..].copy_from_slice(&(data.len() as u32).to_be_bytes());
                s.write_all(&head)?;
                s.write_all(&data)?;
                c.served.fetch_add(1, Ordering::Relaxed);
                c.served_bytes
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
            }
            None => {
                s.write_all(&[0])?;
                c.missed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Reads exactly `buf`, giving up after [`IDLE`] without its first byte,
/// [`REQUEST_TIME`] after it without the rest, or when the service stops.
fn read_full(s: &mut TcpStream, buf: &mut [u8], stop: &AtomicBool) -> io::Result<()> {
    let mut at = 0;
    let mut quiet = Duration::ZERO;
    let mut begun: Option<std::time::Instant> = None;
    while at < buf.len() {
        let late = begun.is_some_and(|t| t.elapsed() > REQUEST_TIME);
        if stop.load(Ordering::SeqCst) || quiet > IDLE || late {
            return Err(io::ErrorKind::TimedOut.into());
        }
        match s.read(&mut buf[at..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                at += n;
                quiet = Duration::ZERO;
                begun.get_or_insert_with(std::time::Instant::now);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                quiet += Duration::from_millis(500);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
