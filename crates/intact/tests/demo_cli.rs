//! `intact demo` runs end to end on its built-in dataset and cleans up.

use std::process::Command;

#[test]
fn demo_sends_its_sample_through_a_server_and_verifies_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_intact"))
        .args(["demo", "--json", "--large-mib", "8"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verified"], true);
    // 1 large + 200 + 1000 + empty + non-ASCII = 1203 files.
    assert_eq!(v["dataset_files"], 1203);
    let bytes = (8 + 200) * (1u64 << 20) + 1000 * 4096 + 1234;
    assert_eq!(v["dataset_bytes"], bytes);
    assert_eq!(v["transfer"]["failed"], 0);
    assert_eq!(v["transfer"]["bytes_sent"], bytes);
    assert_eq!(v["independent_check"]["files_compared"], 1203);
    assert_eq!(v["independent_check"]["mismatched"], 0);
    // riva, and the level it can reach where the demo runs (TMPDIR).
    let probe = tempfile::tempfile().unwrap();
    let level = if intact_cache::backing(&probe).unwrap().has_device() {
        "device"
    } else {
        "cache"
    };
    let files = v["transfer"]["files"].as_array().unwrap();
    for f in files.iter().filter(|f| f["kind"] == "file") {
        assert_eq!(f["verify"], "riva");
        assert_eq!(f["level"], level, "{f}");
    }
}
