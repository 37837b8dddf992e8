//! A connection: owns the stream and its buffers, reads and writes whole
//! messages, plain or sealed (see [`crate::seal`]).
//!
//! Memory follows what the peer actually sent, never what it announced:
//! until the handshake ends a frame may hold at most [`HANDSHAKE_FRAME`]
//! bytes (a 4-byte prefix announcing 16 MiB is refused with nothing
//! allocated), and afterwards the read buffer grows geometrically with the
//! bytes that arrive (at most doubling past what is already held), up to
//! the largest frame allowed.
//!
//! After the handshake a connection is usually split in two
//! ([`Connection::split`]): a reading half and a writing half, each with
//! its own direction's sealing state, so two threads can use them.

use std::io::{self, Read, Write};

use crate::message::{frame_len, HEADER_LEN, MAX_FRAME};
use crate::seal::{Direction, Security, TAG_LEN};
use crate::{Message, ProtoError};

/// Read buffer at first, in bytes; it grows as frames arrive.
const INITIAL_BUFFER: usize = 16 * 1024;

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
        }
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
        loop {
            if let Some(n) = self.frame_len()? {
                let frame = &mut self.buf[self.start..self.start + n];
                let msg = match &mut self.recv {
                    Some(dir) => Message::decode(dir.open(frame)?),
                    None => Message::decode(&frame[HEADER_LEN..]),
                };
                self.start += n;
                if matches!(msg, Ok(Message::Bye)) {
                    self.bye = true;
                }
                return msg.map(Some);
            }
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            if self.end == self.buf.len() {
                // Full: grow towards this frame's length (frame_len bounded
                // it), at most doubling what the peer already sent.
                // (want > end here, so the buffer always gains room.)
                let want = self.wanted().max(INITIAL_BUFFER);
                let grown = (self.buf.len() * 2).max(INITIAL_BUFFER).min(want);
                self.buf.resize(grown, 0);
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

    /// Queues and sends `msg` at once.
    pub fn send(&mut self, msg: &Message) -> Result<(), ProtoError> {
        self.write_message(msg)?;
        self.flush()
    }
}

fn wrong_half(what: &str) -> ProtoError {
    ProtoError::Io(io::Error::new(
        io::ErrorKind::Unsupported,
        format!("connection: {what}"),
    ))
}
