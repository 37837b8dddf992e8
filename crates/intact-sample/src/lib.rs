//! Deterministic, incompressible sample data for intact's demo, tests and
//! benchmarks: [`SampleBytes`] (a xorshift64 stream), [`bytes`] for a
//! buffer, [`write_file`] for a file, and [`make_demo_dataset`], the
//! dataset `intact demo` runs on. The same seed always gives the same bytes.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

use intact_digest::AlignedBuf;

const MIB: u64 = 1 << 20;

/// An endless stream of pseudo-random bytes (xorshift64; not for secrets).
pub struct SampleBytes {
    state: u64,
}

impl SampleBytes {
    /// A stream determined by `seed` (any value, zero included).
    pub fn new(seed: u64) -> SampleBytes {
        SampleBytes {
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        }
    }

    fn next_word(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state
    }

    /// Fills `buf` with the next bytes of the stream.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut words = buf.chunks_exact_mut(8);
        for w in &mut words {
            w.copy_from_slice(&self.next_word().to_le_bytes());
        }
        let tail = words.into_remainder();
        if !tail.is_empty() {
            let w = self.next_word().to_le_bytes();
            tail.copy_from_slice(&w[..tail.len()]);
        }
    }
}

/// `len` sample bytes for `seed`.
pub fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0; len];
    SampleBytes::new(seed).fill(&mut v);
    v
}

/// Writes `len` bytes of `stream` to a new file at `path`.
pub fn write_file(path: &Path, len: u64, stream: &mut SampleBytes) -> io::Result<()> {
    let mut f = fs::File::create(path)?;
    let mut buf = AlignedBuf::new(MIB as usize);
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        stream.fill(&mut buf[..n]);
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// What [`make_demo_dataset`] made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatasetSize {
    /// Regular files written.
    pub files: u64,
    /// Bytes in them.
    pub bytes: u64,
}

/// The dataset of `intact demo` under `root`: one file of `large_mib` MiB,
/// 200 files of 1 MiB and 1000 of 4 KiB in nested directories, an empty
/// file, a file with a non-ASCII name and an empty directory.
pub fn make_demo_dataset(root: &Path, large_mib: u64) -> io::Result<DatasetSize> {
    let mut stream = SampleBytes::new(0x1A7AC7);
    let mut made = DatasetSize { files: 0, bytes: 0 };
    let mut put = |path: &Path, len: u64| -> io::Result<()> {
        fs::create_dir_all(path.parent().expect("dataset paths have parents"))?;
        write_file(path, len, &mut stream)?;
        made.files += 1;
        made.bytes += len;
        Ok(())
    };
    put(&root.join("large.dat"), large_mib * MIB)?;
    for i in 0..200 {
        put(
            &root.join(format!("runs/run{:02}/frame{i:03}.dat", i / 20)),
            MIB,
        )?;
    }
    for i in 0..1000 {
        let dir = format!("meta/{:02}/{:02}", i / 100, i / 10 % 10);
        put(&root.join(format!("{dir}/rec{i:04}.json")), 4096)?;
    }
    put(&root.join("empty.dat"), 0)?;
    put(&root.join("données/résumé.txt"), 1234)?;
    fs::create_dir_all(root.join("empty-dir"))?;
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_bytes_any_split() {
        let whole = bytes(1000, 7);
        let mut s = SampleBytes::new(7);
        let mut parts = vec![0u8; 1000];
        // Splits at multiples of 8 continue the same stream.
        s.fill(&mut parts[..504]);
        s.fill(&mut parts[504..]);
        assert_eq!(whole, parts);
        assert_ne!(bytes(1000, 8), whole);
        assert_ne!(bytes(64, 0), vec![0u8; 64]);
    }

    #[test]
    fn demo_dataset_has_what_it_promises() {
        let dir = std::env::temp_dir().join(format!("intact-sample-{}", std::process::id()));
        let made = make_demo_dataset(&dir, 1).unwrap();
        assert_eq!(made.files, 1203);
        assert_eq!(made.bytes, MIB + 200 * MIB + 1000 * 4096 + 1234);
        assert_eq!(fs::metadata(dir.join("large.dat")).unwrap().len(), MIB);
        assert!(dir.join("empty-dir").is_dir());
        fs::remove_dir_all(&dir).unwrap();
    }
}
