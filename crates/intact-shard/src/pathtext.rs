//! Paths in a plan: JSON strings where they are UTF-8 (almost always), and
//! `{"hex": "…"}` where they are not, so that any Linux file name survives
//! the plan byte for byte.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A path's bytes, as a plan keeps them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PathText(Vec<u8>);

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum Repr {
    Text(String),
    Hex { hex: String },
}

impl PathText {
    /// The path's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// As a path.
    pub fn to_path_buf(&self) -> PathBuf {
        PathBuf::from(OsStr::from_bytes(&self.0))
    }

    /// For messages: the path, with bytes that are not UTF-8 replaced.
    pub fn lossy(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }
}

impl From<&Path> for PathText {
    fn from(p: &Path) -> PathText {
        PathText(p.as_os_str().as_bytes().to_vec())
    }
}

impl From<&[u8]> for PathText {
    fn from(b: &[u8]) -> PathText {
        PathText(b.to_vec())
    }
}

impl Serialize for PathText {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(&self.0) {
            Ok(t) => Repr::Text(t.to_string()),
            Err(_) => Repr::Hex {
                hex: hex::encode(&self.0),
            },
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for PathText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<PathText, D::Error> {
        match Repr::deserialize(d)? {
            Repr::Text(t) => Ok(PathText(t.into_bytes())),
            Repr::Hex { hex } => hex::decode(hex)
                .map(PathText)
                .map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_name_survives_json() {
        for name in [
            &b"plain/name.dat"[..],
            b"caf\xc3\xa9",
            b"bad\xff\xfe",
            b"a\nb",
        ] {
            let p = PathText::from(name);
            let json = serde_json::to_string(&p).unwrap();
            let back: PathText = serde_json::from_str(&json).unwrap();
            assert_eq!(back.as_bytes(), name, "{json}");
        }
        assert_eq!(
            serde_json::to_string(&PathText::from(&b"\xff"[..])).unwrap(),
            r#"{"hex":"ff"}"#
        );
    }
}
