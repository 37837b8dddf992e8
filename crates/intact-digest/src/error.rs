//! Errors of the digest engine.

use std::io;
use std::path::PathBuf;

/// What can go wrong while computing or comparing digests.
#[derive(Debug, thiserror::Error)]
pub enum DigestError {
    /// The name does not match any supported algorithm.
    #[error(
        "unknown algorithm '{0}' (known: crc32c, xxh3, xxh128, blake3, sha256, sha1, md5, adler32, sha512)"
    )]
    UnknownAlgorithm(String),
    /// A hex string had the wrong length or a non-hex character.
    #[error("'{text}' is not a {algorithm} digest ({expected} hex digits expected)")]
    BadHex {
        /// The text that failed to parse.
        text: String,
        /// The algorithm the digest was meant for.
        algorithm: crate::Algorithm,
        /// How many hex digits that algorithm's digest has.
        expected: usize,
    },
    /// A block size of zero was requested.
    #[error("block size must be greater than 0")]
    ZeroBlockSize,
    /// Reading the input failed.
    #[error("{}: {}", path.display(), io_reason(source))]
    Io {
        /// The file being read.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The path names a directory, which has no digest of its own.
    #[error("{}: is a directory", .0.display())]
    IsDirectory(PathBuf),
}

impl DigestError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        DigestError::Io {
            path: path.into(),
            source,
        }
    }
}

/// An I/O error's message without the "(os error N)" suffix, as command-line
/// tools print it ("No such file or directory").
pub fn io_reason(e: &io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}
