//! Errors of the wire protocol.

/// Why bytes from the wire were refused, or a session could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    /// A frame announced a length over the limit; the connection must end.
    #[error("frame of {len} bytes exceeds the {max}-byte limit")]
    Oversized {
        /// Announced length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// A frame announced zero length (it must hold at least its type byte).
    #[error("empty frame")]
    Empty,
    /// The type byte names no known message.
    #[error("unknown message type {0}")]
    UnknownType(u8),
    /// A field ran past the end of the frame, or bytes were left over.
    #[error("malformed {message} frame: {detail}")]
    Malformed {
        /// Which message was being decoded.
        message: &'static str,
        /// What was wrong.
        detail: &'static str,
    },
    /// A path from the wire breaks the rules (see [`crate::WirePath`]).
    #[error("refused path {path:?}: {reason}")]
    BadPath {
        /// The path as received (lossy).
        path: String,
        /// Which rule it broke.
        reason: &'static str,
    },
    /// The peer speaks another protocol version.
    #[error("peer speaks protocol version {peer}, this side {ours}")]
    Version {
        /// The peer's version.
        peer: u16,
        /// Ours.
        ours: u16,
    },
    /// The peer could not prove it holds the key (or we could not).
    #[error("authentication failed: {0}")]
    Auth(&'static str),
    /// The peer sent a message that is valid but not allowed at this point.
    #[error("unexpected {got} while waiting for {wanted}")]
    Unexpected {
        /// What arrived.
        got: &'static str,
        /// What the protocol required.
        wanted: &'static str,
    },
    /// The peer refused the session and said why.
    #[error("peer refused: {0}")]
    Refused(String),
    /// The connection closed in the middle of a frame or a handshake.
    #[error("connection closed by peer")]
    Closed,
    /// A sealed frame failed its authentication tag: forged, altered,
    /// replayed, reordered, or a frame before it was dropped. The
    /// connection must end.
    #[error("a frame failed authentication (forged, altered, replayed, reordered, or one before it was dropped)")]
    Tampered,
    /// A sealed connection ended without the peer's authenticated Bye:
    /// whatever it meant to send last may have been cut off.
    #[error("connection closed without an authenticated Bye (cut off?)")]
    ClosedWithoutBye,
    /// A direction of a sealed connection used up its 2^64 sequence
    /// numbers (a nonce is never reused).
    #[error("frame sequence numbers exhausted; reconnect")]
    SequenceExhausted,
    /// A key file could not be used.
    #[error("key file {path}: {reason}")]
    Key {
        /// The file.
        path: String,
        /// What was wrong.
        reason: String,
    },
    /// A budget the server shares between its sessions (its memory for
    /// what clients send, see [`crate::Budget`]) stayed in use by others;
    /// the connection ends, nothing is lost.
    #[error("server busy: {0}")]
    Busy(String),
    /// The socket failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
