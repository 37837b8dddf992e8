//! `intact copy` names its destinations like cp and rsync, never follows a
//! symlink it was not asked to, and takes what --include/--exclude say,
//! with --dry-run, --delete and --bwlimit; as a real binary.

use std::fs;
use std::process::Output;
use std::time::Instant;

mod common;
use common::{blocked, data, intact, listing, s, stale, stderr, stdout};

/// `intact copy --verify fiver <args>`, which must succeed.
fn copy_fiver(args: &[&str]) -> Output {
    let out = intact(&[&["copy", "--verify", "fiver"], args].concat());
    assert!(out.status.success(), "{}", stderr(&out));
    out
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
    copy_fiver(&[s(&src.join("a.bin")), s(&renamed)]);
    assert!(fs::symlink_metadata(&renamed).unwrap().is_file());
    assert_eq!(fs::read(&renamed).unwrap(), b"aaa");
    assert_eq!(listing(&out_dir), ["renamed.dat"]);
    // Onto an existing file: replaced, as cp does.
    copy_fiver(&[s(&src.join("sub/x.dat")), s(&renamed)]);
    assert_eq!(fs::read(&renamed).unwrap(), b"xx");
    // A trailing slash asks for a directory.
    copy_fiver(&[
        s(&src.join("a.bin")),
        &format!("{}/", s(&out_dir.join("d"))),
    ]);
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
    copy_fiver(&[s(&src), s(&dir.path().join("data2"))]);
}

#[test]
fn symlinks_on_the_command_line_are_not_followed_unless_asked() {
    let dir = tempfile::tempdir().unwrap();
    let src = data(dir.path());
    let link = dir.path().join("dlink");
    std::os::unix::fs::symlink(&src, &link).unwrap();
    let dst = dir.path().join("dst");
    fs::create_dir(&dst).unwrap();

    let out = copy_fiver(&[s(&link), s(&dst)]);
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
    copy_fiver(&[&format!("{}/", s(&link)), s(&dst_c)]);
    assert_eq!(listing(&dst_c), ["a.bin", "sub", "sub/x.dat", "sub/y.tmp"]);
}

#[test]
fn include_exclude_dry_run_and_delete() {
    let dir = tempfile::tempdir().unwrap();
    let src = data(dir.path());
    let dst = dir.path().join("dst");
    let outside = stale(dir.path(), &dst);
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
    let out = copy_fiver(&["--delete", "--exclude", "*.tmp", s(&src), s(&dst)]);
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
    copy_fiver(&[
        "--include",
        "*/",
        "--include",
        "*.dat",
        "--exclude",
        "*",
        s(&src),
        s(&only),
    ]);
    assert_eq!(listing(&only), ["data", "data/sub", "data/sub/x.dat"]);
}

#[test]
fn delete_waits_for_a_copy_that_succeeded() {
    let dir = tempfile::tempdir().unwrap();
    let src = data(dir.path());
    let dst = dir.path().join("dst");
    blocked(&dst);
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
    copy_fiver(&[
        "--block-size",
        "64KiB",
        "--bwlimit",
        "512",
        s(&f),
        &format!("{}/", s(&dst)),
    ]);
    assert!(t.elapsed().as_secs_f64() > 1.8, "{:?}", t.elapsed());
    assert_eq!(
        fs::read(dst.join("f.dat")).unwrap(),
        intact_sample::bytes(1 << 20, 7)
    );
    let out = intact(&["copy", "--bwlimit", "fast", s(&f), s(&dst)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("is not a rate"), "{}", stderr(&out));
}
