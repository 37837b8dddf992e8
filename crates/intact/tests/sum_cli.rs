//! `intact sum` run as a real binary, compared byte for byte with
//! sha256sum, sha1sum, md5sum, sha512sum, b3sum and xxhsum on the same files.
//! The tools are installed by `scripts/setup` (run by `.ci/run`).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const MIB: usize = 1 << 20;

fn intact() -> Command {
    Command::new(env!("CARGO_BIN_EXE_intact"))
}

fn run(mut cmd: Command, dir: &Path) -> Output {
    cmd.current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("command runs")
}

fn run_stdin(mut cmd: Command, dir: &Path, input: &[u8]) -> Output {
    let mut child = cmd
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("command starts");
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// `program args...` for a reference tool; fails loudly if it is missing.
fn tool(spec: &str) -> Command {
    let mut parts = spec.split(' ');
    let program = parts.next().unwrap();
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "reference tool '{program}' is not installed: run scripts/setup (CI does) before the tests"
    );
    let mut c = Command::new(program);
    c.args(parts);
    c
}

fn data(len: usize, seed: u64) -> Vec<u8> {
    intact_sample::bytes(len, seed)
}

/// Files at the boundary sizes, with ordinary but non-trivial names.
fn boundary_files(dir: &Path) -> Vec<String> {
    let sizes = [0, 1, 4095, 4096, 4097, MIB - 1, MIB, MIB + 1, 3 * MIB + 17];
    let mut names = Vec::new();
    for (i, len) in sizes.into_iter().enumerate() {
        let name = match i {
            1 => format!("with space {len}.dat"),
            2 => format!("ünïcödé-{len}.dat"),
            _ => format!("f{len}.dat"),
        };
        fs::write(dir.join(&name), data(len, i as u64)).unwrap();
        names.push(name);
    }
    names
}

/// (reference tool, intact algorithm) pairs whose outputs must be identical.
const PAIRS: [(&str, &str); 7] = [
    ("sha256sum", "sha256"),
    ("sha512sum", "sha512"),
    ("sha1sum", "sha1"),
    ("md5sum", "md5"),
    ("b3sum", "blake3"),
    ("xxhsum -H3", "xxh3"),
    ("xxhsum -H2", "xxh128"),
];

fn assert_ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn output_is_byte_identical_to_the_reference_tools() {
    let dir = tempfile::tempdir().unwrap();
    let names = boundary_files(dir.path());
    for (spec, algo) in PAIRS {
        let mut t = tool(spec);
        t.args(&names);
        let want = run(t, dir.path());
        assert_ok(&want, spec);
        for extra in [
            &["--jobs", "1"][..],
            &[],
            &["--no-mmap"],
            &["--jobs", "3", "--no-mmap"],
        ] {
            let mut c = intact();
            c.args(["sum", "--algo", algo]).args(extra).args(&names);
            let got = run(c, dir.path());
            assert_ok(&got, algo);
            assert_eq!(
                String::from_utf8_lossy(&got.stdout),
                String::from_utf8_lossy(&want.stdout),
                "intact sum --algo {algo} {extra:?} vs {spec}"
            );
        }
    }
}

#[test]
fn awkward_names_are_escaped_like_coreutils_and_b3sum() {
    let dir = tempfile::tempdir().unwrap();
    let names = ["back\\slash", "new\nline", "plain"];
    for (i, n) in names.iter().enumerate() {
        fs::write(dir.path().join(n), data(100 + i, 9)).unwrap();
    }
    for (spec, algo) in [
        ("sha256sum", "sha256"),
        ("md5sum", "md5"),
        ("b3sum", "blake3"),
    ] {
        let mut t = tool(spec);
        t.args(names);
        let want = run(t, dir.path());
        let mut c = intact();
        c.args(["sum", "--algo", algo]).args(names);
        let got = run(c, dir.path());
        assert_ok(&got, algo);
        assert_eq!(got.stdout, want.stdout, "{spec}");
        // And the escaped list checks back.
        fs::write(dir.path().join("SUMS"), &got.stdout).unwrap();
        let mut check = intact();
        check.args(["sum", "--algo", algo, "--check", "SUMS"]);
        assert_ok(&run(check, dir.path()), "check of escaped names");
    }
    // xxhsum 0.8.1 writes such names unescaped; intact reads them literally.
    let mut t = tool("xxhsum -H3");
    t.arg("back\\slash");
    let list = run(t, dir.path());
    let out = run_stdin(
        {
            let mut c = intact();
            c.args(["sum", "--check"]);
            c
        },
        dir.path(),
        &list.stdout,
    );
    assert_ok(&out, "intact --check of xxhsum's unescaped name");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "\\back\\\\slash: OK\n"
    );
}

#[test]
fn lists_interoperate_in_both_directions() {
    let dir = tempfile::tempdir().unwrap();
    let names = boundary_files(dir.path());
    for (spec, algo) in PAIRS {
        // The tool writes, intact checks.
        let mut t = tool(spec);
        t.args(&names);
        let list = run(t, dir.path());
        fs::write(dir.path().join("TOOL_SUMS"), &list.stdout).unwrap();
        let mut c = intact();
        c.args(["sum", "--algo", algo, "--check", "TOOL_SUMS"]);
        let out = run(c, dir.path());
        assert_ok(&out, &format!("intact --check of {spec}'s list"));
        let oks = String::from_utf8_lossy(&out.stdout)
            .matches(": OK\n")
            .count();
        assert_eq!(oks, names.len(), "{spec}");

        // intact writes, the tool checks.
        let mut c = intact();
        c.args(["sum", "--algo", algo]).args(&names);
        let list = run(c, dir.path());
        fs::write(dir.path().join("INTACT_SUMS"), &list.stdout).unwrap();
        let mut t = tool(spec);
        t.args(["-c", "INTACT_SUMS"]);
        assert_ok(&run(t, dir.path()), &format!("{spec} -c of intact's list"));
    }
}

#[test]
fn check_reports_every_failure_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let names = boundary_files(dir.path());
    let mut t = tool("sha256sum");
    t.args(&names);
    let mut list = run(t, dir.path()).stdout;
    list.extend_from_slice(b"this line is not a checksum line\n");
    list.extend_from_slice(
        b"0000000000000000000000000000000000000000000000000000000000000000  missing.dat\n",
    );
    fs::write(dir.path().join("SUMS"), &list).unwrap();
    // Corrupt one byte of one file in the middle of the list.
    let victim = dir.path().join(&names[4]);
    let mut bytes = fs::read(&victim).unwrap();
    bytes[0] ^= 1;
    fs::write(&victim, bytes).unwrap();

    let mut c = intact();
    c.args(["sum", "-a", "sha256", "--check", "SUMS"]);
    let out = run(c, dir.path());
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stdout.matches(": OK\n").count(),
        names.len() - 1,
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("{}: FAILED\n", names[4])),
        "{stdout}"
    );
    assert!(
        stdout.contains("missing.dat: FAILED open or read\n"),
        "{stdout}"
    );
    let bad_line = names.len() + 1;
    assert!(
        stderr.contains(&format!("SUMS:{bad_line}: not a checksum line")),
        "{stderr}"
    );
    assert!(
        stderr.contains("missing.dat: No such file or directory"),
        "{stderr}"
    );
    assert!(
        stderr.contains("WARNING: 1 computed checksum did NOT match"),
        "{stderr}"
    );
    assert!(
        stderr.contains("WARNING: 1 line is improperly formatted"),
        "{stderr}"
    );
    assert!(
        stderr.contains("WARNING: 1 listed file could not be read"),
        "{stderr}"
    );

    // The same in JSON.
    let mut c = intact();
    c.args(["sum", "-a", "sha256", "--check", "SUMS", "--json"]);
    let out = run(c, dir.path());
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &v["summary"];
    assert_eq!(s["ok"], names.len() as u64 - 1);
    assert_eq!(s["mismatched"], 1);
    assert_eq!(s["unreadable"], 1);
    assert_eq!(s["malformed_lines"], 1);
    assert_eq!(v["malformed"][0]["line"], bad_line as u64);
}

#[test]
fn check_with_the_wrong_algorithm_says_so() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a"), b"abc").unwrap();
    let list = run(
        {
            let mut t = tool("md5sum");
            t.arg("a");
            t
        },
        dir.path(),
    );
    // Untagged md5 lines read as the default (blake3): wrong length, explained.
    let out = run_stdin(
        {
            let mut c = intact();
            c.args(["sum", "-c"]);
            c
        },
        dir.path(),
        &list.stdout,
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a blake3 digest"), "{stderr}");
    assert!(stderr.contains("--algo"), "{stderr}");
    // A tag that contradicts --algo is refused.
    let out = run_stdin(
        {
            let mut c = intact();
            c.args(["sum", "-c", "-a", "sha256"]);
            c
        },
        dir.path(),
        b"XXH3 (a) = 78af5f94892f3950\n",
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("tagged xxh3 but --algo is sha256"));
    // A list with nothing usable in it fails.
    let out = run_stdin(
        {
            let mut c = intact();
            c.args(["sum", "-c"]);
            c
        },
        dir.path(),
        b"",
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no properly formatted checksum lines"));
}

#[test]
fn bad_input_gets_clear_messages_and_the_right_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("ok.dat"), b"abc").unwrap();
    fs::create_dir(dir.path().join("sub")).unwrap();

    let mut c = intact();
    c.args(["sum", "-a", "sha256", "nope.dat", "ok.dat", "sub"]);
    let out = run(c, dir.path());
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("nope.dat: No such file or directory"),
        "{stderr}"
    );
    assert!(
        stderr.contains("sub: is a directory (use --recursive"),
        "{stderr}"
    );
    // The good file is still hashed.
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad  ok.dat\n"
    );

    for usage in [
        &["sum", "--algo", "sha3", "ok.dat"][..],
        &["sum", "--jobs", "0", "ok.dat"],
        &["sum", "--block-size", "4KiB", "ok.dat"],
        &["sum", "--quiet", "ok.dat"],
        &["sum", "--json", "--block-size", "0", "ok.dat"],
    ] {
        let mut c = intact();
        c.args(usage);
        let out = run(c, dir.path());
        assert_eq!(out.status.code(), Some(2), "{usage:?}");
        assert!(!out.stderr.is_empty(), "{usage:?} explains itself");
    }

    // An unreadable file. Root reads everything, so as root (CI) intact
    // runs as the user nobody (setpriv, util-linux; scripts/setup).
    use std::os::unix::fs::PermissionsExt;
    let p = dir.path().join("secret.dat");
    fs::write(&p, b"x").unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o000)).unwrap();
    let mut c = if intact_testkit::is_root() {
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(env!("CARGO_BIN_EXE_intact"));
        c
    } else {
        intact()
    };
    c.args(["sum", "secret.dat"]);
    let out = run(c, dir.path());
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Permission denied"));
}

#[test]
fn recursive_hashes_regular_files_in_sorted_order() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tree");
    fs::create_dir_all(root.join("b/deep")).unwrap();
    fs::create_dir_all(root.join("a")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    fs::write(root.join("b/deep/z.dat"), b"z").unwrap();
    fs::write(root.join("b/y.dat"), b"y").unwrap();
    fs::write(root.join("a/x.dat"), b"x").unwrap();
    std::os::unix::fs::symlink("a/x.dat", root.join("link")).unwrap();

    let mut c = intact();
    c.args(["sum", "-r", "-a", "md5", "tree"]);
    let out = run(c, dir.path());
    assert_ok(&out, "sum -r");
    let mut t = tool("md5sum");
    t.args(["tree/a/x.dat", "tree/b/deep/z.dat", "tree/b/y.dat"]);
    assert_eq!(out.stdout, run(t, dir.path()).stdout);
    assert!(String::from_utf8_lossy(&out.stderr).contains("skipping symlink tree/link"));
}

#[test]
fn standard_input_is_hashed_as_dash() {
    let dir = tempfile::tempdir().unwrap();
    let input = data(300_000, 5);
    let want = run_stdin(tool("sha256sum"), dir.path(), &input);
    let got = run_stdin(
        {
            let mut c = intact();
            c.args(["sum", "-a", "sha256"]);
            c
        },
        dir.path(),
        &input,
    );
    assert_ok(&got, "stdin");
    assert_eq!(got.stdout, want.stdout);
}

#[test]
fn json_carries_blocks_pages_and_the_read_path() {
    let dir = tempfile::tempdir().unwrap();
    let input = data(3 * MIB + 17, 77);
    fs::write(dir.path().join("big.dat"), &input).unwrap();
    for (flag, path) in [(None, "mmap"), (Some("--no-mmap"), "read")] {
        let mut c = intact();
        c.args([
            "sum",
            "--json",
            "-a",
            "crc32c",
            "--block-size",
            "1MiB",
            "--pages",
            "big.dat",
        ]);
        c.args(flag);
        let out = run(c, dir.path());
        assert_ok(&out, "json");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let f = &v["files"][0];
        assert_eq!(f["size"], input.len() as u64);
        assert_eq!(f["read_path"], path);
        assert_eq!(f["block_size"], MIB as u64);
        assert_eq!(f["blocks"].as_array().unwrap().len(), 4);
        assert_eq!(
            f["pages_crc32c"].as_array().unwrap().len(),
            (input.len()).div_ceil(4096)
        );
        // The first block's CRC equals the CRC of the first MiB hashed alone.
        fs::write(dir.path().join("first.dat"), &input[..MIB]).unwrap();
        let mut c = intact();
        c.args(["sum", "-a", "crc32c", "first.dat"]);
        let first = String::from_utf8(run(c, dir.path()).stdout).unwrap();
        assert_eq!(f["blocks"][0].as_str().unwrap(), &first[..8]);
        assert_eq!(v["summary"]["failed"], 0);
    }
}

#[test]
fn help_explains_formats_and_exit_status() {
    let mut c = intact();
    c.args(["sum", "--help"]);
    let out = run(c, &PathBuf::from("/"));
    assert_ok(&out, "--help");
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "sha256sum",
        "b3sum",
        "xxhsum",
        "Exit status",
        "--check",
        "--no-mmap",
    ] {
        assert!(help.contains(needle), "help lacks {needle}");
    }
}

/// The names in `dir`, sorted: proves a run wrote nothing there.
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `intact ARGS` in `dir`; asserts the run left `dir` as it found it.
fn intact_in(dir: &Path, args: &[&str]) -> Output {
    let before = listing(dir);
    let mut c = intact();
    c.args(args);
    let out = run(c, dir);
    assert_eq!(listing(dir), before, "intact {args:?} wrote into {dir:?}");
    out
}

/// `spec ARGS` (a reference tool) in `dir`.
fn tool_in(dir: &Path, spec: &str, args: &[&str]) -> Output {
    let mut t = tool(spec);
    t.args(args);
    run(t, dir)
}

#[test]
fn a_list_that_fails_every_line_says_which_algorithm_it_may_be_for() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::write(d.join("a"), b"abc").unwrap();
    fs::write(d.join("b"), data(70_000, 3)).unwrap();
    let sha256 = tool_in(d, "sha256sum", &["a", "b"]).stdout;
    fs::write(d.join("SHA256SUMS"), &sha256).unwrap();

    // Read as BLAKE3 (the default, same length): every line FAILED, as
    // before, and the run says the list may be for sha256.
    let out = intact_in(d, &["sum", "-c", "SHA256SUMS"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout), "a: FAILED\nb: FAILED\n");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("WARNING: 2 computed checksums did NOT match"),
        "{stderr}"
    );
    assert!(
        stderr.contains("the lines were read as blake3")
            && stderr.contains("the list may be for sha256; try --algo sha256"),
        "{stderr}"
    );
    // With the right algorithm it passes, and says nothing more.
    let out = intact_in(d, &["sum", "-c", "-a", "sha256", "SHA256SUMS"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "a: OK\nb: OK\n");
    assert_eq!(text(&out.stderr), "");

    // One real mismatch among matches is not a wrong algorithm: no hint.
    fs::write(d.join("b"), data(70_000, 4)).unwrap();
    let out = intact_in(d, &["sum", "-c", "-a", "sha256", "SHA256SUMS"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout), "a: OK\nb: FAILED\n");
    assert!(!text(&out.stderr).contains("may be for"), "{:?}", out);

    // A BLAKE3 list checked as sha256 names blake3.
    let b3 = tool_in(d, "b3sum", &["a"]).stdout;
    fs::write(d.join("B3SUMS"), &b3).unwrap();
    let out = intact_in(d, &["sum", "-c", "-a", "sha256", "B3SUMS"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout), "a: FAILED\n");
    assert!(
        text(&out.stderr).contains("may be for blake3; try --algo blake3"),
        "{:?}",
        out
    );

    // 32 hex digits read as xxh128: md5 has that length too.
    let md5 = tool_in(d, "md5sum", &["a"]).stdout;
    fs::write(d.join("MD5SUMS"), &md5).unwrap();
    let out = intact_in(d, &["sum", "-c", "-a", "xxh128", "MD5SUMS"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("may be for md5; try --algo md5"),
        "{out:?}"
    );
    // Without -a the length fits no BLAKE3 digest: the line says which fit.
    let out = intact_in(d, &["sum", "-c", "MD5SUMS"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout), "");
    assert!(
        text(&out.stderr)
            .contains("32 hex digits fit another algorithm: try --algo xxh128 or --algo md5"),
        "{out:?}"
    );
    // A tagged line names its algorithm: a mismatch there is a mismatch.
    fs::write(d.join("TAGGED"), b"XXH3 (a) = 0000000000000000\n").unwrap();
    let out = intact_in(d, &["sum", "-c", "TAGGED"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout), "a: FAILED\n");
    assert!(!text(&out.stderr).contains("may be for"), "{out:?}");
}

#[test]
fn tag_lines_are_byte_identical_to_the_gnu_tools() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut names = boundary_files(d);
    for (i, n) in ["back\\slash", "new\nline"].iter().enumerate() {
        fs::write(d.join(n), data(5000 + i, 11)).unwrap();
        names.push(n.to_string());
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    for (spec, algo) in [
        ("sha256sum", "sha256"),
        ("sha512sum", "sha512"),
        ("sha1sum", "sha1"),
        ("md5sum", "md5"),
        ("xxhsum -H2", "xxh128"),
        ("xxhsum -H3", "xxh3"),
    ] {
        // xxhsum 0.8.1 does not escape names (intact escapes as coreutils
        // does for every algorithm), so it gets the plain names only.
        let names = if spec.starts_with("xxhsum") {
            &names[..names.len() - 2]
        } else {
            &names[..]
        };
        let mut args = vec!["--tag"];
        args.extend(names);
        let want = tool_in(d, spec, &args);
        assert_ok(&want, spec);
        let mut args = vec!["sum", "--tag", "-a", algo];
        args.extend(names);
        let got = intact_in(d, &args);
        assert_ok(&got, algo);
        assert_eq!(text(&got.stdout), text(&want.stdout), "{spec} --tag");
        // Tagged lists check back without -a, in intact and in the tool.
        fs::write(d.join("TAGS"), &got.stdout).unwrap();
        let out = intact_in(d, &["sum", "-c", "--quiet", "TAGS"]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert_eq!(text(&out.stdout), "");
        assert_ok(&tool_in(d, spec, &["-c", "TAGS"]), spec);
        fs::remove_file(d.join("TAGS")).unwrap();
    }
    // blake3 has no GNU tool; its tag is BLAKE3, and it checks back.
    let got = intact_in(d, &["sum", "--tag", "f0.dat"]);
    assert_ok(&got, "blake3 --tag");
    assert!(
        text(&got.stdout).starts_with("BLAKE3 (f0.dat) = "),
        "{got:?}"
    );
    // --tag makes no sense when checking, as in coreutils: usage error.
    let out = intact_in(d, &["sum", "-c", "--tag", "f1.dat"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(text(&out.stdout), "");
}

#[test]
fn zero_terminated_lines_are_byte_identical_to_the_gnu_tools() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let names = ["plain", "new\nline", "back\\slash", "car\rriage"];
    for (i, n) in names.iter().enumerate() {
        fs::write(d.join(n), data(3000 + i, 12)).unwrap();
    }
    for (spec, algo) in [
        ("sha256sum", "sha256"),
        ("sha512sum", "sha512"),
        ("md5sum", "md5"),
    ] {
        for tag in [&[][..], &["--tag"]] {
            let mut args = vec!["-z"];
            args.extend(tag);
            args.extend(names);
            let want = tool_in(d, spec, &args);
            assert_ok(&want, spec);
            assert_eq!(want.stdout.iter().filter(|&&b| b == 0).count(), 4);
            let mut args = vec!["sum", "-z", "-a", algo];
            args.extend(tag);
            args.extend(names);
            let got = intact_in(d, &args);
            assert_ok(&got, algo);
            assert_eq!(got.stdout, want.stdout, "{spec} -z {tag:?}");
        }
    }
    // coreutils 9.1 refuses --zero when checking; so does intact (usage: 2).
    fs::write(d.join("SUMS"), b"").unwrap();
    let out = intact_in(d, &["sum", "-c", "-z", "SUMS"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(text(&out.stdout), "");
}

#[test]
fn status_ignore_missing_and_strict_behave_as_in_coreutils() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::write(d.join("a"), b"abc").unwrap();
    fs::write(d.join("b"), data(100_000, 13)).unwrap();
    let mut list = tool_in(d, "sha256sum", &["a", "b"]).stdout;
    fs::write(d.join("GOOD"), &list).unwrap();
    let gone = b"0000000000000000000000000000000000000000000000000000000000000000  gone\n";
    list.extend_from_slice(gone);
    fs::write(d.join("MISSING"), &list).unwrap();
    fs::write(d.join("ONLY_MISSING"), gone).unwrap();
    let mut malformed = tool_in(d, "sha256sum", &["a"]).stdout;
    malformed.extend_from_slice(b"not a checksum line\n");
    fs::write(d.join("MALFORMED"), &malformed).unwrap();
    let mut wrong = tool_in(d, "sha256sum", &["a"]).stdout;
    wrong[0] = if wrong[0] == b'0' { b'1' } else { b'0' };
    fs::write(d.join("WRONG"), &wrong).unwrap();

    // Same stdout and exit status as sha256sum for every case where both
    // agree on the rules.
    let cases: [(&[&str], i32); 8] = [
        (&["--status", "GOOD"], 0),
        (&["--status", "WRONG"], 1),
        (&["--status", "MISSING"], 1),
        (&["--ignore-missing", "MISSING"], 0),
        (&["--ignore-missing", "--quiet", "MISSING"], 0),
        (&["--ignore-missing", "ONLY_MISSING"], 1),
        (&["--status", "--ignore-missing", "MISSING"], 0),
        (&["--strict", "MALFORMED"], 1),
    ];
    for (flags, code) in cases {
        let mut args = vec!["-c"];
        args.extend(flags);
        let want = tool_in(d, "sha256sum", &args);
        assert_eq!(want.status.code(), Some(code), "sha256sum {args:?}");
        let mut args = vec!["sum", "-a", "sha256", "-c"];
        args.extend(flags);
        let got = intact_in(d, &args);
        assert_eq!(got.status.code(), Some(code), "intact {args:?}: {got:?}");
        assert_eq!(text(&got.stdout), text(&want.stdout), "{args:?}");
        let stderr = text(&got.stderr);
        if flags.contains(&"--status") {
            assert!(!stderr.contains("WARNING"), "{args:?}: {stderr}");
        }
        if flags.contains(&"--ignore-missing") {
            assert!(!stderr.contains("gone"), "{args:?}: {stderr}");
        }
        if flags.contains(&"ONLY_MISSING") {
            assert!(
                stderr.contains("ONLY_MISSING: no file was verified"),
                "{stderr}"
            );
        }
    }
    // --status still names a file it could not read on stderr, as coreutils.
    let got = intact_in(d, &["sum", "-a", "sha256", "-c", "--status", "MISSING"]);
    assert!(
        text(&got.stderr).contains("gone: No such file or directory"),
        "{got:?}"
    );
    // Where intact is deliberately stricter: a malformed line fails the
    // run even without --strict (sha256sum exits 0); stdout is the same.
    let want = tool_in(d, "sha256sum", &["-c", "MALFORMED"]);
    assert_eq!(want.status.code(), Some(0));
    let got = intact_in(d, &["sum", "-a", "sha256", "-c", "MALFORMED"]);
    assert_eq!(got.status.code(), Some(1));
    assert_eq!(got.stdout, want.stdout);
    // The checking options without --check are usage errors.
    for flag in ["--status", "--ignore-missing", "--strict"] {
        let out = intact_in(d, &["sum", flag, "a"]);
        assert_eq!(out.status.code(), Some(2), "{flag}");
        assert_eq!(text(&out.stdout), "", "{flag}");
    }
}

/// Runs `cmd` to the end and returns its output and peak RSS in MiB (from
/// the kernel's accounting of that child, `wait4`).
// The child is reaped by wait4 (for its rusage), which clippy cannot see.
#[allow(clippy::zombie_processes)]
fn run_with_peak_rss(mut cmd: Command, dir: &Path) -> (Output, f64) {
    use std::io::Read;
    let mut child = cmd
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("command starts");
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut stderr)
        .unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; pid is our unreaped child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(rc, child.id() as libc::pid_t);
    use std::os::unix::process::ExitStatusExt;
    let out = Output {
        status: std::process::ExitStatus::from_raw(status),
        stdout,
        stderr,
    };
    (out, usage.ru_maxrss as f64 / 1024.0)
}

#[test]
fn large_files_are_mapped_a_window_at_a_time_and_match_the_tools() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let size = 160 * MIB;
    intact_sample::write_file(
        &d.join("big.dat"),
        size as u64,
        &mut intact_sample::SampleBytes::new(21),
    )
    .unwrap();
    fs::write(d.join("small.dat"), data(4096, 22)).unwrap();
    let before = listing(d);

    // One thread hashes XXH3: the file is mapped 16 MiB at a time, so the
    // process stays far below the file's size (it held all 160 MiB before).
    let mut c = intact();
    c.args(["sum", "-a", "xxh3", "big.dat"]);
    let (got, rss) = run_with_peak_rss(c, d);
    assert_ok(&got, "xxh3 big");
    assert_eq!(got.stdout, tool_in(d, "xxhsum -H3", &["big.dat"]).stdout);
    assert!(rss < 100.0, "peak RSS {rss:.0} MiB for a 160 MiB file");

    // The same through every strategy, and BLAKE3 split across threads.
    for extra in [&["--no-mmap"][..], &["--mmap"], &["--jobs", "1"]] {
        let mut args = vec!["sum", "-a", "xxh3"];
        args.extend(extra);
        args.push("big.dat");
        let out = intact_in(d, &args);
        assert_ok(&out, &format!("{extra:?}"));
        assert_eq!(out.stdout, got.stdout, "{extra:?}");
    }
    let out = intact_in(d, &["sum", "big.dat", "small.dat"]);
    assert_ok(&out, "blake3");
    assert_eq!(
        out.stdout,
        tool_in(d, "b3sum", &["big.dat", "small.dat"]).stdout
    );

    // The read path each choice really took.
    for (flags, file, path) in [
        (&[][..], "big.dat", "mmap"),
        (&[][..], "small.dat", "read"),
        (&["--mmap"], "small.dat", "mmap"),
        (&["--no-mmap"], "big.dat", "read"),
    ] {
        let mut args = vec!["sum", "--json", "-a", "xxh3"];
        args.extend(flags);
        args.push(file);
        let out = intact_in(d, &args);
        assert_ok(&out, &format!("{args:?}"));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["files"][0]["read_path"], path, "{args:?}");
    }
    let out = intact_in(d, &["sum", "--mmap", "--no-mmap", "small.dat"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(text(&out.stdout), "");
    assert_eq!(listing(d), before);
}
