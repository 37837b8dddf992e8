//! Split files end to end (issue 18): `intact plan` cuts a file larger
//! than a fair share into block ranges for the shards of one server, the
//! shards run at once, and the server commits the file only when every
//! range verified. The source and the servers' roots are on an ext4 the
//! test made on a loop device, so `riva` reaches `device`; what is
//! checked is what the test can see: the bytes under the final name, no
//! final name while a range is missing, the merged report.

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::{intact, merged, partials, s, stderr, Server};
use serde_json::Value;

const MIB: usize = 1 << 20;

fn send_shard(plan: &Path, i: u32, reports: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_intact"));
    c.args(["send", "--plan", s(plan), "--shard", &i.to_string(), "-q"])
        .arg("--report")
        .arg(reports.join("shard-{shard}.json"));
    c
}

#[test]
fn a_large_file_is_sent_by_two_shards_and_committed_only_when_both_ranges_verified() {
    let test = "a_large_file_is_sent_by_two_shards_and_committed_only_when_both_ranges_verified";
    let Some(fs_) = common::loop_ext4(test, 256) else {
        return;
    };
    let dir = fs_.mnt().to_path_buf();
    let src = dir.join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    let big = intact_sample::bytes(40 * MIB + 12345, 11);
    fs::write(src.join("big.dat"), &big).unwrap();
    for i in 0..6 {
        fs::write(
            src.join(format!("d/f{i}.dat")),
            intact_sample::bytes(i * MIB / 2 + 7, i as u64),
        )
        .unwrap();
    }
    let roots = [dir.join("dst1"), dir.join("dst2")];
    let servers = [Server::start(&roots[0]), Server::start(&roots[1])];
    let plan = dir.join("plan.json");
    let reports = dir.join("reports");
    fs::create_dir_all(&reports).unwrap();
    let to = format!("{},{}", servers[0].addr(), servers[1].addr());
    let src_arg = format!("{}/", src.display());
    let out = intact(&[
        "plan",
        &src_arg,
        "--shards",
        "4",
        "--to",
        &to,
        "--block-size",
        "1MiB",
        "-o",
        s(&plan),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["split"].as_array().unwrap().len(), 1, "{summary:#}");
    assert!(summary["oversized"].as_array().unwrap().is_empty());
    // Without splitting, the big file would fill a shard alone.
    let whole = dir.join("whole.json");
    let out = intact(&[
        "plan",
        &src_arg,
        "--shards",
        "4",
        "--to",
        &to,
        "--no-split",
        "-o",
        s(&whole),
        "--json",
    ]);
    let unsplit: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        summary["imbalance"].as_f64().unwrap() < unsplit["imbalance"].as_f64().unwrap() - 0.5,
        "{} vs {}",
        summary["imbalance"],
        unsplit["imbalance"]
    );
    // The ranges: shards 0 and 2 (the first server's), disjoint, covering.
    let p: Value = serde_json::from_slice(&fs::read(&plan).unwrap()).unwrap();
    let mut ranges = Vec::new();
    for sh in p["shards"].as_array().unwrap() {
        for e in sh["entries"].as_array().unwrap() {
            if let Some(r) = e.get("range") {
                ranges.push((
                    sh["index"].as_u64().unwrap(),
                    r["first"].as_u64().unwrap(),
                    r["end"].as_u64().unwrap(),
                ));
            }
        }
    }
    ranges.sort_by_key(|r| r.1);
    assert_eq!(ranges.len(), 2, "{ranges:?}");
    assert_eq!(
        (ranges[0].1, ranges[0].2, ranges[1].1, ranges[1].2),
        (0, 20, 20, 41)
    );
    let mut owners = vec![ranges[0].0, ranges[1].0];
    owners.sort();
    assert_eq!(owners, [0, 2]);
    // Refused before anything is sent: another block size, a mode that
    // cannot verify a range.
    for extra in [["--block-size", "4MiB"], ["--verify", "file"]] {
        let out = send_shard(&plan, 0, &reports).args(extra).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", stderr(&out));
    }
    for e in fs::read_dir(&reports).unwrap() {
        fs::remove_file(e.unwrap().path()).unwrap();
    }
    // Every shard but the second range's: the file is not there.
    let last = ranges[1].0 as u32;
    let running: Vec<_> = (0..4)
        .filter(|&i| i != last)
        .map(|i| (i, send_shard(&plan, i, &reports).spawn().unwrap()))
        .collect();
    for (i, c) in running {
        let out = c.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "shard {i}: {}", stderr(&out));
    }
    let target = roots[0].join("big.dat");
    assert!(!target.exists(), "committed with one of its two ranges");
    let (code, m) = merged(&plan, &reports);
    assert_eq!(code, Some(1), "{m:#}");
    assert_eq!(m["missing"], serde_json::json!([last]));
    let says_split = m["failures"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["path"] == "big.dat" && f["error"].as_str().unwrap().contains("split file"));
    assert!(says_split, "{m:#}");
    // The last range: committed, whole, at device.
    let out = send_shard(&plan, last, &reports).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        fs::read(&target).unwrap() == big,
        "the committed bytes differ"
    );
    assert!(partials(&roots[0]).is_empty(), "{:?}", partials(&roots[0]));
    let (code, m) = merged(&plan, &reports);
    assert_eq!(code, Some(0), "{m:#}");
    assert_eq!(m["levels"], serde_json::json!({"device": 7}), "{m:#}");
    assert_eq!(m["bytes"].as_u64(), Some(p["bytes"].as_u64().unwrap()));
    // All four at once again: nothing crosses the wire, the ranges are
    // found unchanged, and the merge is still complete.
    let running: Vec<_> = (0..4)
        .map(|i| send_shard(&plan, i, &reports).spawn().unwrap())
        .collect();
    for c in running {
        let out = c.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let (code, m) = merged(&plan, &reports);
    assert_eq!(code, Some(0), "{m:#}");
    let held: Vec<&Value> = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f.get("range").is_some())
        .collect();
    assert_eq!(held.len(), 2);
    for f in held {
        assert_eq!(f["range"]["state"], "held", "{f:#}");
        assert_eq!(f["bytes_sent"], 0, "{f:#}");
    }
    assert_eq!(m["bytes_sent"], 0, "{m:#}");
    // The file removed: received anew. One range at level none, the other
    // with --require-level device: the file is not committed at a level
    // below what a shard asked for.
    fs::remove_file(&target).unwrap();
    let first = ranges[0].0 as u32;
    let out = send_shard(&plan, first, &reports)
        .args(["--verify", "none"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = send_shard(&plan, last, &reports)
        .args(["--require-level", "device"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("would be committed at level none"),
        "{}",
        stderr(&out)
    );
    assert!(!target.exists(), "committed below the level asked for");
    // The first range again in riva: committed, at device.
    for i in [first, last] {
        let out = send_shard(&plan, i, &reports).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    assert!(
        fs::read(&target).unwrap() == big,
        "the committed bytes differ"
    );
    let (code, m) = merged(&plan, &reports);
    assert_eq!(code, Some(0), "{m:#}");
    assert_eq!(m["levels"], serde_json::json!({"device": 7}), "{m:#}");
    drop(servers);
    drop(fs_);
}
