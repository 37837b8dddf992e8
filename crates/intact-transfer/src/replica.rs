//! A replica to repair from: a local directory holding the same tree, or
//! an intact server (`HOST:PORT`, started with `--allow-fetch`) asked over
//! version 8's pull exchange ([`Message::Fetch`]). Nothing a replica
//! returns is trusted: the caller holds every byte against its own
//! catalog before writing it.

use std::net::TcpStream;
use std::path::Path;

use intact_proto::{Connection, Key, Message, SessionSecret, WirePath, MAX_BLOCK};

use crate::{Destination, TransferError};

/// Where good bytes come from.
pub struct Replica {
    from: From,
    /// What it is, for reports.
    name: String,
    /// Why it can no longer answer (the server refused or went away).
    broken: Option<String>,
    /// Bytes fetched from it.
    fetched: u64,
}

enum From {
    Local(Destination),
    /// Connected when first asked (a scrub may read for hours before it
    /// finds rot, longer than a server keeps an idle client), and again
    /// once after a connection breaks.
    Remote {
        addr: String,
        key: Option<Key>,
        subdir: Option<WirePath>,
        conn: Option<Box<Connection<TcpStream>>>,
    },
}

/// How long one Fetch may wait for its answer.
const FETCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

impl Replica {
    /// The tree under the local directory `dir` (symlinks in it are never
    /// followed, as in any destination).
    pub fn local(dir: &Path) -> Result<Replica, TransferError> {
        if !dir.is_dir() {
            return Err(TransferError::Usage(format!(
                "{}: the replica to repair from is not a directory",
                dir.display()
            )));
        }
        Ok(Replica {
            from: From::Local(Destination::open(dir)?),
            name: dir.display().to_string(),
            broken: None,
            fetched: 0,
        })
    }

    /// The server at `addr` (host:port), its files under `subdir` of the
    /// root it gives this client; `key` as for `intact send`. Nothing is
    /// connected until the first fetch.
    pub fn remote(addr: &str, subdir: Option<WirePath>, key: Option<&Key>) -> Replica {
        let name = match &subdir {
            Some(s) => format!("{addr}:/{s}"),
            None => addr.to_string(),
        };
        Replica {
            from: From::Remote {
                addr: addr.to_string(),
                key: key.cloned(),
                subdir,
                conn: None,
            },
            name,
            broken: None,
            fetched: 0,
        }
    }

    /// Connects to a server replica now, so that a wrong address or key
    /// is told before the scrub begins (a lost connection is made again
    /// when next needed).
    pub fn connect_now(&mut self) -> Result<(), TransferError> {
        if let From::Remote {
            addr, key, conn, ..
        } = &mut self.from
        {
            if conn.is_none() {
                *conn = Some(Box::new(
                    open(addr, key.as_ref()).map_err(TransferError::Remote)?,
                ));
            }
        }
        Ok(())
    }

    /// What it is (a directory or HOST:PORT).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Bytes fetched so far.
    pub fn fetched(&self) -> u64 {
        self.fetched
    }

    /// `len` bytes of `path` from `offset`: exactly that many, or why not
    /// (a file shorter than the range is an error here: the catalog says
    /// how long it is).
    pub fn fetch(&mut self, path: &WirePath, offset: u64, len: u64) -> Result<Vec<u8>, String> {
        if let Some(why) = &self.broken {
            return Err(why.clone());
        }
        let mut out = Vec::with_capacity(len.min(MAX_BLOCK as u64) as usize);
        while (out.len() as u64) < len {
            let at = offset + out.len() as u64;
            let want = (len - out.len() as u64).min(MAX_BLOCK as u64) as u32;
            let got = match &mut self.from {
                From::Local(dest) => read_local(dest, path, at, want)?,
                From::Remote {
                    addr,
                    key,
                    subdir,
                    conn,
                } => {
                    let path = match subdir {
                        Some(s) => {
                            let mut joined = s.as_bytes().to_vec();
                            joined.push(b'/');
                            joined.extend_from_slice(path.as_bytes());
                            WirePath::parse(&joined).map_err(|e| e.to_string())?
                        }
                        None => path.clone(),
                    };
                    match ask_again(addr, key.as_ref(), conn, &path, at, want) {
                        Ok(r) => r?,
                        Err(Broken::Refused(why)) => {
                            // The server's rule, not a mishap: asked again
                            // it would refuse again.
                            self.broken = Some(why.clone());
                            return Err(why);
                        }
                        Err(Broken::Lost(why)) => return Err(why),
                    }
                }
            };
            if got.is_empty() {
                return Err(format!(
                    "{path}: the replica's copy ends at byte {at}, before the {len} bytes from {offset}"
                ));
            }
            self.fetched += got.len() as u64;
            out.extend_from_slice(&got);
        }
        out.truncate(len as usize);
        Ok(out)
    }

    /// Ends a server session politely (a local replica has none).
    pub fn close(self) {
        if let From::Remote {
            conn: Some(mut conn),
            ..
        } = self.from
        {
            if conn.send(&Message::Bye).is_ok() {
                let _ = conn.expect_message();
            }
        }
    }
}

fn read_local(dest: &Destination, path: &WirePath, at: u64, want: u32) -> Result<Vec<u8>, String> {
    let file = dest
        .open_final(path)
        .ok_or_else(|| format!("{path}: not a regular file in the replica"))?;
    crate::dest::read_at_most(&file, at, want as usize).map_err(|e| format!("{path}: {e}"))
}

/// Why a connection to the replica server can no longer be used.
enum Broken {
    /// It refused (e.g. not started with --allow-fetch): for good.
    Refused(String),
    /// The connection broke or timed out: a new one may do.
    Lost(String),
}

/// One Fetch on the open connection (connected first if none is), and
/// once more on a new connection if that one was lost.
fn ask_again(
    addr: &str,
    key: Option<&Key>,
    conn: &mut Option<Box<Connection<TcpStream>>>,
    path: &WirePath,
    at: u64,
    want: u32,
) -> Result<Result<Vec<u8>, String>, Broken> {
    let mut tries = 0;
    loop {
        tries += 1;
        if conn.is_none() {
            *conn = Some(Box::new(open(addr, key).map_err(Broken::Lost)?));
        }
        let c = conn.as_mut().expect("connected above");
        match ask(c, path.clone(), at, want) {
            Err(Broken::Lost(_)) if tries < 2 => *conn = None,
            Err(b) => {
                *conn = None;
                return Err(b);
            }
            Ok(r) => return Ok(r),
        }
    }
}

fn open(addr: &str, key: Option<&Key>) -> Result<Connection<TcpStream>, String> {
    let secret = SessionSecret::random().map_err(|e| e.to_string())?;
    let (conn, _) = crate::net::sender::connect(addr, key, &secret)
        .map_err(|e| format!("the replica server: {e}"))?;
    let s = conn.get_ref();
    s.set_read_timeout(Some(FETCH_TIMEOUT))
        .and_then(|()| s.set_write_timeout(Some(FETCH_TIMEOUT)))
        .map_err(|e| format!("the replica server: {e}"))?;
    Ok(conn)
}

/// One Fetch and its answer: the outer error is the connection's (the
/// server refused, or the exchange broke), the inner one this range's.
fn ask(
    conn: &mut Connection<TcpStream>,
    path: WirePath,
    offset: u64,
    len: u32,
) -> Result<Result<Vec<u8>, String>, Broken> {
    let lost = |e: intact_proto::ProtoError| Broken::Lost(format!("the replica server: {e}"));
    conn.send(&Message::Fetch { path, offset, len })
        .map_err(lost)?;
    match conn.expect_message().map_err(lost)? {
        Message::Fetched { offset: o, result } if o == offset => Ok(match result {
            Ok(data) if data.len() > len as usize => {
                Err(format!("the replica sent {} bytes for {len}", data.len()))
            }
            other => other,
        }),
        Message::Refused { reason } => Err(Broken::Refused(format!(
            "the replica server refused: {reason}"
        ))),
        Message::Fetched { offset: o, .. } => Err(Broken::Lost(format!(
            "the replica server answered for offset {o}, asked {offset}"
        ))),
        other => Err(Broken::Lost(format!(
            "the replica server answered {} to a Fetch",
            other.name()
        ))),
    }
}
