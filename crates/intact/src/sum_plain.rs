//! The plainest `intact sum` command lines, read without clap.
//!
//! Even `sum`'s own command (sum_parse) costs clap ~130k instructions to
//! build, match and turn into `SumArgs`: more than `xxhsum -H3` spends on
//! a whole 4 KiB file (149k; callgrind). Scripts run `intact sum --algo
//! xxh3 FILE` once per file, so a command line made only of paths,
//! `--algo NAME`, `--jobs N` and `--no-mmap` or `--mmap` is read here, into the `SumArgs` clap
//! would give. Anything else, including every line clap would refuse, goes
//! to clap (`None`): help, usage and every error stay clap's text, and
//! nothing here can accept what clap refuses (the tests compare both on
//! thousands of generated lines).

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

use crate::args::SumArgs;

/// `SumArgs` for `argv` (`[program, "sum", ...]`) if it is plain enough to
/// read here; `None` sends it to clap.
pub fn parse(argv: &[OsString]) -> Option<SumArgs> {
    let [_, first, rest @ ..] = argv else {
        return None;
    };
    if first != "sum" {
        return None;
    }
    let mut args = SumArgs {
        paths: Vec::new(),
        algo: None,
        check: false,
        quiet: false,
        status: false,
        ignore_missing: false,
        strict: false,
        tag: false,
        zero: false,
        recursive: false,
        jobs: None,
        json: false,
        block_size: None,
        pages: false,
        no_mmap: false,
        mmap: false,
    };
    let mut rest = rest.iter();
    while let Some(arg) = rest.next() {
        let arg = arg.as_os_str();
        if is_path(arg) {
            args.paths.push(PathBuf::from(arg));
            continue;
        }
        // The read-strategy flags (the benchmark's), each once, not both.
        match arg.to_str()? {
            "--no-mmap" if !args.no_mmap && !args.mmap => {
                args.no_mmap = true;
                continue;
            }
            "--mmap" if !args.mmap && !args.no_mmap => {
                args.mmap = true;
                continue;
            }
            _ => {}
        }
        // Options, each at most once, with their value in the next argument.
        let value = rest.next()?.to_str()?;
        match arg.to_str()? {
            "--algo" | "-a" if args.algo.is_none() => args.algo = Some(value.parse().ok()?),
            "--jobs" | "-j" if args.jobs.is_none() => args.jobs = Some(jobs(value)?),
            _ => return None,
        }
    }
    Some(args)
}

/// Whether clap would take `arg` as a path, whatever came before it: "-"
/// or a non-empty argument that does not start with '-' (clap refuses an
/// empty path; "--" and options are clap's to read).
fn is_path(arg: &OsStr) -> bool {
    let bytes = arg.as_encoded_bytes();
    bytes == b"-" || bytes.first().is_some_and(|&b| b != b'-')
}

/// A thread count as `--jobs` takes it: plain decimal digits, 1 to 65535.
fn jobs(value: &str) -> Option<u16> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok().filter(|&n| n >= 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Cli, Command};
    use clap::Parser;

    fn argv(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    /// clap's answer for the same line, through the whole `Cli`.
    fn clap(line: &[OsString]) -> Result<SumArgs, clap::Error> {
        Cli::try_parse_from(line).map(|c| match c.command {
            Command::Sum(a) => a,
            other => panic!("not sum: {other:?}"),
        })
    }

    #[test]
    fn the_benchmark_s_line_is_read_here() {
        let line = argv(&["intact", "sum", "--algo", "xxh3", "--jobs", "1", "f"]);
        let ours = parse(&line).expect("plain line");
        assert_eq!(format!("{ours:?}"), format!("{:?}", clap(&line).unwrap()));
        assert_eq!(ours.jobs, Some(1));
        assert_eq!(ours.paths, [PathBuf::from("f")]);
        for flag in ["--no-mmap", "--mmap"] {
            let line = argv(&["intact", "sum", "-a", "xxh3", flag, "f"]);
            let ours = parse(&line).expect("plain line");
            assert_eq!(format!("{ours:?}"), format!("{:?}", clap(&line).unwrap()));
            assert!(ours.no_mmap != ours.mmap, "{flag}");
        }
    }

    #[test]
    fn what_is_not_plain_goes_to_clap() {
        for line in [
            &["intact", "sum", "--help"][..],
            &["intact", "sum", "--algo", "xxh3", "--algo", "md5", "f"],
            &["intact", "sum", "--algo", "nope", "f"],
            &["intact", "sum", "--algo"],
            &["intact", "sum", "--algo=xxh3", "f"],
            &["intact", "sum", "--jobs", "0", "f"],
            &["intact", "sum", "--jobs", "+1", "f"],
            &["intact", "sum", "--jobs", "65536", "f"],
            &["intact", "sum", "--", "f"],
            &["intact", "sum", ""],
            &["intact", "sum", "-c", "f"],
            &["intact", "sum", "--mmap", "--no-mmap", "f"],
            &["intact", "sum", "--mmap", "--mmap", "f"],
            &["intact", "sum", "--no-mmap", "--no-mmap", "f"],
            &["intact", "copy", "a", "b"],
            &["intact"],
        ] {
            assert!(parse(&argv(line)).is_none(), "{line:?}");
        }
    }

    /// Every line this module reads, clap reads the same way; lines drawn
    /// from options, values and paths, valid and not, many thousands.
    #[test]
    fn every_line_read_here_is_what_clap_reads() {
        const WORDS: &[&str] = &[
            "--algo",
            "-a",
            "xxh3",
            "XXH3",
            "sha256",
            "xxh3-64",
            "bogus",
            "--jobs",
            "-j",
            "1",
            "0",
            "7",
            "65535",
            "65536",
            "01",
            "+2",
            "",
            "-",
            "--",
            "f",
            "-x",
            "--check",
            "-c",
            "--tag",
            "-q",
            "dir/f",
            "--algo=md5",
            "-j2",
            "a b",
            "--no-mmap",
            "--mmap",
            "--no-mmap",
            "--mmap",
        ];
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut read_here, mut agreed_errors) = (0, 0);
        for _ in 0..20_000 {
            let n = (next() % 7) as usize;
            let mut line = vec![OsString::from("intact"), OsString::from("sum")];
            line.extend((0..n).map(|_| OsString::from(WORDS[next() as usize % WORDS.len()])));
            let theirs = clap(&line);
            match parse(&line) {
                Some(ours) => {
                    let theirs = theirs.unwrap_or_else(|e| panic!("{line:?}: clap refuses: {e}"));
                    assert_eq!(format!("{ours:?}"), format!("{theirs:?}"), "{line:?}");
                    read_here += 1;
                }
                None => agreed_errors += usize::from(theirs.is_err()),
            }
        }
        // The generator reaches both sides: lines read here and lines clap refuses.
        assert!(read_here > 1000, "only {read_here} lines read here");
        assert!(agreed_errors > 1000, "only {agreed_errors} refused lines");
    }

    #[test]
    fn non_utf8_paths_are_read_as_clap_reads_them() {
        use std::os::unix::ffi::OsStringExt;
        let mut line = argv(&["intact", "sum", "-a", "md5"]);
        line.push(OsString::from_vec(b"f\xff".to_vec()));
        let ours = parse(&line).expect("plain line");
        assert_eq!(format!("{ours:?}"), format!("{:?}", clap(&line).unwrap()));
    }
}
