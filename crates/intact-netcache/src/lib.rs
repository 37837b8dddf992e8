//! `intact cache`: a recovery cache near the destination.
//!
//! Nazarov and Arslan mirror a transfer's packets at a switch near the
//! destination to a cache server, which serves the resend when the
//! receiver finds a file damaged, over a short fast link instead of the
//! wide-area path. intact repairs single blocks, and the cache here keeps
//! blocks, not files:
//!
//! - [`capture`] reads the mirrored packets (AF_PACKET with a mapped ring,
//!   through `netring`), [`tcp`] rebuilds each connection's two byte
//!   streams, and [`follow`] reads intact's frames from them; the relay
//!   ([`relay`]) does the same for connections that pass through it.
//! - A block is kept ([`store`]) only if its bytes hash to the BLAKE3 the
//!   sender put beside them (sent when the receiver has a recovery cache),
//!   and under that digest: the cache needs no key and no session state
//!   to serve any receiver. A file the receiver reports verified has its
//!   blocks dropped; otherwise the least recently used go first.
//! - [`service`] answers receivers: a block by its BLAKE3, or "not here".
//!   The receiver trusts nothing from the cache: it takes a block only if
//!   its BLAKE3 equals the one that came over its authenticated channel
//!   from the sender ([`client`]).
//!
//! Every count of what the cache could not see (kernel drops, truncated
//! packets, connections joined late, encrypted or broken by a hole) is in
//! its [`stats::Report`], whose `complete` is true only if there were none.

pub mod capture;
pub mod client;
pub mod follow;
mod listener;
pub mod relay;
pub mod service;
pub mod stats;
pub mod store;
pub mod tcp;

pub use client::{Recovered, RecoveryCaches};
pub use stats::{Counters, Report};
pub use store::Store;
