//! What a receiver asks its recovery caches (`intact serve
//! --recovery-cache HOST:PORT[,…]`).
//!
//! A block is asked for by the BLAKE3 its sender sent beside it; what a
//! cache answers is taken only if it has the block's length and hashes to
//! that BLAKE3, so a cache (or anyone who fed it packets) can make a
//! repair slower, never wrong. A cache that does not answer is left alone
//! for [`REST`] before it is tried again, so a cache that is down costs a
//! failed connect now and then, not one per block.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::service::MAGIC;

/// How long a cache that failed is left alone.
pub const REST: Duration = Duration::from_secs(5);

/// How long a connect, or any read or write of one request, may take.
pub const TIMEOUT: Duration = Duration::from_secs(2);

struct Cache {
    addr: String,
    idle: Vec<TcpStream>,
    down_until: Option<Instant>,
}

/// The caches of a server, shared by its sessions.
#[derive(Clone)]
pub struct RecoveryCaches {
    caches: Arc<Vec<Mutex<Cache>>>,
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
                        Mutex::new(Cache {
                            addr,
                            idle: Vec::new(),
                            down_until: None,
                        })
                    })
                    .collect(),
            ),
        }
    }

    /// Their addresses.
    pub fn addrs(&self) -> Vec<String> {
        self.caches
            .iter()
            .map(|c| c.lock().unwrap_or_else(|p| p.into_inner()).addr.clone())
            .collect()
    }

    /// The block of `len` bytes whose BLAKE3 is `key`, from the first
    /// cache that holds it.
    pub fn fetch(&self, key: &[u8; 32], len: usize) -> Result<Recovered, Missed> {
        let mut missed = Missed::default();
        for cache in self.caches.iter() {
            let (addr, conn) = {
                let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
                if c.down_until.is_some_and(|t| Instant::now() < t) {
                    missed.down += 1;
                    continue;
                }
                (c.addr.clone(), c.idle.pop())
            };
            let conn = match conn {
                Some(s) => Ok(s),
                None => connect(&addr),
            };
            let answer = conn.and_then(|mut s| ask(&mut s, key, len).map(|a| (s, a)));
            let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
            match answer {
                Ok((s, Some(data))) => {
                    c.down_until = None;
                    if data.len() == len && blake3::hash(&data).as_bytes() == key {
                        c.idle.push(s);
                        return Ok(Recovered { data, from: addr });
                    }
                    missed.wrong += 1;
                }
                Ok((s, None)) => {
                    c.down_until = None;
                    c.idle.push(s);
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

fn connect(addr: &str) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    for a in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, TIMEOUT) {
            Ok(mut s) => {
                s.set_nodelay(true)?;
                s.set_read_timeout(Some(TIMEOUT))?;
                s.set_write_timeout(Some(TIMEOUT))?;
                s.write_all(MAGIC)?;
                let mut magic = [0u8; 8];
                s.read_exact(&mut magic)?;
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

/// Asks for `key`; a block longer than `len` is refused before it is read.
fn ask(s: &mut TcpStream, key: &[u8; 32], len: usize) -> io::Result<Option<Vec<u8>>> {
    s.write_all(key)?;
    let mut found = [0u8; 1];
    s.read_exact(&mut found)?;
    match found[0] {
        0 => Ok(None),
        1 => {
            let mut n = [0u8; 4];
            s.read_exact(&mut n)?;
            let n = u32::from_be_bytes(n) as usize;
            if n != len {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a block of another length",
                ));
            }
            let mut data = vec![0u8; n];
            s.read_exact(&mut data)?;
            Ok(Some(data))
        }
        _ => Err(io::Error::new(io::ErrorKind::InvalidData, "not an answer")),
    }
}
