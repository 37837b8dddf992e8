//! Issue 14: flash's deferred queue holds digests and positions, never
//! data. A 4 GiB file copied with `--verify flash` and a window no write
//! can pass (W = 64 GiB, no filler) keeps every block waiting until the
//! end; the loop device's own counters show that the re-reads waited
//! (almost nothing read while the file was written), and the kernel's
//! account of the copy's peak memory stays a small fraction of the data.
//! Its own test binary: the peak is of every child this process waited
//! for, and nothing else runs here.

mod common;

use std::fs::{self, File};
use std::process::Command;
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;

/// Sectors (512 bytes) read and written so far on `dev` (`loopN`).
fn sectors(dev: &str) -> (u64, u64) {
    let name = dev.trim_start_matches("/dev/");
    let stat = fs::read_to_string(format!("/sys/block/{name}/stat")).unwrap();
    let f: Vec<u64> = stat
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    (f[2], f[6])
}

/// The largest resident set of any child waited for so far, in KiB.
fn children_peak_kib() -> u64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    ru.ru_maxrss as u64
}

#[test]
fn a_4_gib_flash_copy_keeps_its_deferred_queue_out_of_memory() {
    let test = "a_4_gib_flash_copy_keeps_its_deferred_queue_out_of_memory";
    let Some(lfs) = common::loop_ext4(test, 4 * 1024 + 512) else {
        return;
    };
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    // A sparse source: reading it costs no disk, writing it costs 4 GiB.
    let src = dir.path().join("big.dat");
    File::create(&src).unwrap().set_len(4 * GIB).unwrap();
    let dst = lfs.mnt().join("dst");
    let state = dir.path().join("state");
    let mut child = Command::new(env!("CARGO_BIN_EXE_intact"))
        .args([
            "copy",
            "--json",
            "--verify",
            "flash",
            "--device-cache",
            "64GiB",
            "--max-filler",
            "0",
            "--block-size",
            "1MiB",
        ])
        .arg(&src)
        .arg(&dst)
        .env("XDG_STATE_HOME", &state)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // While the file is written, the re-reads wait: when 3 GiB have been
    // written to the device, at most a little was read from it (riva
    // would have read nearly as much as it wrote by then).
    let (read0, written0) = sectors(lfs.device());
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut read_at_3 = None;
    loop {
        let done = child.try_wait().unwrap().is_some();
        let (read, written) = sectors(lfs.device());
        if read_at_3.is_none() && (written - written0) * 512 >= 3 * GIB {
            read_at_3 = Some((read - read0) * 512);
        }
        if done {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the copy took more than 10 minutes");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read_at_3 = read_at_3.expect("3 GiB were written to the device");
    let peak = children_peak_kib();
    eprintln!(
        "read back while the first 3 GiB were written: {} MiB; the copy's peak resident set: {} MiB",
        read_at_3 >> 20,
        peak / 1024
    );
    assert!(
        read_at_3 < 256 << 20,
        "{} MiB read back while the first 3 GiB were written: the re-reads did not wait",
        read_at_3 >> 20
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let f = &v["files"][0];
    // No window passed and no filler was allowed: device, with the reason.
    assert_eq!(f["level"], "device", "{f}");
    assert!(
        f["note"].as_str().unwrap_or("").contains("W = 64.0 GiB"),
        "{f}"
    );
    assert_eq!(fs::metadata(&dst).unwrap().len(), 4 * GIB);
    // 4,096 blocks waited at once; their queue holds digests and page
    // CRCs (about 1 KiB a block), never the 4 GiB.
    assert!(
        peak < 256 * 1024,
        "the copy's peak resident set was {} MiB for a 4 GiB file",
        peak / 1024
    );
    drop(lfs);
}
