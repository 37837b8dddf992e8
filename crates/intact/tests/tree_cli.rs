//! `intact copy` names its destinations like cp and rsync, never follows a
//! symlink it was not asked to, and takes what --include/--exclude say,
//! with --dry-run, --delete and --bwlimit; as a real binary.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

fn intact(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_intact"))
        .args(args)
        .output()
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// data/{a.bin, sub/x.dat, sub/y.tmp} under `root`.
fn data(root: &Path) -> PathBuf {
    let d = root.join("data");
    fs::create_dir_all(d.join("sub")).unwrap();
    fs::write(d.join("a.bin"), b"aaa").unwrap();
    fs::write(d.join("sub/x.dat"), b"xx").unwrap();
    fs::write(d.join("sub/y.tmp"), b"yy").unwrap();
    d
}

/// Every path under `root`, relative, sorted.
fn listing(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = walkdir::WalkDir::new(root)
        .min_depth(1)
        .into_iter()
        .map(|e| {
            e.unwrap()
                .path()
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_file_destination_is_refused_with_what_to_do_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let src = data(dir.path());
    let before = listing(dir.path());
    // A directory onto a file.
    let out = intact(&["copy", "--verify", "fiver", s(&src), s(&src.join("a.bin"))]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("is a file, not a directory")
            && err.contains("name a directory")
            && !err.contains("File exists"),
        "{err}"
    );
    // Several sources onto a file.
    let other = dir.path().join("other.bin");
    fs::write(&other, b"o").unwrap();
    let out = intact(&[
        "copy",
        s(&other),
        s(&src.join("sub/x.dat")),
        s(&src.join("a.bin")),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("2 sources"), "{}", stderr(&out));
    // A path through a file.
    let out = intact(&[
        "copy",
        s(&other),
        &format!("{}/deeper", s(&src.join("a.bin"))),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("is a file, not a directory"),
        "{}",
        stderr(&out)
    );
    let mut after = listing(dir.path());
    after.retain(|p| p != "other.bin");
    assert_eq!(after, before, "nothing was written");
    assert_eq!(fs::read(src.join("a.bin")).unwrap(), b"aaa");
}

#[test]
fn one_file_to_a_new_name_is_a_file_and_a_directory_never_goes_into_itself() {
    let dir = tempfile::tempdir().unwrap();
    let src = data(dir.path());
    let out_dir = dir.path().join("out");
    fs::create_dir(&out_dir).unwrap();
    let renamed = out_dir.join("renamed.dat");
    let out = intact(&[
        "copy",
        "--verify",
        "fiver",
        s(&src.join("a.bin")),
        s(&renamed),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(fs::symlink_metadata(&renamed).unwrap().is_file());
    assert_eq!(fs::read(&renamed).unwrap(), b"aaa");
    assert_eq!(listing(&out_dir), ["renamed.dat"]);
    // Onto an existing file: replaced, as cp does.
    let out = intact(&[
        "copy",
        "--verify",
        "fiver",
        s(&src.join("sub/x.dat")),
        s(&renamed),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fs::read(&renamed).unwrap(), b"xx");
    // A trailing slash asks for a directory.
    let out = intact(&[
        "copy",
        "--verify",
        "fiver",
        s(&src.join("a.bin")),
        &format!("{}/", s(&out_dir.join("d"))),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fs::read(out_dir.join("d/a.bin")).unwrap(), b"aaa");
    // A new name in a directory that does not exist.
    let out = intact(&[
        "copy",
        s(&src.join("a.bin")),
        s(&dir.path().join("nodir/new.bin")),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("does not exist; create it first"),
        "{}",
        stderr(&out)
    );
    assert!(!dir.path().join("nodir").exists());

    // Into itself: refused, nothing written.
    let before = listing(&src);
    for dst in [src.join("inside"), src.clone()] {
        let out = intact(&["copy", "--verify", "fiver", s(&src), s(&dst)]);
        assert_eq!(out.status.code(), Some(2), "{dst:?}");
        assert!(
            stderr(&out).contains("the copy would copy itself"),
            "{}",
            stderr(&out)
        );
    }
    let out = intact(&["copy", &format!("{}/", s(&src)), s(&src)]);
    assert_eq!(out.status.code(), Some(2));
    let out = intact(&["copy", s(&src.join("a.bin")), s(&src)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("are the same file"),
        "{}",
        stderr(&out)
    );
    assert_eq!(listing(&src), before, "nothing was written into the source");
    assert_eq!(fs::read(src.join("a.bin")).unwrap(), b"aaa");
    // A sibling whose name starts the same is not inside.
    let out = intact(&[
        "copy",
        "--verify",
        "fiver",
        s(&src),
        s(&dir.path().join("data2")),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn symlinks_on_the_command_line_are_not_followed_unless_asked() {
    let dir = tempfile::tempdir().unwrap();
    let src = data(dir.path());
    let link = dir.path().join("dlink");
    std::os::unix::fs::symlink(&src, &link).unwrap();
    let dst = dir.path().join("dst");
    fs::create_dir(&dst).unwrap();

    let out = intact(&["copy", "--verify", "fiver", s(&link), s(&dst)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("is a symlink and is copied as a link; -L copies what it points to"),
        "{}",
        stderr(&out)
    );
    assert_eq!(fs::read_link(dst.join("dlink")).unwrap(), src);
    assert_eq!(listing(&dst), ["dlink"]);

    let dst_l = dir.path().join("dst_l");
    let out = intact(&["copy", "-L", "--verify", "fiver", s(&link), s(&dst_l)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(fs::symlink_metadata(dst_l.join("dlink")).unwrap().is_dir());
    assert_eq!(fs::read(dst_l.join("dlink/sub/x.dat")).unwrap(), b"xx");

    // A trailing slash: the contents of what it points to.
    let dst_c = dir.path().join("dst_c");
    let out = intact(&[
        "copy",
        "--verify",
        "fiver",
        &format!("{}/", s(&link)),
        s(&dst_c),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(listing(&dst_c), ["a.bin", "sub", "sub/x.dat", "sub/y.tmp"]);
}

#[test]
fn include_exclude_dry_run_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    let src = data(dir.path());
    let dst = dir.path().join("dst");
    fs::create_dir_all(dst.join("data/gone/deeper")).unwrap();
    fs::write(dst.join("data/gone/deeper/z"), b"z").unwrap();
    fs::write(dst.join("data/old.dat"), b"old").unwrap();
    fs::write(dst.join("data/keep.tmp"), b"excluded, so protected").unwrap();
    fs::write(dst.join("beside.dat"), b"outside what data covers").unwrap();
    let outside = dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("precious"), b"p").unwrap();
    std::os::unix::fs::symlink(&outside, dst.join("data/link")).unwrap();
    let before = listing(&dst);

    // --dry-run: the plan with sizes, nothing changed.
    let out = intact(&[
        "copy",
        "-n",
        "--delete",
        "--exclude",
        "*.tmp",
        s(&src),
        s(&dst),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("file               3  data/a.bin"), "{text}");
    assert!(!text.contains("y.tmp"), "{text}");
    assert!(
        text.contains("delete                data/old.dat"),
        "{text}"
    );
    assert!(text.contains("delete                data/gone/"), "{text}");
    assert!(text.contains("dry run: 4 entries"), "{text}");
    assert!(text.contains("nothing was changed"), "{text}");
    assert_eq!(listing(&dst), before, "a dry run changes nothing");

    // The same for real.
    let out = intact(&[
        "copy",
        "--verify",
        "fiver",
        "--delete",
        "--exclude",
        "*.tmp",
        s(&src),
        s(&dst),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("deleted data/old.dat"),
        "{}",
        stdout(&out)
    );
    assert_eq!(
        listing(&dst),
        [
            "beside.dat",
            "data",
            "data/a.bin",
            "data/keep.tmp",
            "data/sub",
            "data/sub/x.dat"
        ]
    );
    assert_eq!(
        fs::read(outside.join("precious")).unwrap(),
        b"p",
        "never through a link"
    );

    // Include before exclude: the first rule that matches decides.
    let only = dir.path().join("only");
    let out = intact(&[
        "copy",
        "--verify",
        "fiver",
        "--include",
        "*/",
        "--include",
        "*.dat",
        "--exclude",
        "*",
        s(&src),
        s(&only),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(listing(&only), ["data", "data/sub", "data/sub/x.dat"]);
}

#[test]
fn delete_waits_for_a_copy_that_succeeded() {
    let dir = tempfile::tempdir().unwrap();
    let src = data(dir.path());
    let dst = dir.path().join("dst");
    fs::create_dir_all(dst.join("data")).unwrap();
    fs::write(dst.join("data/old.dat"), b"old").unwrap();
    // data/sub is a file at the destination: that entry fails.
    fs::write(dst.join("data/sub"), b"in the way").unwrap();
    let out = intact(&["copy", "--verify", "fiver", "--delete", s(&src), s(&dst)]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("--delete: nothing was deleted, because"),
        "{err}"
    );
    assert!(
        err.contains("incomplete:") && err.contains("run the same command again"),
        "{err}"
    );
    assert_eq!(fs::read(dst.join("data/old.dat")).unwrap(), b"old");
}

#[test]
fn bwlimit_holds_the_rate() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("f.dat");
    fs::write(&f, intact_sample::bytes(1 << 20, 7)).unwrap();
    let dst = dir.path().join("dst");
    let t = Instant::now();
    // 512 KiB/s for 1 MiB: about 2 s, never less than the last block's due time.
    let out = intact(&[
        "copy",
        "--verify",
        "fiver",
        "--block-size",
        "64KiB",
        "--bwlimit",
        "512",
        s(&f),
        &format!("{}/", s(&dst)),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(t.elapsed().as_secs_f64() > 1.8, "{:?}", t.elapsed());
    assert_eq!(
        fs::read(dst.join("f.dat")).unwrap(),
        intact_sample::bytes(1 << 20, 7)
    );
    let out = intact(&["copy", "--bwlimit", "fast", s(&f), s(&dst)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("is not a rate"), "{}", stderr(&out));
}
