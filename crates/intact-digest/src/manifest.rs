//! Checksum-list lines in the formats of `sha256sum`, `b3sum` and `xxhsum`.
//!
//! [`format_line`] writes the line the usual tool for an algorithm writes,
//! so lists interoperate both ways; [`parse_line`] reads all the variants
//! those tools write: GNU (`HEX  NAME`, `HEX *NAME`), BSD tags
//! (`SHA256 (NAME) = HEX`, which `xxhsum -H3` prints), `xxhsum`'s
//! prefixed form (`XXH3_HEX  NAME`), and coreutils' escaping of names with
//! a backslash, a newline or a carriage return (the line then starts `\`).

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use crate::{Algorithm, Digest};

/// The tag BSD-style lines use for `algorithm`.
pub fn bsd_tag(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::Crc32c => "CRC32C",
        Algorithm::Xxh3_64 => "XXH3",
        Algorithm::Xxh3_128 => "XXH128",
        Algorithm::Blake3 => "BLAKE3",
        Algorithm::Sha256 => "SHA256",
        Algorithm::Sha1 => "SHA1",
        Algorithm::Md5 => "MD5",
        Algorithm::Adler32 => "ADLER32",
        Algorithm::Sha512 => "SHA512",
    }
}

fn algorithm_for_tag(tag: &[u8]) -> Option<Algorithm> {
    Algorithm::ALL
        .into_iter()
        .find(|a| bsd_tag(*a).as_bytes() == tag)
}

/// Whether the usual tool for `algorithm` writes BSD-tagged lines
/// (`xxhsum -H3` does; `sha256sum`, `b3sum`, `xxhsum -H2` do not).
pub fn uses_bsd_tag(algorithm: Algorithm) -> bool {
    algorithm == Algorithm::Xxh3_64
}

/// `name` as checksum lines print it: whether the line must start with a
/// backslash (coreutils' mark for an escaped name), and the name's bytes
/// with backslash, newline and carriage return escaped when it must.
pub fn escape_name(name: &Path) -> (bool, Vec<u8>) {
    let raw = name.as_os_str().as_bytes();
    let escape = raw.iter().any(|b| matches!(b, b'\\' | b'\n' | b'\r'));
    if !escape {
        return (false, raw.to_vec());
    }
    let mut out = Vec::with_capacity(raw.len() + 8);
    for &b in raw {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            _ => out.push(b),
        }
    }
    (true, out)
}

/// How a checksum line is written beyond the algorithm's usual format:
/// the GNU options `--tag` and `-z`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LineStyle {
    /// BSD-style `ALGO (NAME) = HEX` whatever the algorithm (`--tag`).
    pub bsd_tag: bool,
    /// End the line with NUL instead of a newline and never escape the
    /// name (`-z`), as coreutils does.
    pub zero: bool,
}

/// One line (with its newline) for `digest` of the file `name`.
pub fn format_line(digest: &Digest, name: &Path) -> Vec<u8> {
    format_line_as(digest, name, LineStyle::default())
}

/// One line for `digest` of the file `name`, written as `style` says.
pub fn format_line_as(digest: &Digest, name: &Path, style: LineStyle) -> Vec<u8> {
    let (escaped, name) = if style.zero {
        (false, name.as_os_str().as_bytes().to_vec())
    } else {
        escape_name(name)
    };
    let hex = digest.to_hex();
    let mut line = Vec::with_capacity(name.len() + hex.len() + 16);
    if escaped {
        line.push(b'\\');
    }
    if style.bsd_tag || uses_bsd_tag(digest.algorithm()) {
        line.extend_from_slice(bsd_tag(digest.algorithm()).as_bytes());
        line.extend_from_slice(b" (");
        line.extend_from_slice(&name);
        line.extend_from_slice(b") = ");
        line.extend_from_slice(hex.as_bytes());
    } else {
        line.extend_from_slice(hex.as_bytes());
        line.extend_from_slice(b"  ");
        line.extend_from_slice(&name);
    }
    line.push(if style.zero { 0 } else { b'\n' });
    line
}

/// What one line of a checksum list says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckLine {
    /// The algorithm named by a tag or prefix on the line, if any.
    pub tagged: Option<Algorithm>,
    /// The expected digest, as hex text (validated against an algorithm later).
    pub hex: String,
    /// The file the line is about.
    pub path: PathBuf,
}

/// Why a line of a checksum list could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// The line matches none of the known formats.
    #[error("not a checksum line (expected 'HEX  NAME' or 'ALGO (NAME) = HEX')")]
    Malformed,
    /// A BSD tag or prefix names an algorithm intact does not know.
    #[error("unknown algorithm tag '{0}'")]
    UnknownTag(String),
    /// An escaped name has a backslash not followed by `\`, `n` or `r`.
    #[error("bad escape in file name")]
    BadEscape,
}

/// Reads one line (without its newline). `Ok(None)` for blank and `#` lines.
pub fn parse_line(line: &[u8]) -> Result<Option<CheckLine>, LineError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) || line.first() == Some(&b'#') {
        return Ok(None);
    }
    let (escaped, body) = match line.strip_prefix(b"\\") {
        Some(rest) => (true, rest),
        None => (false, line),
    };
    let (tagged, hex, name) = match parse_bsd(body)? {
        Some(parts) => parts,
        None => parse_gnu(body)?,
    };
    let name = if escaped {
        unescape(name)?
    } else {
        name.to_vec()
    };
    if name.is_empty() {
        return Err(LineError::Malformed);
    }
    Ok(Some(CheckLine {
        tagged,
        hex: String::from_utf8(hex.to_vec()).map_err(|_| LineError::Malformed)?,
        path: PathBuf::from(OsString::from_vec(name)),
    }))
}

type Parts<'a> = (Option<Algorithm>, &'a [u8], &'a [u8]);

/// `TAG (NAME) = HEX`; `Ok(None)` if the line is not of that shape.
fn parse_bsd(body: &[u8]) -> Result<Option<Parts<'_>>, LineError> {
    let Some(open) = find(body, b" (") else {
        return Ok(None);
    };
    let Some(close) = rfind(body, b") = ") else {
        return Ok(None);
    };
    let tag = &body[..open];
    let hex = &body[close + 4..];
    if close < open + 2
        || tag.is_empty()
        || !tag.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-')
        || !is_hex(hex)
    {
        return Ok(None);
    }
    let algorithm = algorithm_for_tag(tag)
        .ok_or_else(|| LineError::UnknownTag(String::from_utf8_lossy(tag).into_owned()))?;
    Ok(Some((Some(algorithm), hex, &body[open + 2..close])))
}

/// `HEX  NAME`, `HEX *NAME`, or `XXH3_HEX  NAME`.
fn parse_gnu(body: &[u8]) -> Result<Parts<'_>, LineError> {
    let sp = body
        .iter()
        .position(|&b| b == b' ')
        .ok_or(LineError::Malformed)?;
    let (mut hex, rest) = (&body[..sp], &body[sp + 1..]);
    let name = match rest.first() {
        Some(b' ') | Some(b'*') => &rest[1..],
        _ => return Err(LineError::Malformed),
    };
    let mut tagged = None;
    if let Some(us) = hex.iter().position(|&b| b == b'_') {
        let tag = &hex[..us];
        tagged = Some(
            algorithm_for_tag(tag)
                .ok_or_else(|| LineError::UnknownTag(String::from_utf8_lossy(tag).into_owned()))?,
        );
        hex = &hex[us + 1..];
    }
    if !is_hex(hex) {
        return Err(LineError::Malformed);
    }
    Ok((tagged, hex, name))
}

fn unescape(name: &[u8]) -> Result<Vec<u8>, LineError> {
    let mut out = Vec::with_capacity(name.len());
    let mut it = name.iter();
    while let Some(&b) = it.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        out.push(match it.next() {
            Some(b'\\') => b'\\',
            Some(b'n') => b'\n',
            Some(b'r') => b'\r',
            _ => return Err(LineError::BadEscape),
        });
    }
    Ok(out)
}

fn is_hex(s: &[u8]) -> bool {
    !s.is_empty() && s.iter().all(u8::is_ascii_hexdigit)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn rfind(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).rposition(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash;

    fn round_trip(alg: Algorithm, name: &[u8]) {
        let d = hash(alg, b"abc");
        let path = PathBuf::from(OsString::from_vec(name.to_vec()));
        let line = format_line(&d, &path);
        assert_eq!(line.last(), Some(&b'\n'));
        let parsed = parse_line(&line[..line.len() - 1]).unwrap().unwrap();
        assert_eq!(parsed.path, path);
        assert_eq!(parsed.hex, d.to_hex());
        if uses_bsd_tag(alg) {
            assert_eq!(parsed.tagged, Some(alg));
        }
    }

    #[test]
    fn lines_round_trip_for_every_algorithm_and_awkward_names() {
        let names: [&[u8]; 7] = [
            b"a.dat",
            b"with space.dat",
            b"back\\slash",
            b"new\nline",
            b"car\rriage",
            b"paren (1) = x",
            b"\xff\xfe-not-utf8",
        ];
        for alg in Algorithm::ALL {
            for name in names {
                round_trip(alg, name);
            }
        }
    }

    #[test]
    fn tag_and_zero_styles() {
        let d = hash(Algorithm::Sha256, b"abc");
        let tag = LineStyle {
            bsd_tag: true,
            zero: false,
        };
        let line = format_line_as(&d, Path::new("a\\b"), tag);
        assert_eq!(
            line,
            format!("\\SHA256 (a\\\\b) = {}\n", d.to_hex()).into_bytes()
        );
        let parsed = parse_line(&line[..line.len() - 1]).unwrap().unwrap();
        assert_eq!(
            (parsed.tagged, parsed.path),
            (Some(Algorithm::Sha256), "a\\b".into())
        );
        let zero = LineStyle {
            bsd_tag: false,
            zero: true,
        };
        let line = format_line_as(&d, Path::new("n\nl"), zero);
        assert_eq!(line, format!("{}  n\nl\0", d.to_hex()).into_bytes());
    }

    #[test]
    fn reads_what_other_tools_write() {
        let gnu = parse_line(b"900150983cd24fb0d6963f7d28e17f72  a.txt")
            .unwrap()
            .unwrap();
        assert_eq!(
            (gnu.tagged, gnu.path.as_os_str().as_bytes()),
            (None, &b"a.txt"[..])
        );
        let bin = parse_line(b"900150983cd24fb0d6963f7d28e17f72 *a.txt")
            .unwrap()
            .unwrap();
        assert_eq!(bin.path, PathBuf::from("a.txt"));
        let bsd = parse_line(b"XXH3 (a.txt) = 78af5f94892f3950")
            .unwrap()
            .unwrap();
        assert_eq!(bsd.tagged, Some(Algorithm::Xxh3_64));
        assert_eq!(bsd.hex, "78af5f94892f3950");
        let pre = parse_line(b"XXH3_78af5f94892f3950  a.txt")
            .unwrap()
            .unwrap();
        assert_eq!(pre.tagged, Some(Algorithm::Xxh3_64));
        let esc = parse_line(b"\\abc  a\\\\b\\nc").unwrap().unwrap();
        assert_eq!(esc.path.as_os_str().as_bytes(), b"a\\b\nc");
        let crlf = parse_line(b"abc  x\r").unwrap().unwrap();
        assert_eq!(crlf.path, PathBuf::from("x"));
    }

    #[test]
    fn rejects_malformed_lines() {
        assert_eq!(parse_line(b"").unwrap(), None);
        assert_eq!(parse_line(b"# comment").unwrap(), None);
        for bad in [
            &b"nothex  a"[..],
            b"abc",
            b"abc a",
            b"abc  ",
            b"\\abc  a\\x",
        ] {
            assert!(
                parse_line(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(
            parse_line(b"WHIRL (a) = abcd"),
            Err(LineError::UnknownTag("WHIRL".into()))
        );
    }
}
