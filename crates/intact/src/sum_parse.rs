//! `intact sum ...` parsed without building intact's other commands.
//!
//! Building the whole command line (`Cli`: nine commands, some hundred
//! options) cost about as many instructions as `xxhsum -H3` spends on a
//! whole 4 KiB file (callgrind: ~300k of intact's ~950k), and `sum` is run
//! once per file by scripts. When the first argument is `sum`, only `sum`'s
//! command is built, from the same definitions (`SumArgs`, `SUM_SHORT`,
//! `SUM_ABOUT`), with the name clap would give it as a subcommand of
//! `intact`, so its help, usage and errors are the same text; the tests
//! below compare both ways on help and on every kind of error.

use std::ffi::OsString;
use std::path::Path;

use clap::{Args, Command, FromArgMatches};

use crate::args::{SumArgs, SUM_ABOUT, SUM_SHORT};

/// The `sum` command as `intact`'s subcommand is built, for a binary
/// invoked as `bin`.
pub fn command(bin: &str) -> Command {
    let cmd = Command::new("sum")
        .about(SUM_SHORT)
        .long_about(SUM_ABOUT)
        .bin_name(format!("{bin} sum"));
    SumArgs::augment_args(cmd)
}

/// `Some` when the command line is `intact sum ...`: its arguments, parsed
/// (help and usage errors exit here, as `Cli::parse` does). `None` for
/// every other command, and for a program name that is not UTF-8 (clap
/// names that one differently): parse the whole `Cli` then.
pub fn parse() -> Option<SumArgs> {
    let argv: Vec<OsString> = std::env::args_os().collect();
    if let Some(plain) = crate::sum_plain::parse(&argv) {
        return Some(plain);
    }
    let parsed = parse_from(&argv)?;
    Some(parsed.unwrap_or_else(|e| e.exit()))
}

/// What [`parse`] does, for a given command line.
pub fn parse_from(argv: &[OsString]) -> Option<Result<SumArgs, clap::Error>> {
    let [argv0, first, ..] = argv else {
        return None;
    };
    if first != "sum" {
        return None;
    }
    // clap names the program after the file name of argv[0] when it is UTF-8.
    let bin = Path::new(argv0).file_name()?.to_str()?;
    let mut cmd = command(bin);
    let parsed = cmd
        .try_get_matches_from_mut(&argv[1..])
        .and_then(|mut m| SumArgs::from_arg_matches_mut(&mut m))
        .map_err(|e| e.format(&mut command(bin)));
    Some(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Cli, Command as Sub};
    use clap::{CommandFactory, Parser};

    fn argv(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    /// The full `Cli`'s answer for the same command line.
    fn full(args: &[&str]) -> Result<SumArgs, clap::Error> {
        Cli::try_parse_from(argv(args)).map(|c| match c.command {
            Sub::Sum(a) => a,
            other => panic!("not sum: {other:?}"),
        })
    }

    fn fast(args: &[&str]) -> Result<SumArgs, clap::Error> {
        parse_from(&argv(args)).expect("the fast path takes `sum`")
    }

    /// The `sum` subcommand as the full `Cli` builds it.
    fn full_sum(bin: &str) -> Command {
        let mut cli = Cli::command().bin_name(bin);
        cli.build();
        cli.find_subcommand("sum").expect("sum exists").clone()
    }

    #[test]
    fn help_and_usage_are_the_full_cli_s() {
        for bin in ["intact", "intact.renamed"] {
            let mut ours = command(bin);
            ours.build();
            let mut theirs = full_sum(bin);
            assert_eq!(
                ours.render_help().to_string(),
                theirs.render_help().to_string()
            );
            assert_eq!(
                ours.render_long_help().to_string(),
                theirs.render_long_help().to_string()
            );
            assert_eq!(
                ours.render_usage().to_string(),
                theirs.render_usage().to_string()
            );
            // The help really is sum's (not an empty command's).
            let long = ours.render_long_help().to_string();
            assert!(long.contains(SUM_ABOUT.lines().next().unwrap()), "{long}");
            assert!(long.contains("--ignore-missing"), "{long}");
        }
    }

    #[test]
    fn help_and_errors_print_the_same_text_and_status() {
        let lines: &[&[&str]] = &[
            &["intact", "sum", "--help"],
            &["intact", "sum", "-h"],
            &["intact", "sum", "x", "--help"],
            &["intact", "sum", "--bogus"],
            &["intact", "sum", "--version"],
            &["intact", "sum", "-V"],
            &["intact", "sum", "--algo"],
            &["intact", "sum", "--algo", "nope", "x"],
            &["intact", "sum", "--jobs", "0", "x"],
            &["intact", "sum", "--jobs", "70000", "x"],
            &["intact", "sum", "-q", "x"],
            &["intact", "sum", "--status", "x"],
            &["intact", "sum", "--tag", "--check", "x"],
            &["intact", "sum", "-c", "--json", "--status", "x"],
            &["intact", "sum", "--block-size", "4K", "x"],
            &["intact", "sum", "--block-size", "0", "--json", "x"],
            &["intact", "sum", "--mmap", "--no-mmap", "x"],
            &["intact", "sum", "-z", "--json", "x"],
            &["intact", "sum", "--tag", "--tag", "x"],
            &["intact", "sum", "--chek", "x"],
            &["/usr/local/bin/intact", "sum", "--bogus"],
        ];
        for line in lines {
            let (ours, theirs) = (fast(line), full(line));
            let (ours, theirs) = match (ours, theirs) {
                (Err(a), Err(b)) => (a, b),
                (a, b) => panic!("{line:?}: fast {a:?}, full {b:?}"),
            };
            assert_eq!(ours.kind(), theirs.kind(), "{line:?}");
            assert_eq!(ours.exit_code(), theirs.exit_code(), "{line:?}");
            assert_eq!(
                ours.render().to_string(),
                theirs.render().to_string(),
                "{line:?}"
            );
        }
    }

    #[test]
    fn valid_lines_give_the_same_arguments() {
        let lines: &[&[&str]] = &[
            &["intact", "sum"],
            &["intact", "sum", "-"],
            &["intact", "sum", "--algo", "xxh3", "--jobs", "1", "a", "b"],
            &[
                "intact",
                "sum",
                "-a",
                "sha256",
                "-r",
                "-z",
                "--no-mmap",
                "d",
            ],
            &[
                "intact",
                "sum",
                "-c",
                "-q",
                "--ignore-missing",
                "--strict",
                "l",
            ],
            &[
                "intact",
                "sum",
                "--json",
                "--block-size",
                "4MiB",
                "--pages",
                "f",
            ],
            &["intact", "sum", "--tag", "--mmap", "--", "--help"],
            &["intact", "sum", "sum", "help"],
        ];
        for line in lines {
            let ours = fast(line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
            let theirs = full(line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
            assert_eq!(format!("{ours:?}"), format!("{theirs:?}"), "{line:?}");
        }
    }

    #[test]
    fn only_sum_takes_the_fast_path() {
        for line in [
            &["intact"][..],
            &["intact", "copy", "a", "b"],
            &["intact", "help", "sum"],
            &["intact", "--help"],
            &["intact", "-h", "sum"],
            &["intact", "Sum", "x"],
            &["intact", "sums", "x"],
        ] {
            assert!(parse_from(&argv(line)).is_none(), "{line:?}");
        }
    }

    #[test]
    fn a_program_name_that_is_not_utf8_takes_the_full_path() {
        use std::os::unix::ffi::OsStringExt;
        let line = vec![
            OsString::from_vec(b"/bin/int\xffact".to_vec()),
            OsString::from("sum"),
        ];
        assert!(parse_from(&line).is_none());
    }
}
