//! The cache's service to receivers: a block by its BLAKE3.
//!
//! The exchange (TCP, one request at a time per connection): both sides
//! first send [`MAGIC`]; then the receiver sends a 32-byte key and the
//! cache answers `0` (not held) or `1`, a 4-byte big-endian length and
//! the block. A request is a fixed 32 bytes, so nothing a client sends
//! makes the cache allocate; at most [`MAX_CLIENTS`] connections are
//! served at once (others are closed at once), and one idle for
//! [`IDLE`] is closed. No key protects this: what the cache serves was
//! seen on the wire, and the receiver takes a block only if it hashes to
//! the BLAKE3 its sender sent it over their authenticated channel.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
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
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((s, _)) => {
                if open.fetch_add(1, Ordering::SeqCst) >= MAX_CLIENTS {
                    open.fetch_sub(1, Ordering::SeqCst);
                    continue;
                }
                let (store, c, open, stop) = (
                    Arc::clone(&store),
                    Arc::clone(&c),
                    Arc::clone(&open),
                    Arc::clone(&stop),
                );
                let spawned = std::thread::Builder::new()
                    .name("cache-client".into())
                    .spawn(move || {
                        let _ = serve(s, &store, &c, &stop);
                        open.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    // The thread never ran: give its place back here.
                    // (Its closure, with the stream, was dropped.)
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

/// Reads exactly `buf`, giving up after [`IDLE`] without a byte or when
/// the service stops.
fn read_full(s: &mut TcpStream, buf: &mut [u8], stop: &AtomicBool) -> io::Result<()> {
    let mut at = 0;
    let mut quiet = Duration::ZERO;
    while at < buf.len() {
        if stop.load(Ordering::SeqCst) || quiet > IDLE {
            return Err(io::ErrorKind::TimedOut.into());
        }
        match s.read(&mut buf[at..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                at += n;
                quiet = Duration::ZERO;
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
