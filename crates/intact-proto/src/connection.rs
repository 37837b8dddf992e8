//! A connection: owns the stream and its buffers, reads and writes whole
//! messages.

use std::io::{self, Read, Write};

use crate::message::{frame_len, HEADER_LEN};
use crate::{Message, ProtoError};

/// Initial read buffer, in bytes; it grows to the largest frame seen.
const INITIAL_BUFFER: usize = 64 * 1024;

/// A message stream over any byte stream (TCP, a pipe, a test buffer).
pub struct Connection<S> {
    stream: S,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    out: Vec<u8>,
}

impl<S: Read + Write> Connection<S> {
    /// Wraps `stream`.
    pub fn new(stream: S) -> Connection<S> {
        Connection {
            stream,
            buf: vec![0; INITIAL_BUFFER],
            start: 0,
            end: 0,
            out: Vec::new(),
        }
    }

    /// The underlying stream.
    pub fn get_ref(&self) -> &S {
        &self.stream
    }

    /// Whether a whole message is already buffered (so reading it will not
    /// block). Replies can be batched until this turns false.
    pub fn has_buffered_message(&self) -> bool {
        matches!(frame_len(&self.buf[self.start..self.end]), Ok(Some(_)))
    }

    /// Reads the next message. `Ok(None)` when the peer closed the stream
    /// cleanly between frames; a close inside a frame is an error. A bad
    /// frame is an error too, and the caller must drop the connection: the
    /// stream position is then meaningless.
    pub fn read_message(&mut self) -> Result<Option<Message>, ProtoError> {
        loop {
            let buffered = &self.buf[self.start..self.end];
            if let Some(n) = frame_len(buffered)? {
                let msg = Message::decode(&buffered[HEADER_LEN..n]);
                self.start += n;
                return msg.map(Some);
            }
            // Make room for the rest of this frame (frame_len bounded it).
            let need = match buffered.get(..HEADER_LEN) {
                Some(p) => HEADER_LEN + u32::from_be_bytes(p.try_into().expect("4")) as usize,
                None => HEADER_LEN,
            };
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            if self.buf.len() < need {
                self.buf.resize(need, 0);
            }
            let n = match self.stream.read(&mut self.buf[self.end..]) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            };
            if n == 0 {
                return if self.end == self.start {
                    Ok(None)
                } else {
                    Err(ProtoError::Closed)
                };
            }
            self.end += n;
        }
    }

    /// Reads a message that must be there (EOF is an error).
    pub fn expect_message(&mut self) -> Result<Message, ProtoError> {
        self.read_message()?.ok_or(ProtoError::Closed)
    }

    /// Queues `msg`; it is sent at the next [`Connection::flush`] or when
    /// the queue passes 1 MiB.
    pub fn write_message(&mut self, msg: &Message) -> Result<(), ProtoError> {
        msg.encode(&mut self.out);
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
