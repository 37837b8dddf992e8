//! The versioned handshake and mutual authentication with a pre-shared key.
//!
//! Both sides send `Hello { version, keyed, nonce, session }` with 32 fresh
//! random bytes; the client's [`SessionId`] is the same on every stream of
//! one run, so the server can count clients, not streams. With a key K,
//! the client then proves it holds K with
//! `Proof { BLAKE3-keyed(K, "intact/1 client" ‖ version ‖ nonce_server ‖ nonce_client ‖ session) }`;
//! the server checks it in constant time and answers with its own proof
//! over the nonces in the other order and the label "intact/1 server".
//! The key never crosses the wire; fresh nonces on both sides make a
//! recorded proof useless later; the distinct labels stop a proof being
//! reflected back. Without a key, the server serves loopback clients only.
//!
//! The server admits a session (its limits) only once the client is
//! authenticated, and refuses it, with the reason, in place of its last
//! handshake message, so a refused client fails before any data moves.

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use subtle::ConstantTimeEq;

use crate::{Connection, Message, ProtoError};

/// The protocol version this build speaks (4: Hello carries the client's
/// session id; 5: the `--delete` exchange; 6: FileEnd's whole-file digest
/// is checked, and a file held whole is answered with its recorded digest).
pub const VERSION: u16 = 6;

/// The reason a server gives a client whose proof is wrong.
pub const AUTH_FAILED: &str = "authentication failed";

/// One client run's id, sent on each of its streams.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessionId(pub [u8; 16]);

impl SessionId {
    /// A fresh random id.
    pub fn random() -> Result<SessionId, ProtoError> {
        let mut n = [0u8; 16];
        getrandom::fill(&mut n)
            .map_err(|e| ProtoError::Io(std::io::Error::other(e.to_string())))?;
        Ok(SessionId(n))
    }
}

impl std::fmt::Display for SessionId {
    /// The first 4 bytes in hex: enough to tell sessions apart in a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in &self.0[..4] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionId({self})")
    }
}

/// Context string for deriving the session key from a key file.
const KEY_CONTEXT: &str = "intact 2026-11-22 pre-shared key v1";

/// A pre-shared key (32 bytes derived from the key file's contents).
#[derive(Clone)]
pub struct Key([u8; 32]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Key {
    /// Derives a key from secret bytes (at least 16 of them).
    pub fn from_secret(secret: &[u8]) -> Result<Key, ProtoError> {
        if secret.len() < 16 {
            return Err(ProtoError::Key {
                path: "(secret)".into(),
                reason: "a key must hold at least 16 bytes".into(),
            });
        }
        Ok(Key(blake3::derive_key(KEY_CONTEXT, secret)))
    }

    /// Reads a key file. Surrounding whitespace is ignored; at least 16
    /// bytes must remain; like ssh with private keys, a file that group or
    /// others can read is refused.
    pub fn from_file(path: &Path) -> Result<Key, ProtoError> {
        let err = |reason: String| ProtoError::Key {
            path: path.display().to_string(),
            reason,
        };
        let meta = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
        if meta.mode() & 0o077 != 0 {
            return Err(err(format!(
                "permissions {:o} let others read it (chmod 600)",
                meta.mode() & 0o777
            )));
        }
        let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
        let trimmed = bytes.trim_ascii();
        Key::from_secret(trimmed).map_err(|_| err("a key must hold at least 16 bytes".into()))
    }

    fn proof(
        &self,
        label: &[u8],
        first: &[u8; 32],
        second: &[u8; 32],
        session: &SessionId,
    ) -> [u8; 32] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(label);
        h.update(&VERSION.to_be_bytes());
        h.update(first);
        h.update(second);
        h.update(&session.0);
        *h.finalize().as_bytes()
    }
}

const CLIENT_LABEL: &[u8] = b"intact/1 client";
const SERVER_LABEL: &[u8] = b"intact/1 server";

fn nonce() -> Result<[u8; 32], ProtoError> {
    let mut n = [0u8; 32];
    getrandom::fill(&mut n).map_err(|e| ProtoError::Io(std::io::Error::other(e.to_string())))?;
    Ok(n)
}

fn expect_hello(msg: Message) -> Result<(u16, bool, [u8; 32], SessionId), ProtoError> {
    match msg {
        Message::Hello {
            version,
            keyed,
            nonce,
            session,
        } => Ok((version, keyed, nonce, SessionId(session))),
        Message::Refused { reason } => Err(ProtoError::Refused(reason)),
        other => Err(ProtoError::Unexpected {
            got: other.name(),
            wanted: "Hello",
        }),
    }
}

/// Client side of the handshake, as a session of its own (one stream).
/// With `key`, the server must prove it holds the same key too; a server
/// without a key is refused.
pub fn client_handshake<S: Read + Write>(
    conn: &mut Connection<S>,
    key: Option<&Key>,
) -> Result<(), ProtoError> {
    client_handshake_in(conn, key, &SessionId::random()?)
}

/// Client side of the handshake for one stream of `session` (every stream
/// of one run passes the same id).
pub fn client_handshake_in<S: Read + Write>(
    conn: &mut Connection<S>,
    key: Option<&Key>,
    session: &SessionId,
) -> Result<(), ProtoError> {
    let ours = nonce()?;
    conn.send(&Message::Hello {
        version: VERSION,
        keyed: key.is_some(),
        nonce: ours,
        session: session.0,
    })?;
    let (version, keyed, theirs, _) = expect_hello(conn.expect_message()?)?;
    if version != VERSION {
        return Err(ProtoError::Version {
            peer: version,
            ours: VERSION,
        });
    }
    let Some(key) = key else {
        return if keyed {
            Err(ProtoError::Auth("the server requires a key (--key-file)"))
        } else {
            Ok(())
        };
    };
    if !keyed {
        return Err(ProtoError::Auth(
            "the server has no key, so it cannot prove who it is",
        ));
    }
    conn.send(&Message::Proof {
        mac: key.proof(CLIENT_LABEL, &theirs, &ours, session),
    })?;
    match conn.expect_message()? {
        Message::Proof { mac } => {
            let want = key.proof(SERVER_LABEL, &ours, &theirs, session);
            if bool::from(mac.ct_eq(&want)) {
                Ok(())
            } else {
                Err(ProtoError::Auth(
                    "the server's proof is wrong (different key at the server? both sides need the same --key-file)",
                ))
            }
        }
        Message::Refused { reason } if reason == AUTH_FAILED => Err(ProtoError::Auth(
            "the server did not accept this key (different key at the server? both sides need the same --key-file)",
        )),
        Message::Refused { reason } => Err(ProtoError::Refused(reason)),
        other => Err(ProtoError::Unexpected {
            got: other.name(),
            wanted: "Proof",
        }),
    }
}

/// Server side of the handshake, admitting every authenticated session.
/// Refuses (telling the client why) a version mismatch, a client without
/// the key the server holds, a client with a key when the server has none,
/// a wrong proof, and, when the server has no key, any client not on
/// loopback.
pub fn server_handshake<S: Read + Write>(
    conn: &mut Connection<S>,
    key: Option<&Key>,
    peer_is_loopback: bool,
) -> Result<(), ProtoError> {
    server_handshake_admit(conn, key, peer_is_loopback, |_| Ok(()))
}

/// Server side of the handshake, as [`server_handshake`], then `admit`
/// decides on the authenticated client's session: its `Err(reason)` is
/// sent to the client in place of the server's last handshake message
/// (and returned as [`ProtoError::Refused`]); its `Ok` value is returned.
pub fn server_handshake_admit<S: Read + Write, T>(
    conn: &mut Connection<S>,
    key: Option<&Key>,
    peer_is_loopback: bool,
    admit: impl FnOnce(SessionId) -> Result<T, String>,
) -> Result<T, ProtoError> {
    let (version, keyed, theirs, session) = expect_hello(conn.expect_message()?)?;
    let refuse = |conn: &mut Connection<S>, reason: &str| -> ProtoError {
        let _ = conn.send(&Message::Refused {
            reason: reason.to_string(),
        });
        ProtoError::Refused(reason.to_string())
    };
    if version != VERSION {
        let why = format!("protocol version {version} is not spoken here ({VERSION} is)");
        return Err(refuse(conn, &why));
    }
    match (key, keyed) {
        (Some(_), false) => return Err(refuse(conn, "this server requires a key (--key-file)")),
        (None, true) => {
            return Err(refuse(
                conn,
                "this server has no key; start it with the same --key-file",
            ))
        }
        (None, false) if !peer_is_loopback => {
            return Err(refuse(
                conn,
                "without a key this server only serves loopback clients",
            ))
        }
        _ => {}
    }
    let ours = nonce()?;
    let Some(key) = key else {
        // Without a key the client is done after the server's Hello: admit
        // it before that, so a refusal comes in its place.
        let admitted = admit(session).map_err(|why| refuse(conn, &why))?;
        conn.send(&Message::Hello {
            version: VERSION,
            keyed: false,
            nonce: ours,
            session: [0; 16],
        })?;
        return Ok(admitted);
    };
    conn.send(&Message::Hello {
        version: VERSION,
        keyed: true,
        nonce: ours,
        session: [0; 16],
    })?;
    match conn.expect_message()? {
        Message::Proof { mac } => {
            let want = key.proof(CLIENT_LABEL, &ours, &theirs, &session);
            if !bool::from(mac.ct_eq(&want)) {
                let _ = refuse(conn, AUTH_FAILED);
                return Err(ProtoError::Auth(
                    "the client's proof is wrong (different key?)",
                ));
            }
        }
        other => {
            return Err(ProtoError::Unexpected {
                got: other.name(),
                wanted: "Proof",
            })
        }
    }
    let admitted = admit(session).map_err(|why| refuse(conn, &why))?;
    conn.send(&Message::Proof {
        mac: key.proof(SERVER_LABEL, &theirs, &ours, &session),
    })?;
    Ok(admitted)
}
