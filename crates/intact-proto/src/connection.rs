//! A connection: owns the stream and its buffers, reads and writes whole
//! messages, plain or sealed (see [`crate::seal`]).
//!
//! Memory follows what the peer actually sent, never what it announced:
//! until the handshake ends a frame may hold at most [`HANDSHAKE_FRAME`]
//! bytes (a 4-byte prefix announcing 16 MiB is refused with nothing
//! allocated). Frames that fit the small read buffer ([`SMALL_FRAME`])
//! are read through it, several per `read` (those past [`UNPAID_FRAME`]
//! pay for their length from the budget before they are decoded); a
//! larger frame gets memory of its own, taken first from the connection's
//! budget when it has one
//! (its session's place in the server's, see [`crate::Budget`]), and filled as its
//! bytes arrive (never zero-filled or sized ahead of them beyond the
//! frame's length, which the limit bounds). A Block's data is then moved
//! out of that memory, not copied, and the grant travels with the
//! message ([`Connection::take_held`]). A frame of any size whose lists
//! decode into more than its own bytes (a DeleteKeep of short paths, see
//! [`crate::decoded_extra`]) pays for that too, before it is decoded.
//!
//! After the handshake a connection is usually split in two
//! ([`Connection::split`]): a reading half and a writing half, each with
//! its own direction's sealing state, so two threads can use them.

use std::io::{self, Read, Write};

use crate::budget::{Held, Party};
use crate::message::{decoded_extra, frame_len, HEADER_LEN, MAX_FRAME};
use crate::seal::{Direction, Security, TAG_LEN};
use crate::{Message, ProtoError};

/// The read buffer, in bytes: frames up to this size (prefix included)
/// are read through it; larger ones into memory of their own. 64 KiB
/// holds a few frames of a 16 KiB file's block, so many small files
/// take one `read` per few files, not two per file.
pub const SMALL_FRAME: usize = 64 * 1024;

/// Frames up to this size (prefix included) decode into memory nobody
/// pays for (a connection's read-ahead of them is bounded by count); a
/// larger one read through the buffer pays for its length from the
/// budget, as a frame read into memory of its own does.
pub const UNPAID_FRAME: usize = 16 * 1024;

/// The largest frame on the wire, prefix and tag included.
pub const LARGEST_FRAME: usize = HEADER_LEN + MAX_FRAME + TAG_LEN;

/// Largest frame body a peer may send before the handshake is over: a
/// Hello, a Proof or a Refused with its longest reason fit.
pub const HANDSHAKE_FRAME: usize = 8 * 1024;

/// Which ways a connection may be used.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Half {
    Both,
    Read,
    Write,
}

/// A message stream over any byte stream (TCP, a pipe, a test buffer).
pub struct Connection<S> {
    stream: S,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    out: Vec<u8>,
    /// Largest frame body accepted (as on the wire, tag included).
    limit: usize,
    recv: Option<Direction>,
    send: Option<Direction>,
    security: Security,
    half: Half,
    /// An authenticated Bye came in (a sealed stream may end after it).
    bye: bool,
    /// Where frames larger than the buffer take their memory from, and
    /// how long a frame may wait for it.
    budget: Option<(Party, std::time::Duration)>,
    /// The grant behind the last message read, until the caller takes it.
    held: Option<Held>,
}

impl<S> Connection<S> {
    /// The underlying stream.
    pub fn get_ref(&self) -> &S {
        &self.stream
    }

    /// How frames are protected (plain until a keyed handshake ends).
    pub fn security(&self) -> Security {
        self.security
    }

    /// Frames up to `limit` body bytes are accepted from now on.
    pub(crate) fn set_limit(&mut self, limit: usize) {
        self.limit = limit;
    }

    /// The handshake is over: frames of any allowed size are accepted, and
    /// with `dirs` (receive, send) every frame from now on is sealed.
    pub(crate) fn established(&mut self, security: Security, dirs: Option<(Direction, Direction)>) {
        self.security = security;
        match dirs {
            Some((recv, send)) => {
                self.recv = Some(recv);
                self.send = Some(send);
                self.limit = MAX_FRAME + TAG_LEN;
            }
            None => self.limit = MAX_FRAME,
        }
    }

    /// Splits a connection whose handshake is over into a reading half
    /// (this stream, the bytes already read, the receiving state) and a
    /// writing half (`other`, a second handle on the same socket, the
    /// queued output, the sending state). Reading from the writing half,
    /// or writing to the reading half, is an error.
    pub fn split(self, other: S) -> (Connection<S>, Connection<S>) {
        let writer = Connection {
            stream: other,
            buf: Vec::new(),
            start: 0,
            end: 0,
            out: self.out,
            limit: self.limit,
            recv: None,
            send: self.send,
            security: self.security,
            half: Half::Write,
            bye: false,
            budget: None,
            held: None,
        };
        let reader = Connection {
            stream: self.stream,
            buf: self.buf,
            start: self.start,
            end: self.end,
            out: Vec::new(),
            limit: self.limit,
            recv: self.recv,
            send: None,
            security: self.security,
            half: Half::Read,
            bye: self.bye,
            budget: self.budget,
            held: None,
        };
        (reader, writer)
    }

    /// Whether a whole message is already buffered (so reading it will not
    /// block). Replies can be batched until this turns false.
    pub fn has_buffered_message(&self) -> bool {
        matches!(self.frame_len(), Ok(Some(_)))
    }

    /// Step 1 of decoding under this connection's limit and framing.
    fn frame_len(&self) -> Result<Option<usize>, ProtoError> {
        let buffered = &self.buf[self.start..self.end];
        let Some(prefix) = buffered.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(prefix.try_into().expect("4 bytes")) as usize;
        let overhead = if self.recv.is_some() { TAG_LEN } else { 0 };
        if len > self.limit {
            return Err(ProtoError::Oversized {
                len: len as u64,
                max: self.limit as u64,
            });
        }
        if len <= overhead {
            return Err(ProtoError::Empty);
        }
        if overhead == 0 {
            // Plain frames: the message module's own rule.
            return frame_len(buffered);
        }
        Ok((buffered.len() >= HEADER_LEN + len).then_some(HEADER_LEN + len))
    }

    /// Bytes the whole frame at the front of the buffer takes (only its
    /// prefix is needed), or the prefix's length while that is incomplete.
    fn wanted(&self) -> usize {
        match self.buf[self.start..self.end].get(..HEADER_LEN) {
            Some(p) => HEADER_LEN + u32::from_be_bytes(p.try_into().expect("4")) as usize,
            None => HEADER_LEN,
        }
    }
}

impl<S: Read + Write> Connection<S> {
    /// Wraps `stream`: plain frames of any allowed size (the handshakes
    /// narrow that while they run).
    pub fn new(stream: S) -> Connection<S> {
        Connection {
            stream,
            buf: Vec::new(),
            start: 0,
            end: 0,
            out: Vec::new(),
            limit: MAX_FRAME,
            recv: None,
            send: None,
            security: Security::Plain,
            half: Half::Both,
            bye: false,
            budget: None,
            held: None,
        }
    }

    /// Frames larger than the small buffer take their memory from
    /// `budget` from now on, each waiting up to `wait` while the budget's
    /// rule does not allow it (see [`crate::Budget`]), then failing with
    /// [`ProtoError::Busy`]. The caller takes each message's grant with
    /// [`Connection::take_held`] and drops it when done with the message.
    pub fn set_budget(&mut self, budget: Party, wait: std::time::Duration) {
        self.budget = Some((budget, wait));
    }

    /// The budget grant behind the message last read (`None` for a frame
    /// read through the small buffer, or without a budget). Hold it as
    /// long as the message; a grant not taken is given back when the next
    /// message is read.
    pub fn take_held(&mut self) -> Option<Held> {
        self.held.take()
    }

    /// Reads the next message. `Ok(None)` when the peer closed the stream
    /// cleanly between frames — on a sealed connection only after its
    /// authenticated Bye, else [`ProtoError::ClosedWithoutBye`]; a close
    /// inside a frame is an error. A bad frame is an error too, and the
    /// caller must drop the connection: the stream position is then
    /// meaningless.
    pub fn read_message(&mut self) -> Result<Option<Message>, ProtoError> {
        if self.half == Half::Write {
            return Err(wrong_half("read from the writing half"));
        }
        self.held = None;
        if self.buf.is_empty() {
            self.buf = vec![0; SMALL_FRAME];
        }
        loop {
            if let Some(n) = self.frame_len()? {
                let frame = &mut self.buf[self.start..self.start + n];
                let body = match &mut self.recv {
                    Some(dir) => dir.open(frame)?,
                    None => &frame[HEADER_LEN..],
                };
                // The buffer is this connection's own; what the body's
                // lists decode into, and the copy of a body past
                // UNPAID_FRAME, are paid for first.
                let copy = if n > UNPAID_FRAME { n as u64 } else { 0 };
                self.held = charge(&self.budget, decoded_extra(body) + copy)?;
                let msg = Message::decode(body);
                self.start += n;
                return self.arrived(msg);
            }
            if self.wanted() > SMALL_FRAME {
                // frame_len checked the prefix: the length is allowed.
                return self.read_large();
            }
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            let n = match self.stream.read(&mut self.buf[self.end..]) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            };
            if n == 0 {
                return if self.end != self.start {
                    Err(ProtoError::Closed)
                } else if self.recv.is_some() && !self.bye {
                    Err(ProtoError::ClosedWithoutBye)
                } else {
                    Ok(None)
                };
            }
            self.end += n;
        }
    }

    /// Reads the frame at the front, larger than the buffer, into memory
    /// of its own (taken from the budget first): what the buffer holds of
    /// it, then the rest straight from the stream.
    fn read_large(&mut self) -> Result<Option<Message>, ProtoError> {
        let want = self.wanted();
        let mut held = charge(&self.budget, want as u64)?;
        let mut frame = Vec::with_capacity(want);
        frame.extend_from_slice(&self.buf[self.start..self.end]);
        (self.start, self.end) = (0, 0);
        let rest = (want - frame.len()) as u64;
        // Take bounds the read to this frame; read_to_end fills the spare
        // capacity without zeroing it first and retries on EINTR.
        let got = (&mut self.stream).take(rest).read_to_end(&mut frame)?;
        if (got as u64) < rest {
            return Err(ProtoError::Closed);
        }
        if let Some(dir) = &mut self.recv {
            let body = dir.open(&mut frame)?.len();
            // The body sits after the prefix; the tag follows it.
            frame.truncate(HEADER_LEN + body);
        }
        // What its lists decode into, beyond the frame (freed after).
        if let Some(more) = charge(&self.budget, decoded_extra(&frame[HEADER_LEN..]))? {
            match &mut held {
                Some(h) => h.absorb(more),
                None => held = Some(more),
            }
        }
        let msg = Message::decode_owned(frame);
        self.held = held;
        self.arrived(msg)
    }

    /// A message decoded: note an authenticated Bye.
    fn arrived(&mut self, msg: Result<Message, ProtoError>) -> Result<Option<Message>, ProtoError> {
        if matches!(msg, Ok(Message::Bye)) {
            self.bye = true;
        }
        msg.map(Some)
    }

    /// Reads a message that must be there (EOF is an error).
    pub fn expect_message(&mut self) -> Result<Message, ProtoError> {
        self.read_message()?.ok_or(ProtoError::Closed)
    }

    /// Queues `msg` (sealed, on a sealed connection); it is sent at the
    /// next [`Connection::flush`] or when the queue passes 1 MiB.
    pub fn write_message(&mut self, msg: &Message) -> Result<(), ProtoError> {
        if self.half == Half::Read {
            return Err(wrong_half("write to the reading half"));
        }
        let start = self.out.len();
        msg.encode(&mut self.out);
        if let Some(dir) = &mut self.send {
            if let Err(e) = dir.seal(&mut self.out, start) {
                self.out.truncate(start);
                return Err(e);
            }
        }
        if self.out.len() >= 1 << 20 {
            self.flush()?;
        }
        Ok(())
    }

    /// Sends everything queued.
    pub fn flush(&mut self) -> Result<(), ProtoError> {
        self.stream.write_all(&self.out)?;
        self.out.clear();
        self.stream.flush()?;
        Ok(())
    }

    /// Gives back the memory of the write buffer when a large frame left
    /// it large (a server after answering a Fetch: the memory budget that
    /// covered the reply no longer counts it).
    pub fn trim_write_buffer(&mut self) {
        if self.out.capacity() > SMALL_FRAME {
            self.out = Vec::new();
        }
    }

    /// Queues and sends `msg` at once.
    pub fn send(&mut self, msg: &Message) -> Result<(), ProtoError> {
        self.write_message(msg)?;
        self.flush()
    }
}

/// `amount` taken from `budget` (waiting as it allows); nothing without
/// a budget or for nothing.
fn charge(
    budget: &Option<(Party, std::time::Duration)>,
    amount: u64,
) -> Result<Option<Held>, ProtoError> {
    match budget {
        Some((b, wait)) if amount > 0 => b.take(amount, *wait).map(Some),
        _ => Ok(None),
    }
}

fn wrong_half(what: &str) -> ProtoError {
    ProtoError::Io(io::Error::new(
        io::ErrorKind::Unsupported,
        format!("connection: {what}"),
    ))
}
