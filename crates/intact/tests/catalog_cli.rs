//! `intact catalog add` as a user runs it: files another program put
//! under a cataloged root are adopted and then scrubbed like the rest
//! (rot in them is found by page); a file already cataloged is left
//! alone, one changed outside intact is refused unless --replace, a
//! symlink is never followed.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Output};

fn run(state: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_intact"))
        .args(args)
        .env("XDG_STATE_HOME", state)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o.stdout)))
}

#[test]
fn adopted_files_are_scrubbed_like_received_ones() {
    let t = tempfile::tempdir().unwrap();
    let (src, root, state) = (
        t.path().join("src"),
        t.path().join("root"),
        t.path().join("st"),
    );
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("a"), intact_sample::bytes(30_000, 1)).unwrap();
    let o = run(&state, &["copy", &format!("{}/", s(&src)), &s(&root)]);
    assert!(o.status.success(), "{}", text(&o.stderr));

    // Another program writes files under the root.
    fs::create_dir_all(root.join("made/deep")).unwrap();
    let made = intact_sample::bytes(5 << 20, 2);
    fs::write(root.join("made/deep/x.dat"), &made).unwrap();
    fs::write(root.join("made/y.dat"), b"small").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", root.join("made/link")).unwrap();

    let o = run(
        &state,
        &["catalog", "add", "--json", &s(&root.join("made"))],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let r = json(&o);
    assert_eq!(r["adopted"], 2, "{r}");
    // The symlink is not a file to walk into, nor followed.
    assert_eq!(r["refused"], 0, "{r}");

    let o = run(&state, &["status", "--json", &s(&root)]);
    let st = json(&o);
    assert_eq!(st["files"], 3, "{st}");
    let adopted: u64 = st["adopted_levels"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(adopted, 2, "{st}");

    // Named again: left alone. A symlink named: refused, not followed.
    let o = run(&state, &["catalog", "add", &s(&root.join("made/y.dat"))]);
    assert_eq!(o.status.code(), Some(0));
    assert!(
        text(&o.stdout).contains("ALREADY made/y.dat"),
        "{}",
        text(&o.stdout)
    );
    let o = run(&state, &["catalog", "add", &s(&root.join("made/link"))]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    assert!(text(&o.stdout).contains("REFUSED"), "{}", text(&o.stdout));

    // Scrubbed like the rest: clean, then rot in place is found by page.
    let o = run(&state, &["scrub", "--json", &s(&root)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stdout));
    assert_eq!(json(&o)["clean"], 3);
    let p = root.join("made/deep/x.dat");
    let mtime = fs::metadata(&p).unwrap().modified().unwrap();
    let f = fs::File::options().write(true).open(&p).unwrap();
    let at = (4 << 20) + 4096 * 3 + 17;
    f.write_all_at(&[made[at] ^ 1], at as u64).unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    let o = run(&state, &["scrub", &s(&root)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    let page = at / 4096 * 4096;
    assert!(
        text(&o.stdout).contains(&format!(
            "ROT made/deep/x.dat: bytes {page}..{}",
            page + 4096
        )),
        "{}",
        text(&o.stdout)
    );

    // Changed outside intact (a new size): refused, adopted anew with --replace.
    fs::write(root.join("made/y.dat"), b"bigger now").unwrap();
    let o = run(&state, &["catalog", "add", &s(&root.join("made/y.dat"))]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stdout).contains("--replace"), "{}", text(&o.stdout));
    let o = run(
        &state,
        &["catalog", "add", "--replace", &s(&root.join("made/y.dat"))],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stdout));
}

#[test]
fn a_path_outside_the_root_or_without_a_catalog_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let (root, other, state) = (
        t.path().join("root"),
        t.path().join("other"),
        t.path().join("st"),
    );
    fs::create_dir_all(&root).unwrap();
    fs::create_dir_all(&other).unwrap();
    fs::write(other.join("f"), b"x").unwrap();
    // No catalog above it, no --root: a usage error that says what to do.
    let o = run(&state, &["catalog", "add", &s(&other.join("f"))]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("--root"), "{}", text(&o.stderr));
    // --root creates the catalog; a file outside it is refused.
    let o = run(
        &state,
        &["catalog", "add", "--root", &s(&root), &s(&other.join("f"))],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("not under the root"),
        "{}",
        text(&o.stdout)
    );
    fs::write(root.join("g"), b"y").unwrap();
    let o = run(
        &state,
        &["catalog", "add", "--root", &s(&root), &s(&root.join("g"))],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stdout));
    assert!(root.join(".intact/journal.sqlite").is_file());
}
