//! intact's wire protocol.
//!
//! [`Message`] is everything the sender and the receiver say to each other
//! (protocol [`VERSION`] 7); frames are length-prefixed and decoded in two
//! steps, [`frame_len`] (is a whole frame buffered? is its length
//! possible?) then [`Message::decode`], with a hard limit on every field,
//! so hostile bytes end a connection with a [`ProtoError`], never a panic
//! or an unbounded allocation. [`Connection`] owns a stream and its
//! buffers. [`WirePath`] is the only form in which a path from a peer
//! exists: relative, normalised, no `..`, no NUL. [`auth`] is the
//! handshake: versions, then mutual challenge-response over a pre-shared
//! [`Key`], with no key material on the wire, an ephemeral X25519
//! exchange mixed into the keys (forward secrecy), and the client's
//! [`SessionSecret`] ([`session`]) by which the server groups its
//! streams. After a keyed handshake every frame is sealed with an AEAD
//! under per-direction keys ([`seal`]):
//! encrypted by default, authenticated always. [`key`] has the key-file
//! formats (generated keys, passphrases stretched with Argon2id) and
//! [`Keyring`] a server's several clients, each confined to a subtree.

pub mod auth;
mod budget;
mod connection;
mod dh;
mod error;
pub mod key;
mod keyring;
mod message;
mod path;
pub mod seal;
pub mod session;

pub use auth::{
    client_handshake, client_handshake_in, client_handshake_with, server_handshake,
    server_handshake_admit, server_handshake_keyring, AUTH_FAILED, JOIN_UNOPENED, SECRET_MISMATCH,
    VERSION,
};
pub use budget::{Budget, Held, Party, Refused};
pub use connection::{Connection, HANDSHAKE_FRAME, LARGEST_FRAME, SMALL_FRAME, UNPAID_FRAME};
pub use error::ProtoError;
pub use key::{write_new_key_file, Key};
pub use keyring::{ClientKey, Keyring, CLIENT_TAG};
pub use message::{
    decoded_extra, frame_len, range_digest, Block, Entry, EntryKind, EntryRange, FileEnd,
    FileResult, FileStatus, Holding, Message, DELETE_CHUNK_BYTES, HEADER_LEN, LIST_ITEM_COST,
    MAX_BLOCK, MAX_DELETE_RULES, MAX_DELETE_SCOPES, MAX_DIGEST, MAX_FRAME, MAX_JOIN, MAX_ORIGIN,
    MAX_PAGES, MAX_STATUS_BLOCKS, MAX_TEXT, STRONG_LEN, WIRE_PAGE,
};
pub use path::{WirePath, MAX_PATH_LEN};
pub use seal::{Cipher, Security, TAG_LEN};
pub use session::{SessionId, SessionSecret};
