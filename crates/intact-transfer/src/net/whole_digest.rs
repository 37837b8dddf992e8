//! The receiver's whole-file BLAKE3 of the bytes it holds for a file.
//!
//! The sender's FileEnd carries the BLAKE3 of its source. Before a file is
//! committed, the receiver compares it with the BLAKE3 of the bytes *it*
//! holds; only an equal file gets its final name, and the journal records
//! that digest (so a later quick check answers with a digest some check
//! established, never one a client merely announced). A mismatch fails the
//! file: nothing is committed, and which block is wrong is unknown (in
//! `none` there are no block digests at all), so no block is asked again;
//! the blocks that verified stay journaled, and the next attempt resumes
//! from them, re-checked.
//!
//! How the receiver's digest is obtained:
//! - power-of-two block sizes of at least 1 KiB: per block, the BLAKE3
//!   subtree of the bytes accepted and written ([`Blake3Blocks`]), a resent
//!   block replacing its part; blocks held from an earlier run (a resume,
//!   a file held whole) take theirs from the read that re-verifies them in
//!   place. The file is never read again for it.
//! - other block sizes (or a part missing): the file is read once more,
//!   through the page cache, and hashed.
//!
//! What the check covers: that the bytes this session wrote (and the held
//! bytes it re-read) form the file the sender read, whatever each block's
//! own digest said. Another writer of the same partial file is kept out by
//! the partial file's owner lock, not by this digest; damage on the device
//! after the write is riva's re-read's business.

use std::fs::File;
use std::os::unix::fs::FileExt;

use intact_digest::{AlignedBuf, Blake3Blocks};

use crate::journal::VerifiedAt;

/// Bytes of a BLAKE3 digest.
pub const LEN: usize = 32;

/// Bytes read per call when a file is hashed as a whole.
const READ_BYTES: usize = 4 << 20;

/// A file held whole under its final name: the digest of what it holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeldWhole {
    /// The BLAKE3 of the bytes it holds.
    pub digest: [u8; LEN],
    /// The journal record it is trusted on (the digest is the recorded
    /// one); None: the digest was computed in this run from a re-read in
    /// place.
    pub trusted: Option<VerifiedAt>,
    /// The final file as it was when the session looked at it (before any
    /// re-read): the answer and the record hold only if it is still that.
    pub stamp: Stamp,
}

/// What identifies one version of a file under its name: device, inode,
/// size, mtime and ctime (nanoseconds). Another transfer's commit (a
/// rename: another inode) or any write, chmod or link change in place (a
/// new ctime) gives another stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    /// The stamp of a file's status.
    pub fn of_stat(st: &rustix::fs::Stat) -> Stamp {
        Stamp {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size as u64,
            mtime: (st.st_mtime, st.st_mtime_nsec as i64),
            ctime: (st.st_ctime, st.st_ctime_nsec as i64),
        }
    }

    /// The stamp of the open `file`.
    pub fn of(file: &File) -> std::io::Result<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata()?;
        Ok(Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

/// One file's whole-file digest at the receiver.
#[derive(Debug, Default)]
pub(crate) struct WholeDigest {
    tree: Option<Blake3Blocks>,
    /// Held whole under its final name (nothing written in this run).
    pub held: Option<HeldWhole>,
    /// The sender's digest, from its FileEnd.
    pub theirs: Vec<u8>,
    /// Found equal to the sender's: what the journal records at commit.
    pub confirmed: Option<[u8; LEN]>,
}

impl WholeDigest {
    /// For a file of `size` bytes in blocks of `block_size`.
    #[cfg(test)]
    pub fn new(size: u64, block_size: u32) -> WholeDigest {
        WholeDigest::new_from(size, block_size, 0)
    }

    /// For blocks `first..` of such a file (one range of a split file).
    pub fn new_from(size: u64, block_size: u32, first: u64) -> WholeDigest {
        WholeDigest {
            tree: Blake3Blocks::new_from(size, u64::from(block_size), first),
            ..WholeDigest::default()
        }
    }

    /// The per-block parts (power-of-two block sizes only).
    pub fn tree(&self) -> Option<&Blake3Blocks> {
        self.tree.as_ref()
    }

    /// Block `index` holds `bytes`: as written in this run, or as re-read
    /// in place from an earlier one (replacing what it held before).
    pub fn add(&mut self, index: u64, bytes: &[u8]) {
        if let Some(t) = self.tree.as_mut() {
            t.set(index, bytes);
        }
    }

    /// The BLAKE3 of the file's bytes: from the blocks' parts, or (other
    /// block sizes, or a part missing) by reading `file`, `size` bytes.
    pub fn of_file(
        &self,
        file: &File,
        size: u64,
        buf: &mut AlignedBuf,
    ) -> std::io::Result<[u8; LEN]> {
        if let Some(h) = self.tree.as_ref().and_then(Blake3Blocks::finalize) {
            return Ok(*h.as_bytes());
        }
        hash_file(file, size, buf)
    }

    /// Compares `ours` with the sender's digest; equal: remembered as the
    /// digest to record. Constant time (a client learns nothing from it).
    pub fn confirm(&mut self, ours: [u8; LEN]) -> Result<(), String> {
        let theirs = <[u8; LEN]>::try_from(self.theirs.as_slice()).map_err(|_| {
            format!(
                "the sender's FileEnd carries no BLAKE3 ({} bytes)",
                self.theirs.len()
            )
        })?;
        if blake3::Hash::from_bytes(ours) != blake3::Hash::from_bytes(theirs) {
            return Err(format!(
                "the BLAKE3 of the bytes written ({}) differs from the sender's ({}): not committed",
                hex(&ours),
                hex(&theirs)
            ));
        }
        self.confirmed = Some(ours);
        Ok(())
    }
}

/// The BLAKE3 of the first `size` bytes of `file`, read in large calls.
pub(crate) fn hash_file(
    file: &File,
    size: u64,
    buf: &mut AlignedBuf,
) -> std::io::Result<[u8; LEN]> {
    if buf.len() < READ_BYTES {
        *buf = AlignedBuf::new(READ_BYTES);
    }
    let mut h = blake3::Hasher::new();
    let mut offset = 0u64;
    while offset < size {
        let n = (size - offset).min(READ_BYTES as u64) as usize;
        file.read_exact_at(&mut buf[..n], offset)?;
        h.update(&buf[..n]);
        offset += n as u64;
    }
    Ok(*h.finalize().as_bytes())
}

fn hex(d: &[u8]) -> String {
    blake3::Hash::from_slice(d).map_or_else(|_| String::from("?"), |h| h.to_hex().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parts_and_a_read_agree_and_a_wrong_digest_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 253) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        let mut buf = AlignedBuf::new(0);
        for bs in [1024u32, 3000] {
            let mut w = WholeDigest::new(data.len() as u64, bs);
            for (i, c) in data.chunks(bs as usize).enumerate() {
                w.add(i as u64, c);
            }
            let ours = w.of_file(&file, data.len() as u64, &mut buf).unwrap();
            assert_eq!(ours, *blake3::hash(&data).as_bytes(), "block size {bs}");
            w.theirs = vec![0; LEN];
            assert!(w.confirm(ours).is_err());
            assert!(w.confirmed.is_none());
            w.theirs = Vec::new();
            assert!(w.confirm(ours).is_err());
            w.theirs = ours.to_vec();
            assert!(w.confirm(ours).is_ok());
            assert_eq!(w.confirmed, Some(ours));
        }
    }
}
