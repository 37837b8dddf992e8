//! CI's fault matrix (issue 5): small sizes, a few crash trials, every
//! fault against every mode, with the real `intact` binary for crashes.
//! Fails if a riva cell is not repaired, a fault left no trace, a loop
//! device or a namespace is left behind, or a cache-level mode stops
//! showing the misses the papers predict.

use std::path::PathBuf;

use intact_lab::{run_matrix, Fault, MatrixConfig, Outcome};
use intact_transfer::VerifyMode;

#[test]
fn the_small_fault_matrix() {
    if let Err(why) = intact_faults::usable() {
        eprintln!("SKIP the_small_fault_matrix: {why}");
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let cfg = MatrixConfig {
        dir: dir.path().to_path_buf(),
        // One block, and several blocks (4 MiB blocks).
        sizes: vec![1 << 20, 9 << 20],
        modes: VerifyMode::ALL.to_vec(),
        faults: Fault::ALL.to_vec(),
        crash_trials: 2,
        intact: Some(PathBuf::from(env!("CARGO_BIN_EXE_intact"))),
    };
    let m = run_matrix(&cfg, &|c| eprintln!("{}: {:?}", c.label(), c.outcome)).unwrap();
    assert!(m.skipped.is_empty(), "{:?}", m.skipped);
    assert_eq!(m.cells.len(), 2 * 6 * Fault::ALL.len());
    assert!(m.problems().is_empty(), "{:#?}", m.problems());
    let netns = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output();
    if let Ok(out) = netns {
        assert!(!String::from_utf8_lossy(&out.stdout).contains("intact-lab"));
    }
    let outcome = |f: Fault, mode: VerifyMode| {
        let cells: Vec<_> = m
            .cells
            .iter()
            .filter(|c| c.fault == f && c.mode == mode)
            .collect();
        assert!(
            cells.windows(2).all(|w| w[0].outcome == w[1].outcome),
            "{cells:?}"
        );
        cells[0].outcome
    };
    // What the papers predict, and the proof that each injection bites:
    // files that stay cached hide device faults from every cache-level mode.
    for mode in [
        VerifyMode::None,
        VerifyMode::Sequential,
        VerifyMode::File,
        VerifyMode::Block,
        VerifyMode::Fiver,
    ] {
        for f in [
            Fault::DeviceWrite,
            Fault::DeviceWriteExtreme,
            Fault::SourceRead,
        ] {
            assert_eq!(outcome(f, mode), Outcome::Missed, "{} {mode}", f.name());
        }
    }
    // The network check catches the wire; only `none` lets it through.
    assert_eq!(
        outcome(Fault::NetworkFlip, VerifyMode::None),
        Outcome::Missed
    );
    assert_eq!(
        outcome(Fault::NetworkFlip, VerifyMode::Fiver),
        Outcome::Repaired
    );
    // A flip after the network check: fiver misses it; re-reads catch it.
    assert_eq!(outcome(Fault::Memory, VerifyMode::Fiver), Outcome::Missed);
    assert_eq!(outcome(Fault::Memory, VerifyMode::Block), Outcome::Repaired);
    for mode in VerifyMode::ALL {
        for f in [
            Fault::CrashSender,
            Fault::CrashServer,
            Fault::DiskFull,
            Fault::NetworkCut,
            Fault::NetworkStall,
        ] {
            assert_eq!(outcome(f, mode), Outcome::Repaired, "{} {mode}", f.name());
        }
    }
}
