//! Fuzzes the session state machine of `intact serve` on stable Rust: a
//! seeded generator makes sequences of protocol messages (see
//! `session_fuzz/gen.rs`), a hand-written client sends each on its own
//! connection to an in-process server, and `session_fuzz/harness.rs`
//! judges the result by what it reads itself (panics of any thread,
//! hangs, descriptors, peak RSS, the tree outside and inside the root, a
//! normal send afterwards). The cargo-fuzz target `fuzz/fuzz_targets/
//! session.rs` runs the same generator and harness on libFuzzer's bytes.
//!
//! Knobs: `INTACT_FUZZ_SECS` (time budget, default 60), `INTACT_FUZZ_SEED`
//! (first seed, default fixed; `random` for a fresh one), `INTACT_FUZZ_HUGE=0`
//! (keep announced block counts under 2^16 per file; by default sizes up
//! to 2^40 in blocks of 1 byte are announced and must be refused),
//! `INTACT_FUZZ_LENIENT=1` or a list of `reuse,samepath,modes,digest`
//! (leave out sequences and checks, for fuzzing a build known to miss
//! them; see gen::Limits),
//! `INTACT_FUZZ_DIR` (where roots go; default the temp directory).

#[path = "session_fuzz/gen.rs"]
mod gen;
#[path = "session_fuzz/harness.rs"]
mod harness;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use gen::{block, bytes_from, file_end, file_entry, generate, Limits, Source};
use harness::Harness;
use intact_proto::{Block, Message};

/// The tests of this binary share the panic recorder: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sequences between two normal sends.
const SANITY_EVERY: u64 = 25;

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) if v == "random" => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            t.as_nanos() as u64 ^ u64::from(std::process::id())
        }
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a number")),
        Err(_) => default,
    }
}

/// A short, pasteable account of a sequence (block data by length and
/// first bytes).
fn describe(msgs: &[Message]) -> String {
    let mut s = String::new();
    for m in msgs {
        let line = match m {
            Message::Block(Block {
                file,
                index,
                source_level,
                digest,
                crcs,
                patch,
                data,
                ..
            }) => format!(
                "Block {{ file: {file}, index: {index}, source_level: {source_level}, digest: {}, crcs: {} bytes, patch: {patch:?}, data: {} bytes {:02x?}.. }}",
                if *digest == gen::block_digest(data) {
                    "correct".to_string()
                } else {
                    format!("{digest:02x?}")
                },
                crcs.len(),
                data.len(),
                &data[..data.len().min(8)]
            ),
            Message::Entry(e) => format!("{e:?}"),
            other => {
                let t = format!("{other:?}");
                t[..t.len().min(300)].to_string()
            }
        };
        s.push_str(&line);
        s.push('\n');
    }
    s
}

#[test]
fn session_state_machine_survives_fuzzed_message_sequences() {
    let _serial = serial();
    let secs = env_u64("INTACT_FUZZ_SECS", 60);
    let first = env_u64("INTACT_FUZZ_SEED", 0x1117_0000);
    let max_cases = env_u64("INTACT_FUZZ_CASES", u64::MAX);
    let mut h = Harness::new();
    let lim = Limits::new(&h.outside);
    eprintln!(
        "session fuzz: seeds from {first}, {secs} s, huge={}, same path={}, reused ids={}, strict modes={}, strict digests={}, root {}",
        lim.huge,
        lim.same_path,
        lim.reuse_ids,
        h.strict_modes,
        h.strict_digest,
        h.root.display()
    );
    let start = Instant::now();
    let mut seed = first;
    let mut slowest = (first, Duration::ZERO);
    while start.elapsed() < Duration::from_secs(secs) && seed - first < max_cases {
        let msgs = generate(&mut Source::from_seed(seed), &lim);
        if std::env::var_os("INTACT_FUZZ_VERBOSE").is_some() {
            eprintln!("seed {seed}:\n{}", describe(&msgs));
        }
        let t = Instant::now();
        let r = h.run(&msgs);
        let took = t.elapsed();
        if took > slowest.1 {
            slowest = (seed, took);
        }
        if took > Duration::from_secs(2) {
            eprintln!("session fuzz: seed {seed} took {took:?}");
        }
        if let Err(why) = r {
            panic!(
                "seed {seed} (rerun: INTACT_FUZZ_SEED={seed} INTACT_FUZZ_CASES=1): {why}\nsequence:\n{}",
                describe(&msgs)
            );
        }
        seed += 1;
        if (seed - first).is_multiple_of(SANITY_EVERY) {
            if let Err(why) = h.sanity() {
                panic!("after seed {seed}: {why}");
            }
        }
    }
    h.sanity().expect("a normal send at the end");
    let hwm = harness::status_kib("VmHWM");
    let stats = h.stop().expect("the server stops cleanly");
    eprintln!(
        "session fuzz: {} sequences in {:.1} s, slowest seed {} ({:?}), peak RSS {hwm} KiB: {stats:?}",
        stats.sequences,
        start.elapsed().as_secs_f64(),
        slowest.0,
        slowest.1,
    );
    // The run reached the receiver's inner states, not only its error
    // paths: files committed, blocks verified and rejected, final files
    // judged, normal sends in between.
    assert!(stats.sequences >= 20, "{stats:?}");
    assert!(stats.verified_files > 0, "{stats:?}");
    assert!(stats.blocks_ok > 0, "{stats:?}");
    assert!(stats.blocks_rejected > 0, "{stats:?}");
    assert!(stats.statuses > 0, "{stats:?}");
    assert!(stats.final_files_checked > 0, "{stats:?}");
    assert!(stats.sanity_sends >= 2, "{stats:?}");
}

/// A valid session through the harness commits the file, and the bytes
/// read back are the ones sent.
#[test]
fn an_honest_sequence_commits_and_the_harness_accepts_it() {
    let _serial = serial();
    let mut h = Harness::new();
    let data = bytes_from(5, 200);
    let msgs = vec![
        Message::Entry(file_entry(1, "a", 200, 64, 4)),
        block(1, 0, &data[..64]),
        block(1, 1, &data[64..128]),
        block(1, 2, &data[128..192]),
        block(1, 3, &data[192..]),
        file_end(1, 4, &data),
        Message::Bye,
    ];
    h.run(&msgs).unwrap();
    assert_eq!(std::fs::read(h.root.join("a")).unwrap(), data);
    assert_eq!(h.stats.verified_files, 1, "{:?}", h.stats);
    assert_eq!(h.stats.blocks_ok, 4, "{:?}", h.stats);
    h.stop().unwrap();
}

/// The harness's checks can fail: a file planted outside the root, bytes
/// planted under a final name, and a panic in some thread are each seen.
#[test]
fn the_harness_sees_what_it_must_catch() {
    let _serial = serial();
    let mut h = Harness::new();
    std::fs::write(h.outside.join("planted"), b"x").unwrap();
    let e = h.run(&[Message::Bye]).unwrap_err();
    assert!(e.contains("outside the root"), "{e}");
    std::fs::remove_file(h.outside.join("planted")).unwrap();

    // Announced and sent with a matching digest, but other bytes on disk.
    let data = bytes_from(9, 100);
    h.run(&[
        Message::Entry(file_entry(1, "b", 100, 64, 4)),
        block(1, 0, &data[..64]),
        block(1, 1, &data[64..]),
        file_end(1, 2, &data),
        Message::Bye,
    ])
    .unwrap();
    let mut other = data.clone();
    other[70] ^= 1;
    std::fs::write(h.root.join("b"), &other).unwrap();
    let e = h.run(&[Message::Bye]).unwrap_err();
    assert!(
        e.contains("unverified bytes") && e.contains("block 1"),
        "{e}"
    );
    std::fs::write(h.root.join("b"), &data).unwrap();
    h.run(&[Message::Bye]).unwrap();

    let _ = std::thread::spawn(|| panic!("planted panic")).join();
    let e = h.run(&[Message::Bye]).unwrap_err();
    assert!(e.contains("planted panic"), "{e}");
    h.stop().unwrap();
}

// Regression tests for what the fuzz found in today's receiver (issue 11).
// Each performs the attack and asserts what a fixed server must do; they
// are ignored until the fixes are merged (run: cargo test -p
// intact-transfer --test session_fuzz -- --ignored).

/// Item 2: an Entry reusing the id of a file whose block is still at the
/// verifier. The verifier's verdict then lands on the new file:
/// `f.checking -= 1` underflows (receiver.rs:720, debug builds) or
/// `f.verified[c.index]` indexes past the new file's blocks
/// (receiver.rs:733, release builds). Timing decides which message wins,
/// so the attack is repeated; a normal send must work afterwards.
#[test]
fn a_reused_id_while_a_block_is_at_the_verifier_ends_the_connection_only() {
    let _serial = serial();
    let mut h = Harness::new();
    let data = bytes_from(1, 64);
    let other = bytes_from(2, 64 * 64);
    for round in 0..20 {
        let mut msgs = vec![
            Message::Entry(file_entry(7, "a", 64, 64, 5)),
            block(7, 0, &data),
            Message::Entry(file_entry(7, "b", 0, 64, 5)),
            // Keep the session busy while the verifier re-reads block 0
            // of "a": its verdict then finds "b" under id 7.
            Message::Entry(file_entry(8, "c", other.len() as u64, 64, 4)),
        ];
        for (i, chunk) in other.chunks(64).enumerate() {
            msgs.push(block(8, i as u64, chunk));
        }
        msgs.push(Message::Bye);
        if let Err(why) = h.run(&msgs) {
            panic!("round {round}: {why}");
        }
    }
    h.sanity().unwrap();
    h.stop().unwrap();
}

/// Item 3, within one session: two entries for one path share the hidden
/// partial file; the second's block lands in the first's file, which is
/// then committed and reported verified though its bytes are not the
/// ones whose digests the first entry announced.
#[test]
fn two_entries_for_one_path_never_commit_a_mix() {
    let _serial = serial();
    let mut h = Harness::new();
    let a = bytes_from(2, 128);
    let b = bytes_from(3, 128);
    let msgs = vec![
        Message::Entry(file_entry(1, "a", 128, 64, 4)),
        Message::Entry(file_entry(2, "a", 128, 64, 4)),
        block(1, 0, &a[..64]),
        block(1, 1, &a[64..]),
        block(2, 1, &b[64..]),
        file_end(1, 2, &a),
        Message::Bye,
    ];
    h.run(&msgs).unwrap();
    if let Ok(stored) = std::fs::read(h.root.join("a")) {
        assert!(
            stored == a || stored == b,
            "the stored file mixes two entries: first block {}, second block {}",
            if stored[..64] == a[..64] {
                "of entry 1"
            } else {
                "other"
            },
            if stored[64..] == b[64..] {
                "of entry 2"
            } else {
                "other"
            },
        );
    }
    h.stop().unwrap();
}

/// Item 3: the whole-file digest in FileEnd is not checked: a FileEnd
/// whose digest is not that of the bytes written still commits the file
/// (and reports it verified).
#[test]
fn a_wrong_whole_file_digest_is_not_committed() {
    let _serial = serial();
    let mut h = Harness::new();
    let a = bytes_from(4, 128);
    let msgs = vec![
        Message::Entry(file_entry(1, "a", 128, 64, 4)),
        block(1, 0, &a[..64]),
        block(1, 1, &a[64..]),
        Message::FileEnd {
            file: 1,
            blocks: 2,
            source_level: 4,
            digest: vec![7; 32],
        },
        Message::Bye,
    ];
    h.run(&msgs).unwrap();
    assert!(
        !h.root.join("a").exists(),
        "a file whose FileEnd digest does not match its bytes got its final name ({} verified result(s))",
        h.stats.verified_files
    );
    h.stop().unwrap();
}

/// Item 5: setuid, setgid and sticky bits from the wire are applied.
#[test]
fn setuid_bits_from_the_wire_are_stripped() {
    use std::os::unix::fs::MetadataExt;
    let _serial = serial();
    let mut h = Harness::new();
    let a = bytes_from(5, 10);
    let mut e = file_entry(1, "s", 10, 64, 4);
    e.mode = 0o6755;
    let mut d = file_entry(2, "dir", 0, 64, 4);
    d.kind = intact_proto::EntryKind::Dir;
    d.mode = 0o7777;
    h.run(&[
        Message::Entry(e),
        block(1, 0, &a),
        file_end(1, 1, &a),
        Message::Entry(d),
        Message::Bye,
    ])
    .unwrap();
    for name in ["s", "dir"] {
        let m = std::fs::symlink_metadata(h.root.join(name)).unwrap();
        assert_eq!(m.mode() & 0o7000, 0, "{name}: mode {:o}", m.mode() & 0o7777);
    }
    h.stop().unwrap();
}

/// Item 1: per-block state sized by the announced block count. Run in a
/// child process, since today it aborts the process: an Entry of 16 MiB
/// in blocks of 1 byte (a 1.1 GB vector of 65-byte slots, filled) and
/// one of 2^40 bytes in blocks of 1 byte (`memory allocation of
/// 71468255805440 bytes failed`, SIGABRT). The child judges its peak RSS
/// itself (at most 1 GiB).
#[test]
fn a_huge_block_count_is_refused_not_allocated() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "huge_block_count_child",
            "--ignored",
            "--nocapture",
        ])
        .env("INTACT_FUZZ_CHILD", "1")
        .env("INTACT_FUZZ_DIR", dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let why: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("memory allocation") || l.contains("panicked") || l.contains("Err"))
        .collect();
    assert!(
        out.status.success(),
        "the child died or failed ({}): {}",
        out.status,
        why.join("\n")
    );
}

/// The child of the test above (does nothing unless run by it).
#[test]
#[ignore = "run by a_huge_block_count_is_refused_not_allocated"]
fn huge_block_count_child() {
    if std::env::var_os("INTACT_FUZZ_CHILD").is_none() {
        return;
    }
    let mut h = Harness::new();
    h.run(&[
        Message::Entry(file_entry(1, "m", 16 << 20, 1, 4)),
        Message::Entry(file_entry(2, "h", 1 << 40, 1, 4)),
        Message::Bye,
    ])
    .unwrap();
    h.sanity().unwrap();
    h.stop().unwrap();
}
