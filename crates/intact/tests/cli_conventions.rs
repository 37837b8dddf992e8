//! The command line behaves like the tools users already know: true help
//! generated from one place, usage errors exit 2, a closed stdout ends the
//! output quietly, sane block sizes, a summary without the model, escaped
//! names, `-q`, completions and man pages. Every test runs the real binary.

use std::fs;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// The verification modes `copy` and `send` run, as `intact_transfer`
/// defines them.
const MODES: [&str; 7] = [
    "none",
    "sequential",
    "file",
    "block",
    "fiver",
    "riva",
    "flash",
];

fn intact(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_intact"))
        .args(args)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A source file and a destination path that does not exist yet (so a
/// copy of the one file there is the file DST, as with cp).
fn src_and_dst(dir: &Path) -> (String, String) {
    let src = dir.join("f.dat");
    fs::write(&src, intact_sample::bytes(100_000, 7)).unwrap();
    let dst = dir.join("out");
    (
        src.to_str().unwrap().to_string(),
        dst.to_str().unwrap().to_string(),
    )
}

/// The source is untouched and nothing was written at the destination.
fn nothing_written(dir: &Path) {
    assert_eq!(
        fs::read(dir.join("f.dat")).unwrap(),
        intact_sample::bytes(100_000, 7),
        "the source changed"
    );
    assert!(!dir.join("out").exists(), "something was written");
}

#[test]
fn help_lists_the_real_modes_with_riva_as_default_and_a_true_usage_line() {
    for cmd in ["copy", "send"] {
        let out = intact(&[cmd, "--help"]);
        assert_eq!(out.status.code(), Some(0));
        let help = text(&out.stdout);
        assert!(!help.contains("not built yet"), "{cmd}: {help}");
        assert!(!help.contains("[default]"), "{cmd}: {help}");
        assert!(help.contains("[default: riva]"), "{cmd}: {help}");
        for m in MODES {
            assert!(help.contains(&format!("- {m}:")), "{cmd} lacks {m}: {help}");
        }
        let usage = match cmd {
            "copy" => "Usage: intact copy [OPTIONS] <SRC>... <DST>",
            _ => "Usage: intact send [OPTIONS] <SRC>... <HOST:PORT>",
        };
        assert!(help.contains(usage), "{cmd}: {help}");
        assert!(!help.contains("<SRC... DST>"), "{cmd}: {help}");
        for flag in [
            "--include <PATTERN>",
            "--exclude <PATTERN>",
            "-n, --dry-run",
            "-L, --copy-links",
            "--bwlimit <RATE>",
            "-q, --quiet",
        ] {
            assert!(help.contains(flag), "{cmd} lacks {flag}: {help}");
        }
        // Both offer --delete (send's runs on the server).
        let offers_delete = help.lines().any(|l| l.trim() == "--delete");
        assert!(offers_delete, "{cmd}: {help}");
    }
    // The reliability table lists exactly the modes that exist.
    let out = intact(&["reliability", "--transfer", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed: Vec<_> = v["modes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["verify"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(listed, MODES);
    let out = intact(&["reliability", "--transfer", "--verify", "media"]);
    assert_eq!(out.status.code(), Some(2));

    // A mode that does not exist: exit 2, the real modes named, nothing written.
    let dir = tempfile::tempdir().unwrap();
    let (s, d) = src_and_dst(dir.path());
    let out = intact(&["copy", "--verify", "media", &s, &d]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("invalid value 'media'")
            && err.contains("none, sequential, file, block, fiver, riva, flash"),
        "{err}"
    );
    nothing_written(dir.path());
}

/// Runs intact with its standard output a pipe whose reader is already
/// gone, as in `intact ... | head` once head has exited.
fn with_closed_stdout(args: &[&str]) -> Output {
    let mut fds = [0; 2];
    // SAFETY: pipe fills two descriptors we then own.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: fresh descriptors from pipe, owned once each.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    Command::new(env!("CARGO_BIN_EXE_intact"))
        .args(args)
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn a_closed_stdout_ends_the_output_quietly_and_the_copy_stands() {
    let dir = tempfile::tempdir().unwrap();
    let (s, d) = src_and_dst(dir.path());
    for (i, flag) in ["--json", "-v", "--verbose"].into_iter().enumerate() {
        let d = format!("{d}{i}");
        let out = with_closed_stdout(&["copy", "--verify", "block", flag, &s, &d]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{flag}: {err}");
        assert!(err.is_empty(), "{flag}: not quiet: {err}");
        assert_eq!(
            fs::read(&d).unwrap(),
            intact_sample::bytes(100_000, 7),
            "{flag}: the copy is not complete"
        );
    }
    // A dry run's listing too, and it still writes nothing.
    for flag in ["--verbose", "--json"] {
        let out = with_closed_stdout(&["copy", "--dry-run", flag, &s, &d]);
        assert_eq!(out.status.code(), Some(0), "{flag}: {}", text(&out.stderr));
        assert!(out.stderr.is_empty(), "{flag}: {}", text(&out.stderr));
    }
    nothing_written(dir.path());
    // The same for the other commands that print reports.
    for args in [
        &["reliability", "--json"][..],
        &["reliability", "--transfer"],
        &["completions", "bash"],
        &["man"],
    ] {
        let out = with_closed_stdout(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(out.stderr.is_empty(), "{args:?}: {}", text(&out.stderr));
    }
}

#[test]
fn a_server_address_that_is_not_host_port_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = src_and_dst(dir.path());
    for (target, why) in [
        ("127.0.0.1", "no port"),
        (
            "host:99999",
            "the port '99999' is not a number from 1 to 65535",
        ),
        (":notaport", "no host"),
        ("host:", "the port '' is not a number"),
        ("[::1", "closing ']'"),
        ("h:4750:/../up", "cannot be used"),
    ] {
        let out = intact(&["send", &s, target]);
        assert_eq!(out.status.code(), Some(2), "{target}");
        let err = text(&out.stderr);
        assert!(
            err.contains(&format!("'{target}' is not HOST:PORT")) || err.contains(why),
            "{target}: {err}"
        );
        assert!(err.contains(why), "{target}: {err}");
        assert!(err.contains("e.g."), "{target}: says what to write: {err}");
    }
    nothing_written(dir.path());
    // Out-of-range model inputs are usage errors too.
    let out = intact(&["reliability", "--uber", "2"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("UBER must be in (0, 1)"));
    assert!(out.stdout.is_empty());
}

#[test]
fn block_sizes_must_be_whole_pages_within_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let (s, d) = src_and_dst(dir.path());
    for (size, why) in [
        ("3", "too small"),
        ("4095", "too small"),
        ("6KiB", "not a whole number of 4KiB pages"),
        ("32MiB", "too large"),
        ("0", "greater than 0"),
    ] {
        for cmd in ["copy", "send"] {
            let target = if cmd == "copy" {
                d.clone()
            } else {
                "127.0.0.1:9".into()
            };
            let out = intact(&[cmd, "--block-size", size, &s, &target]);
            assert_eq!(out.status.code(), Some(2), "{cmd} {size}");
            let err = text(&out.stderr);
            assert!(err.contains(why), "{cmd} {size}: {err}");
            if why != "greater than 0" {
                assert!(
                    err.contains("a multiple of 4KiB from 4KiB to 16MiB"),
                    "{size}: {err}"
                );
            }
        }
    }
    nothing_written(dir.path());
    // The bounds themselves are accepted.
    for size in ["4KiB", "16MiB"] {
        let out = intact(&["copy", "--verify", "block", "--block-size", size, &s, &d]);
        assert_eq!(out.status.code(), Some(0), "{size}: {}", text(&out.stderr));
    }
}

#[test]
fn the_summary_shows_what_a_user_needs_and_the_model_stays_in_json() {
    let dir = tempfile::tempdir().unwrap();
    let (s, d) = src_and_dst(dir.path());
    let out = intact(&["copy", &s, &d]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let summary = text(&out.stdout);
    assert!(!summary.contains("model"), "{summary}");
    assert!(!summary.contains("predicted"), "{summary}");
    assert!(
        summary.starts_with("1 of 1 entries") && summary.contains("verify riva: level"),
        "{summary}"
    );
    assert_eq!(summary.lines().count(), 1, "{summary}");
    let out = intact(&["copy", "--json", &s, &format!("{d}2")]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["model"]["predicted_seconds"].is_number(), "{v}");
    assert!(v["model"]["error_percent"].is_number(), "{v}");
}

#[test]
fn verbose_names_with_line_breaks_are_escaped_as_sum_escapes_them() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("data");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("two\nlines"), b"a").unwrap();
    fs::write(src.join("back\\slash"), b"b").unwrap();
    fs::write(src.join("plain"), b"c").unwrap();
    let dst = dir.path().join("out");
    let out = intact(&[
        "copy",
        "-v",
        "--verify",
        "block",
        src.to_str().unwrap(),
        dst.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    // One line per entry (the directory and three files) and the summary.
    assert_eq!(stdout.lines().count(), 5, "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("\\file data/two\\nlines (1 B")),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("\\file data/back\\\\slash (1 B")),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("file data/plain (1 B")),
        "{stdout}"
    );
    // The names themselves arrived unchanged.
    assert_eq!(fs::read(dst.join("data/two\nlines")).unwrap(), b"a");
    assert_eq!(fs::read(dst.join("data/back\\slash")).unwrap(), b"b");
}

#[test]
fn quiet_prints_nothing_but_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (s, d) = src_and_dst(dir.path());
    let out = intact(&["copy", "-q", "--verify", "block", &s, &d]);
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    assert_eq!(fs::read(&d).unwrap(), intact_sample::bytes(100_000, 7));
    // An error still shows, and the good file is still copied.
    let d2 = format!("{d}2");
    let out = intact(&["copy", "--quiet", "/nonexistent/source", &s, &d2]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    assert!(text(&out.stderr).contains("/nonexistent/source"));
    // ... with the line that says how to finish the job (standard error).
    let err = text(&out.stderr);
    assert!(
        err.contains("incomplete: ") && err.contains("run the same command again: "),
        "{err}"
    );
    assert!(Path::new(&d2).join("f.dat").exists());
    // A dry run and a symlink source's note are silenced as well; a usage
    // error is not.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&s, &link).unwrap();
    let d4 = format!("{d}4");
    for args in [
        &["copy", "-q", "--dry-run", &s, &d4][..],
        &[
            "copy",
            "-q",
            "--verify",
            "block",
            link.to_str().unwrap(),
            &d4,
        ],
    ] {
        let out = intact(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
        assert!(out.stderr.is_empty(), "{args:?}: {}", text(&out.stderr));
    }
    let out = intact(&["copy", "-q", dir.path().to_str().unwrap(), &format!("{d}5")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("the copy would copy itself"));
    // -q with -v or --json is a contradiction: exit 2, nothing written.
    for other in ["-v", "--json"] {
        let d3 = format!("{d}3");
        let out = intact(&["copy", "-q", other, &s, &d3]);
        assert_eq!(out.status.code(), Some(2), "{other}");
        assert!(text(&out.stderr).contains("cannot be used with"));
        assert!(!Path::new(&d3).exists());
    }
}

#[test]
fn completions_and_man_pages_come_from_the_same_definitions() {
    for shell in ["bash", "zsh", "fish"] {
        let out = intact(&["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let script = text(&out.stdout);
        for word in [
            "copy",
            "send",
            "serve",
            "sum",
            "verify",
            "block-size",
            "quiet",
            "include",
            "exclude",
            "delete",
            "dry-run",
            "copy-links",
            "bwlimit",
        ] {
            assert!(script.contains(word), "{shell} lacks {word}");
        }
        for m in MODES {
            assert!(script.contains(m), "{shell} lacks mode {m}");
        }
    }
    let out = intact(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("possible values"));

    let out = intact(&["man"]);
    assert_eq!(out.status.code(), Some(0));
    let page = text(&out.stdout);
    assert!(page.contains(".TH intact 1"), "{page}");
    for cmd in ["copy", "send", "serve", "sum", "demo", "reliability"] {
        assert!(page.contains(&format!("intact\\-{cmd}(1)")), "{cmd}");
    }
    let out = intact(&["man", "copy"]);
    assert_eq!(out.status.code(), Some(0));
    let page = text(&out.stdout);
    assert!(page.contains(".TH intact\\-copy 1") || page.contains(".TH intact-copy 1"));
    assert!(page.contains("\\-\\-verify") && page.contains("riva"));
    assert!(page.contains("\\-\\-block\\-size"));
    for flag in [
        "\\-\\-include",
        "\\-\\-exclude",
        "\\-\\-delete",
        "\\-\\-dry\\-run",
        "\\-\\-copy\\-links",
        "\\-\\-bwlimit",
    ] {
        assert!(page.contains(flag), "intact-copy(1) lacks {flag}");
    }

    let out = intact(&["man", "nosuch"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("commands: copy, serve, send"));

    let dir = tempfile::tempdir().unwrap();
    let man = dir.path().join("man1");
    let out = intact(&["man", "--dir", man.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    for page in [
        "intact.1",
        "intact-copy.1",
        "intact-send.1",
        "intact-serve.1",
        "intact-keygen.1",
        "intact-catalog-add.1",
        "intact-catalog-init.1",
        "intact-mount.1",
        "intact-plan.1",
        "intact-report-merge.1",
        "intact-cache.1",
    ] {
        assert!(man.join(page).is_file(), "{page}");
    }
    let pages = fs::read_dir(&man).unwrap().count();
    assert_eq!(
        pages, 21,
        "intact, its sixteen commands, `catalog add`, `catalog init`, `report merge` and `report shards`"
    );
}

#[test]
fn riva_on_tmpfs_does_not_evict_and_says_cache() {
    const T: &str = "riva_on_tmpfs_does_not_evict_and_says_cache";
    let Some(shm) = intact_testkit::tmpfs(T) else {
        return;
    };
    let src = shm.path().join("src");
    fs::create_dir(&src).unwrap();
    for i in 0..20u64 {
        fs::write(src.join(format!("f{i}")), intact_sample::bytes(300_000, i)).unwrap();
    }
    let dst = shm.path().join("dst");
    let out = intact(&[
        "copy",
        "--json",
        "--block-size",
        "64KiB",
        src.to_str().unwrap(),
        dst.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let files: Vec<_> = v["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "file")
        .collect();
    assert_eq!(files.len(), 20);
    for f in files {
        // Level cache, with the reason, as before; but no eviction tried,
        // so no eviction time and no pages "left after eviction".
        assert_eq!(f["level"], "cache", "{f}");
        assert!(f["note"].as_str().unwrap().contains("tmpfs"), "{f}");
        assert_eq!(f["evict_seconds"], 0.0, "{f}");
        assert_eq!(f["pages_resident"], 0, "{f}");
        assert_eq!(f["read_path"], "cached", "{f}");
        let name = f["path"].as_str().unwrap().trim_start_matches("src/");
        let i: u64 = name[1..].parse().unwrap();
        assert_eq!(
            fs::read(dst.join("src").join(name)).unwrap(),
            intact_sample::bytes(300_000, i)
        );
    }
    // --require-level device still fails there, before anything is written.
    let dst2 = shm.path().join("dst2");
    let out = intact(&[
        "copy",
        "--require-level",
        "device",
        src.join("f0").to_str().unwrap(),
        dst2.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!dst2.exists(), "neither the file dst2 nor dst2/f0");
}
