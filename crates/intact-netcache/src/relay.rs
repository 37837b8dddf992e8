//! `intact cache --relay`: where the switch cannot mirror, the sender
//! connects to the cache, which forwards every byte unchanged to the
//! receiver and back while following the connection as the capture does.
//!
//! The relay changes nothing the two ends agree on (the handshake binds
//! their addresses to nothing; a relay that altered a byte would break
//! the frames' tags), so an encrypted session passes through it too, only
//! unfollowed.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::follow::{Budget, Conn, Side};
use crate::listener::Listening;
use crate::stats::Counters;
use crate::store::Store;

/// Connections relayed at once; more are closed at once.
pub const MAX_RELAYED: usize = 256;

/// A relayed connection with no byte either way for this long is closed.
pub const RELAY_IDLE: Duration = Duration::from_secs(300);

/// A running relay; stopped on drop.
pub struct Relay(Listening);

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
        let relayed = move |client: TcpStream, _: &AtomicBool| {
            let (store, c, b) = (
                Arc::clone(&store),
                Arc::clone(&counters),
                Arc::clone(&budget),
            );
            let _ = relay(client, &upstream, store, c, b);
        };
        Listening::start(listen, "cache-relayed", MAX_RELAYED, MAX_RELAYED, relayed).map(Relay)
    }

    /// Where it listens.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.0.addr()
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
        // Followed before it is forwarded: a block is in the store before
        // the receiver can have it, let alone find it bad and ask for it.
        conn.lock()
            .unwrap_or_else(|p| p.into_inner())
            .feed(side, &buf[..n]);
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
