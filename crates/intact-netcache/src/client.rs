//! What a receiver asks its recovery caches (`intact serve
//! --recovery-cache HOST:PORT[,…]`).
//!
//! A block is asked for by the BLAKE3 its sender sent beside it; what a
//! cache answers is taken only if it has the block's length and hashes to
//! that BLAKE3, so a cache (or anyone who fed it packets) can make a
//! repair slower, never wrong, and not by much: one request, connect and
//! answer together, has a deadline ([`deadline_for`]: a cache slower than
//! [`MIN_RATE`] is not worth waiting for). A cache that does not answer
//! is left alone for [`REST`] before it is tried again, so a cache that
//! is down costs a failed connect now and then, not one per block. A
//! connection kept for the next request that has gone stale (the cache
//! closed it, or restarted) is replaced once before the cache counts as
//! down.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::service::MAGIC;

/// How long a cache that failed is left alone.
pub const REST: Duration = Duration::from_secs(5);

/// How long a connect may take.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// The slowest a cache may send a block (bytes per second) before the
/// request gives up: a cache is near and fast, or not worth waiting for.
pub const MIN_RATE: u64 = 16 << 20;

/// A kept connection unused for this long is not reused (the service
/// closes connections idle for 60 s).
pub const KEEP: Duration = Duration::from_secs(30);

/// The deadline of one request for a block of `len` bytes: [`TIMEOUT`]
/// plus its bytes at [`MIN_RATE`].
pub fn deadline_for(len: usize) -> Duration {
    TIMEOUT + Duration::from_millis(len as u64 * 1000 / MIN_RATE)
}

/// Requests one receiver process makes of one cache at once (the
/// service's per-peer cap); more wait for one to end, within their
/// deadline.
pub const AT_ONCE: usize = crate::service::PER_PEER;

struct Cache {
    addr: String,
    idle: Vec<(TcpStream, Instant)>,
    down_until: Option<Instant>,
    /// Requests under way.
    busy: usize,
}

/// The caches of a server, shared by its sessions.
#[derive(Clone)]
pub struct RecoveryCaches {
    caches: Arc<Vec<(Mutex<Cache>, Condvar)>>,
}

impl std::fmt::Debug for RecoveryCaches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.addrs()).finish()
    }
}

/// A block a cache gave back, checked.
#[derive(Debug)]
pub struct Recovered {
    /// Its bytes (their BLAKE3 is the key asked for).
    pub data: Vec<u8>,
    /// Which cache gave it.
    pub from: String,
}

/// Why no cache gave a block.
#[derive(Debug, Default, Clone, Copy)]
pub struct Missed {
    /// Caches that answered "not here".
    pub absent: u32,
    /// Caches that answered bytes that were not the block.
    pub wrong: u32,
    /// Caches that could not be reached, or are resting after a failure.
    pub down: u32,
}

impl RecoveryCaches {
    /// Caches at `addrs` (HOST:PORT each), tried in this order.
    pub fn new(addrs: Vec<String>) -> RecoveryCaches {
        RecoveryCaches {
            caches: Arc::new(
                addrs
                    .into_iter()
                    .map(|addr| {
                        let c = Cache {
                            addr,
                            idle: Vec::new(),
                            down_until: None,
                            busy: 0,
                        };
                        (Mutex::new(c), Condvar::new())
                    })
                    .collect(),
            ),
        }
    }

    /// Their addresses.
    pub fn addrs(&self) -> Vec<String> {
        self.caches
            .iter()
            .map(|(c, _)| c.lock().unwrap_or_else(|p| p.into_inner()).addr.clone())
            .collect()
    }

    /// The block of `len` bytes whose BLAKE3 is `key`, from the first
    /// cache that holds it.
    pub fn fetch(&self, key: &[u8; 32], len: usize) -> Result<Recovered, Missed> {
        let mut missed = Missed::default();
        for cache in self.caches.iter() {
            let deadline = Instant::now() + deadline_for(len);
            let (addr, kept) = {
                let (lock, freed) = cache;
                let mut c = lock.lock().unwrap_or_else(|p| p.into_inner());
                while c.busy >= AT_ONCE && Instant::now() < deadline {
                    let wait = deadline.saturating_duration_since(Instant::now());
                    c = freed
                        .wait_timeout(c, wait)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                if c.busy >= AT_ONCE || c.down_until.is_some_and(|t| Instant::now() < t) {
                    missed.down += 1;
                    continue;
                }
                c.busy += 1;
                c.idle.retain(|(_, used)| used.elapsed() < KEEP);
                (c.addr.clone(), c.idle.pop().map(|(s, _)| s))
            };
            let mut answer = match kept {
                Some(mut s) => ask(&mut s, key, len, deadline).map(|a| (s, a)),
                None => Err(io::ErrorKind::NotConnected.into()),
            };
            if answer.is_err() {
                // No kept connection, or a stale one: once more, anew.
                answer = connect(&addr, deadline)
                    .and_then(|mut s| ask(&mut s, key, len, deadline).map(|a| (s, a)));
            }
            let (lock, freed) = cache;
            let mut c = lock.lock().unwrap_or_else(|p| p.into_inner());
            c.busy -= 1;
            freed.notify_one();
            match answer {
                Ok((s, Some(data))) => {
                    if data.len() == len && blake3::hash(&data).as_bytes() == key {
                        c.down_until = None;
                        c.idle.push((s, Instant::now()));
                        return Ok(Recovered { data, from: addr });
                    }
                    // Not the block: this cache is not asked again for a
                    // while.
                    c.down_until = Some(Instant::now() + REST);
                    missed.wrong += 1;
                }
                Ok((s, None)) => {
                    c.down_until = None;
                    c.idle.push((s, Instant::now()));
                    missed.absent += 1;
                }
                Err(_) => {
                    c.down_until = Some(Instant::now() + REST);
                    missed.down += 1;
                }
            }
        }
        Err(missed)
    }
}

fn connect(addr: &str, deadline: Instant) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    for a in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, left(deadline)?.min(TIMEOUT)) {
            Ok(mut s) => {
                s.set_nodelay(true)?;
                write_by(&mut s, MAGIC, deadline)?;
                let mut magic = [0u8; 8];
                read_by(&mut s, &mut magic, deadline)?;
                if &magic != MAGIC {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "not an intact recovery cache",
                    ));
                }
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The time left before `deadline`, or an error once it passed.
fn left(deadline: Instant) -> io::Result<Duration> {
    match deadline.checked_duration_since(Instant::now()) {
        Some(d) if !d.is_zero() => Ok(d),
        _ => Err(io::ErrorKind::TimedOut.into()),
    }
}

/// Reads all of `buf` before `deadline`, however the bytes trickle in.
fn read_by(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        s.set_read_timeout(Some(left(deadline)?))?;
        match s.read(&mut buf[at..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `buf` before `deadline`.
fn write_by(s: &mut TcpStream, buf: &[u8], deadline: Instant) -> io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        s.set_write_timeout(Some(left(deadline)?))?;
        match s.write(&buf[at..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Asks for `key`; a block of another length than `len` is refused before
/// it is read; all before `deadline`.
fn ask(
    s: &mut TcpStream,
    key: &[u8; 32],
    len: usize,
    deadline: Instant,
) -> io::Result<Option<Vec<u8>>> {
    write_by(s, key, deadline)?;
    let mut found = [0u8; 1];
    read_by(s, &mut found, deadline)?;
    match found[0] {
        0 => Ok(None),
        1 => {
            let mut n = [0u8; 4];
            read_by(s, &mut n, deadline)?;
            let n = u32::from_be_bytes(n) as usize;
            if n != len {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a block of another length",
                ));
            }
            let mut data = vec![0u8; n];
            read_by(s, &mut data, deadline)?;
            Ok(Some(data))
        }
        _ => Err(io::Error::new(io::ErrorKind::InvalidData, "not an answer")),
    }
}
