//! What `intact sum`'s short start-up must keep: its own parse gives the
//! help the whole command line gives, and the entry point without std's
//! wrapper still does what that wrapper did (standard descriptors opened,
//! SIGPIPE ignored, output flushed at exit). Each test runs the real binary
//! in the state it sets up itself and checks what the process did.

use std::fs;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};

fn intact() -> Command {
    Command::new(env!("CARGO_BIN_EXE_intact"))
}

/// A 64 KiB file of known bytes and its `xxhsum -H3` line, as intact prints it.
fn sample(dir: &Path) -> (std::path::PathBuf, String) {
    let path = dir.join("data.bin");
    fs::write(&path, intact_sample::bytes(64 << 10, 7)).unwrap();
    let out = intact()
        .args(["sum", "--algo", "xxh3"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    (path, String::from_utf8(out.stdout).unwrap())
}

#[test]
fn sum_help_is_the_whole_command_line_s() {
    // `intact help sum` goes through the whole Cli; `intact sum --help`
    // through sum's own parse.
    let whole = intact().args(["help", "sum"]).output().unwrap();
    let own = intact().args(["sum", "--help"]).output().unwrap();
    assert!(whole.status.success() && own.status.success());
    assert!(!own.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&own.stdout),
        String::from_utf8_lossy(&whole.stdout)
    );
    // And it is sum's help, with the name the binary was run by.
    let text = String::from_utf8_lossy(&own.stdout);
    assert!(
        text.contains("Usage: intact sum [OPTIONS] [PATH]..."),
        "{text}"
    );
    assert!(text.contains("--ignore-missing"), "{text}");
}

#[test]
fn a_usage_error_exits_2_with_sum_s_usage() {
    let out = intact().args(["sum", "--no-such-flag"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unexpected argument '--no-such-flag'"),
        "{err}"
    );
    assert!(
        err.contains("Usage: intact sum [OPTIONS] [PATH]..."),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn a_closed_standard_descriptor_is_opened_on_dev_null() {
    // Started with descriptor 0 closed, intact must have /dev/null there
    // (else the first file it opens becomes its standard input): hashing
    // its own /proc/self/fd/0 then reads /dev/null, an empty input. Were
    // 0 still closed, that path would not exist and the run would fail.
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    fs::write(&empty, b"").unwrap();
    let expected = intact()
        .args(["sum", "--algo", "xxh3"])
        .arg(&empty)
        .output()
        .unwrap();
    let expected = String::from_utf8(expected.stdout).unwrap();
    let expected = expected.replace(&*empty.to_string_lossy(), "/proc/self/fd/0");
    let mut cmd = intact();
    cmd.args(["sum", "--algo", "xxh3", "/proc/self/fd/0"]);
    // SAFETY: only async-signal-safe close() between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::close(0);
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
    assert!(
        expected.starts_with("XXH3 (/proc/self/fd/0) = "),
        "{expected}"
    );
}

#[test]
fn a_closed_pipe_is_an_error_not_a_signal() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = sample(dir.path());
    // The digest lines, and the JSON reports of sum and check (which
    // once panicked there, exit 101).
    let list = dir.path().join("list");
    let line = intact().args(["sum"]).arg(&path).output().unwrap();
    std::fs::write(&list, &line.stdout).unwrap();
    let runs: [Vec<std::ffi::OsString>; 3] = [
        vec![
            "sum".into(),
            "--algo".into(),
            "xxh3".into(),
            path.clone().into(),
        ],
        vec!["sum".into(), "--json".into(), path.clone().into()],
        vec!["sum".into(), "--json".into(), "-c".into(), list.into()],
    ];
    for args in runs {
        let mut fds = [0; 2];
        // SAFETY: pipe writes two new descriptors into `fds`.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both descriptors were just created and are owned here only.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        drop(read);
        let out = intact()
            .args(&args)
            .stdout(Stdio::from(write))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        // Killed by SIGPIPE would be a signal, not an exit status.
        assert_eq!(out.status.signal(), None, "{args:?}: {out:?}");
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("Broken pipe") && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn output_without_a_final_newline_is_flushed_at_exit() {
    let dir = tempfile::tempdir().unwrap();
    let (path, line) = sample(dir.path());
    let out = intact()
        .args(["sum", "--algo", "xxh3", "-z"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let expected = format!("{}\0", line.trim_end_matches('\n'));
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
}
