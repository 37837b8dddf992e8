//! The link between a sender half and a receiver half: the one message
//! interface both halves speak, over either of two transports.
//!
//! - TCP (`intact send` → `intact serve`): an [`intact_proto::Connection`],
//!   frames serialised (and sealed, with a key), a reader thread at each
//!   end turning the socket back into messages.
//! - In process (`intact copy`): [`LocalOut`] hands each [`Message`] to the
//!   other half's event queue as it is, a block's bytes moved, never
//!   serialised or copied. The receiver's read-ahead bound holds here as
//!   on TCP: a sender may be at most `credits` messages ahead, after which
//!   its `put` waits, as a full socket buffer would make it wait.
//!
//! Each half writes through [`Outbound`] and reads from its own event
//! queue, so neither knows which transport carries it.

use std::io::{Read, Write};
use std::sync::mpsc;

use intact_proto::{Connection, Message, ProtoError};

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
}

impl<S: Read + Write> Outbound for Connection<S> {
    fn put(&mut self, msg: Message) -> Result<(), ProtoError> {
        self.write_message(&msg)
    }

    fn flush(&mut self) -> Result<(), ProtoError> {
        Connection::flush(self)
    }
}

/// What a half's event queue receives from the link: the next message,
/// `Ok(None)` when the other half closed, or the link's error.
pub(crate) type Arrival = Result<Option<Message>, ProtoError>;

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

/// The in-process transport's writing end: each message goes to the other
/// half's event queue, wrapped as that half's event type `T`.
pub(crate) struct LocalOut<T: Send> {
    events: mpsc::Sender<T>,
    /// One credit per message not yet taken by the other half (None: no
    /// bound, for replies, which the receiver sends at most one per
    /// message it took).
    credits: Option<mpsc::SyncSender<()>>,
    wrap: fn(Arrival) -> T,
}

impl<T: Send> LocalOut<T> {
    pub(crate) fn new(
        events: mpsc::Sender<T>,
        credits: Option<mpsc::SyncSender<()>>,
        wrap: fn(Arrival) -> T,
    ) -> LocalOut<T> {
        LocalOut {
            events,
            credits,
            wrap,
        }
    }
}

impl<T: Send> Outbound for LocalOut<T> {
    fn put(&mut self, msg: Message) -> Result<(), ProtoError> {
        if let Some(c) = &self.credits {
            c.send(()).map_err(|_| ProtoError::Closed)?;
        }
        self.events
            .send((self.wrap)(Ok(Some(msg))))
            .map_err(|_| ProtoError::Closed)
    }

    fn flush(&mut self) -> Result<(), ProtoError> {
        Ok(())
    }
}

impl<T: Send> Drop for LocalOut<T> {
    /// The other half sees the link close, as a socket's reader would.
    fn drop(&mut self) {
        let _ = self.events.send((self.wrap)(Ok(None)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_arrive_in_order_and_a_dropped_end_closes_the_link() {
        let (tx, rx) = mpsc::channel::<Arrival>();
        let mut out = LocalOut::new(tx, None, |a| a);
        out.put(Message::Waiting).unwrap();
        out.send(Message::Bye).unwrap();
        drop(out);
        assert_eq!(rx.recv().unwrap().unwrap(), Some(Message::Waiting));
        assert_eq!(rx.recv().unwrap().unwrap(), Some(Message::Bye));
        assert_eq!(rx.recv().unwrap().unwrap(), None);
        assert!(rx.recv().is_err(), "nothing after the close");
    }

    #[test]
    fn a_sender_waits_once_the_reader_is_credits_ahead() {
        let (tx, rx) = mpsc::channel::<Arrival>();
        let (credit_tx, credits) = mpsc::sync_channel(2);
        let mut out = LocalOut::new(tx, Some(credit_tx), |a| a);
        out.put(Message::Waiting).unwrap();
        out.put(Message::Waiting).unwrap();
        let (done_tx, done) = mpsc::channel();
        let t = std::thread::spawn(move || {
            out.put(Message::Bye).unwrap();
            done_tx.send(()).unwrap();
        });
        // The third message waits for a credit the reader gives back.
        assert!(done
            .recv_timeout(std::time::Duration::from_millis(200))
            .is_err());
        credits.recv().unwrap();
        done.recv_timeout(std::time::Duration::from_secs(30))
            .expect("a credit given back lets the sender go on");
        t.join().unwrap();
        assert_eq!(rx.try_iter().count(), 4, "three messages and the close");
    }

    #[test]
    fn a_gone_reader_is_a_closed_link() {
        let (tx, rx) = mpsc::channel::<Arrival>();
        drop(rx);
        let mut out = LocalOut::new(tx, None, |a| a);
        assert!(matches!(out.put(Message::Bye), Err(ProtoError::Closed)));
    }
}
