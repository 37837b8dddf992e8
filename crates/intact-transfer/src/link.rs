//! The link between a sender half and a receiver half: the one message
//! interface both halves speak, over either of two transports.
//!
//! - TCP (`intact send` → `intact serve`): an [`intact_proto::Connection`],
//!   frames serialised (and sealed, with a key), a reader thread at each
//!   end turning the socket back into messages.
//! - In process (`intact copy`): [`LocalOut`] hands [`Message`]s to the
//!   other half's event queue as they are, a block's bytes moved, never
//!   serialised or copied, in batches of up to [`BATCH_MESSAGES`] messages
//!   or [`BATCH_BYTES`] of block data (one queue hand-off, one wake-up of
//!   the other thread per batch, as a socket's buffer batches frames). The
//!   receiver's read-ahead bound holds here as on TCP: a sender may be at
//!   most the window's batches ahead (see [`crate::credits`]), after
//!   which it waits, as a full socket buffer would make it wait.
//!
//! Each half writes through [`Outbound`] and reads from its own event
//! queue, so neither knows which transport carries it.

use std::io::{Read, Write};
use std::sync::mpsc;

use intact_proto::{Connection, Message, ProtoError};

use crate::credits::CreditTaker;

/// The writing end of one stream, whichever transport carries it.
pub(crate) trait Outbound {
    /// Queues `msg` for the other half (may wait for room).
    fn put(&mut self, msg: Message) -> Result<(), ProtoError>;
    /// Pushes out what is queued.
    fn flush(&mut self) -> Result<(), ProtoError>;
    /// `put` then `flush`.
    fn send(&mut self, msg: Message) -> Result<(), ProtoError> {
        self.put(msg)?;
        self.flush()
    }
    /// Gives back buffer memory a large message left behind (after a
    /// flush); nothing to do for most links.
    fn trim(&mut self) {}
}

impl<S: Read + Write> Outbound for Connection<S> {
    fn put(&mut self, msg: Message) -> Result<(), ProtoError> {
        self.write_message(&msg)
    }

    fn flush(&mut self) -> Result<(), ProtoError> {
        Connection::flush(self)
    }

    fn trim(&mut self) {
        self.trim_write_buffer();
    }
}

/// Messages the in-process link hands over at once at most.
pub(crate) const BATCH_MESSAGES: usize = 64;

/// Block data the in-process link hands over at once at most, in bytes
/// (a batch is sent as soon as it reaches this).
pub(crate) const BATCH_BYTES: usize = 1 << 20;

/// What a half's event queue receives from the link.
#[derive(Debug)]
pub(crate) enum Arrival {
    /// A message read off a socket, `Ok(None)` when the other end closed,
    /// or the link's error.
    Read(Result<Option<Message>, ProtoError>),
    /// Messages handed over in process, in order.
    Moved(Vec<Message>),
    /// The in-process other half closed.
    Closed,
}

/// The messages of one [`Arrival`], in order (a socket's one message
/// needs no list of its own).
pub(crate) type Messages =
    std::iter::Chain<std::option::IntoIter<Message>, std::vec::IntoIter<Message>>;

impl Arrival {
    /// The messages, in order; `Ok(None)` when the other half closed.
    pub(crate) fn messages(self) -> Result<Option<Messages>, ProtoError> {
        let (one, many) = match self {
            Arrival::Read(Ok(Some(m))) => (Some(m), Vec::new()),
            Arrival::Moved(v) => (None, v),
            Arrival::Read(Ok(None)) | Arrival::Closed => return Ok(None),
            Arrival::Read(Err(e)) => return Err(e),
        };
        Ok(Some(one.into_iter().chain(many)))
    }
}

/// A link that changes messages on their way (the fault lab's corrupting
/// link); built only with the `fault-hooks` feature.
#[cfg(feature = "fault-hooks")]
pub(crate) struct Tampered<'a> {
    pub(crate) inner: Box<dyn Outbound + Send + 'a>,
    pub(crate) tamper: Box<dyn FnMut(&mut Message) + Send + 'a>,
}

#[cfg(feature = "fault-hooks")]
impl Outbound for Tampered<'_> {
    fn put(&mut self, mut msg: Message) -> Result<(), ProtoError> {
        (self.tamper)(&mut msg);
        self.inner.put(msg)
    }

    fn flush(&mut self) -> Result<(), ProtoError> {
        self.inner.flush()
    }
}

/// The in-process transport's writing end: messages go to the other
/// half's event queue in batches, wrapped as that half's event type `T`.
pub(crate) struct LocalOut<T: Send> {
    events: mpsc::Sender<T>,
    /// A credit per batch not yet taken by the other half (None: no
    /// bound, for replies, which the receiver sends at most one per
    /// message it took).
    credits: Option<CreditTaker>,
    wrap: fn(Arrival) -> T,
    batch: Vec<Message>,
    /// Block data in `batch`, in bytes.
    bytes: usize,
}

impl<T: Send> LocalOut<T> {
    pub(crate) fn new(
        events: mpsc::Sender<T>,
        credits: Option<CreditTaker>,
        wrap: fn(Arrival) -> T,
    ) -> LocalOut<T> {
        LocalOut {
            events,
            credits,
            wrap,
            batch: Vec::new(),
            bytes: 0,
        }
    }
}

impl<T: Send> Outbound for LocalOut<T> {
    fn put(&mut self, msg: Message) -> Result<(), ProtoError> {
        if let Message::Block(b) = &msg {
            self.bytes += b.data.len();
        }
        self.batch.push(msg);
        if self.batch.len() >= BATCH_MESSAGES || self.bytes >= BATCH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), ProtoError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        if let Some(c) = &self.credits {
            c.take().map_err(|_| ProtoError::Closed)?;
        }
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH_MESSAGES));
        self.bytes = 0;
        self.events
            .send((self.wrap)(Arrival::Moved(batch)))
            .map_err(|_| ProtoError::Closed)
    }
}

impl<T: Send> Drop for LocalOut<T> {
    /// The other half sees the link close, as a socket's reader would
    /// (what was put and never flushed is lost with the link, as unsent
    /// bytes in a socket's buffer would be).
    fn drop(&mut self) {
        let _ = self.events.send((self.wrap)(Arrival::Closed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(rx: &mpsc::Receiver<Arrival>) -> Option<Vec<Message>> {
        rx.recv()
            .unwrap()
            .messages()
            .unwrap()
            .map(Iterator::collect)
    }

    #[test]
    fn messages_arrive_in_order_at_a_flush_and_a_dropped_end_closes_the_link() {
        let (tx, rx) = mpsc::channel::<Arrival>();
        let mut out = LocalOut::new(tx, None, |a| a);
        out.put(Message::Waiting).unwrap();
        assert!(rx.try_recv().is_err(), "a put alone is not sent");
        out.send(Message::Bye).unwrap();
        drop(out);
        assert_eq!(received(&rx), Some(vec![Message::Waiting, Message::Bye]));
        assert_eq!(received(&rx), None);
        assert!(rx.recv().is_err(), "nothing after the close");
    }

    #[test]
    fn a_full_batch_goes_without_a_flush() {
        let (tx, rx) = mpsc::channel::<Arrival>();
        let mut out = LocalOut::new(tx, None, |a| a);
        for _ in 0..BATCH_MESSAGES {
            out.put(Message::Waiting).unwrap();
        }
        assert_eq!(received(&rx).map(|v| v.len()), Some(BATCH_MESSAGES));
        let block = |n| {
            Message::Block(intact_proto::Block {
                file: 0,
                index: n,
                source_level: 0,
                digest: Vec::new(),
                crcs: Vec::new(),
                patch: Vec::new(),
                strong: Vec::new(),
                data: vec![0; BATCH_BYTES / 2],
            })
        };
        out.put(block(0)).unwrap();
        assert!(rx.try_recv().is_err());
        out.put(block(1)).unwrap();
        assert_eq!(received(&rx).map(|v| v.len()), Some(2), "bytes full");
    }

    #[test]
    fn a_sender_waits_once_the_reader_is_credits_ahead() {
        let (tx, rx) = mpsc::channel::<Arrival>();
        let (taker, giver) = crate::credits::window(2, 1);
        let mut out = LocalOut::new(tx, Some(taker), |a| a);
        out.send(Message::Waiting).unwrap();
        out.send(Message::Waiting).unwrap();
        let (done_tx, done) = mpsc::channel();
        let t = std::thread::spawn(move || {
            out.send(Message::Bye).unwrap();
            done_tx.send(()).unwrap();
        });
        // The third batch waits for a credit the reader gives back.
        assert!(done
            .recv_timeout(std::time::Duration::from_millis(200))
            .is_err());
        giver.give_back();
        done.recv_timeout(std::time::Duration::from_secs(30))
            .expect("a credit given back lets the sender go on");
        t.join().unwrap();
        assert_eq!(rx.try_iter().count(), 4, "three batches and the close");
    }

    #[test]
    fn a_gone_reader_is_a_closed_link() {
        let (tx, rx) = mpsc::channel::<Arrival>();
        drop(rx);
        let mut out = LocalOut::new(tx, None, |a| a);
        assert!(matches!(out.send(Message::Bye), Err(ProtoError::Closed)));
    }
}
