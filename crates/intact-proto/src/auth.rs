//! The versioned handshake and mutual authentication with a pre-shared key.
//!
//! Both sides send `Hello { version, keyed, nonce }` with 32 fresh random
//! bytes. With a key K, the client then proves it holds K with
//! `Proof { BLAKE3-keyed(K, "intact/1 client" ‖ nonce_server ‖ nonce_client) }`;
//! the server checks it in constant time and answers with its own proof
//! over the nonces in the other order and the label "intact/1 server".
//! The key never crosses the wire; fresh nonces on both sides make a
//! recorded proof useless later; the distinct labels stop a proof being
//! reflected back. Without a key, the server serves loopback clients only.

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use subtle::ConstantTimeEq;

use crate::{Connection, Message, ProtoError};

/// The protocol version this build speaks.
pub const VERSION: u16 = 3;

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

    fn proof(&self, label: &[u8], first: &[u8; 32], second: &[u8; 32]) -> [u8; 32] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(label);
        h.update(&VERSION.to_be_bytes());
        h.update(first);
        h.update(second);
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

fn expect_hello(msg: Message) -> Result<(u16, bool, [u8; 32]), ProtoError> {
    match msg {
        Message::Hello {
            version,
            keyed,
            nonce,
        } => Ok((version, keyed, nonce)),
        Message::Refused { reason } => Err(ProtoError::Refused(reason)),
        other => Err(ProtoError::Unexpected {
            got: other.name(),
            wanted: "Hello",
        }),
    }
}

/// Client side of the handshake. With `key`, the server must prove it
/// holds the same key too; a server without a key is refused.
pub fn client_handshake<S: Read + Write>(
    conn: &mut Connection<S>,
    key: Option<&Key>,
) -> Result<(), ProtoError> {
    let ours = nonce()?;
    conn.send(&Message::Hello {
        version: VERSION,
        keyed: key.is_some(),
        nonce: ours,
    })?;
    let (version, keyed, theirs) = expect_hello(conn.expect_message()?)?;
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
        mac: key.proof(CLIENT_LABEL, &theirs, &ours),
    })?;
    match conn.expect_message()? {
        Message::Proof { mac } => {
            let want = key.proof(SERVER_LABEL, &ours, &theirs);
            if bool::from(mac.ct_eq(&want)) {
                Ok(())
            } else {
                Err(ProtoError::Auth(
                    "the server's proof is wrong (different key?)",
                ))
            }
        }
        Message::Refused { reason } => Err(ProtoError::Refused(reason)),
        other => Err(ProtoError::Unexpected {
            got: other.name(),
            wanted: "Proof",
        }),
    }
}

/// Server side of the handshake. Refuses (telling the client why) a
/// version mismatch, a client without the key the server holds, a client
/// with a key when the server has none, a wrong proof, and, when the
/// server has no key, any client not on loopback.
pub fn server_handshake<S: Read + Write>(
    conn: &mut Connection<S>,
    key: Option<&Key>,
    peer_is_loopback: bool,
) -> Result<(), ProtoError> {
    let (version, keyed, theirs) = expect_hello(conn.expect_message()?)?;
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
    conn.send(&Message::Hello {
        version: VERSION,
        keyed: key.is_some(),
        nonce: ours,
    })?;
    let Some(key) = key else {
        return Ok(());
    };
    match conn.expect_message()? {
        Message::Proof { mac } => {
            let want = key.proof(CLIENT_LABEL, &ours, &theirs);
            if !bool::from(mac.ct_eq(&want)) {
                let _ = refuse(conn, "authentication failed");
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
    conn.send(&Message::Proof {
        mac: key.proof(SERVER_LABEL, &theirs, &ours),
    })
}
