//! Paths as they travel on the wire, and the rules they must follow.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::ProtoError;

/// Longest path accepted from the wire, in bytes (Linux's PATH_MAX).
pub const MAX_PATH_LEN: usize = 4096;

/// A relative, normalised path from the wire: non-empty components joined
/// by `/`, none of them `.` or `..`, no NUL byte, no leading `/`, at most
/// [`MAX_PATH_LEN`] bytes. Constructing one is the only way a path from a
/// peer reaches the file system, so every path there obeys these rules.
///
/// The rules keep a path inside the root *lexically*. A symlink already
/// inside the root could still lead out; the receiver must resolve
/// components without following symlinks (openat with O_NOFOLLOW).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WirePath(Vec<u8>);

impl WirePath {
    /// Checks bytes received from a peer.
    pub fn parse(bytes: &[u8]) -> Result<WirePath, ProtoError> {
        let bad = |reason| ProtoError::BadPath {
            path: String::from_utf8_lossy(bytes).into_owned(),
            reason,
        };
        if bytes.is_empty() {
            return Err(bad("empty"));
        }
        if bytes.len() > MAX_PATH_LEN {
            return Err(bad("longer than 4096 bytes"));
        }
        if bytes.contains(&0) {
            return Err(bad("contains a NUL byte"));
        }
        if bytes[0] == b'/' {
            return Err(bad("absolute"));
        }
        for c in bytes.split(|&b| b == b'/') {
            match c {
                b"" => return Err(bad("empty component (// or trailing /)")),
                b"." => return Err(bad("'.' component")),
                b".." => return Err(bad("'..' component")),
                _ => {}
            }
        }
        Ok(WirePath(bytes.to_vec()))
    }

    /// The wire form of a local relative path (sender side).
    pub fn from_relative(path: &Path) -> Result<WirePath, ProtoError> {
        let mut out = Vec::new();
        for c in path.components() {
            match c {
                Component::Normal(s) => {
                    if !out.is_empty() {
                        out.push(b'/');
                    }
                    out.extend_from_slice(s.as_bytes());
                }
                Component::CurDir => {}
                _ => {
                    return Err(ProtoError::BadPath {
                        path: path.display().to_string(),
                        reason: "not a plain relative path",
                    })
                }
            }
        }
        WirePath::parse(&out)
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The components, each a single file name.
    pub fn components(&self) -> impl Iterator<Item = &OsStr> {
        self.0.split(|&b| b == b'/').map(OsStr::from_bytes)
    }

    /// As a relative local path.
    pub fn to_path_buf(&self) -> PathBuf {
        PathBuf::from(OsStr::from_bytes(&self.0))
    }
}

impl std::fmt::Display for WirePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&String::from_utf8_lossy(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_relative_paths() {
        for ok in ["a", "a/b/c.dat", "dir/..hidden", "...", "ünï/cödé", "a b/c"] {
            let p = WirePath::parse(ok.as_bytes()).unwrap();
            assert_eq!(p.to_path_buf(), PathBuf::from(ok));
        }
        let p = WirePath::parse(b"x/\xff\xfe").unwrap();
        assert_eq!(p.components().count(), 2);
    }

    #[test]
    fn refuses_every_escape() {
        for bad in [
            &b""[..],
            b"/etc/passwd",
            b"..",
            b"../x",
            b"a/../../x",
            b"a/..",
            b"./a",
            b"a/./b",
            b"a//b",
            b"a/",
            b"a\0b",
        ] {
            assert!(
                WirePath::parse(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(WirePath::parse(&vec![b'a'; MAX_PATH_LEN + 1]).is_err());
    }

    #[test]
    fn local_relative_paths_convert() {
        let p = WirePath::from_relative(Path::new("./a/b")).unwrap();
        assert_eq!(p.as_bytes(), b"a/b");
        assert!(WirePath::from_relative(Path::new("/abs")).is_err());
        assert!(WirePath::from_relative(Path::new("a/../b")).is_err());
        assert!(WirePath::from_relative(Path::new("")).is_err());
    }
}
