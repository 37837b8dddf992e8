//! How a server groups the streams of one client run: by a secret.
//!
//! Every `intact send` run draws a 32-byte [`SessionSecret`] S that all its
//! streams share. A stream's Hello carries only S's tag
//! `T = BLAKE3-derive_key("intact 2026 session tag", S)[..16]`, which is
//! public; S itself follows in a [`crate::Message::Join`]:
//!
//! - after a keyed handshake's client Proof (pipelined, no extra round
//!   trip), sealed with ChaCha20-Poly1305 under a join key derived from the
//!   handshake (its own HKDF output, see [`crate::seal`]; the nonce is
//!   zero because the key seals this one message only; associated data
//!   [`JOIN_AAD`]), so S is unreadable on the wire even when the frames
//!   are only authenticated (`--no-encrypt`), and a Join recorded on one
//!   connection does not open on another;
//! - after a keyless client's Hello, in the clear: a keyless server only
//!   serves loopback clients, and only root can read loopback traffic.
//!
//! The server opens the Join, checks that S's tag is the Hello's T, and
//! only then admits the stream into the session [`SessionSecret::id`]
//! names (a keyring server mixes the client's name in, see
//! [`SessionId::within`]). Who saw a Hello knows T, not S, so cannot join
//! (take the slots of, or act as) the session that sent it.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::ChaCha20Poly1305;
use subtle::ConstantTimeEq;
use zeroize::Zeroize;

use crate::ProtoError;

/// The grouping key of a server's sessions: derived from the client's
/// [`SessionSecret`] (never from what its Hello shows).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SessionId(pub [u8; 16]);

impl SessionId {
    /// This id as seen by a server with a keyring: the client's name mixed
    /// in, so clients of two keys never share a session (its slots) even
    /// when one knows the other's secret.
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

/// Bytes of a session secret.
pub const SECRET_LEN: usize = 32;
/// Bytes of a sealed Join payload: the secret and the AEAD's tag.
pub const SEALED_JOIN_LEN: usize = SECRET_LEN + 16;
/// The associated data of a sealed Join.
pub const JOIN_AAD: &[u8] = b"intact/7 join";

/// One client run's secret, shared by all its streams.
#[derive(Clone, PartialEq, Eq)]
pub struct SessionSecret([u8; SECRET_LEN]);

impl Drop for SessionSecret {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl std::fmt::Debug for SessionSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionSecret(..)")
    }
}

impl SessionSecret {
    /// A fresh random secret.
    pub fn random() -> Result<SessionSecret, ProtoError> {
        let mut s = [0u8; SECRET_LEN];
        getrandom::fill(&mut s)
            .map_err(|e| ProtoError::Io(std::io::Error::other(e.to_string())))?;
        Ok(SessionSecret(s))
    }

    /// A secret with these bytes (tests, and a Join being read).
    pub fn from_bytes(bytes: [u8; SECRET_LEN]) -> SessionSecret {
        SessionSecret(bytes)
    }

    /// The secret's bytes.
    pub fn bytes(&self) -> &[u8; SECRET_LEN] {
        &self.0
    }

    /// The public tag a Hello carries.
    pub fn tag(&self) -> [u8; 16] {
        let d = blake3::derive_key("intact 2026 session tag", &self.0);
        d[..16].try_into().expect("16 bytes")
    }

    /// Whether this secret is the one `tag` was made from (constant time).
    pub fn matches(&self, tag: &[u8; 16]) -> bool {
        bool::from(self.tag().ct_eq(tag))
    }

    /// The session this secret names on a server.
    pub fn id(&self) -> SessionId {
        let d = blake3::derive_key("intact 2026 session id", &self.0);
        SessionId(d[..16].try_into().expect("16 bytes"))
    }

    /// A keyed handshake's Join payload: the secret sealed under the
    /// handshake's join key.
    pub(crate) fn seal(&self, join_key: &[u8; 32]) -> Vec<u8> {
        let aead = ChaCha20Poly1305::new(join_key.into());
        aead.encrypt(
            &[0u8; 12].into(),
            Payload {
                msg: &self.0,
                aad: JOIN_AAD,
            },
        )
        .expect("ChaCha20-Poly1305 seals 32 bytes")
    }

    /// Opens a keyed handshake's Join payload; `None` if it is not the
    /// right length or was not sealed under `join_key`.
    pub(crate) fn open(join_key: &[u8; 32], payload: &[u8]) -> Option<SessionSecret> {
        if payload.len() != SEALED_JOIN_LEN {
            return None;
        }
        let aead = ChaCha20Poly1305::new(join_key.into());
        let mut plain = aead
            .decrypt(
                &[0u8; 12].into(),
                Payload {
                    msg: payload,
                    aad: JOIN_AAD,
                },
            )
            .ok()?;
        let s = SessionSecret::clear(&plain);
        plain.zeroize();
        s
    }

    /// Reads a keyless handshake's Join payload (the secret in the clear).
    pub(crate) fn clear(payload: &[u8]) -> Option<SessionSecret> {
        Some(SessionSecret(payload.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tag_and_the_id_are_different_functions_of_the_secret() {
        let s = SessionSecret::from_bytes([7; 32]);
        let t = SessionSecret::from_bytes([8; 32]);
        assert!(s.matches(&s.tag()));
        assert!(!t.matches(&s.tag()));
        assert_ne!(s.tag(), s.id().0, "the public tag names the session");
        assert_ne!(s.id(), t.id());
        assert_ne!(s.id().within("a"), s.id().within("b"));
    }

    #[test]
    fn a_sealed_join_opens_only_under_its_key_and_unaltered() {
        let s = SessionSecret::from_bytes([7; 32]);
        let (k, other) = ([1u8; 32], [2u8; 32]);
        let sealed = s.seal(&k);
        assert_eq!(sealed.len(), SEALED_JOIN_LEN);
        assert!(!sealed.windows(32).any(|w| w == s.bytes()));
        assert_eq!(SessionSecret::open(&k, &sealed), Some(s.clone()));
        assert_eq!(SessionSecret::open(&other, &sealed), None);
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 1;
            assert_eq!(SessionSecret::open(&k, &bad), None, "byte {i}");
        }
        assert_eq!(SessionSecret::open(&k, &sealed[..40]), None);
        assert_eq!(SessionSecret::open(&k, s.bytes()), None);
        assert_eq!(SessionSecret::clear(&sealed), None);
        assert_eq!(SessionSecret::clear(s.bytes()), Some(s));
    }
}
