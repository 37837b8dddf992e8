//! Deadlines for connections, kept by one thread per server that shuts a
//! socket down (`shutdown(2)`, which wakes the session's blocked reads and
//! writes) when its deadline passes.
//!
//! Per-read and per-write timeouts alone are reset by every byte: one byte
//! every 4 s kept a connection alive past a 5 s timeout, and a client that
//! reads a few bytes now and then keeps a blocked write going. Here the
//! deadlines are the connection's, not the call's:
//!
//! - **Handshake**: a connection must finish authenticating within its
//!   deadline, counted from its accept, whatever it sends meanwhile.
//! - **Session**: a session must make progress within its idle timeout,
//!   or it is ended. Progress is what the kernel counts for the socket
//!   (`TCP_INFO`, `SIOCINQ`, `SIOCOUTQ`), so it holds whatever the frames
//!   look like (sealed or not):
//!   - the client read a reply of ours (bytes acknowledged: it completed a
//!     message we answered), or
//!   - it sent at least [`MIN_PROGRESS_BYTES`] since the last progress (a
//!     block on its way), or
//!   - bytes wait unread in our receive queue, at two checks in a row,
//!     while we owe it nothing: the server is the slow side, not the
//!     client.
//!
//!   - the server itself is working for the session (a commit's syncfs, a
//!     whole-file re-read: see [`Working`]); the client is waiting on us.
//!
//!   A client trickling a byte at a time never completes a message, so it
//!   gets no reply and sends fewer than [`MIN_PROGRESS_BYTES`]: it is
//!   dropped at its deadline. A client that never reads its replies stops
//!   acknowledging once its receive buffer is full, the server's writes
//!   block, the server stops reading, and no progress is left: dropped at
//!   its deadline too, its blocked write ended by the shutdown.

use std::collections::HashMap;
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Bytes a client must send between two moments of progress when nothing
/// else counts (no reply of ours read): a minimum rate of this many bytes
/// per idle timeout, as a web server's minimum request rate.
pub const MIN_PROGRESS_BYTES: u64 = 16 * 1024;

/// How often a session's counters are read, at most and at least.
const TICK_MIN: Duration = Duration::from_millis(50);
const TICK_MAX: Duration = Duration::from_secs(1);

/// The thread that enforces the deadlines of one server's connections;
/// stops when dropped.
pub(crate) struct Watchdog {
    inner: Arc<Inner>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Inner {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    next: u64,
    watched: HashMap<u64, Watched>,
    stop: bool,
}

struct Watched {
    socket: TcpStream,
    phase: Phase,
    expired: Arc<Mutex<Option<String>>>,
    working: Working,
}

/// Marks the stretches in which a server works for a session without
/// reading from or writing to its client (a commit's syncfs, a file read
/// back whole): while one is open, the session's idle clock does not run.
/// Only work that cannot block on the client may be marked, or a client
/// that never reads would be kept alive by it.
#[derive(Clone, Debug, Default)]
pub struct Working(Arc<AtomicUsize>);

/// One open stretch of [`Working`]; it ends when dropped.
pub struct WorkingNow(Arc<AtomicUsize>);

impl Working {
    /// Opens a stretch of work.
    pub fn now(&self) -> WorkingNow {
        self.0.fetch_add(1, Ordering::SeqCst);
        WorkingNow(Arc::clone(&self.0))
    }

    fn busy(&self) -> bool {
        self.0.load(Ordering::SeqCst) > 0
    }
}

impl Drop for WorkingNow {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

enum Phase {
    Handshake {
        deadline: Instant,
        timeout: Duration,
    },
    Session {
        idle: Duration,
        last: Instant,
        mark: Counters,
        /// Bytes waited unread (while we owed nothing) at the last check.
        behind: bool,
    },
}

/// One connection's hold on the watchdog: its deadlines end with it.
pub(crate) struct Watch {
    inner: Arc<Inner>,
    id: u64,
    expired: Arc<Mutex<Option<String>>>,
    working: Working,
}

/// What the kernel counts for a TCP socket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    /// Payload bytes received from the peer.
    pub received: u64,
    /// Payload bytes of ours the peer acknowledged.
    pub acked: u64,
    /// Bytes received and not yet read by us.
    pub unread: u64,
    /// Bytes written by us and not yet acknowledged.
    pub unacked: u64,
}

fn lock(inner: &Inner) -> MutexGuard<'_, State> {
    // Plain data: a panic elsewhere cannot leave it inconsistent.
    inner.state.lock().unwrap_or_else(|p| p.into_inner())
}

impl Watchdog {
    /// Starts the thread.
    pub fn start() -> std::io::Result<Watchdog> {
        let inner = Arc::new(Inner {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        let thread = {
            let inner = Arc::clone(&inner);
            std::thread::Builder::new()
                .name("intact-watchdog".into())
                .spawn(move || run(&inner))?
        };
        Ok(Watchdog {
            inner,
            thread: Some(thread),
        })
    }

    /// Watches `socket` (a clone of the connection's, used only to shut it
    /// down): it must authenticate within `timeout` from now.
    pub fn handshake(&self, socket: TcpStream, timeout: Duration) -> Watch {
        let expired = Arc::new(Mutex::new(None));
        let working = Working::default();
        let mut st = lock(&self.inner);
        let id = st.next;
        st.next += 1;
        st.watched.insert(
            id,
            Watched {
                socket,
                phase: Phase::Handshake {
                    deadline: Instant::now() + timeout,
                    timeout,
                },
                expired: Arc::clone(&expired),
                working: working.clone(),
            },
        );
        drop(st);
        self.inner.changed.notify_all();
        Watch {
            inner: Arc::clone(&self.inner),
            id,
            expired,
            working,
        }
    }

    /// Connections watched now.
    #[cfg(test)]
    pub fn watched(&self) -> usize {
        lock(&self.inner).watched.len()
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        lock(&self.inner).stop = true;
        self.inner.changed.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Watch {
    /// The handshake is done: from now on the session must make progress
    /// within `idle` (see the module's documentation).
    pub fn session(&self, idle: Duration) {
        let mut st = lock(&self.inner);
        if let Some(w) = st.watched.get_mut(&self.id) {
            w.phase = Phase::Session {
                idle,
                last: Instant::now(),
                mark: counters(&w.socket).unwrap_or_default(),
                behind: false,
            };
        }
        drop(st);
        self.inner.changed.notify_all();
    }

    /// The marker of the server's own work for this session.
    pub fn working(&self) -> Working {
        self.working.clone()
    }

    /// Why the watchdog ended this connection, if it did.
    pub fn expired(&self) -> Option<String> {
        self.expired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        lock(&self.inner).watched.remove(&self.id);
    }
}

fn run(inner: &Inner) {
    let mut st = lock(inner);
    loop {
        if st.stop {
            return;
        }
        let now = Instant::now();
        let mut wake = now + TICK_MAX;
        let mut ended = Vec::new();
        for (&id, w) in st.watched.iter_mut() {
            match check(w, now) {
                Verdict::Until(t) => wake = wake.min(t),
                Verdict::End(why) => {
                    // The reason first: the session, woken by the
                    // shutdown, asks for it at once.
                    *w.expired.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
                    let _ = w.socket.shutdown(std::net::Shutdown::Both);
                    ended.push(id);
                }
            }
        }
        for id in ended {
            st.watched.remove(&id);
        }
        let wait = wake.saturating_duration_since(Instant::now());
        st = inner
            .changed
            .wait_timeout(st, wait.max(Duration::from_millis(1)))
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

enum Verdict {
    /// Fine until then (check again).
    Until(Instant),
    /// Shut it down, for this reason.
    End(String),
}

fn check(w: &mut Watched, now: Instant) -> Verdict {
    match &mut w.phase {
        Phase::Handshake { deadline, timeout } => {
            if now >= *deadline {
                Verdict::End(format!(
                    "did not authenticate within {} s",
                    timeout.as_secs_f64()
                ))
            } else {
                Verdict::Until(*deadline)
            }
        }
        Phase::Session {
            idle,
            last,
            mark,
            behind,
        } => {
            let tick = (*idle / 8).clamp(TICK_MIN, TICK_MAX);
            let Some(c) = counters(&w.socket) else {
                // No counters (not Linux, or the socket is gone): the
                // per-call timeouts still hold.
                return Verdict::Until(now + tick);
            };
            // Bytes wait for us at two checks in a row: we are the slow
            // side (a byte that just arrived is read within microseconds).
            let behind_now = c.unread > 0 && c.unacked == 0;
            if progressed(mark, &c) || (behind_now && *behind) || w.working.busy() {
                *mark = c;
                *last = now;
            }
            *behind = behind_now;
            if now.saturating_duration_since(*last) >= *idle {
                let what = if c.unacked > 0 {
                    "did not read its replies"
                } else {
                    "made no progress"
                };
                Verdict::End(format!(
                    "{what} for {} s (the server's --idle-timeout)",
                    idle.as_secs_f64()
                ))
            } else {
                Verdict::Until((*last + *idle).min(now + tick))
            }
        }
    }
}

/// Whether the client moved bytes that count as progress between two
/// readings: it read a reply of ours, or sent [`MIN_PROGRESS_BYTES`].
pub(crate) fn progressed(before: &Counters, now: &Counters) -> bool {
    now.acked > before.acked || now.received.saturating_sub(before.received) >= MIN_PROGRESS_BYTES
}

/// The kernel's counters for `s`, where it has them.
#[cfg(target_os = "linux")]
pub(crate) fn counters(s: &TcpStream) -> Option<Counters> {
    use std::os::fd::AsRawFd;
    let fd = s.as_raw_fd();
    // tcpi_bytes_received is the last field used (Linux 4.1 and later).
    let need = std::mem::offset_of!(libc::tcp_info, tcpi_bytes_received) + 8;
    let info = super::tcp_info::tcp_info(s, need)?;
    let queue = |req| {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD/TIOCOUTQ on a socket write one int.
        let r = unsafe { libc::ioctl(fd, req, &mut n) };
        (r == 0).then_some(n.max(0) as u64)
    };
    Some(Counters {
        received: info.tcpi_bytes_received,
        acked: info.tcpi_bytes_acked,
        unread: queue(libc::FIONREAD)?,
        unacked: queue(libc::TIOCOUTQ)?,
    })
}

/// The kernel's counters for `s`, where it has them.
#[cfg(not(target_os = "linux"))]
pub(crate) fn counters(_s: &TcpStream) -> Option<Counters> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (s, c)
    }

    /// Reads until EOF or error; returns when and what it saw.
    fn read_until_end(mut s: TcpStream) -> std::thread::JoinHandle<(Instant, usize)> {
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            let mut n = 0;
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => return (Instant::now(), n),
                    Ok(k) => n += k,
                }
            }
        })
    }

    #[test]
    fn the_kernel_counts_what_moved() {
        let (mut s, mut c) = pair();
        let before = counters(&s).expect("TCP_INFO on Linux");
        c.write_all(&[7; 5000]).unwrap();
        let mut got = [0; 5000];
        s.read_exact(&mut got).unwrap();
        s.write_all(&[1; 300]).unwrap();
        let mut back = [0; 300];
        c.read_exact(&mut back).unwrap();
        // Acknowledgements can lag the read a little.
        let t = Instant::now();
        let mut now = counters(&s).unwrap();
        while now.acked < before.acked + 300 && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
            now = counters(&s).unwrap();
        }
        assert_eq!(now.received - before.received, 5000);
        assert_eq!(now.acked - before.acked, 300);
        assert_eq!(now.unread, 0);
    }

    #[test]
    fn a_whole_handshake_has_one_deadline_however_bytes_trickle() {
        let dog = Watchdog::start().unwrap();
        let (s, mut c) = pair();
        let w = dog.handshake(s.try_clone().unwrap(), Duration::from_millis(600));
        let start = Instant::now();
        let reader = read_until_end(s);
        // A byte every 100 ms: a per-read timeout of 600 ms never fires.
        let trickle = std::thread::spawn(move || {
            for _ in 0..200 {
                if c.write_all(&[0]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let (ended, n) = reader.join().unwrap();
        assert!(n >= 1, "the trickle arrived ({n} bytes)");
        assert!(
            ended.duration_since(start) < Duration::from_secs(10),
            "ended after {:?}",
            ended.duration_since(start)
        );
        assert!(w.expired().unwrap().contains("authenticate"));
        trickle.join().unwrap();
        drop(w);
        assert_eq!(dog.watched(), 0);
    }

    /// A silent client whose server works for it (a long commit) is not
    /// idle; once the work ends, the clock runs again and it is ended.
    #[test]
    fn the_servers_own_work_stops_the_idle_clock() {
        let dog = Watchdog::start().unwrap();
        let idle = Duration::from_millis(300);
        let (s, _c) = pair();
        let w = dog.handshake(s.try_clone().unwrap(), Duration::from_secs(60));
        w.session(idle);
        let work = w.working().now();
        std::thread::sleep(idle * 5);
        assert_eq!(w.expired(), None, "ended while the server worked");
        let ended_work = Instant::now();
        drop(work);
        let t = Instant::now();
        while w.expired().is_none() && t.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let why = w
            .expired()
            .expect("a silent client is ended after the work");
        assert!(why.contains("no progress"), "{why}");
        // The clock restarts at the last check during the work, at most one
        // check interval (idle / 8 here) before the work ended.
        assert!(
            ended_work.elapsed() >= idle / 2,
            "ended {:?} after the work (idle {idle:?})",
            ended_work.elapsed()
        );
    }

    #[test]
    fn a_trickling_session_is_ended_and_a_busy_one_is_not() {
        let dog = Watchdog::start().unwrap();
        let idle = Duration::from_millis(800);
        // Trickle: a byte every 100 ms, never a reply.
        let (s, mut c) = pair();
        let w = dog.handshake(s.try_clone().unwrap(), Duration::from_secs(60));
        w.session(idle);
        let start = Instant::now();
        let reader = read_until_end(s);
        let trickle = std::thread::spawn(move || {
            for _ in 0..300 {
                if c.write_all(&[0]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        // Bulk: 64 KiB every 100 ms, for longer than the idle timeout.
        let (s2, mut c2) = pair();
        let w2 = dog.handshake(s2.try_clone().unwrap(), Duration::from_secs(60));
        w2.session(idle);
        let reader2 = read_until_end(s2.try_clone().unwrap());
        let bulk = std::thread::spawn(move || {
            for _ in 0..30 {
                c2.write_all(&[0; 64 << 10]).unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let (ended, _) = reader.join().unwrap();
        assert!(ended.duration_since(start) < Duration::from_secs(15));
        assert!(
            w.expired().unwrap().contains("no progress"),
            "{:?}",
            w.expired()
        );
        bulk.join().unwrap();
        assert_eq!(w2.expired(), None, "a client sending blocks is kept");
        s2.shutdown(std::net::Shutdown::Both).unwrap();
        reader2.join().unwrap();
        trickle.join().unwrap();
    }

    #[test]
    fn a_blocked_write_to_a_client_that_never_reads_is_ended() {
        let dog = Watchdog::start().unwrap();
        let (s, _c) = pair();
        let w = dog.handshake(s.try_clone().unwrap(), Duration::from_secs(60));
        w.session(Duration::from_millis(800));
        let start = Instant::now();
        let mut writer = s.try_clone().unwrap();
        let wrote = std::thread::spawn(move || {
            let mut n = 0u64;
            loop {
                match writer.write(&[0; 64 << 10]) {
                    Ok(k) => n += k as u64,
                    Err(_) => return (Instant::now(), n),
                }
            }
        });
        let (ended, n) = wrote.join().unwrap();
        assert!(n > 0);
        assert!(
            ended.duration_since(start) < Duration::from_secs(15),
            "the blocked write ended after {:?}",
            ended.duration_since(start)
        );
        assert!(w.expired().unwrap().contains("did not read its replies"));
    }

    #[test]
    fn progress_is_what_the_client_did() {
        let c = |received, acked, unread, unacked| Counters {
            received,
            acked,
            unread,
            unacked,
        };
        let base = c(1000, 500, 0, 0);
        assert!(!progressed(&base, &c(1001, 500, 0, 0)), "a byte");
        assert!(!progressed(
            &base,
            &c(1000 + MIN_PROGRESS_BYTES - 1, 500, 0, 0)
        ));
        assert!(progressed(&base, &c(1000 + MIN_PROGRESS_BYTES, 500, 0, 0)));
        assert!(progressed(&base, &c(1000, 501, 0, 0)), "read a reply");
        assert!(!progressed(&base, &c(1000, 500, 10, 4096)));
    }
}
