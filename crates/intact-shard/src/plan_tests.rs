//! Tests of plans.

use super::*;

fn tree() -> (tempfile::TempDir, Scan) {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    for (name, size) in [
        ("big", 900_000),
        ("d/a", 300_000),
        ("d/e/b", 200_000),
        ("d/c", 1),
        ("z", 0),
    ] {
        let p = src.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, vec![7u8; size]).unwrap();
    }
    std::fs::create_dir_all(src.join("empty")).unwrap();
    std::os::unix::fs::symlink("big", src.join("link")).unwrap();
    let scan = intact_transfer::scan(&[src]);
    (t, scan)
}

#[test]
fn every_entry_goes_to_one_shard_with_the_directories_above_it() {
    let (t, scan) = tree();
    let targets = vec!["h:1".to_string(), "h:2".to_string()];
    let plan = Plan::make(&PlanInput {
        sources: &[t.path().join("src")],
        scan: &scan,
        shards: 3,
        targets: &targets,
        copy_links: false,
        now: 0,
        block_size: DEFAULT_BLOCK,
        split: true,
        secret: [1; 32],
    })
    .unwrap();
    assert_eq!(plan.files, 5);
    assert_eq!(plan.bytes, 1_400_001);
    assert_eq!(
        plan.shards
            .iter()
            .map(|s| s.to.as_str())
            .collect::<Vec<_>>(),
        ["h:1", "h:2", "h:1"]
    );
    // Each non-directory, and the empty directory, in exactly one shard.
    let mut owners: HashMap<String, u32> = HashMap::new();
    for s in &plan.shards {
        let names: Vec<String> = s.entries.iter().map(|e| e.path.lossy()).collect();
        for e in &s.entries {
            let name = e.path.lossy();
            if e.kind != "dir" || name.ends_with("empty") {
                assert!(
                    owners.insert(name.clone(), s.index).is_none(),
                    "{name} twice"
                );
            }
            // Its directories come before it in the same shard.
            let mut up = name.as_str();
            while let Some((p, _)) = up.rsplit_once('/') {
                let at = names.iter().position(|n| n == p).expect("parent in shard");
                assert!(at < names.iter().position(|n| *n == name).unwrap());
                up = p;
            }
        }
    }
    assert_eq!(owners.len(), 7, "{owners:?}");
    // The big file is alone in its shard (it is over a fair share).
    assert_eq!(plan.oversized.len(), 1);
    let big = owners["src/big"];
    assert_eq!(plan.shards[big as usize].files, 1);
    // Round trip, and an edit is caught.
    let file = t.path().join("plan.json");
    plan.save(&file).unwrap();
    let back = Plan::load(&file).unwrap();
    assert_eq!(back.id, plan.id);
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("\"h:2\"", "\"h:3\"");
    std::fs::write(&file, text).unwrap();
    let e = Plan::load(&file).unwrap_err().to_string();
    assert!(e.contains("no longer match"), "{e}");
}

#[test]
fn a_shard_sends_what_is_there_now_and_fails_what_changed_kind() {
    let (t, scan) = tree();
    let targets = vec!["h:1".to_string()];
    let plan = Plan::make(&PlanInput {
        sources: &[t.path().join("src")],
        scan: &scan,
        shards: 1,
        targets: &targets,
        copy_links: false,
        now: 0,
        block_size: DEFAULT_BLOCK,
        split: true,
        secret: [1; 32],
    })
    .unwrap();
    let src = t.path().join("src");
    std::fs::write(src.join("d/a"), b"now shorter").unwrap();
    std::fs::remove_file(src.join("z")).unwrap();
    std::fs::create_dir(src.join("z")).unwrap();
    let s = plan.scan(0).unwrap();
    let a = s
        .entries
        .iter()
        .find(|e| e.rel.to_string() == "src/d/a")
        .unwrap();
    assert_eq!(a.size, 11);
    assert_eq!(s.errors.len(), 1, "{:?}", s.errors);
    assert!(
        s.errors[0].to_string().contains("was a file"),
        "{}",
        s.errors[0]
    );
    assert!(plan
        .scan(1)
        .unwrap_err()
        .to_string()
        .contains("shards 0 to 0"));
    // A directory swapped for a symlink (to outside the tree) since the
    // plan: what is under it is not read through it.
    let outside = t.path().join("outside");
    std::fs::create_dir_all(outside.join("e")).unwrap();
    std::fs::write(outside.join("e/b"), b"secret").unwrap();
    std::fs::rename(src.join("d"), t.path().join("d-moved")).unwrap();
    std::os::unix::fs::symlink(&outside, src.join("d")).unwrap();
    let s = plan.scan(0).unwrap();
    assert!(!s.entries.iter().any(|e| e.rel.to_string() == "src/d/e/b"));
    assert!(
        s.errors
            .iter()
            .any(|e| e.to_string().contains("no longer a directory")),
        "{:?}",
        s.errors
    );
}

#[test]
fn sources_that_overlap_are_refused() {
    let (t, _) = tree();
    let src = t.path().join("src");
    let other = t.path().join("other/src");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("big"), b"x").unwrap();
    let scan = intact_transfer::scan(&[src.clone(), other.clone()]);
    let e = Plan::make(&PlanInput {
        sources: &[src, other],
        scan: &scan,
        shards: 2,
        targets: &["h:1".to_string()],
        copy_links: false,
        now: 0,
        block_size: DEFAULT_BLOCK,
        split: true,
        secret: [1; 32],
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("would both arrive as src/big"), "{e}");
}

#[test]
fn a_file_over_a_fair_share_is_split_among_one_servers_shards() {
    let (t, scan) = tree();
    let targets = vec!["h:1".to_string(), "h:2".to_string()];
    let sources = [t.path().join("src")];
    let input = |split: bool| PlanInput {
        sources: &sources,
        scan: &scan,
        shards: 4,
        targets: &targets,
        copy_links: false,
        now: 0,
        block_size: 4096,
        split,
        secret: [2; 32],
    };
    let whole = Plan::make(&input(false)).unwrap();
    let plan = Plan::make(&input(true)).unwrap();
    assert!(plan.has_ranges() && !whole.has_ranges());
    assert_eq!(plan.split.len(), 1, "{:?}", plan.split);
    assert!(plan.oversized.is_empty(), "{:?}", plan.oversized_why);
    assert_eq!(whole.oversized_why, ["not split (--no-split)"]);
    assert!(
        plan.imbalance < whole.imbalance,
        "{} {}",
        plan.imbalance,
        whole.imbalance
    );
    assert_eq!(plan.bytes, whole.bytes, "ranges add up to the file");
    // The ranges: shards 0 and 2 (server h:1), at blocks, disjoint, covering.
    let mut got: Vec<(u32, u64, u64, String)> = Vec::new();
    for s in &plan.shards {
        for e in s.entries.iter().filter(|e| e.range.is_some()) {
            let r = e.range.as_ref().unwrap();
            got.push((s.index, r.first, r.end, r.split.clone()));
        }
    }
    got.sort_by_key(|g| g.1);
    let blocks = 900_000u64.div_ceil(4096);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(
        (got[0].1, got[0].2, got[1].1, got[1].2),
        (0, blocks / 2, blocks / 2, blocks)
    );
    let mut shards: Vec<u32> = got.iter().map(|g| g.0).collect();
    shards.sort();
    assert_eq!(shards, [0, 2]);
    assert_eq!(got[0].3, got[1].3, "one split id");
    assert_eq!(got[0].3.len(), 32);
    // Another secret, another id (nobody without the plan can make it).
    let other = Plan::make(&PlanInput {
        secret: [3; 32],
        ..input(true)
    })
    .unwrap();
    assert_ne!(other.id, plan.id);
    // A shard sends its range of the file as it is; changed, it fails.
    let s = plan.scan(got[0].0).unwrap();
    let e = s.entries.iter().find(|e| e.range.is_some()).unwrap();
    assert_eq!(e.range.unwrap().block_size, 4096);
    assert_eq!(e.bytes(), (blocks / 2) * 4096);
    let big = t.path().join("src/big");
    std::fs::write(&big, vec![1u8; 900_001]).unwrap();
    let s = plan.scan(got[0].0).unwrap();
    assert!(
        s.errors
            .iter()
            .any(|e| e.to_string().contains("make a new plan")),
        "{:?}",
        s.errors
    );
    // Round trip, and v2's block size is covered by the id.
    let file = t.path().join("plan.json");
    plan.save(&file).unwrap();
    assert_eq!(Plan::load(&file).unwrap().id, plan.id);
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("\"block_size\": 4096", "\"block_size\": 8192");
    std::fs::write(&file, text).unwrap();
    assert!(Plan::load(&file).is_err());
    // A block size that cannot be split at is refused.
    assert!(Plan::make(&PlanInput {
        block_size: 3000,
        ..input(true)
    })
    .is_err());
}
