//! Command-line flags, parsed into plain values. Building what the flags ask
//! for (thread pools, plans, file lists) happens in the command modules.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use intact_digest::Algorithm;

/// Move and keep scientific data with integrity verified on the device.
#[derive(Debug, Parser)]
#[command(name = "intact", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print or check file digests, in the formats of sha256sum, b3sum and xxhsum.
    #[command(long_about = SUM_ABOUT)]
    Sum(SumArgs),
    /// Make a sample dataset in a temporary directory, run intact's main job on it, print the report.
    Demo(DemoArgs),
}

const SUM_ABOUT: &str = "\
Print or check file digests.

Output lines have the format of the usual tool for each algorithm, so lists
interoperate both ways: sha256 and sha1 and md5 like sha256sum/sha1sum/md5sum,
blake3 like b3sum, xxh128 like `xxhsum -H2`, xxh3 like `xxhsum -H3`
(`XXH3 (NAME) = HEX`). crc32c and adler32 print `HEX  NAME` (8 hex digits,
big-endian, as xrdcp prints them).

Files are hashed in parallel; BLAKE3, CRC-32C and Adler-32 also split one
large file across threads. Large regular files are memory-mapped; --no-mmap
forces plain reads into 4 KiB-aligned buffers.

Exit status: 0 if every file was hashed (and, with --check, matched);
1 if any file was missing, unreadable, a directory, mismatched, or a check
line was malformed; 2 for usage errors.";

#[derive(Debug, Args)]
pub struct SumArgs {
    /// Files to hash (with --check: checksum lists to verify); '-' or none reads standard input.
    #[arg(value_name = "PATH")]
    pub paths: Vec<PathBuf>,

    /// Digest algorithm: crc32c, xxh3, xxh128, blake3, sha256, sha1, md5, adler32 [default: blake3].
    /// With --check, lines tagged with an algorithm (e.g. `XXH3 (f) = ...`) use their tag.
    #[arg(short, long, value_name = "A", value_parser = parse_algorithm)]
    pub algo: Option<Algorithm>,

    /// Read checksum lists from PATHs and verify every file they name.
    #[arg(short, long)]
    pub check: bool,

    /// With --check, do not print a line for each file that matched.
    #[arg(short, long, requires = "check")]
    pub quiet: bool,

    /// Hash regular files found under directories (symlinks and special files are skipped with a note).
    #[arg(short, long, conflicts_with = "check")]
    pub recursive: bool,

    /// Number of threads [default: all cores].
    #[arg(short, long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub jobs: Option<u16>,

    /// Print one JSON document (per-file digests, sizes, times, errors) instead of lines.
    #[arg(long)]
    pub json: bool,

    /// Also compute per-block digests with this block size (e.g. 4MiB); needs --json.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, requires = "json", conflicts_with = "check")]
    pub block_size: Option<usize>,

    /// Also compute the CRC-32C of every 4 KiB page; needs --json.
    #[arg(long, requires = "json", conflicts_with = "check")]
    pub pages: bool,

    /// Never memory-map files; always read them into aligned buffers.
    #[arg(long)]
    pub no_mmap: bool,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,

    /// Size of the large sample file, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 256)]
    pub large_mib: u64,
}

fn parse_algorithm(s: &str) -> Result<Algorithm, String> {
    s.parse()
        .map_err(|e: intact_digest::DigestError| e.to_string())
}

/// Parses a byte size: a number with an optional unit (K, KiB, M, MiB, G,
/// GiB; all powers of 1024, since block sizes are).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (examples: 4096, 64KiB, 4MiB)"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        other => return Err(format!("unknown size unit '{other}' (use K, M or G)")),
    };
    let size = n
        .checked_mul(1usize << shift)
        .ok_or_else(|| format!("'{s}' is too large"))?;
    if size == 0 {
        return Err("size must be greater than 0".into());
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("4M"), Ok(4 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("0").is_err());
        assert!(parse_size("4X").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
    }
}
