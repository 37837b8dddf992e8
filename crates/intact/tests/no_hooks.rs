//! Test hooks never ship: the `intact` binary is built without
//! intact-transfer's `fault-hooks` feature (the fault lab's and the tests'
//! fault injection), read from cargo's own resolution of the binary's
//! dependencies, with the fault lab's as the control that the check can
//! see the feature at all.

use std::process::Command;

/// The features cargo resolves for intact-transfer when building `pkg`
/// alone (as `cargo build --release -p intact` and `cargo static-release`
/// do), as printed by `cargo tree`.
fn transfer_features(pkg: &str) -> String {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "-p",
            pkg,
            "-e",
            "normal",
            "-f",
            "{p} [{f}]",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines()
        .find(|l| l.contains("intact-transfer v"))
        .unwrap_or_else(|| panic!("no intact-transfer in {pkg}'s tree:\n{text}"))
        .to_string()
}

#[test]
fn the_intact_binary_is_built_without_fault_hooks() {
    let lab = transfer_features("intact-lab");
    assert!(lab.contains("fault-hooks"), "control: {lab}");
    let bin = transfer_features("intact");
    assert!(!bin.contains("fault-hooks"), "{bin}");
}
