//! `intact scrub` and `intact status` as a user runs them: exit statuses,
//! the lines printed, and the JSON for scripts. (Rot on a device is made
//! and found in intact-transfer's tests/scrub.rs, which needs root.)

use std::fs;

mod common;
use common::{intact_in, s, stderr, stdout};

#[test]
fn scrub_exits_0_when_clean_1_when_a_file_is_missing_and_status_counts_it() {
    let t = tempfile::tempdir().unwrap();
    let [src, dst, state] = common::dirs(t.path(), ["src", "dst", "state"]);
    fs::create_dir_all(src.join("d")).unwrap();
    fs::write(src.join("a"), vec![7u8; 70_000]).unwrap();
    fs::write(src.join("d/b"), vec![9u8; 5_000]).unwrap();
    let o = intact_in(&state, &["copy", &format!("{}/", s(&src)), s(&dst)]);
    assert!(o.status.success(), "{}", stderr(&o));

    let o = intact_in(&state, &["scrub", s(&dst)]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("scrubbed 2 files"), "{}", stdout(&o));
    assert!(stdout(&o).contains("2 clean"), "{}", stdout(&o));

    fs::remove_file(dst.join("d/b")).unwrap();
    let o = intact_in(&state, &["scrub", s(&dst)]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("MISSING d/b"), "{}", stdout(&o));

    let o = intact_in(&state, &["status", "--json", s(&dst)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["files"], 2);
    assert_eq!(v["bytes"], 75_000);
    assert_eq!(v["last_scrub"]["missing"], 1, "{v}");
    assert_eq!(v["last_scrub"]["clean"], 1, "{v}");
    assert_eq!(v["never_scrubbed"], 0);

    let o = intact_in(&state, &["scrub", "--json", s(&dst)]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["missing"], 1, "{v}");
    assert_eq!(
        v["reports"].as_array().unwrap().len(),
        2,
        "--json lists every file"
    );
}

#[test]
fn a_root_without_a_catalog_is_a_usage_error_that_says_so() {
    let t = tempfile::tempdir().unwrap();
    for cmd in ["scrub", "status"] {
        let o = intact_in(&t.path().join("state"), &[cmd, t.path().to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2), "{cmd}");
        assert!(stderr(&o).contains("no catalog there"), "{}", stderr(&o));
    }
}
