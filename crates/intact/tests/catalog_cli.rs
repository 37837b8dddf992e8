//! `intact catalog add` as a user runs it: files another program put
//! under a cataloged root are adopted and then scrubbed like the rest
//! (rot in them is found by page); a file already cataloged is left
//! alone, one changed outside intact is refused unless --replace, a
//! symlink is never followed.

use std::fs;
use std::os::unix::fs::FileExt;
use std::process::Output;

mod common;
use common::{intact_in, s, stderr, stdout};

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

#[test]
fn adopted_files_are_scrubbed_like_received_ones() {
    let t = tempfile::tempdir().unwrap();
    let [src, root, state] = common::dirs(t.path(), ["src", "root", "st"]);
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("a"), intact_sample::bytes(30_000, 1)).unwrap();
    let o = intact_in(&state, &["copy", &format!("{}/", s(&src)), s(&root)]);
    assert!(o.status.success(), "{}", stderr(&o));

    // Another program writes files under the root.
    fs::create_dir_all(root.join("made/deep")).unwrap();
    let made = intact_sample::bytes(5 << 20, 2);
    fs::write(root.join("made/deep/x.dat"), &made).unwrap();
    fs::write(root.join("made/y.dat"), b"small").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", root.join("made/link")).unwrap();

    let o = intact_in(&state, &["catalog", "add", "--json", s(&root.join("made"))]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r = json(&o);
    assert_eq!(r["adopted"], 2, "{r}");
    // The symlink is not a file to walk into, nor followed.
    assert_eq!(r["refused"], 0, "{r}");

    let o = intact_in(&state, &["status", "--json", s(&root)]);
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
    let o = intact_in(&state, &["catalog", "add", s(&root.join("made/y.dat"))]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("ALREADY made/y.dat"), "{}", stdout(&o));
    let o = intact_in(&state, &["catalog", "add", s(&root.join("made/link"))]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("REFUSED"), "{}", stdout(&o));

    // Scrubbed like the rest: clean, then rot in place is found by page.
    let o = intact_in(&state, &["scrub", "--json", s(&root)]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert_eq!(json(&o)["clean"], 3);
    let p = root.join("made/deep/x.dat");
    let mtime = fs::metadata(&p).unwrap().modified().unwrap();
    let f = fs::File::options().write(true).open(&p).unwrap();
    let at = (4 << 20) + 4096 * 3 + 17;
    f.write_all_at(&[made[at] ^ 1], at as u64).unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    let o = intact_in(&state, &["scrub", s(&root)]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let page = at / 4096 * 4096;
    assert!(
        stdout(&o).contains(&format!(
            "ROT made/deep/x.dat: bytes {page}..{}",
            page + 4096
        )),
        "{}",
        stdout(&o)
    );

    // Changed outside intact (a new size): refused, adopted anew with --replace.
    fs::write(root.join("made/y.dat"), b"bigger now").unwrap();
    let o = intact_in(&state, &["catalog", "add", s(&root.join("made/y.dat"))]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("--replace"), "{}", stdout(&o));
    let o = intact_in(
        &state,
        &["catalog", "add", "--replace", s(&root.join("made/y.dat"))],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
}

#[test]
fn a_path_outside_the_root_or_without_a_catalog_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let [root, other, state] = common::dirs(t.path(), ["root", "other", "st"]);
    fs::create_dir_all(&root).unwrap();
    fs::create_dir_all(&other).unwrap();
    fs::write(other.join("f"), b"x").unwrap();
    // No catalog above it, no --root: a usage error that says what to do.
    let o = intact_in(&state, &["catalog", "add", s(&other.join("f"))]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--root"), "{}", stderr(&o));
    // --root creates the catalog; a file outside it is refused.
    let o = intact_in(
        &state,
        &["catalog", "add", "--root", s(&root), s(&other.join("f"))],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stdout(&o).contains("not under the root"), "{}", stdout(&o));
    fs::write(root.join("g"), b"y").unwrap();
    let o = intact_in(
        &state,
        &["catalog", "add", "--root", s(&root), s(&root.join("g"))],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(root.join(".intact/journal.sqlite").is_file());
}

#[test]
fn catalog_init_chooses_the_page_size_before_the_first_file_and_copy_uses_that_catalog() {
    let t = tempfile::tempdir().unwrap();
    let [src, root, state] = common::dirs(t.path(), ["src", "root", "st"]);
    fs::create_dir_all(&src).unwrap();
    let data = intact_sample::bytes(200_000, 5);
    fs::write(src.join("a"), &data).unwrap();
    for bad in ["3000", "256", "2MiB", "lots"] {
        let o = intact_in(&state, &["catalog", "init", s(&root), "--page-size", bad]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", stderr(&o));
    }
    let o = intact_in(
        &state,
        &[
            "catalog",
            "init",
            s(&root),
            "--page-size",
            "64KiB",
            "--json",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(json(&o)["page_size"], 65536);
    let o = intact_in(&state, &["copy", &format!("{}/", s(&src)), s(&root)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = intact_in(&state, &["status", s(&root), "--json"]);
    assert_eq!(json(&o)["page_size"], 65536, "{}", stdout(&o));
    assert_eq!(json(&o)["files"], 1, "{}", stdout(&o));
    // Fixed once a file is cataloged; asking again for the same is fine.
    let o = intact_in(
        &state,
        &["catalog", "init", s(&root), "--page-size", "4KiB"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("before the first file"),
        "{}",
        stderr(&o)
    );
    let o = intact_in(
        &state,
        &["catalog", "init", s(&root), "--page-size", "64KiB"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // Rot is named by 64 KiB page.
    let f = fs::OpenOptions::new()
        .write(true)
        .open(root.join("a"))
        .unwrap();
    let mtime = f.metadata().unwrap().modified().unwrap();
    f.write_all_at(&[data[70_000] ^ 1], 70_000).unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    let o = intact_in(&state, &["scrub", s(&root), "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let v = json(&o);
    let rot = &v["reports"][0]["rot"][0];
    assert_eq!(
        (rot["offset"].as_u64(), rot["len"].as_u64()),
        (Some(65536), Some(65536)),
        "{v}"
    );
}
