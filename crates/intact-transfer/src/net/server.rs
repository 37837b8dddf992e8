//! `intact serve`: accepts connections, authenticates them, and runs a
//! receiving stream on each, in its own thread, grouped into sessions.
//!
//! [`Server::open`] checks and locks the root and opens its journal before
//! anything listens, so a server that cannot work says so at start.
//! [`Server::run`] then serves until shut down: whatever happens inside
//! one session (a journal error, a hostile peer, a panic) is logged and
//! ends that session only, never the accept loop.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use intact_proto::{server_handshake_keyring, Connection, Key, Keyring, Message};

use crate::dest::Destination;
use crate::journal::Journal;
use crate::net::bounds::Budgets;
use crate::net::confine::confine;
use crate::net::handshakes::{Handshakes, Handshaking};
use crate::net::ratelimit::{Backoff, Repeats, REPEAT_WINDOW};
use crate::net::receiver::{receive, ReceiveOptions};
use crate::net::root::{RootError, RootLock};
use crate::net::sessions::{Limits, Log, Sessions};
use crate::net::watchdog::{Watch, Watchdog};
use crate::TransferError;

/// How a server runs.
#[derive(Clone)]
pub struct ServerConfig {
    /// The only directory it writes under.
    pub root: PathBuf,
    /// Pre-shared key, for the whole root; without a key (nor a keyring),
    /// only loopback clients are served, with plain frames.
    pub key: Option<Key>,
    /// Several clients' keys, each confined to its subtree of the root
    /// (used instead of `key` when set).
    pub keyring: Option<Keyring>,
    /// Encrypt the frames of keyed sessions (they are authenticated
    /// either way); off for a capture-based cache on the path.
    pub encrypt: bool,
    /// Clients (sessions: one `intact send` run, whatever its streams)
    /// served at once; more are refused with a reason.
    pub max_sessions: usize,
    /// TCP streams one client may open; more are refused with a reason.
    pub max_streams_per_session: usize,
    /// A session that makes no progress for this long is dropped: it sent
    /// no whole message we answered and read no reply of ours, and did not
    /// send 16 KiB either (see the watchdog); a write the client does not
    /// read ends then too. A connection not yet authenticated gets this or
    /// [`HANDSHAKE_TIMEOUT`], whichever is shorter, for its whole handshake.
    pub idle_timeout: Duration,
    /// Bytes all sessions may hold at once for what their clients sent:
    /// frames read and not yet written (with what their lists decode
    /// into) and `--delete` keep lists; each of `max_sessions` sessions is
    /// guaranteed 1/(2 × max_sessions) of it, and raised to hold at least
    /// two of the largest frames each.
    pub frame_memory: u64,
    /// Log a line per stream and per refused connection too, not only one
    /// per session.
    pub verbose: bool,
    /// How sessions receive (fault hooks for tests and the fault lab).
    pub receive: ReceiveOptions,
    /// Scrub the root's catalogs in the background (`--scrub-every`).
    pub scrub: Option<super::ScrubSchedule>,
}

/// How long a connection may take to authenticate, from its accept to its
/// admission, whatever it sends meanwhile (an honest client needs two round
/// trips); shorter when the idle timeout is.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The accept loop's wait after a failed accept (out of descriptors, say):
/// doubling from the first to the second while the failures go on, so
/// sessions get time to end and free theirs, and nothing spins.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// How long a stopping server waits for its sessions to end.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// A server whose root is checked, locked and journaled, ready to serve.
pub struct Server {
    cfg: ServerConfig,
    journal: Arc<Journal>,
    _lock: RootLock,
}

impl Server {
    /// Checks the root (a directory, created if missing), locks it against
    /// a second server, and opens its destination and journal.
    pub fn open(cfg: ServerConfig) -> Result<Server, RootError> {
        let lock = RootLock::acquire(&cfg.root)?;
        Destination::open(&cfg.root)?;
        let journal = Arc::new(Journal::open(&cfg.root)?);
        // What a mount that did not end cleanly left in its intent log.
        crate::journal::recover_intents(
            &journal,
            &cfg.root.join(crate::journal::STATE_DIR),
            &cfg.root,
        )?;
        Ok(Server {
            cfg,
            journal,
            _lock: lock,
        })
    }

    /// Serves `listener` until `shutdown` is set (then wake it with a
    /// connection to its address, see [`wake`]). `log` receives one line
    /// per session with its totals and one per stream that failed (with
    /// `verbose`, one per stream and per refused connection as well). At
    /// shutdown, running sessions get up to 10 s to end; any still running
    /// then are left to end with the process: their partial files stay
    /// hidden, nothing unverified is final.
    pub fn run(self, listener: TcpListener, shutdown: Arc<AtomicBool>, log: Log) {
        let scrub_log = Arc::clone(&log);
        return_freed_frames();
        let cfg = Arc::new(self.cfg);
        let max_sessions = cfg.max_sessions.max(1);
        let sessions = Arc::new(Sessions::new(
            Limits {
                sessions: max_sessions,
                streams_per_session: cfg.max_streams_per_session.max(1),
            },
            Budgets::new(
                &cfg.receive.limits,
                frame_memory(cfg.frame_memory, max_sessions),
                max_sessions,
            ),
            log,
            cfg.verbose,
        ));
        let scrubber = cfg.scrub.and_then(|schedule| {
            super::background_scrub::start(
                cfg.root.clone(),
                Arc::clone(&self.journal),
                schedule,
                Arc::clone(&shutdown),
                Arc::clone(&scrub_log),
            )
            .map_err(|e| scrub_log(format!("cannot start the scrub thread: {e}; not scrubbing")))
            .ok()
        });
        let handshaking = Handshakes::default();
        let threads = Arc::new(AtomicUsize::new(0));
        let watchdog = match Watchdog::start() {
            Ok(w) => w,
            Err(e) => {
                sessions.log(format!(
                    "cannot start the watchdog thread: {e}; not serving"
                ));
                return;
            }
        };
        // Faults that repeat (out of descriptors, out of threads): a
        // growing wait instead of a spin, and one line per run of them.
        let mut faults = Faults {
            backoff: Backoff::new(ACCEPT_BACKOFF_MIN, ACCEPT_BACKOFF_MAX),
            repeats: Repeats::new(REPEAT_WINDOW),
        };
        for stream in listener.incoming() {
            if shutdown.load(Ordering::SeqCst) {
                break;
            }
            let stream = match stream {
                Ok(s) => s,
                Err(e) => {
                    faults.failed(&sessions, format!("accept failed: {e}"));
                    continue;
                }
            };
            let place = match stream.peer_addr() {
                Ok(peer) => handshaking.take(peer.ip()),
                Err(e) => Err(format!("no peer address: {e}")),
            };
            let place = match place {
                Ok(p) => p,
                Err(reason) => {
                    let mut conn = Connection::new(stream);
                    let _ = conn.send(&Message::Refused { reason });
                    continue;
                }
            };
            // Its deadline starts now, before a thread is spent on it; the
            // watchdog needs its own descriptor of the socket.
            let timeout = HANDSHAKE_TIMEOUT.min(cfg.idle_timeout);
            let watch = match stream.try_clone() {
                Ok(s) => watchdog.handshake(s, timeout),
                Err(e) => {
                    faults.failed(&sessions, format!("accept failed: {e}"));
                    continue;
                }
            };
            // Both counted until the thread lets go (or never starts).
            let running = Release::take(&threads);
            let mut handshake = Some(place);
            let (cfg, journal, s) = (
                Arc::clone(&cfg),
                Arc::clone(&self.journal),
                Arc::clone(&sessions),
            );
            let spawned = std::thread::Builder::new()
                .name("intact-session".into())
                .spawn(move || {
                    let _running = running;
                    // A panic ends this stream only (its Stream reports it,
                    // the guards give its places back).
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        connection(stream, &cfg, &journal, &s, &mut handshake, &watch)
                    }));
                });
            match spawned {
                Ok(_) => faults.cleared(&sessions),
                Err(e) => faults.failed(&sessions, format!("cannot start a session thread: {e}")),
            }
        }
        faults.cleared(&sessions);
        // Give running sessions a moment to finish their commits and close
        // their files (a caller may unmount the root next), within a bound.
        let deadline = std::time::Instant::now() + SHUTDOWN_GRACE;
        while threads.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        // The scrub stops between files (its pass goes on at the next
        // start); a file being read then is read to its end.
        if let Some(t) = scrubber {
            let _ = t.join();
        }
    }
}

/// The accept loop's faults: waited out with a growing pause, logged once
/// per run of identical lines.
struct Faults {
    backoff: Backoff,
    repeats: Repeats,
}

impl Faults {
    fn failed(&mut self, sessions: &Sessions, line: String) {
        for l in self.repeats.line(line, Instant::now()) {
            sessions.log(l);
        }
        std::thread::sleep(self.backoff.step());
    }

    fn cleared(&mut self, sessions: &Sessions) {
        self.backoff.reset();
        if let Some(l) = self.repeats.flush(Instant::now()) {
            sessions.log(l);
        }
    }
}

/// The frame memory a server uses: what it was given, raised so that
/// every session's guaranteed share holds two of the largest frames (one
/// being read while another is written).
pub fn frame_memory(asked: u64, max_sessions: usize) -> u64 {
    let floor = 4 * intact_proto::LARGEST_FRAME as u64 * max_sessions.max(1) as u64;
    asked.max(floor)
}

/// Makes the process give a large frame's memory back when it is freed.
///
/// A frame is allocated by its stream's reading thread and freed by its
/// session thread. glibc's malloc serves allocations above its mmap
/// threshold with their own mapping, but raises that threshold to the
/// largest such block freed (up to 32 MiB), after which 4–16 MiB frames
/// come from per-thread arenas that keep freed memory resident: in the
/// frame-memory attack test the server then peaked at 357 MB for a
/// 256 MiB frame budget (174 MB with the threshold fixed). Fixing it at
/// 1 MiB keeps every block-sized frame in a mapping of its own, returned
/// at free, so resident memory follows the frame budget. Its cost, one
/// 1 GiB `send --verify none` between /dev/shm trees, 14 runs each
/// interleaved: server CPU median 0.81 s against 0.79 s with glibc's
/// default (within the noise); one arena for all threads (the other way
/// to reuse freed frames) cost 0.83 s and peaked at 214 MB in the test.
/// (Other allocators: nothing to do here.)
fn return_freed_frames() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a malloc parameter; any value is valid.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// Default [`ServerConfig::frame_memory`]: 1 GiB.
pub const DEFAULT_FRAME_MEMORY: u64 = 1 << 30;

/// One unit of a counter, given back when dropped (also when a thread
/// unwinds, or never starts).
struct Release(Arc<AtomicUsize>);

impl Release {
    fn take(counter: &Arc<AtomicUsize>) -> Release {
        counter.fetch_add(1, Ordering::SeqCst);
        Release(Arc::clone(counter))
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves `listener` with a server opened on `cfg` (see [`Server::open`]
/// and [`Server::run`]); `log` receives one line per session.
pub fn serve(
    listener: TcpListener,
    cfg: ServerConfig,
    shutdown: Arc<AtomicBool>,
    log: Log,
) -> Result<(), TransferError> {
    Server::open(cfg)?.run(listener, shutdown, log);
    Ok(())
}

/// One connection: handshake (admitted into its session), then receive.
/// `watch` holds its deadlines: the whole handshake's, then the session's
/// (see the watchdog); the per-call timeouts set here are a second line.
fn connection(
    stream: TcpStream,
    cfg: &ServerConfig,
    journal: &Journal,
    sessions: &Arc<Sessions>,
    handshake: &mut Option<Handshaking>,
    watch: &Watch,
) {
    let peer = match stream.peer_addr() {
        Ok(p) => p,
        Err(_) => return,
    };
    let _ = stream.set_nodelay(true);
    let backstop = Some(HANDSHAKE_TIMEOUT.min(cfg.idle_timeout).saturating_mul(2));
    if stream.set_read_timeout(backstop).is_err() || stream.set_write_timeout(backstop).is_err() {
        return;
    }
    let mut conn = Connection::new(stream);
    let single = cfg.key.clone().map(Keyring::single);
    let clients = cfg.keyring.as_ref().or(single.as_ref());
    let clients = clients.map_or(&[][..], |r| r.clients());
    let admitted = server_handshake_keyring(
        &mut conn,
        clients,
        cfg.encrypt,
        peer.ip().is_loopback(),
        |id, client| {
            // A client's streams group by its id within its key's name.
            let id = client.map_or(id, |c| id.within(&c.name));
            let subtree = client.and_then(|c| c.subtree.clone());
            sessions.admit(id, peer).map(|s| (s, subtree))
        },
    );
    handshake.take();
    let (session, subtree) = match admitted {
        Ok(s) => s,
        Err(e) => {
            // A wrong key or a refusal is worth a line; a port scan, a
            // wake-up, a silent or too slow peer only with -v.
            let quiet = matches!(
                e,
                intact_proto::ProtoError::Closed | intact_proto::ProtoError::Io(_)
            );
            if !quiet || sessions.verbose() {
                let why = match (watch.expired(), e) {
                    (Some(why), _) => why,
                    (None, intact_proto::ProtoError::Refused(why)) => why,
                    (None, other) => other.to_string(),
                };
                sessions.log_kind(&why, format!("{peer}: refused: {why}"));
            }
            return;
        }
    };
    watch.session(cfg.idle_timeout);
    #[cfg(test)]
    crate::net::seam::maybe_panic(&session);
    let outcome = (|| {
        let socket = conn.get_ref();
        // A second line behind the watchdog (which ends a session after
        // the idle timeout without progress, and says why): no single read
        // or write blocks for twice that (the socket's options, shared by
        // the receiver's clones of it).
        let backstop = Some(cfg.idle_timeout.saturating_mul(2));
        socket
            .set_read_timeout(backstop)
            .and_then(|()| socket.set_write_timeout(backstop))
            .map_err(|e| TransferError::Path(e.into()))?;
        let to = confine(&cfg.root, subtree.as_ref(), journal)?;
        // The session's streams share what its directories are (a sender
        // makes a directory on one stream and sends its entry on another).
        let opts = ReceiveOptions {
            session: Some(session.id()),
            working: watch.working(),
            shares: Some(session.shares().clone()),
            profile: Arc::clone(session.profile()),
            data_timeout: Some(cfg.idle_timeout),
            ..cfg.receive.clone()
        };
        receive(conn, &to.dest, &to.root, &to.journal, &opts)
    })();
    // A session the watchdog ended may look like a clean close to the
    // receiver: it is not one.
    let outcome = match watch.expired() {
        Some(why) => Err(why),
        None => outcome.map_err(|e| e.to_string()),
    };
    session.end(outcome);
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
        LocalServer::start_on(cfg, "127.0.0.1:0")
    }

    /// Binds `listen` (a test host's address, in the network namespace of
    /// the calling thread) and serves `cfg` on a thread. Stop it from a
    /// thread in the same namespace: stopping connects to it.
    pub fn start_on(cfg: ServerConfig, listen: &str) -> Result<LocalServer, TransferError> {
        let io = |e: std::io::Error| TransferError::Path(e.into());
        let listener = TcpListener::bind(listen).map_err(io)?;
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
    /// only), 16 clients of up to 64 streams each, 60 s idle timeout.
    pub fn local(root: impl Into<PathBuf>) -> ServerConfig {
        ServerConfig {
            root: root.into(),
            key: None,
            keyring: None,
            encrypt: true,
            max_sessions: 16,
            max_streams_per_session: 64,
            idle_timeout: Duration::from_secs(60),
            frame_memory: DEFAULT_FRAME_MEMORY,
            verbose: false,
            receive: ReceiveOptions::default(),
            scrub: None,
        }
    }
}
