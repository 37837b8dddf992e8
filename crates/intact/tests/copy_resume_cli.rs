//! `intact copy` resumes and quick-checks as `intact send` does, since it
//! runs the same two halves: after a SIGKILL the same copy writes only
//! what was not yet verified (its report's counters prove it), a repeated
//! copy writes nothing, and a file changed in place under the same size
//! and mtime is found by its digest and copied again.

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

mod common;
use common::{resume_dataset, same_data};

fn copy_cmd(src: &Path, dst: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_intact"));
    cmd.args(["copy", "--json", "--block-size", "64KiB", "--streams", "2"])
        .args(extra)
        .arg(src)
        .arg(dst)
        // The source-digest cache and the copy's journal of this test only.
        .env("XDG_CACHE_HOME", dst.with_extension("cache"))
        .env("XDG_STATE_HOME", dst.with_extension("state"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn copy(src: &Path, dst: &Path, extra: &[&str]) -> serde_json::Value {
    let out = copy_cmd(src, dst, extra).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The largest hidden partial file under `dir`, in bytes.
fn largest_partial(dir: &Path) -> u64 {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".intact-partial-")
        })
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .max()
        .unwrap_or(0)
}

fn sum(r: &serde_json::Value, f: impl Fn(&serde_json::Value) -> u64) -> u64 {
    r["files"].as_array().unwrap().iter().map(f).sum()
}

#[test]
fn a_copy_killed_mid_file_resumes_with_only_the_missing_part() {
    let dir = tempfile::tempdir().unwrap();
    let (src, total) = resume_dataset(dir.path());
    let dst = dir.path().join("dst");
    // Slowed, so that the kill lands mid-file: at 16 MiB/s the 40 MiB
    // file takes seconds, and by 24 MiB written its first blocks are
    // verified and journaled (batches of 8 MiB).
    let mut child = copy_cmd(&src, &dst, &["--bwlimit", "16MiB"])
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while largest_partial(&dst) < 24 * MIB {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the copy ended before it could be killed mid-file"
        );
        assert!(Instant::now() < deadline, "the copy never got to 24 MiB");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "killed mid-transfer");
    assert!(
        !dst.join("data/large.dat").exists(),
        "the large file had no final name yet"
    );

    let r = copy(&src, &dst, &[]);
    assert_eq!(r["failed"], 0, "{r}");
    let skipped = sum(&r, |f| f["bytes_skipped"].as_u64().unwrap());
    let held = sum(&r, |f| {
        if f["unchanged"] == true {
            f["size"].as_u64().unwrap()
        } else {
            0
        }
    });
    let sent = r["bytes_sent"].as_u64().unwrap();
    // Every byte was written now, or held verified from the killed run.
    assert_eq!(sent + skipped + held, total, "{r}");
    let large = r["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "data/large.dat")
        .unwrap();
    assert!(
        large["bytes_skipped"].as_u64().unwrap() >= 8 * MIB,
        "the large file resumed past its journaled blocks: {large}"
    );
    same_data(&src, &dst.join("data"));
}

#[test]
fn a_repeated_copy_writes_nothing_and_a_changed_file_is_found_by_its_digest() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("data");
    fs::create_dir_all(&src).unwrap();
    for i in 0..5u64 {
        fs::write(src.join(format!("f{i}")), intact_sample::bytes(100_000, i)).unwrap();
    }
    let dst = dir.path().join("dst");
    let first = copy(&src, &dst, &[]);
    assert_eq!(first["bytes_sent"], 500_000, "{first}");

    let again = copy(&src, &dst, &[]);
    assert_eq!(again["bytes_sent"], 0, "{again}");
    let files = again["files"].as_array().unwrap();
    assert!(
        files
            .iter()
            .filter(|f| f["kind"] == "file")
            .all(|f| f["unchanged"] == true),
        "{again}"
    );

    // f2 changed in place: other bytes, same size, its mtime put back.
    let f2 = src.join("f2");
    let mtime = fs::metadata(&f2).unwrap().modified().unwrap();
    fs::write(&f2, intact_sample::bytes(100_000, 77)).unwrap();
    fs::File::options()
        .write(true)
        .open(&f2)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    // The cached digest of the old bytes is keyed by ctime too, which the
    // rewrite changed, so the source is read again.
    let third = copy(&src, &dst, &[]);
    assert_eq!(third["bytes_sent"], 100_000, "only f2 again: {third}");
    same_data(&src, &dst.join("data"));

    // --reverify re-checks what is held instead of trusting the journal.
    let re = copy(&src, &dst, &["--reverify"]);
    assert_eq!(re["failed"], 0, "{re}");
    assert_eq!(re["bytes_reverified"], 500_000, "{re}");
}

#[test]
fn a_copy_keeps_its_journal_out_of_dst_and_forgets_a_dst_that_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("data");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), b"some bytes").unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    // Both copies keep their state in one place: a's.
    let state = a.with_extension("state");
    let copy_with_state = |dst: &Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_intact"))
            .args(["copy", "-q"])
            .arg(&src)
            .arg(dst)
            .env("XDG_STATE_HOME", &state)
            .env("XDG_CACHE_HOME", dir.path().join("cache"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    copy_with_state(&a);
    // Nothing of intact's in the destination.
    let names: Vec<_> = walkdir::WalkDir::new(&a)
        .min_depth(1)
        .into_iter()
        .map(|e| e.unwrap().path().strip_prefix(&a).unwrap().to_owned())
        .collect();
    assert_eq!(names, [Path::new("data"), Path::new("data/f")]);
    let copies = state.join("intact/copies");
    let held = |copies: &Path| -> Vec<String> {
        fs::read_dir(copies)
            .unwrap()
            .map(|e| fs::read_to_string(e.unwrap().path().join("destination")).unwrap())
            .collect()
    };
    let a_real = fs::canonicalize(&a).unwrap();
    assert_eq!(held(&copies), [a_real.to_str().unwrap()]);
    let journal = fs::read_dir(&copies)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert!(fs::read(journal.join("journal.sqlite"))
        .unwrap()
        .starts_with(b"SQLite format 3\0"));
    // a removed: the next copy (into b) forgets a's state.
    fs::remove_dir_all(&a).unwrap();
    copy_with_state(&b);
    let b_real = fs::canonicalize(&b).unwrap();
    assert_eq!(held(&copies), [b_real.to_str().unwrap()]);
}
