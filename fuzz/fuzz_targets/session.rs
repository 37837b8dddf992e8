//! The session state machine of `intact serve`, driven by libFuzzer: the
//! input is a stream of choices that the generator of
//! crates/intact-transfer/tests/session_fuzz/gen.rs turns into a message
//! sequence (biased towards valid sessions with mutations), or, when its
//! first byte is 0xFF, raw bytes sent verbatim after the handshake. The
//! harness of the same test (one in-process server per fuzzing process)
//! sends it and fails on any panic of any thread (libFuzzer's panic hook
//! aborts), a hang, a descriptor leak, a peak RSS over 1 GiB, a change
//! outside the root, or bytes under a final name that were never sent
//! with a matching digest; every 500 inputs a normal send must succeed.
//!
//! Build and run (stable toolchain, nightly flags allowed by
//! RUSTC_BOOTSTRAP): `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run session`.
//! The environment knobs of the test (`INTACT_FUZZ_HUGE`,
//! `INTACT_FUZZ_LENIENT`, `INTACT_FUZZ_DIR`) apply here too.
#![no_main]

#[path = "../../crates/intact-transfer/tests/session_fuzz/gen.rs"]
mod gen;
#[path = "../../crates/intact-transfer/tests/session_fuzz/harness.rs"]
mod harness;

use std::sync::Mutex;

use libfuzzer_sys::fuzz_target;

static STATE: Mutex<Option<(harness::Harness, gen::Limits, u64)>> = Mutex::new(None);

/// The harness's directories, removed at exit (libFuzzer exits without
/// dropping statics; a crash leaves them under /dev/shm for inspection).
static DIRS: Mutex<Vec<std::path::PathBuf>> = Mutex::new(Vec::new());

extern "C" fn remove_dirs() {
    if let Ok(dirs) = DIRS.lock() {
        for d in dirs.iter() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut state = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let (h, lim, runs) = state.get_or_insert_with(|| {
        let h = harness::Harness::new();
        DIRS.lock().unwrap().extend(h.dirs());
        // SAFETY: registers a plain function that takes no arguments.
        unsafe { libc::atexit(remove_dirs) };
        let lim = gen::Limits::new(&h.outside);
        (h, lim, 0)
    });
    let result = if data.first() == Some(&0xFF) {
        let wire = &data[1..];
        h.run_bytes(wire, &harness::decode_all(wire))
    } else {
        let msgs = gen::generate(&mut gen::Source::from_bytes(data), lim);
        h.run(&msgs)
    };
    if let Err(why) = result {
        panic!("{why}");
    }
    *runs += 1;
    if *runs % 500 == 0 {
        if let Err(why) = h.sanity() {
            panic!("{why}");
        }
    }
});
