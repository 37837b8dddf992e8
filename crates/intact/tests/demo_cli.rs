//! `intact demo` runs end to end on its built-in dataset and cleans up.

use std::process::Command;

#[test]
fn demo_verifies_its_sample_and_reports() {
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
    let phases = v["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 3);
    // 1 large + 200 + 1000 + empty + non-ASCII = 1203 files, all hashed and verified.
    for p in phases {
        assert_eq!(p["files"], 1203, "{p}");
        assert_eq!(p["failed"], 0, "{p}");
    }
    let bytes = (8 + 200) * (1u64 << 20) + 1000 * 4096 + 1234;
    assert_eq!(phases[2]["bytes"], bytes);
    // The temporary dataset is gone.
    let dataset = v["dataset"].as_str().unwrap();
    assert!(
        !std::path::Path::new(dataset).exists(),
        "{dataset} left behind"
    );
}
