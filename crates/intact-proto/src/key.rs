//! Pre-shared keys: the formats of a key file, passphrase stretching, and
//! writing a fresh key (`intact keygen`).
//!
//! A key file holds one of three things (surrounding whitespace ignored):
//!
//! * a generated key, one line `intact-key-v1 <64 hex digits>`: the 32
//!   bytes are the key itself (written by [`write_new_key_file`]);
//! * a keyring, for `intact serve` only: lines
//!   `intact-client-v1 NAME SUBTREE SECRET`, see [`crate::Keyring`];
//! * anything else is a passphrase of at least [`MIN_PASSPHRASE`] bytes,
//!   stretched with Argon2id (RFC 9106) at fixed parameters —
//!   [`ARGON2_MEMORY_KIB`] KiB of memory, [`ARGON2_PASSES`] passes, one
//!   lane (the OWASP minimum for Argon2id), and the fixed salt
//!   [`PASSPHRASE_SALT`]. The salt is fixed because both ends must derive
//!   the same key from the same words with nothing exchanged; the cost is
//!   that equal passphrases give equal keys everywhere, so a generated key
//!   is the better choice and a short passphrase is refused outright.
//!
//! Like ssh with private keys, a key file that group or others can read is
//! refused. Key bytes are wiped from memory when a [`Key`] is dropped.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use zeroize::{Zeroize, Zeroizing};

use crate::ProtoError;

/// First word of a generated key's line.
pub const KEY_TAG: &str = "intact-key-v1";
/// Fewest bytes a passphrase may have.
pub const MIN_PASSPHRASE: usize = 16;
/// Argon2id memory cost, KiB (19 MiB: OWASP's minimum for Argon2id).
pub const ARGON2_MEMORY_KIB: u32 = 19 * 1024;
/// Argon2id passes over that memory.
pub const ARGON2_PASSES: u32 = 2;
/// The fixed Argon2id salt (both ends must agree without talking).
pub const PASSPHRASE_SALT: &[u8] = b"intact 2026 passphrase-to-key v1";

/// A pre-shared key: 32 secret bytes, wiped on drop, never printed.
#[derive(Clone)]
pub struct Key([u8; 32]);

impl Drop for Key {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl PartialEq for Key {
    /// Constant-time comparison.
    fn eq(&self, other: &Key) -> bool {
        use subtle::ConstantTimeEq;
        bool::from(self.0.ct_eq(&other.0))
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

fn key_err(path: &str, reason: impl Into<String>) -> ProtoError {
    ProtoError::Key {
        path: path.to_string(),
        reason: reason.into(),
    }
}

impl Key {
    /// A fresh random key from the operating system's generator.
    pub fn generate() -> Result<Key, ProtoError> {
        let mut k = [0u8; 32];
        getrandom::fill(&mut k)
            .map_err(|e| ProtoError::Io(std::io::Error::other(e.to_string())))?;
        Ok(Key(k))
    }

    /// The key's bytes (for the handshake's proofs and key derivation).
    pub(crate) fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A secret derived from the key for one purpose (BLAKE3's key
    /// derivation with `context`), which tells nothing of the key.
    pub fn derive(&self, context: &str) -> [u8; 32] {
        blake3::derive_key(context, &self.0)
    }

    /// The key stretched from a passphrase (at least [`MIN_PASSPHRASE`]
    /// bytes) by Argon2id at the fixed parameters above.
    pub fn from_passphrase(pass: &[u8]) -> Result<Key, ProtoError> {
        if pass.len() < MIN_PASSPHRASE {
            return Err(key_err(
                "(passphrase)",
                format!(
                    "a passphrase must hold at least {MIN_PASSPHRASE} bytes (or use `intact keygen`)"
                ),
            ));
        }
        let params = argon2::Params::new(ARGON2_MEMORY_KIB, ARGON2_PASSES, 1, Some(32))
            .map_err(|e| key_err("(passphrase)", e.to_string()))?;
        let argon =
            argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        let mut out = [0u8; 32];
        argon
            .hash_password_into(pass, PASSPHRASE_SALT, &mut out)
            .map_err(|e| key_err("(passphrase)", e.to_string()))?;
        let k = Key(out);
        out.zeroize();
        Ok(k)
    }

    /// Same as [`Key::from_passphrase`] (kept for callers of earlier
    /// versions, whose secrets were derived without stretching).
    pub fn from_secret(secret: &[u8]) -> Result<Key, ProtoError> {
        Key::from_passphrase(secret)
    }

    /// Parses a secret as written in a key file or a keyring line: a
    /// generated key (`intact-key-v1 HEX`) or else a passphrase.
    pub(crate) fn parse_secret(text: &[u8], path: &str) -> Result<Key, ProtoError> {
        let text = text.trim_ascii();
        let tag = KEY_TAG.as_bytes();
        if let Some(rest) = text.strip_prefix(tag) {
            if rest.first().is_some_and(u8::is_ascii_whitespace) || rest.is_empty() {
                let hex_digits = rest.trim_ascii();
                let mut k = [0u8; 32];
                if hex_digits.len() != 64 || hex::decode_to_slice(hex_digits, &mut k).is_err() {
                    return Err(key_err(
                        path,
                        format!("{KEY_TAG} must be followed by 64 hex digits (32 bytes)"),
                    ));
                }
                return Ok(Key(k));
            }
        }
        Key::from_passphrase(text).map_err(|_| {
            key_err(
                path,
                format!(
                    "neither a generated key ({KEY_TAG} HEX) nor a passphrase of at least {MIN_PASSPHRASE} bytes"
                ),
            )
        })
    }

    /// Reads a client's key file: a generated key or a passphrase (a
    /// keyring is for `intact serve`).
    pub fn from_file(path: &Path) -> Result<Key, ProtoError> {
        let name = path.display().to_string();
        let bytes = read_private(path)?;
        if crate::keyring::is_keyring(&bytes) {
            return Err(key_err(
                &name,
                "this is a keyring (intact-client-v1 lines), for `intact serve`; give the client the one key of its line",
            ));
        }
        Key::parse_secret(&bytes, &name)
    }

    /// The key's line in a key file: `intact-key-v1 <64 hex>`.
    pub fn to_line(&self) -> Zeroizing<String> {
        Zeroizing::new(format!("{KEY_TAG} {}", hex::encode(self.0)))
    }
}

/// Reads a key file that only its owner can read.
pub(crate) fn read_private(path: &Path) -> Result<Zeroizing<Vec<u8>>, ProtoError> {
    let name = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| key_err(&name, e.to_string()))?;
    if meta.mode() & 0o077 != 0 {
        return Err(key_err(
            &name,
            format!(
                "permissions {:o} let others read it (chmod 600)",
                meta.mode() & 0o777
            ),
        ));
    }
    std::fs::read(path)
        .map(Zeroizing::new)
        .map_err(|e| key_err(&name, e.to_string()))
}

/// Writes a fresh generated key to `path`, created with mode 0600 and
/// `O_EXCL` (an existing file is an error), unless `force`: then the key
/// is written to a new file beside it (0600, `O_EXCL`) and renamed over
/// it, so the key is never readable by others, not even for a moment.
pub fn write_new_key_file(path: &Path, force: bool) -> Result<Key, ProtoError> {
    let name = path.display().to_string();
    let key = Key::generate()?;
    let mut line = key.to_line();
    line.push('\n');
    // O_CREAT | O_EXCL: never opens an existing file, nor follows a
    // symlink planted at the name (even a dangling one).
    let create = |p: &Path| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(p)
    };
    if !force {
        let mut f = create(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                key_err(
                    &name,
                    "already exists; refusing to overwrite it (--force replaces it)",
                )
            } else {
                key_err(&name, e.to_string())
            }
        })?;
        f.write_all(line.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| key_err(&name, e.to_string()))?;
        return Ok(key);
    }
    let file_name = path
        .file_name()
        .ok_or_else(|| key_err(&name, "not a file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".keygen-{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let written = (|| {
        let mut f = create(&tmp)?;
        f.write_all(line.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(key_err(&name, e.to_string()));
    }
    Ok(key)
}
