//! A computed digest value, its hex form, and constant-time comparison.

use std::fmt;

use subtle::ConstantTimeEq;

use crate::{Algorithm, DigestError};

/// Longest digest any [`Algorithm`] produces, in bytes.
pub const MAX_DIGEST_LEN: usize = 64;

/// The digest of some bytes under one algorithm.
///
/// Bytes are stored in the order the usual tools print them: big-endian for
/// the integer checksums (CRC-32C, Adler-32, XXH3), as produced for the
/// cryptographic hashes. So `to_hex` matches `xxhsum`, `b3sum`, `sha256sum`.
#[derive(Clone, Copy)]
pub struct Digest {
    algorithm: Algorithm,
    bytes: [u8; MAX_DIGEST_LEN],
}

impl Digest {
    /// Wraps the raw digest bytes of `algorithm`; `raw` must have its length.
    pub(crate) fn from_raw(algorithm: Algorithm, raw: &[u8]) -> Digest {
        debug_assert_eq!(raw.len(), algorithm.digest_len());
        let mut bytes = [0u8; MAX_DIGEST_LEN];
        bytes[..raw.len()].copy_from_slice(raw);
        Digest { algorithm, bytes }
    }

    /// A digest of `algorithm` from its raw bytes (e.g. from the wire);
    /// `None` if the length is not the algorithm's.
    pub fn from_bytes(algorithm: Algorithm, raw: &[u8]) -> Option<Digest> {
        (raw.len() == algorithm.digest_len()).then(|| Digest::from_raw(algorithm, raw))
    }

    /// Parses the hex form (either case) of a digest of `algorithm`.
    pub fn from_hex(algorithm: Algorithm, text: &str) -> Result<Digest, DigestError> {
        let len = algorithm.digest_len();
        let bad = || DigestError::BadHex {
            text: text.to_string(),
            algorithm,
            expected: 2 * len,
        };
        if text.len() != 2 * len {
            return Err(bad());
        }
        let mut bytes = [0u8; MAX_DIGEST_LEN];
        hex::decode_to_slice(text, &mut bytes[..len]).map_err(|_| bad())?;
        Ok(Digest { algorithm, bytes })
    }

    /// The algorithm that produced this digest.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The digest bytes, in printing order.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.algorithm.digest_len()]
    }

    /// Lower-case hex, as the usual command-line tools print it.
    pub fn to_hex(&self) -> String {
        hex::encode(self.as_bytes())
    }

    /// Compares in time independent of where the digests differ.
    ///
    /// Digests of different algorithms are never equal.
    pub fn ct_eq(&self, other: &Digest) -> bool {
        // The algorithm is public; only the bytes must not leak timing.
        self.algorithm == other.algorithm && bool::from(self.as_bytes().ct_eq(other.as_bytes()))
    }
}

impl PartialEq for Digest {
    fn eq(&self, other: &Self) -> bool {
        self.ct_eq(other)
    }
}

impl Eq for Digest {}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.algorithm, self.to_hex())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_length_check() {
        let d = Digest::from_hex(Algorithm::Crc32c, "E3069283").unwrap();
        assert_eq!(d.to_hex(), "e3069283");
        assert!(Digest::from_hex(Algorithm::Crc32c, "e30692").is_err());
        assert!(Digest::from_hex(Algorithm::Crc32c, "e306928g").is_err());
        assert!(Digest::from_hex(Algorithm::Sha256, "e3069283").is_err());
    }

    #[test]
    fn equality_needs_same_algorithm_and_bytes() {
        let a = Digest::from_hex(Algorithm::Crc32c, "00000001").unwrap();
        let b = Digest::from_hex(Algorithm::Adler32, "00000001").unwrap();
        let c = Digest::from_hex(Algorithm::Crc32c, "00000002").unwrap();
        assert!(a.ct_eq(&a));
        assert!(!a.ct_eq(&b));
        assert!(!a.ct_eq(&c));
    }
}
