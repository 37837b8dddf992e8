//! The versioned handshake and mutual authentication with a pre-shared key.
//!
//! Both sides send `Hello { version, keyed, nonce, session, suite, share }`
//! with 32 fresh random bytes; from a client, `session` is the public tag
//! T of its run's [`SessionSecret`] (see [`crate::session`]). With a key K,
//! the client then proves it holds K with
//! `Proof { BLAKE3-keyed(K, "intact/1 client" ‖ version ‖ nonce_server ‖
//! nonce_client ‖ T ‖ offer ‖ choice ‖ share_client ‖ share_server) }`
//! and, without waiting, sends its session secret sealed in a `Join`;
//! the server reads both, checks the proof in constant time, opens the
//! Join, checks its secret against T, and answers with its own proof over
//! the nonces in the other order and the label "intact/1 server".
//! The key never crosses the wire; fresh nonces on both sides make a
//! recorded proof useless later; the distinct labels stop a proof being
//! reflected back. Without a key, the server serves loopback clients only,
//! and the client sends its Join in the clear right after its Hello.
//!
//! The server admits a session (its limits) only once the client is
//! authenticated and its secret matches its tag, and refuses it, with the
//! reason, in place of its last handshake message, so a refused client
//! fails before any data moves. Streams are grouped by the secret (the
//! session is [`SessionSecret::id`]), never by the tag a Hello shows.
//!
//! Version 6 seals every frame after a keyed handshake (see
//! [`crate::seal`]): the client's Hello offers (whether AES is fast on it,
//! whether it asks for no encryption), the server's Hello chooses, both
//! bytes are inside both proofs (a relay that changes either breaks the
//! proofs) and inside the key derivation. A server with a keyring tries
//! the client's proof against every key, each in constant time, and
//! tells the caller which client it is. Until the handshake is over a
//! frame may hold at most [`crate::HANDSHAKE_FRAME`] bytes.
//!
//! Version 7 adds the ephemeral X25519 shares (each Hello's `share`; the
//! shared secret goes into the key derivation with K, for forward secrecy,
//! and both shares are inside both proofs, so a relay that swaps one breaks
//! them), the session secret and its `Join`. Messages of a keyed handshake:
//! client Hello → server Hello → client Proof and Join (one write) →
//! server Proof or Refused. Keyless: client Hello and Join (one write) →
//! server Hello or Refused.

use std::io::{Read, Write};

use subtle::{ConditionallySelectable, ConstantTimeEq};

use crate::connection::HANDSHAKE_FRAME;
use crate::dh::Ephemeral;
use crate::seal::{aes_is_fast, Secrets, Security, Transcript, OFFER_AES, OFFER_NO_ENCRYPT};
use crate::{ClientKey, Connection, Key, Message, ProtoError, SessionId, SessionSecret};

/// The protocol version this build speaks (4: Hello carries the client's
/// session id; 5: the `--delete` exchange; 6: sealed frames, FileEnd's
/// whole-file digest is checked, and a file held whole is answered with
/// its recorded digest; 7: ephemeral X25519 in the keys, streams grouped
/// by a session secret sent in a Join, Hello carrying only its tag; 8:
/// the pull exchange, Fetch and Fetched; 9: an Entry names its origin;
/// 10: page CRCs on every Block and page-level resend; 11: split files,
/// an Entry carrying a block range; 12: a Block's BLAKE3 for a recovery
/// cache, asked for in the Status).
pub const VERSION: u16 = 13;

/// The reason a server gives a client whose proof is wrong.
pub const AUTH_FAILED: &str = "authentication failed";

/// The reason a server gives a client whose Join names another session
/// than its Hello's tag.
pub const SECRET_MISMATCH: &str = "the session secret does not match its tag";

/// The reason a server gives a client whose sealed Join does not open
/// (not sealed for this connection: replayed, altered, or garbage).
pub const JOIN_UNOPENED: &str = "the session secret did not open (not sealed for this connection)";

/// What both proofs cover besides the key and the label.
struct Exchange<'a> {
    client_nonce: &'a [u8; 32],
    server_nonce: &'a [u8; 32],
    tag: &'a [u8; 16],
    offer: u8,
    choice: u8,
    client_share: &'a [u8; 32],
    server_share: &'a [u8; 32],
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
        h.update(self.tag);
        h.update(&[self.offer, self.choice]);
        h.update(self.client_share);
        h.update(self.server_share);
        *h.finalize().as_bytes()
    }

    fn transcript(&self) -> Transcript<'_> {
        Transcript {
            version: VERSION,
            client_nonce: self.client_nonce,
            server_nonce: self.server_nonce,
            tag: self.tag,
            offer: self.offer,
            choice: self.choice,
            client_share: self.client_share,
            server_share: self.server_share,
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
    tag: [u8; 16],
    suite: u8,
    share: [u8; 32],
}

fn expect_hello(msg: Message) -> Result<Hello, ProtoError> {
    match msg {
        Message::Hello {
            version,
            keyed,
            nonce,
            session,
            suite,
            share,
        } => Ok(Hello {
            version,
            keyed,
            nonce,
            tag: session,
            suite,
            share,
        }),
        Message::Refused { reason } => Err(ProtoError::Refused(reason)),
        other => Err(ProtoError::Unexpected {
            got: other.name(),
            wanted: "Hello",
        }),
    }
}

/// Reads the client's Join; anything else is refused (with the reason).
fn read_join<S: Read + Write>(conn: &mut Connection<S>) -> Result<Vec<u8>, ProtoError> {
    match conn.expect_message()? {
        Message::Join { payload } => Ok(payload),
        other => {
            let why = format!("expected the session secret (Join), got {}", other.name());
            let _ = conn.send(&Message::Refused {
                reason: why.clone(),
            });
            Err(ProtoError::Refused(why))
        }
    }
}

/// Client side of the handshake, as a session of its own (one stream).
/// With `key`, the server must prove it holds the same key too; a server
/// without a key is refused.
pub fn client_handshake<S: Read + Write>(
    conn: &mut Connection<S>,
    key: Option<&Key>,
) -> Result<(), ProtoError> {
    client_handshake_in(conn, key, &SessionSecret::random()?)
}

/// Client side of the handshake for one stream of the session `secret`
/// names (every stream of one run passes the same secret); frames are
/// encrypted.
pub fn client_handshake_in<S: Read + Write>(
    conn: &mut Connection<S>,
    key: Option<&Key>,
    secret: &SessionSecret,
) -> Result<(), ProtoError> {
    client_handshake_with(conn, key, secret, true).map(|_| ())
}

/// Client side of the handshake; with a key and `encrypt` false, asks the
/// server not to encrypt frames (they are still authenticated). Returns
/// how the connection's frames are protected from now on (the server's
/// choice, authenticated by its proof).
pub fn client_handshake_with<S: Read + Write>(
    conn: &mut Connection<S>,
    key: Option<&Key>,
    secret: &SessionSecret,
    encrypt: bool,
) -> Result<Security, ProtoError> {
    conn.set_limit(HANDSHAKE_FRAME);
    let ours = nonce()?;
    let tag = secret.tag();
    let offer = match key {
        None => 0,
        Some(_) => {
            (if aes_is_fast() { OFFER_AES } else { 0 })
                | (if encrypt { 0 } else { OFFER_NO_ENCRYPT })
        }
    };
    let (ephemeral, share) = match key {
        Some(_) => {
            let (e, s) = Ephemeral::new()?;
            (Some(e), s)
        }
        None => (None, [0; 32]),
    };
    conn.write_message(&Message::Hello {
        version: VERSION,
        keyed: key.is_some(),
        nonce: ours,
        session: tag,
        suite: offer,
        share,
    })?;
    if key.is_none() {
        // Keyless (loopback only: only root reads loopback traffic): the
        // secret goes in the clear, in the same write as the Hello.
        conn.write_message(&Message::Join {
            payload: secret.bytes().to_vec(),
        })?;
    }
    conn.flush()?;
    let theirs = expect_hello(conn.expect_message()?)?;
    if theirs.version != VERSION {
        return Err(ProtoError::Version {
            peer: theirs.version,
            ours: VERSION,
        });
    }
    let (Some(key), Some(ephemeral)) = (key, ephemeral) else {
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
    let dh = zeroize::Zeroizing::new(ephemeral.agree(&theirs.share)?);
    let ex = Exchange {
        client_nonce: &ours,
        server_nonce: &theirs.nonce,
        tag: &tag,
        offer,
        choice: theirs.suite,
        client_share: &share,
        server_share: &theirs.share,
    };
    let transcript = ex.transcript();
    let secrets = Secrets::new(key, &dh, &transcript);
    // Proof and Join in one write: no round trip for the Join.
    conn.write_message(&Message::Proof {
        mac: ex.proof(key, CLIENT_LABEL),
    })?;
    conn.send(&Message::Join {
        payload: secret.seal(&secrets.join_key()),
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
    let (to_server, to_client) = secrets.frame_keys(security);
    conn.established(security, Some((to_client, to_server)));
    Ok(security)
}

/// Server side of the handshake, admitting every authenticated session.
/// Refuses (telling the client why) a version mismatch, a client without
/// the key the server holds, a client with a key when the server has none,
/// a wrong proof, a session secret that does not match its tag, and, when
/// the server has no key, any client not on loopback.
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
/// against every key, each in constant time, its session secret is opened
/// and checked against its Hello's tag, and `admit` is told the session
/// (named by the secret: [`SessionSecret::id`]) and which client proved
/// itself. With `encrypt` false frames are authenticated but not
/// encrypted (a client may ask for that too).
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
    // A keyless client sent its Join with its Hello: read it before any
    // refusal, so no unread bytes turn the close into a reset that could
    // lose the reason.
    let clear_join = if theirs.keyed {
        None
    } else {
        Some(read_join(conn)?)
    };
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
    if let Some(payload) = clear_join {
        // Without a key the client is done after the server's Hello: admit
        // it before that, so a refusal comes in its place.
        let Some(secret) = SessionSecret::clear(&payload) else {
            return Err(refuse(conn, "the session secret is not 32 bytes"));
        };
        if !secret.matches(&theirs.tag) {
            return Err(refuse(conn, SECRET_MISMATCH));
        }
        let admitted = admit(secret.id(), None).map_err(|why| refuse(conn, &why))?;
        conn.send(&Message::Hello {
            version: VERSION,
            keyed: false,
            nonce: ours,
            session: [0; 16],
            suite: Security::Plain.wire(),
            share: [0; 32],
        })?;
        conn.established(Security::Plain, None);
        return Ok(admitted);
    }
    let security = Security::choose(theirs.suite, encrypt);
    let (ephemeral, share) = Ephemeral::new()?;
    let dh = match ephemeral.agree(&theirs.share) {
        Ok(dh) => zeroize::Zeroizing::new(dh),
        Err(e) => {
            let _ = refuse(
                conn,
                "the client's X25519 key share is unusable (small order)",
            );
            return Err(e);
        }
    };
    let ex = Exchange {
        client_nonce: &theirs.nonce,
        server_nonce: &ours,
        tag: &theirs.tag,
        offer: theirs.suite,
        choice: security.wire(),
        client_share: &theirs.share,
        server_share: &share,
    };
    conn.send(&Message::Hello {
        version: VERSION,
        keyed: true,
        nonce: ours,
        session: [0; 16],
        suite: ex.choice,
        share,
    })?;
    let mac = match conn.expect_message()? {
        Message::Proof { mac } => mac,
        other => {
            return Err(ProtoError::Unexpected {
                got: other.name(),
                wanted: "Proof",
            })
        }
    };
    // The client sent its Join with its Proof: read it before judging
    // either (nothing is left unread behind a refusal).
    let join = read_join(conn)?;
    // Every key is tried, each compared in constant time: the time taken
    // tells nothing about which key matched, or how nearly.
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
    let client = &clients[index as usize];
    let transcript = ex.transcript();
    let secrets = Secrets::new(&client.key, &dh, &transcript);
    let Some(secret) = SessionSecret::open(&secrets.join_key(), &join) else {
        return Err(refuse(conn, JOIN_UNOPENED));
    };
    if !secret.matches(&theirs.tag) {
        return Err(refuse(conn, SECRET_MISMATCH));
    }
    let admitted = admit(secret.id(), Some(client)).map_err(|why| refuse(conn, &why))?;
    conn.send(&Message::Proof {
        mac: ex.proof(&client.key, SERVER_LABEL),
    })?;
    let (from_client, to_client) = secrets.frame_keys(security);
    conn.established(security, Some((from_client, to_client)));
    Ok(admitted)
}

#[cfg(test)]
mod tests;
