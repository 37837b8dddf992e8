//! `intact demo` runs end to end on its built-in dataset and cleans up.

use std::process::Command;

mod common;

#[test]
fn demo_sends_its_sample_through_a_server_and_verifies_it() {
    const T: &str = "demo_sends_its_sample_through_a_server_and_verifies_it";
    // The demo works in TMPDIR; pointed at an ext4 this test made on a
    // loop device, riva must reach level device there. Without root
    // loop_ext4 records a counted skip (the level goes unchecked) and the
    // demo runs in the default TMPDIR.
    let lfs = common::loop_ext4(T, 640);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_intact"));
    cmd.args(["demo", "--json", "--large-mib", "8"]);
    if let Some(lfs) = &lfs {
        cmd.env("TMPDIR", lfs.mnt());
    }
    let out = cmd.output().unwrap();
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
    let files = v["transfer"]["files"].as_array().unwrap();
    for f in files.iter().filter(|f| f["kind"] == "file") {
        assert_eq!(f["verify"], "riva");
        if lfs.is_some() {
            assert_eq!(f["level"], "device", "{f}");
        }
    }
    // The demo cleaned up after itself.
    if let Some(lfs) = &lfs {
        assert_eq!(
            std::fs::read_dir(lfs.mnt()).unwrap().count(),
            1,
            "only lost+found"
        );
    }
}
