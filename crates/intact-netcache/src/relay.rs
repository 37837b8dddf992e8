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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::follow::{Budget, Conn, Side};
use crate::listener::Listening;
use crate::stats::Counters;
use crate::store::Store;

/// Connections relayed at once; more are closed at once.
pub const MAX_RELAYED: usize = 256;

/// A relayed connection with no byte either way for this long is closed
/// (longer than a server's default idle timeout, 300 s).
pub const RELAY_IDLE: Duration = Duration::from_secs(600);

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
        s.set_read_timeout(Some(TICK))?;
        s.set_write_timeout(Some(RELAY_IDLE))?;
    }
    let conn = Arc::new(Mutex::new(Conn::new(store, c, budget)));
    let clock = Arc::new(Activity::new());
    let back = {
        let (from, to, conn, clock) = (
            server.try_clone()?,
            client.try_clone()?,
            Arc::clone(&conn),
            Arc::clone(&clock),
        );
        std::thread::Builder::new()
            .name("cache-relay-back".into())
            .spawn(move || pump(from, to, &conn, Side::Server, &clock))?
    };
    pump(client, server, &conn, Side::Client, &clock);
    let _ = back.join();
    Ok(())
}

/// How often a silent pump looks at the connection's clock.
const TICK: Duration = Duration::from_secs(1);

/// When either direction of a relayed connection last carried a byte.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn touch(&self) {
        self.last_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Both directions silent for [`RELAY_IDLE`].
    fn idle(&self) -> bool {
        self.now_ms()
            .saturating_sub(self.last_ms.load(Ordering::Relaxed))
            > RELAY_IDLE.as_millis() as u64
    }
}

/// Copies `from` to `to` until either ends (or the connection is silent
/// both ways for [`RELAY_IDLE`]), following what passes; then closes
/// both, so that the other direction's pump ends too.
fn pump(mut from: TcpStream, mut to: TcpStream, conn: &Mutex<Conn>, side: Side, clock: &Activity) {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if clock.idle() {
                    break;
                }
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        clock.touch();
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
