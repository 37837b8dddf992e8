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

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::listener::Listening;
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

/// How long a request for a block not (yet) held waits for it when the
/// cache captures: a receiver that finds a block bad right after writing
/// it may ask before the capture has read the block's last packets off
/// the mirror. (The relay keeps a block before it forwards it: its
/// misses are final and answered at once.)
pub const MISS_WAIT: Duration = Duration::from_millis(250);

/// A running service; stopped on drop.
pub struct Service(Listening);

impl Service {
    /// Listens on `listen` and serves `store`; a request for a block not
    /// held waits up to `miss_wait` for it ([`MISS_WAIT`] with a capture,
    /// zero without).
    pub fn start(
        listen: &str,
        store: Arc<Store>,
        counters: Arc<Counters>,
        miss_wait: Duration,
    ) -> io::Result<Service> {
        let served = move |s: TcpStream, stop: &AtomicBool| {
            let _ = serve(s, &store, &counters, stop, miss_wait);
        };
        Listening::start(listen, "cache-client", MAX_CLIENTS, PER_PEER, served).map(Service)
    }

    /// Where it listens.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.0.addr()
    }
}

fn serve(
    mut s: TcpStream,
    store: &Store,
    c: &Counters,
    stop: &AtomicBool,
    miss_wait: Duration,
) -> io::Result<()> {
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
        let mut found = store.get(&key);
        let asked = std::time::Instant::now();
        let mut waited = false;
        while found.is_none() && asked.elapsed() < miss_wait && !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
            waited = true;
            found = store.get(&key);
        }
        if found.is_some() && waited {
            c.late_hits.fetch_add(1, Ordering::Relaxed);
        }
        match found {
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
