//! `intact cache --relay`: where the switch cannot mirror, the sender
//! connects to the cache, which forwards every byte unchanged to the
//! receiver and back while following the connection as the capture does.
//!
//! The relay changes nothing the two ends agree on (the handshake binds
//! their addresses to nothing; a relay that altered a byte would break
//! the frames' tags), so an encrypted session passes through it too, only
//! unfollowed.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::follow::{Budget, Conn, Side};
use crate::stats::Counters;
use crate::store::Store;

/// Connections relayed at once; more are closed at once.
pub const MAX_RELAYED: usize = 256;

/// A relayed connection with no byte either way for this long is closed.
pub const RELAY_IDLE: Duration = Duration::from_secs(300);

/// A running relay.
pub struct Relay {
    addr: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Relay {
    /// Listens on `listen` and relays each connection to `upstream`,
    /// following them within `budget`.
    pub fn start(
        listen: &str,
        upstream: String,
        store: Arc<Store>,
        counters: Arc<Counters>,
        budget: Arc<Budget>,
    ) -> io::Result<Relay> {
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("cache-relay".into())
            .spawn(move || {
                let open = Arc::new(AtomicUsize::new(0));
                while !flag.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            if open.fetch_add(1, Ordering::SeqCst) >= MAX_RELAYED {
                                open.fetch_sub(1, Ordering::SeqCst);
                                continue;
                            }
                            let (up, store, c, b, left) = (
                                upstream.clone(),
                                Arc::clone(&store),
                                Arc::clone(&counters),
                                Arc::clone(&budget),
                                Arc::clone(&open),
                            );
                            let spawned = std::thread::Builder::new()
                                .name("cache-relayed".into())
                                .spawn(move || {
                                    let _ = relay(client, &up, store, c, b);
                                    left.fetch_sub(1, Ordering::SeqCst);
                                });
                            if spawned.is_err() {
                                // Its closure never ran: give the place back.
                                open.fetch_sub(1, Ordering::SeqCst);
                            }
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            })?;
        Ok(Relay {
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

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn relay(
    client: TcpStream,
    upstream: &str,
    store: Arc<Store>,
    c: Arc<Counters>,
    budget: Arc<Budget>,
) -> io::Result<()> {
    client.set_nonblocking(false)?;
    let server = TcpStream::connect(upstream)?;
    for s in [&client, &server] {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(RELAY_IDLE))?;
        s.set_write_timeout(Some(RELAY_IDLE))?;
    }
    let conn = Arc::new(Mutex::new(Conn::new(store, c, budget)));
    let back = {
        let (from, to, conn) = (server.try_clone()?, client.try_clone()?, Arc::clone(&conn));
        std::thread::Builder::new()
            .name("cache-relay-back".into())
            .spawn(move || pump(from, to, &conn, Side::Server))?
    };
    pump(client, server, &conn, Side::Client);
    let _ = back.join();
    Ok(())
}

/// Copies `from` to `to` until either ends (or stays silent for
/// [`RELAY_IDLE`]), following what passes; then closes both, so that the
/// other direction's pump ends too.
fn pump(mut from: TcpStream, mut to: TcpStream, conn: &Mutex<Conn>, side: Side) {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        conn.lock()
            .unwrap_or_else(|p| p.into_inner())
            .feed(side, &buf[..n]);
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
