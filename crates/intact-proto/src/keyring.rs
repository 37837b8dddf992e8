//! A server's keyring: several clients, each with its own key and its own
//! subtree of the root, so that clients of one server cannot touch each
//! other's data (as rsync's daemon modules and XRootD's export paths do).
//!
//! Format: one client per line, blank lines and lines starting with `#`
//! ignored, fields separated by blanks:
//!
//! ```text
//! # name    subtree      secret (the rest of the line)
//! intact-client-v1 alice  groups/alice  intact-key-v1 5f0c…(64 hex digits)
//! intact-client-v1 bob    groups/bob    a passphrase of sixteen bytes or more
//! ```
//!
//! * NAME: 1 to 64 of `A-Z a-z 0-9 . _ -`, unique; it names the client in
//!   the log.
//! * SUBTREE: the directory under the root the client is confined to,
//!   relative, by the rules of a wire path (no `..`, no `.intact`
//!   component at its start), created when the client first connects.
//!   No subtree may contain another (a client of the outer one could
//!   write the inner one's files); two clients may share one subtree.
//!   `/` gives a client the whole root, and is then the only subtree the
//!   keyring may name.
//! * SECRET: a generated key (`intact-key-v1 HEX`) or a passphrase, as in
//!   a single key file (see [`crate::key`]); no two clients may hold the
//!   same key (the server tells clients apart by their key).
//!
//! The client's own `--key-file` holds just its secret (the same
//! `intact-key-v1 HEX` line, or the same passphrase).

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::key::{read_private, Key};
use crate::{ProtoError, WirePath};

/// First word of a keyring line.
pub const CLIENT_TAG: &str = "intact-client-v1";

/// One client of a keyring.
#[derive(Clone, Debug)]
pub struct ClientKey {
    /// Its name, for the log.
    pub name: String,
    /// Its key.
    pub key: Key,
    /// The subtree of the root it is confined to (`None`: the whole root).
    pub subtree: Option<WirePath>,
}

/// The clients a server knows by key.
#[derive(Clone, Debug, Default)]
pub struct Keyring {
    clients: Vec<ClientKey>,
}

/// Whether a key file's contents are a keyring (its first line that is
/// neither blank nor a comment starts with [`CLIENT_TAG`]).
pub(crate) fn is_keyring(bytes: &[u8]) -> bool {
    bytes
        .split(|&b| b == b'\n')
        .map(<[u8]>::trim_ascii)
        .find(|l| !l.is_empty() && !l.starts_with(b"#"))
        .is_some_and(|l| l.starts_with(CLIENT_TAG.as_bytes()))
}

fn err(path: &str, line: usize, reason: impl std::fmt::Display) -> ProtoError {
    ProtoError::Key {
        path: path.to_string(),
        reason: format!("line {line}: {reason}"),
    }
}

/// Splits off the first blank-separated word.
fn word(s: &[u8]) -> (&[u8], &[u8]) {
    let s = s.trim_ascii_start();
    let end = s
        .iter()
        .position(u8::is_ascii_whitespace)
        .unwrap_or(s.len());
    (&s[..end], s[end..].trim_ascii_start())
}

impl Keyring {
    /// A keyring of one client with the whole root.
    pub fn single(key: Key) -> Keyring {
        Keyring {
            clients: vec![ClientKey {
                name: "key".into(),
                key,
                subtree: None,
            }],
        }
    }

    /// Its clients, in the file's order.
    pub fn clients(&self) -> &[ClientKey] {
        &self.clients
    }

    /// Reads a server's key file: a keyring, or a single key (one client
    /// with the whole root). The file must be private (mode 600).
    pub fn from_file(path: &Path) -> Result<Keyring, ProtoError> {
        let name = path.display().to_string();
        let bytes = read_private(path)?;
        if is_keyring(&bytes) {
            Keyring::parse(&bytes, &name)
        } else {
            Ok(Keyring::single(Key::parse_secret(&bytes, &name)?))
        }
    }

    /// Parses keyring text (`path` names it in errors).
    pub fn parse(text: &[u8], path: &str) -> Result<Keyring, ProtoError> {
        let mut clients: Vec<ClientKey> = Vec::new();
        for (n, line) in text.split(|&b| b == b'\n').enumerate() {
            let n = n + 1;
            let line = line.trim_ascii();
            if line.is_empty() || line.starts_with(b"#") {
                continue;
            }
            let (tag, rest) = word(line);
            if tag != CLIENT_TAG.as_bytes() {
                return Err(err(
                    path,
                    n,
                    format!("expected `{CLIENT_TAG} NAME SUBTREE SECRET`"),
                ));
            }
            let (name, rest) = word(rest);
            let (subtree, secret) = word(rest);
            let name = std::str::from_utf8(name)
                .ok()
                .filter(|s| {
                    (1..=64).contains(&s.len())
                        && s.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
                })
                .ok_or_else(|| err(path, n, "NAME must be 1-64 of A-Z a-z 0-9 . _ -"))?
                .to_string();
            let subtree = parse_subtree(subtree).map_err(|why| err(path, n, why))?;
            if secret.is_empty() {
                return Err(err(path, n, "no SECRET after NAME and SUBTREE"));
            }
            let key = Key::parse_secret(secret, path).map_err(|e| match e {
                ProtoError::Key { reason, .. } => err(path, n, reason),
                other => other,
            })?;
            for c in &clients {
                if c.name == name {
                    return Err(err(path, n, format!("name {name} is used twice")));
                }
                if c.key == key {
                    return Err(err(
                        path,
                        n,
                        format!(
                            "{name} holds the same key as {} (each client needs its own)",
                            c.name
                        ),
                    ));
                }
                if nested(c.subtree.as_ref(), subtree.as_ref()) {
                    return Err(err(
                        path,
                        n,
                        format!(
                            "{name}'s subtree and {}'s contain one another (they would reach each other's files)",
                            c.name
                        ),
                    ));
                }
            }
            clients.push(ClientKey { name, key, subtree });
        }
        if clients.is_empty() {
            return Err(ProtoError::Key {
                path: path.to_string(),
                reason: "the keyring names no client".into(),
            });
        }
        Ok(Keyring { clients })
    }
}

/// A SUBTREE field: `/` (the whole root) or a relative wire path whose
/// first component is not `.intact` (the server's own state).
fn parse_subtree(s: &[u8]) -> Result<Option<WirePath>, String> {
    if s == b"/" {
        return Ok(None);
    }
    let p = WirePath::parse(s).map_err(|e| format!("SUBTREE: {e}"))?;
    let first = p.components().next().map(|c| c.as_bytes());
    if first == Some(b".intact".as_slice()) {
        return Err("SUBTREE must not be inside .intact (the server's own state)".into());
    }
    if p.components()
        .any(|c| c.as_bytes().starts_with(b".intact-partial-"))
    {
        return Err("SUBTREE must not name a partial file".into());
    }
    Ok(Some(p))
}

/// Whether one subtree contains the other, or they are distinct but one
/// is the whole root. Equal subtrees are allowed (shared on purpose).
fn nested(a: Option<&WirePath>, b: Option<&WirePath>) -> bool {
    match (a, b) {
        (None, None) => false,
        (None, Some(_)) | (Some(_), None) => true,
        (Some(a), Some(b)) => {
            let ca: Vec<_> = a.components().collect();
            let cb: Vec<_> = b.components().collect();
            ca != cb && (ca.starts_with(&cb) || cb.starts_with(&ca))
        }
    }
}
