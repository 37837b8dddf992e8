//! `intact serve`: accepts connections, authenticates them, and runs a
//! receiving session on each, in its own thread.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use intact_proto::{server_handshake, Connection, Key, Message};

use crate::dest::Destination;
use crate::net::receiver::{receive, ReceiveOptions};
use crate::TransferError;

/// How a server runs.
#[derive(Clone)]
pub struct ServerConfig {
    /// The only directory it writes under.
    pub root: PathBuf,
    /// Pre-shared key; without one, only loopback clients are served.
    pub key: Option<Key>,
    /// Connections served at once; more are refused with a reason.
    pub max_connections: usize,
    /// A client that sends nothing for this long is dropped.
    pub idle_timeout: Duration,
    /// How sessions receive (fault hooks for tests and the fault lab).
    pub receive: ReceiveOptions,
}

/// Serves `listener` until `shutdown` is set (then wake it with a
/// connection to its address, see [`wake`]). `log` receives one line per
/// session. Sessions still running at shutdown are left to end with the
/// process: their partial files stay hidden, nothing unverified is final.
pub fn serve(
    listener: TcpListener,
    cfg: ServerConfig,
    shutdown: Arc<AtomicBool>,
    log: Arc<dyn Fn(String) + Send + Sync>,
) -> Result<(), TransferError> {
    Destination::open(&cfg.root)?;
    let journal = Arc::new(crate::journal::Journal::open(&cfg.root)?);
    let active = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        if shutdown.load(Ordering::SeqCst) {
            break;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                log(format!("accept failed: {e}"));
                continue;
            }
        };
        if active.load(Ordering::SeqCst) >= cfg.max_connections {
            let mut conn = Connection::new(stream);
            let _ = conn.send(&Message::Refused {
                reason: format!("busy: {} connections already", cfg.max_connections),
            });
            continue;
        }
        active.fetch_add(1, Ordering::SeqCst);
        let (cfg, log, active) = (cfg.clone(), Arc::clone(&log), Arc::clone(&active));
        let journal = Arc::clone(&journal);
        std::thread::spawn(move || {
            let peer = stream
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_default();
            match session(stream, &cfg, &journal) {
                Ok(s) => log(format!(
                    "{peer}: {} files verified, {} failed, {} blocks asked again, {} bytes",
                    s.verified, s.failed, s.blocks_rejected, s.bytes
                )),
                Err(e) => log(format!("{peer}: session ended: {e}")),
            }
            active.fetch_sub(1, Ordering::SeqCst);
        });
    }
    Ok(())
}

fn session(
    stream: TcpStream,
    cfg: &ServerConfig,
    journal: &crate::journal::Journal,
) -> Result<crate::net::SessionSummary, TransferError> {
    stream
        .set_read_timeout(Some(cfg.idle_timeout))
        .map_err(io)?;
    stream.set_nodelay(true).map_err(io)?;
    let loopback = stream
        .peer_addr()
        .map(|a| a.ip().is_loopback())
        .unwrap_or(false);
    let mut conn = Connection::new(stream);
    server_handshake(&mut conn, cfg.key.as_ref(), loopback)?;
    let dest = Destination::open(&cfg.root)?;
    receive(conn, &dest, journal, &cfg.receive)
}

fn io(e: std::io::Error) -> TransferError {
    TransferError::Path(e.into())
}

/// Wakes a server blocked in accept so that it sees its shutdown flag.
pub fn wake(addr: std::net::SocketAddr) {
    let _ = TcpStream::connect_timeout(&addr, Duration::from_secs(1));
}
