//! `intact reliability` as a real binary: its JSON carries the model's
//! numbers, and bad input is refused with exit status 2.

use std::process::{Command, Output};

fn intact(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_intact"))
        .arg("reliability")
        .args(args)
        .output()
        .unwrap()
}

fn json(args: &[&str]) -> serde_json::Value {
    let out = intact(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn systems_report_the_papers_config_2_numbers() {
    let v = json(&["--config", "2", "--json"]);
    assert!((v["goal_score"].as_f64().unwrap() - 17.46).abs() < 0.01);
    assert_eq!(v["t_switch"]["kind"], "after");
    assert!((v["t_switch"]["seconds"].as_f64().unwrap() - 92.0).abs() < 1.0);
    let score = |name: &str| {
        v["systems"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["system"] == name)
            .unwrap()["score"]
            .as_f64()
            .unwrap()
    };
    assert!((score("ncfs") - 7.4).abs() < 0.1);
    assert!((score("e2zfs-xor") - 17.1).abs() < 0.1);
}

#[test]
fn memory_and_disk_flags_override_the_configuration() {
    // FIT/Mbit 25,000 is the paper's λmid; UBER 1e-12 its regular disk.
    let a = json(&[
        "--fit-per-mbit",
        "25000",
        "--uber",
        "1e-12",
        "--system",
        "ncfs",
        "--json",
    ]);
    let b = json(&["--config", "2", "--system", "ncfs", "--json"]);
    let sa = a["systems"][0]["score"].as_f64().unwrap();
    let sb = b["systems"][0]["score"].as_f64().unwrap();
    assert!((sa - sb).abs() < 0.01, "{sa} vs {sb}");
    assert_eq!(a["systems"].as_array().unwrap().len(), 1);
}

#[test]
fn transfer_mode_shows_riva_orders_of_magnitude_better() {
    let v = json(&[
        "--transfer",
        "--block-size",
        "256MiB",
        "--uber",
        "1e-10",
        "--json",
    ]);
    let modes = v["modes"].as_array().unwrap();
    let exact = |mode: &str| {
        modes.iter().find(|m| m["verify"] == mode).unwrap()["exact"]
            .as_f64()
            .unwrap()
    };
    assert!((exact("fiver") - 0.193).abs() < 0.001);
    assert!(exact("riva") < 1e-10 && exact("riva") > 1e-12);
    // flash re-reads the device like riva: the same odds of a disk error.
    assert_eq!(exact("flash"), exact("riva"));
    assert!(exact("none") > exact("sequential"));
    let one = json(&["--transfer", "--verify", "riva", "--json"]);
    assert_eq!(one["modes"].as_array().unwrap().len(), 1);
    assert_eq!(one["block_bytes"], 4 << 20);
}

#[test]
fn defaults_meet_the_zettabyte_goal_in_every_paper_configuration() {
    let v = json(&["--defaults", "--json"]);
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 12, "3 checksums × 4 configurations");
    for r in rows {
        assert_eq!(r["meets_goal"], true, "{r}");
        assert!(r["score"].as_f64().unwrap() > r["goal_score"].as_f64().unwrap());
    }
    let units: Vec<_> = rows[..3]
        .iter()
        .map(|r| r["algorithm"].as_str().unwrap())
        .collect();
    assert_eq!(units, ["crc32c", "xxh128", "blake3"]);
}

#[test]
fn bad_input_is_refused() {
    for args in [
        &["--config", "5"][..],
        &["--mem-index", "14", "--lambda", "1e-15"],
        &["--system", "btrfs"],
        &["--verify", "riva"],
        &["--transfer", "--verify", "magic"],
        &["--uber", "abc"],
    ] {
        let out = intact(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!out.stderr.is_empty());
    }
    let out = intact(&["--uber", "2"]);
    assert_eq!(out.status.code(), Some(2), "out of range: a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("UBER must be in (0, 1)"));
}
