//! A sender stream's link: where it writes, the queue its answers arrive
//! on, and over TCP the socket and its reader thread.

use std::net::TcpStream;
use std::sync::mpsc;

use intact_proto::{Connection, Message};

use super::conn_err;
use crate::link::{Arrival, Outbound};
use crate::TransferError;

/// One stream's link as the sender half sees it: where it writes, the
/// queue its answers arrive on, and, over TCP, the socket and its reader
/// thread to stop at the end.
pub(crate) struct SenderLink<'a> {
    pub(crate) out: Box<dyn Outbound + Send + 'a>,
    pub(crate) events: mpsc::Receiver<Arrival>,
    pub(super) tcp: Option<TcpEnd>,
}

/// A TCP link's socket and reader thread: ended (shut down, joined) when
/// dropped, also for a link never used because another stream failed to
/// connect.
pub(super) struct TcpEnd {
    pub(super) socket: TcpStream,
    pub(super) reader: Option<std::thread::JoinHandle<()>>,
}

impl Drop for TcpEnd {
    fn drop(&mut self) {
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

impl SenderLink<'_> {
    /// A link over an authenticated TCP connection.
    pub(super) fn tcp(conn: Connection<TcpStream>) -> Result<SenderLink<'static>, TransferError> {
        let socket = conn.get_ref().try_clone().map_err(conn_err)?;
        let write_half = socket.try_clone().map_err(conn_err)?;
        // Each half carries its own direction's sealing state.
        let (read_half, conn) = conn.split(write_half);
        let (tx, events) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut r = read_half;
            loop {
                let m = r.read_message();
                let stop = !matches!(m, Ok(Some(ref msg)) if *msg != Message::Bye);
                if tx.send(Arrival::Read(m)).is_err() || stop {
                    return;
                }
            }
        });
        Ok(SenderLink {
            out: Box::new(conn),
            events,
            tcp: Some(TcpEnd {
                socket,
                reader: Some(reader),
            }),
        })
    }

    /// An in-process link: `out` reaches the receiver half, whose answers
    /// arrive on `events`.
    pub(crate) fn local(
        out: Box<dyn Outbound + Send + '_>,
        events: mpsc::Receiver<Arrival>,
    ) -> SenderLink<'_> {
        SenderLink {
            out,
            events,
            tcp: None,
        }
    }
}
