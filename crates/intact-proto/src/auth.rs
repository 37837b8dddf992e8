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
//!
//! Version 6 seals every frame after a keyed handshake (see
//! [`crate::seal`]): the client's Hello offers (whether AES is fast on it,
//! whether it asks for no encryption), the server's Hello chooses, both
//! bytes are inside both proofs (a relay that changes either breaks the
//! proofs) and inside the key derivation. A server with a keyring tries
//! the client's proof against every key, each in constant time, and
//! tells the caller which client it is. Until the handshake is over a
//! frame may hold at most [`crate::HANDSHAKE_FRAME`] bytes.

use std::io::{Read, Write};

use subtle::{ConditionallySelectable, ConstantTimeEq};

use crate::connection::HANDSHAKE_FRAME;
use crate::seal::{aes_is_fast, derive, Security, Transcript, OFFER_AES, OFFER_NO_ENCRYPT};
use crate::{ClientKey, Connection, Key, Message, ProtoError};

/// The protocol version this build speaks (4: Hello carries the client's
/// session id; 5: the `--delete` exchange; 6: sealed frames, FileEnd's
/// whole-file digest is checked, and a file held whole is answered with
/// its recorded digest).
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

impl SessionId {
    /// This id as seen by a server with a keyring: the client's name mixed
    /// in, so clients of two keys never share a session (its slots) even
    /// when one sends the other's id.
    pub fn within(&self, name: &str) -> SessionId {
        let mut h = blake3::Hasher::new_derive_key("intact 2026 session id within a client name");
        h.update(&(name.len() as u64).to_be_bytes());
        h.update(name.as_bytes());
        h.update(&self.0);
        let mut id = [0u8; 16];
        id.copy_from_slice(&h.finalize().as_bytes()[..16]);
        SessionId(id)
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

/// What both proofs cover besides the key and the label.
struct Exchange<'a> {
    client_nonce: &'a [u8; 32],
    server_nonce: &'a [u8; 32],
    session: &'a SessionId,
    offer: u8,
    choice: u8,
}

impl Exchange<'_> {
    /// The proof of `label`'s side; `first` is the other side's nonce.
    fn proof(&self, key: &Key, label: &[u8]) -> [u8; 32] {
        let (first, second) = if label == CLIENT_LABEL {
            (self.server_nonce, self.client_nonce)
        } else {
            (self.client_nonce, self.server_nonce)
        };
        let mut h = blake3::Hasher::new_keyed(key.bytes());
        h.update(label);
        h.update(&VERSION.to_be_bytes());
        h.update(first);
        h.update(second);
        h.update(&self.session.0);
        h.update(&[self.offer, self.choice]);
        *h.finalize().as_bytes()
    }

    fn transcript(&self) -> Transcript<'_> {
        Transcript {
            version: VERSION,
            client_nonce: self.client_nonce,
            server_nonce: self.server_nonce,
            session: &self.session.0,
            offer: self.offer,
            choice: self.choice,
        }
    }
}

const CLIENT_LABEL: &[u8] = b"intact/1 client";
const SERVER_LABEL: &[u8] = b"intact/1 server";

fn nonce() -> Result<[u8; 32], ProtoError> {
    let mut n = [0u8; 32];
    getrandom::fill(&mut n).map_err(|e| ProtoError::Io(std::io::Error::other(e.to_string())))?;
    Ok(n)
}

/// A Hello's fields.
struct Hello {
    version: u16,
    keyed: bool,
    nonce: [u8; 32],
    session: SessionId,
    suite: u8,
}

fn expect_hello(msg: Message) -> Result<Hello, ProtoError> {
    match msg {
        Message::Hello {
            version,
            keyed,
            nonce,
            session,
            suite,
        } => Ok(Hello {
            version,
            keyed,
            nonce,
            session: SessionId(session),
            suite,
        }),
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
/// of one run passes the same id); frames are encrypted.
pub fn client_handshake_in<S: Read + Write>(
    conn: &mut Connection<S>,
    key: Option<&Key>,
    session: &SessionId,
) -> Result<(), ProtoError> {
    client_handshake_with(conn, key, session, true).map(|_| ())
}

/// Client side of the handshake; with a key and `encrypt` false, asks the
/// server not to encrypt frames (they are still authenticated). Returns
/// how the connection's frames are protected from now on (the server's
/// choice, authenticated by its proof).
pub fn client_handshake_with<S: Read + Write>(
    conn: &mut Connection<S>,
    key: Option<&Key>,
    session: &SessionId,
    encrypt: bool,
) -> Result<Security, ProtoError> {
    conn.set_limit(HANDSHAKE_FRAME);
    let ours = nonce()?;
    let offer = match key {
        None => 0,
        Some(_) => {
            (if aes_is_fast() { OFFER_AES } else { 0 })
                | (if encrypt { 0 } else { OFFER_NO_ENCRYPT })
        }
    };
    conn.send(&Message::Hello {
        version: VERSION,
        keyed: key.is_some(),
        nonce: ours,
        session: session.0,
        suite: offer,
    })?;
    let theirs = expect_hello(conn.expect_message()?)?;
    if theirs.version != VERSION {
        return Err(ProtoError::Version {
            peer: theirs.version,
            ours: VERSION,
        });
    }
    let Some(key) = key else {
        if theirs.keyed {
            return Err(ProtoError::Auth("the server requires a key (--key-file)"));
        }
        if theirs.suite != 0 {
            return Err(ProtoError::Auth(
                "a keyless server chose to seal frames, which it cannot",
            ));
        }
        conn.established(Security::Plain, None);
        return Ok(Security::Plain);
    };
    if !theirs.keyed {
        return Err(ProtoError::Auth(
            "the server has no key, so it cannot prove who it is",
        ));
    }
    let security = match Security::from_wire(theirs.suite) {
        Some(s @ Security::Sealed { .. }) => s,
        _ => {
            return Err(ProtoError::Auth(
                "the server chose a frame protection this client does not know",
            ))
        }
    };
    let ex = Exchange {
        client_nonce: &ours,
        server_nonce: &theirs.nonce,
        session,
        offer,
        choice: theirs.suite,
    };
    conn.send(&Message::Proof {
        mac: ex.proof(key, CLIENT_LABEL),
    })?;
    match conn.expect_message()? {
        Message::Proof { mac } => {
            if !bool::from(mac.ct_eq(&ex.proof(key, SERVER_LABEL))) {
                return Err(ProtoError::Auth(
                    "the server's proof is wrong (different key at the server? both sides need the same --key-file)",
                ));
            }
        }
        Message::Refused { reason } if reason == AUTH_FAILED => {
            return Err(ProtoError::Auth(
                "the server did not accept this key (different key at the server? both sides need the same --key-file)",
            ))
        }
        Message::Refused { reason } => return Err(ProtoError::Refused(reason)),
        other => {
            return Err(ProtoError::Unexpected {
                got: other.name(),
                wanted: "Proof",
            })
        }
    }
    let (to_server, to_client) = derive(key, &ex.transcript(), security);
    conn.established(security, Some((to_client, to_server)));
    Ok(security)
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
/// Frames are encrypted unless the client asks otherwise.
pub fn server_handshake_admit<S: Read + Write, T>(
    conn: &mut Connection<S>,
    key: Option<&Key>,
    peer_is_loopback: bool,
    admit: impl FnOnce(SessionId) -> Result<T, String>,
) -> Result<T, ProtoError> {
    let ring = key.map(|k| crate::Keyring::single(k.clone()));
    let clients = ring.as_ref().map_or(&[][..], |r| r.clients());
    server_handshake_keyring(conn, clients, true, peer_is_loopback, |id, _| admit(id))
}

/// Server side of the handshake against several clients' keys (none: a
/// keyless server, loopback clients only): the client's proof is checked
/// against every key, each in constant time, and `admit` is told the
/// session and which client proved itself. With `encrypt` false frames
/// are authenticated but not encrypted (a client may ask for that too).
pub fn server_handshake_keyring<S: Read + Write, T>(
    conn: &mut Connection<S>,
    clients: &[ClientKey],
    encrypt: bool,
    peer_is_loopback: bool,
    admit: impl FnOnce(SessionId, Option<&ClientKey>) -> Result<T, String>,
) -> Result<T, ProtoError> {
    conn.set_limit(HANDSHAKE_FRAME);
    let theirs = expect_hello(conn.expect_message()?)?;
    let refuse = |conn: &mut Connection<S>, reason: &str| -> ProtoError {
        let _ = conn.send(&Message::Refused {
            reason: reason.to_string(),
        });
        ProtoError::Refused(reason.to_string())
    };
    if theirs.version != VERSION {
        let why = format!(
            "protocol version {} is not spoken here ({VERSION} is)",
            theirs.version
        );
        return Err(refuse(conn, &why));
    }
    match (clients.is_empty(), theirs.keyed) {
        (false, false) => return Err(refuse(conn, "this server requires a key (--key-file)")),
        (true, true) => {
            return Err(refuse(
                conn,
                "this server has no key; start it with the same --key-file",
            ))
        }
        (true, false) if !peer_is_loopback => {
            return Err(refuse(
                conn,
                "without a key this server only serves loopback clients",
            ))
        }
        _ => {}
    }
    let ours = nonce()?;
    let session = theirs.session;
    if clients.is_empty() {
        // Without a key the client is done after the server's Hello: admit
        // it before that, so a refusal comes in its place.
        let admitted = admit(session, None).map_err(|why| refuse(conn, &why))?;
        conn.send(&Message::Hello {
            version: VERSION,
            keyed: false,
            nonce: ours,
            session: [0; 16],
            suite: Security::Plain.wire(),
        })?;
        conn.established(Security::Plain, None);
        return Ok(admitted);
    }
    let security = Security::choose(theirs.suite, encrypt);
    let ex = Exchange {
        client_nonce: &theirs.nonce,
        server_nonce: &ours,
        session: &session,
        offer: theirs.suite,
        choice: security.wire(),
    };
    conn.send(&Message::Hello {
        version: VERSION,
        keyed: true,
        nonce: ours,
        session: [0; 16],
        suite: ex.choice,
    })?;
    let client = match conn.expect_message()? {
        Message::Proof { mac } => {
            // Every key is tried, each compared in constant time: the time
            // taken tells nothing about which key matched, or how nearly.
            let mut found = subtle::Choice::from(0);
            let mut index = 0u32;
            for (i, c) in clients.iter().enumerate() {
                let hit = mac.ct_eq(&ex.proof(&c.key, CLIENT_LABEL));
                index.conditional_assign(&(i as u32), hit & !found);
                found |= hit;
            }
            if !bool::from(found) {
                let _ = refuse(conn, AUTH_FAILED);
                return Err(ProtoError::Auth(
                    "the client's proof is wrong (different key?)",
                ));
            }
            &clients[index as usize]
        }
        other => {
            return Err(ProtoError::Unexpected {
                got: other.name(),
                wanted: "Proof",
            })
        }
    };
    let admitted = admit(session, Some(client)).map_err(|why| refuse(conn, &why))?;
    conn.send(&Message::Proof {
        mac: ex.proof(&client.key, SERVER_LABEL),
    })?;
    let (from_client, to_client) = derive(&client.key, &ex.transcript(), security);
    conn.established(security, Some((from_client, to_client)));
    Ok(admitted)
}
