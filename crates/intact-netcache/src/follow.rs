//! Following one intact connection from its bytes: the frames of each
//! direction, in order, as a relay forwards them or as TCP reassembly
//! rebuilds them from mirrored packets.
//!
//! The follower knows the handshake's shape ([`intact_proto::auth`]):
//! keyed, the client sends Hello, then Proof and Join, and the server
//! Hello, then Proof (or Refused); keyless, the client sends Hello and
//! Join, the server Hello. Every later frame is plain (keyless), or
//! sealed: its body then its 16-byte tag. The server's Hello says whether
//! sealed bodies are encrypted; an encrypted connection cannot be
//! followed (the cache never holds a key) and is counted as such.
//!
//! Of the client's frames only Blocks matter: a whole Block that carries
//! its BLAKE3 ([`intact_proto::Block::strong`]) is kept if its bytes hash
//! to that digest, and rejected otherwise. Of the server's, FileResults:
//! a file verified needs no repair, so its blocks are dropped. Every
//! frame is bounded by the protocol's own limits before anything is
//! buffered; a frame that does not decode ends the following of that
//! connection (its framing can no longer be trusted), never the cache.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use intact_proto::{
    FileStatus, Message, HANDSHAKE_FRAME, HEADER_LEN, MAX_FRAME, STRONG_LEN, TAG_LEN,
};

use crate::stats::Counters;
use crate::store::{Key, Store};

/// Which end of the connection sent the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The sender (it connected): data towards the receiver.
    Client,
    /// The receiver (`intact serve`): results back.
    Server,
}

/// Block digests tracked per connection to drop a file's blocks when its
/// result comes (beyond this, blocks are left to the store's eviction).
pub const MAX_TRACKED: usize = 1 << 16;

/// What one tracked digest costs against the [`Budget`].
const TRACKED_COST: usize = 64;

/// The memory all followed connections together may hold besides the
/// store: bytes of frames not yet complete, digests tracked, and (in TCP
/// reassembly) bytes waiting behind holes. A connection that would go
/// past it, or past its own share ([`Budget::per_flow`]: an eighth of
/// it, or one largest frame if that is more), is no longer followed
/// ([`Stop::Memory`]), so one connection cannot starve the others.
#[derive(Debug)]
pub struct Budget {
    limit: usize,
    used: AtomicUsize,
}

impl Budget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<Budget> {
        Arc::new(Budget {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    /// The most one connection may take.
    pub fn per_flow(&self) -> usize {
        (self.limit / 8).max(MAX_BUFFERED + 64 * 1024)
    }

    /// Takes `n` bytes, or none if that would pass the limit.
    pub fn take(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                u.checked_add(n).filter(|&t| t <= self.limit)
            })
            .is_ok()
    }

    /// Gives `n` bytes back.
    pub fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::SeqCst);
    }

    /// Bytes taken now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::SeqCst)
    }
}

/// The most one direction holds while it waits for the server's Hello to
/// say how frames are sealed, or for the rest of a frame.
const MAX_BUFFERED: usize = HEADER_LEN + MAX_FRAME + TAG_LEN + HANDSHAKE_FRAME;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sealing {
    /// Not known yet (the server's Hello has not been seen).
    Unknown,
    /// Keyless: frames are plain.
    Plain,
    /// Sealed, bodies readable: a tag follows each body.
    Tagged,
}

#[derive(Default)]
struct Direction {
    buf: Vec<u8>,
    frames: u64,
}

/// Why a connection is no longer followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Its frames are encrypted (`intact send` without `--no-encrypt`).
    Encrypted,
    /// A frame did not decode, or was larger than the protocol allows.
    Malformed,
    /// The server refused the session.
    Refused,
    /// Its bytes went missing (a gap TCP reassembly could not fill).
    Gap,
    /// The capture began after the connection's first bytes.
    Joined,
    /// Not an intact connection (its first frame is not a Hello): not
    /// counted as a connection the cache failed to follow.
    NotIntact,
    /// Following it would take more memory than the budget has left.
    Memory,
}

impl Stop {
    /// Words for the report.
    pub fn why(self) -> &'static str {
        match self {
            Stop::Encrypted => "encrypted (send with --no-encrypt, or through the relay)",
            Stop::Malformed => "a frame did not decode",
            Stop::Refused => "the server refused the session",
            Stop::Gap => "bytes missing from the capture",
            Stop::Joined => "seen only after its start",
            Stop::NotIntact => "not an intact connection",
            Stop::Memory => "over the memory for following connections",
        }
    }
}

/// One connection being followed.
pub struct Conn {
    client: Direction,
    server: Direction,
    keyed: Option<bool>,
    sealing: Sealing,
    files: HashMap<u64, Vec<Key>>,
    /// Blocks this connection holds in the store (each held once), with
    /// the generation of the entry it holds.
    holds: HashMap<Key, u64>,
    stopped: Option<Stop>,
    store: Arc<Store>,
    counters: Arc<Counters>,
    budget: Arc<Budget>,
    /// What this connection has taken of the budget.
    taken: usize,
}

impl Conn {
    /// A connection whose first bytes come next, keeping blocks in
    /// `store`, its memory taken from `budget`.
    pub fn new(store: Arc<Store>, counters: Arc<Counters>, budget: Arc<Budget>) -> Conn {
        counters.streams.fetch_add(1, Ordering::Relaxed);
        Conn {
            client: Direction::default(),
            server: Direction::default(),
            keyed: None,
            sealing: Sealing::Unknown,
            files: HashMap::new(),
            holds: HashMap::new(),
            stopped: None,
            store,
            counters,
            budget,
            taken: 0,
        }
    }

    fn take(&mut self, n: usize) -> bool {
        if self.taken + n <= self.budget.per_flow() && self.budget.take(n) {
            self.taken += n;
            true
        } else {
            self.stop(Stop::Memory);
            false
        }
    }

    fn give(&mut self, n: usize) {
        let n = n.min(self.taken);
        self.taken -= n;
        self.budget.give(n);
    }

    /// Why it is no longer followed (None: it is).
    pub fn stopped(&self) -> Option<Stop> {
        self.stopped
    }

    /// Stops following, counted once under `why`.
    pub fn stop(&mut self, why: Stop) {
        if self.stopped.is_none() {
            self.stopped = Some(why);
            self.counters.stopped(why);
            self.client = Direction::default();
            self.server = Direction::default();
            self.files.clear();
            for (k, gen) in std::mem::take(&mut self.holds) {
                self.store.release(&k, gen, false);
            }
            let taken = self.taken;
            self.give(taken);
        }
    }

    /// Bytes `side` may add before its buffer holds the rest of its
    /// current frame (at least 1): input is taken a frame at a time, so a
    /// direction holds at most about one frame whatever the reads' sizes.
    fn wanted(&self, side: Side) -> usize {
        let buf = match side {
            Side::Client => &self.client.buf,
            Side::Server => &self.server.buf,
        };
        if buf.len() < HEADER_LEN {
            return HEADER_LEN - buf.len();
        }
        let len = u32::from_be_bytes(buf[..HEADER_LEN].try_into().expect("4 bytes")) as usize;
        HEADER_LEN
            .saturating_add(len)
            .saturating_sub(buf.len())
            .max(1)
    }

    /// The next bytes `side` sent, in order.
    pub fn feed(&mut self, side: Side, mut bytes: &[u8]) {
        while self.stopped.is_none() && !bytes.is_empty() {
            let n = self.wanted(side).min(bytes.len());
            let dir = match side {
                Side::Client => &self.client,
                Side::Server => &self.server,
            };
            if dir.buf.len() + n > MAX_BUFFERED {
                return self.bad();
            }
            if !self.take(n) {
                return;
            }
            let dir = match side {
                Side::Client => &mut self.client,
                Side::Server => &mut self.server,
            };
            dir.buf.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            self.drain(side);
            // The server's Hello may have said how the client's frames
            // held back are sealed.
            if side == Side::Server && self.stopped.is_none() {
                self.drain(Side::Client);
            }
        }
    }

    fn drain(&mut self, side: Side) {
        let mut at = 0;
        while self.stopped.is_none() {
            let dir = match side {
                Side::Client => &self.client,
                Side::Server => &self.server,
            };
            let handshake = match (side, self.keyed) {
                // The server's first frame is read once the client's
                // Hello said whether the session is keyed.
                (Side::Server, None) => break,
                (Side::Client, None) => true,
                (Side::Client, Some(true)) => dir.frames < 3,
                (Side::Client, Some(false)) => dir.frames < 2,
                (Side::Server, Some(true)) => dir.frames < 2,
                (Side::Server, Some(false)) => dir.frames < 1,
            };
            if !handshake && self.sealing == Sealing::Unknown {
                break;
            }
            let rest = &dir.buf[at..];
            if rest.len() < HEADER_LEN {
                break;
            }
            let len = u32::from_be_bytes(rest[..HEADER_LEN].try_into().expect("4 bytes")) as usize;
            let (limit, tag) = match (handshake, self.sealing) {
                (true, _) => (HANDSHAKE_FRAME, 0),
                (false, Sealing::Tagged) => (MAX_FRAME + TAG_LEN, TAG_LEN),
                (false, _) => (MAX_FRAME, 0),
            };
            if len > limit || len < tag + 1 {
                self.bad();
                break;
            }
            if rest.len() < HEADER_LEN + len {
                break;
            }
            let body = &rest[HEADER_LEN..HEADER_LEN + len - tag];
            let msg = Message::decode(body);
            at += HEADER_LEN + len;
            match side {
                Side::Client => self.client.frames += 1,
                Side::Server => self.server.frames += 1,
            }
            match msg {
                Ok(m) => self.message(side, handshake, m),
                Err(_) => self.bad(),
            }
        }
        let dir = match side {
            Side::Client => &mut self.client,
            Side::Server => &mut self.server,
        };
        if at > 0 && self.stopped.is_none() {
            dir.buf.drain(..at);
            // Frames taken a piece at a time: the buffer stays small.
            dir.buf.shrink_to(HEADER_LEN.max(dir.buf.len()) + 64 * 1024);
            self.give(at);
        }
    }

    fn message(&mut self, side: Side, handshake: bool, m: Message) {
        match (side, handshake, m) {
            (Side::Client, true, Message::Hello { keyed, .. }) if self.keyed.is_none() => {
                self.keyed = Some(keyed);
                if !keyed {
                    self.sealing = Sealing::Plain;
                }
            }
            (_, true, Message::Refused { .. }) => self.stop(Stop::Refused),
            (Side::Server, true, Message::Hello { suite, .. }) if self.keyed == Some(true) => {
                self.sealing = Sealing::Tagged;
                // Choice: 0 plain (keyless), 1 or 2 the AEAD, +0x80
                // bodies not encrypted.
                if suite & 0x80 == 0 {
                    self.stop(Stop::Encrypted);
                }
            }
            (Side::Server, true, Message::Hello { .. }) => {}
            (_, true, Message::Proof { .. } | Message::Join { .. }) => {}
            (_, true, _) => self.bad(),
            (Side::Client, false, Message::Block(b)) => self.block(b),
            (Side::Server, false, Message::FileResult(r)) => {
                if let Some(keys) = self.files.remove(&r.file) {
                    // Only this connection's holds: a block another
                    // connection also carried stays for it. A failed
                    // file's blocks stay in the store, unheld.
                    let verified = r.status == FileStatus::Verified;
                    for k in &keys {
                        if let Some(gen) = self.holds.remove(k) {
                            self.store.release(k, gen, verified);
                            self.give(TRACKED_COST);
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// Bytes that are not intact's frames: before the client's Hello,
    /// another protocol; after it, a broken or hostile connection.
    fn bad(&mut self) {
        self.stop(if self.keyed.is_none() {
            Stop::NotIntact
        } else {
            Stop::Malformed
        });
    }

    fn block(&mut self, b: intact_proto::Block) {
        let c = &self.counters;
        if b.strong.len() != STRONG_LEN {
            c.uncacheable.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if !b.patch.is_empty() {
            c.partial.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let key: Key = b.strong[..].try_into().expect("32 bytes");
        if *blake3::hash(&b.data).as_bytes() != key {
            c.rejected.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let len = b.data.len() as u64;
        let track = !self.holds.contains_key(&key) && self.holds.len() < MAX_TRACKED;
        if track && !self.take(TRACKED_COST) {
            return;
        }
        let c = &self.counters;
        let Some(gen) = self.store.insert(key, b.data.into(), track) else {
            c.too_large.fetch_add(1, Ordering::Relaxed);
            if track {
                self.give(TRACKED_COST);
            }
            return;
        };
        c.cached.fetch_add(1, Ordering::Relaxed);
        c.cached_bytes.fetch_add(len, Ordering::Relaxed);
        if track {
            self.holds.insert(key, gen);
            self.files.entry(b.file).or_default().push(key);
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let taken = self.taken;
        self.give(taken);
    }
}
