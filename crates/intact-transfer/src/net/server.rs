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
/// session. At shutdown, running sessions get up to 10 s to end; any still
/// running then are left to end with the process: their partial files stay
/// hidden, nothing unverified is final.
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
    // Give running sessions a moment to finish their commits and close
    // their files (a caller may unmount the root next), within a bound.
    let deadline = std::time::Instant::now() + SHUTDOWN_GRACE;
    while active.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// How long a stopping server waits for its sessions to end.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

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

/// A server on 127.0.0.1 (port chosen by the kernel) running in a thread of
/// this process: for `intact demo`, tests and the fault lab, where hooks
/// must sit in the receiver. Stopped by [`LocalServer::stop`] or on drop.
pub struct LocalServer {
    addr: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<(), TransferError>>>,
}

impl LocalServer {
    /// Binds 127.0.0.1:0 and serves `cfg` on a thread.
    pub fn start(cfg: ServerConfig) -> Result<LocalServer, TransferError> {
        let io = |e: std::io::Error| TransferError::Path(e.into());
        let listener = TcpListener::bind("127.0.0.1:0").map_err(io)?;
        let addr = listener.local_addr().map_err(io)?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || serve(listener, cfg, stop, Arc::new(|_| {})))
        };
        Ok(LocalServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// host:port to send to.
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// Stops accepting, waits for the server thread, returns how it ended.
    pub fn stop(mut self) -> Result<(), TransferError> {
        self.halt()
    }

    fn halt(&mut self) -> Result<(), TransferError> {
        let Some(t) = self.thread.take() else {
            return Ok(());
        };
        self.stop.store(true, Ordering::SeqCst);
        wake(self.addr);
        t.join().expect("server thread panicked")
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

impl ServerConfig {
    /// A server rooted at `root`, without a key (so loopback clients
    /// only), 64 connections, 60 s idle timeout.
    pub fn local(root: impl Into<PathBuf>) -> ServerConfig {
        ServerConfig {
            root: root.into(),
            key: None,
            max_connections: 64,
            idle_timeout: Duration::from_secs(60),
            receive: ReceiveOptions::default(),
        }
    }
}
