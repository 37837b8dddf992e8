//! The ephemeral X25519 exchange of a keyed handshake (`ring::agreement`):
//! a fresh private key per connection, its public share in Hello, and the
//! shared secret that [`crate::seal`] mixes into the keys.

use ring::agreement::{agree_ephemeral, EphemeralPrivateKey, UnparsedPublicKey, X25519};
use ring::rand::SystemRandom;

use crate::ProtoError;

/// One side's ephemeral private key (used once, then dropped by `ring`).
pub(crate) struct Ephemeral(EphemeralPrivateKey);

impl Ephemeral {
    /// A fresh key and its 32-byte public share.
    pub(crate) fn new() -> Result<(Ephemeral, [u8; 32]), ProtoError> {
        let failed = |_| ProtoError::Io(std::io::Error::other("X25519 key generation failed"));
        let key = EphemeralPrivateKey::generate(&X25519, &SystemRandom::new()).map_err(failed)?;
        let public = key.compute_public_key().map_err(failed)?;
        let share: [u8; 32] = public
            .as_ref()
            .try_into()
            .map_err(|_| ProtoError::Io(std::io::Error::other("X25519 share is not 32 bytes")))?;
        Ok((Ephemeral(key), share))
    }

    /// The shared secret with the peer's `share`. A share of small order
    /// (the all-zero secret, RFC 7748 §6.1; `ring` refuses it) is an
    /// authentication error: such a share would make the secret known.
    pub(crate) fn agree(self, share: &[u8; 32]) -> Result<[u8; 32], ProtoError> {
        agree_ephemeral(self.0, &UnparsedPublicKey::new(&X25519, share), |dh| {
            let mut out = [0u8; 32];
            out.copy_from_slice(dh);
            out
        })
        .map_err(|_| ProtoError::Auth("the peer's X25519 key share is unusable (small order)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_sides_agree_and_a_small_order_share_is_refused() {
        let (a, share_a) = Ephemeral::new().unwrap();
        let (b, share_b) = Ephemeral::new().unwrap();
        assert_ne!(share_a, share_b);
        let (x, y) = (a.agree(&share_b).unwrap(), b.agree(&share_a).unwrap());
        assert_eq!(x, y);
        assert_ne!(x, [0; 32]);
        // Points of small order (RFC 7748 / curve25519 low-order list):
        // 0 and 1 give an all-zero secret, which must be refused.
        let mut one = [0u8; 32];
        one[0] = 1;
        for bad in [[0u8; 32], one] {
            let (c, _) = Ephemeral::new().unwrap();
            assert!(matches!(c.agree(&bad), Err(ProtoError::Auth(_))));
        }
    }
}
