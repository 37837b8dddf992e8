//! The set of checksum algorithms intact computes.

use std::fmt;
use std::str::FromStr;

use crate::DigestError;

/// A checksum algorithm.
///
/// The `name` of each variant is what `--algo` accepts and what reports print;
/// `aliases` are accepted too so that users of other tools find theirs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// CRC-32C (Castagnoli), hardware-accelerated with SSE4.2 where present.
    Crc32c,
    /// XXH3, 64-bit output.
    Xxh3_64,
    /// XXH3, 128-bit output (XXH128).
    Xxh3_128,
    /// BLAKE3, 256-bit output; its tree allows one file to be hashed on all cores.
    Blake3,
    /// SHA-256 (uses the SHA extensions where present).
    Sha256,
    /// SHA-1, for compatibility with existing manifests only.
    Sha1,
    /// MD5, for compatibility with existing manifests only.
    Md5,
    /// Adler-32, for compatibility with xrdcp/GridFTP users.
    Adler32,
    /// SHA-512, for compatibility with `sha512sum` lists.
    Sha512,
}

impl Algorithm {
    /// Every algorithm, in the order help texts list them. New algorithms
    /// go at the end: the wire protocol names an algorithm by its index here.
    pub const ALL: [Algorithm; 9] = [
        Algorithm::Crc32c,
        Algorithm::Xxh3_64,
        Algorithm::Xxh3_128,
        Algorithm::Blake3,
        Algorithm::Sha256,
        Algorithm::Sha1,
        Algorithm::Md5,
        Algorithm::Adler32,
        Algorithm::Sha512,
    ];

    /// Its id on intact's wire: its place in [`Algorithm::ALL`].
    pub fn wire_id(self) -> u8 {
        Algorithm::ALL
            .iter()
            .position(|a| *a == self)
            .expect("every algorithm is in ALL") as u8
    }

    /// The canonical name, as accepted by `--algo` and printed in reports.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Crc32c => "crc32c",
            Algorithm::Xxh3_64 => "xxh3",
            Algorithm::Xxh3_128 => "xxh128",
            Algorithm::Blake3 => "blake3",
            Algorithm::Sha256 => "sha256",
            Algorithm::Sha1 => "sha1",
            Algorithm::Md5 => "md5",
            Algorithm::Adler32 => "adler32",
            Algorithm::Sha512 => "sha512",
        }
    }

    /// Other spellings accepted for this algorithm.
    pub fn aliases(self) -> &'static [&'static str] {
        match self {
            Algorithm::Crc32c => &["crc-32c", "crc32-c"],
            Algorithm::Xxh3_64 => &["xxh3-64", "xxh3_64", "xxh64-3"],
            Algorithm::Xxh3_128 => &["xxh3-128", "xxh3_128", "xxh3128"],
            Algorithm::Blake3 => &["b3"],
            Algorithm::Sha256 => &["sha-256", "sha2-256"],
            Algorithm::Sha1 => &["sha-1"],
            Algorithm::Md5 => &["md-5"],
            Algorithm::Adler32 => &["adler-32", "adler"],
            Algorithm::Sha512 => &["sha-512", "sha2-512"],
        }
    }

    /// Length of the digest in bytes.
    pub fn digest_len(self) -> usize {
        match self {
            Algorithm::Crc32c | Algorithm::Adler32 => 4,
            Algorithm::Xxh3_64 => 8,
            Algorithm::Xxh3_128 | Algorithm::Md5 => 16,
            Algorithm::Sha1 => 20,
            Algorithm::Blake3 | Algorithm::Sha256 => 32,
            Algorithm::Sha512 => 64,
        }
    }

    /// The algorithms whose digests have `hex_digits` hex digits, in
    /// [`Algorithm::ALL`] order: what a checksum list of unknown origin
    /// may have been made with.
    pub fn with_hex_len(hex_digits: usize) -> impl Iterator<Item = Algorithm> {
        Algorithm::ALL
            .into_iter()
            .filter(move |a| 2 * a.digest_len() == hex_digits)
    }

    /// Whether one long input can be hashed on several cores.
    ///
    /// BLAKE3 is a tree; CRC-32C and Adler-32 have a combine operation that
    /// joins the checksums of two adjacent pieces. XXH3, SHA-256, SHA-1 and
    /// MD5 are strictly sequential: their parallelism is across files.
    pub fn splits_within_file(self) -> bool {
        matches!(
            self,
            Algorithm::Blake3 | Algorithm::Crc32c | Algorithm::Adler32
        )
    }

    /// Whether the algorithm is cryptographic (collision resistant).
    pub fn is_cryptographic(self) -> bool {
        matches!(
            self,
            Algorithm::Blake3 | Algorithm::Sha256 | Algorithm::Sha512
        )
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl serde::Serialize for Algorithm {
    /// As its [`Algorithm::name`], the spelling `--algo` accepts.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for Algorithm {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl FromStr for Algorithm {
    type Err = DigestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().to_ascii_lowercase();
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == wanted || a.aliases().contains(&wanted.as_str()))
            .ok_or_else(|| DigestError::UnknownAlgorithm(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_aliases_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(a.name().parse::<Algorithm>().unwrap(), a);
            for alias in a.aliases() {
                assert_eq!(alias.parse::<Algorithm>().unwrap(), a);
            }
            assert_eq!(a.name().to_uppercase().parse::<Algorithm>().unwrap(), a);
        }
    }

    #[test]
    fn digest_lengths_name_the_candidates() {
        let names = |n| {
            Algorithm::with_hex_len(n)
                .map(Algorithm::name)
                .collect::<Vec<_>>()
        };
        assert_eq!(names(64), ["blake3", "sha256"]);
        assert_eq!(names(128), ["sha512"]);
        assert_eq!(names(32), ["xxh128", "md5"]);
        assert_eq!(names(40), ["sha1"]);
        assert!(names(63).is_empty());
    }

    #[test]
    fn unknown_name_is_an_error() {
        let err = "sha3".parse::<Algorithm>().unwrap_err();
        assert!(err.to_string().contains("sha3"), "{err}");
    }
}
