//! Levels that never lie (root only: a loop-mounted ext4). Each test
//! makes the device hold other bytes than the page cache under a file the
//! receiver already holds (a partial file from an interrupted run, or a
//! file held whole), sends again, and then judges by facts it establishes
//! itself: the bytes read back after unmounting and mounting the file
//! system again (so no page cache survives, and intact's own eviction is
//! not what the check relies on), and the accounting of the report.

mod common;

use std::fs::{self, File};

use common::*;
use intact_transfer::{SendOptions, VerifyLevel, VerifyMode};

/// Lie 1: blocks journaled by a `fiver` run (level network) are not
/// trusted by a later `riva` run; damage on the device under one of them
/// is found by re-reading it from the device, and repaired.
#[test]
fn a_resume_re_verifies_held_blocks_below_its_level() {
    if !usable("a_resume_re_verifies_held_blocks_below_its_level") {
        return;
    }
    let c = Case::new();
    let partial = c.interrupted_fiver();
    // The good copy stays cached: a resume that re-read through the cache
    // would miss the flip.
    c.flip_under(&partial, 101);

    let r = send_once(&c.src, &c.root, &opts(VerifyMode::Riva), None).unwrap();
    let f = the_file(&r);
    assert_eq!(r.failed, 0, "{:?}", f.error);
    // The fact first: the device now holds the source's bytes.
    assert!(c.stored() == c.data, "the device differs from the source");
    assert_eq!(f.level, Some(VerifyLevel::Device), "{f:#?}");
    accounted(f, BS as u64);
    assert_eq!(
        f.bytes_trusted, 0,
        "fiver's blocks must not be trusted by riva"
    );
    assert!(
        f.bytes_reverified > 0,
        "no held block was re-verified: {f:#?}"
    );
}

/// Lie 2: a file held whole, recorded at level network by `fiver`, is not
/// reported `device` (nor passed under `--require-level device`) without
/// being re-read from the device; damage there is found and repaired.
#[test]
fn an_unchanged_file_below_the_level_asked_is_re_verified() {
    if !usable("an_unchanged_file_below_the_level_asked_is_re_verified") {
        return;
    }
    let c = Case::sent_whole(VerifyMode::Fiver, VerifyLevel::Network);

    // Sent again in fiver: trusted at its recorded level, nothing sent.
    let r = send_once(&c.src, &c.root, &opts(VerifyMode::Fiver), None).unwrap();
    let f = the_file(&r);
    assert!(f.unchanged && f.bytes_sent == 0, "{f:#?}");
    assert_eq!(f.bytes_trusted, SIZE as u64);
    assert_eq!(f.trusted_level, Some(VerifyLevel::Network));
    assert_eq!(f.level, Some(VerifyLevel::Network));

    let final_path = c.root.join("data.bin");
    let at = 3 * BS as u64 + 17;
    c.flip_under(&final_path, at);

    let mut o = opts(VerifyMode::Riva);
    o.require_level = Some(VerifyLevel::Device);
    let r = send_once(&c.src, &c.root, &o, None).unwrap();
    let f = the_file(&r);
    assert!(c.stored() == c.data, "the device differs from the source");
    assert_eq!(r.failed, 0, "{:?}", f.error);
    assert_eq!(f.level, Some(VerifyLevel::Device));
    accounted(f, BS as u64);
    assert!(
        !f.unchanged,
        "a damaged file was reported unchanged: {f:#?}"
    );
    assert_eq!(f.bytes_trusted, 0);
}

/// An undamaged file held at level network is re-verified in place (both
/// ends read from the device, nothing sent) and then reaches `device`; a
/// third run trusts that record and says so.
#[test]
fn an_unchanged_file_is_re_verified_in_place_then_trusted() {
    if !usable("an_unchanged_file_is_re_verified_in_place_then_trusted") {
        return;
    }
    let c = Case::new();
    send_once(&c.src, &c.root, &opts(VerifyMode::Fiver), None).unwrap();
    let mut o = opts(VerifyMode::Riva);
    o.require_level = Some(VerifyLevel::Device);
    let r = send_once(&c.src, &c.root, &o, None).unwrap();
    let f = the_file(&r);
    assert_eq!(r.failed, 0, "{:?}", f.error);
    assert!(f.unchanged, "{f:#?}");
    assert_eq!(
        (f.bytes_sent, f.bytes_reverified, f.bytes_trusted),
        (0, SIZE as u64, 0)
    );
    assert_eq!(f.level, Some(VerifyLevel::Device));
    assert!(f.pages_resident == 0);

    let r = send_once(&c.src, &c.root, &o, None).unwrap();
    let f = the_file(&r);
    assert!(f.unchanged);
    assert_eq!(
        (f.bytes_sent, f.bytes_reverified, f.bytes_trusted),
        (0, 0, SIZE as u64)
    );
    assert_eq!(f.trusted_level, Some(VerifyLevel::Device));
    assert!(f.trusted_since.is_some_and(|t| t > 0));
    assert_eq!(f.level, Some(VerifyLevel::Device));
    assert!(c.stored() == c.data);
}

/// `--reverify` re-reads a file held at `device` by riva's means: damage
/// on the device is found and the file is sent again.
#[test]
fn reverify_reads_the_device() {
    if !usable("reverify_reads_the_device") {
        return;
    }
    let c = Case::new();
    send_once(&c.src, &c.root, &opts(VerifyMode::Riva), None).unwrap();
    let final_path = c.root.join("data.bin");
    c.flip_under(&final_path, 5);
    let mut o = opts(VerifyMode::Riva);
    o.reverify = true;
    let r = send_once(&c.src, &c.root, &o, None).unwrap();
    let f = the_file(&r);
    assert_eq!(r.failed, 0, "{:?}", f.error);
    assert!(!f.unchanged);
    assert_eq!(f.bytes_sent, SIZE as u64);
    assert!(c.stored() == c.data);
}

/// The whole-file digest a sender reports is that of the bytes finally
/// accepted: with the source's page cache holding a wrong byte (its device
/// right), riva sends the cached block, the receiver refuses it, the resend
/// reads the device; the report's BLAKE3 must be the true source's.
#[test]
fn the_reported_digest_is_of_the_bytes_accepted() {
    // A power-of-two block size: the digest is assembled per block.
    digest_after_a_resend("the_reported_digest_is_of_the_bytes_accepted", BS);
}

/// The same with a block size that is not a power of two: the digest is
/// streamed and, after a resend, computed again from the source.
#[test]
fn the_reported_digest_is_of_the_bytes_accepted_at_any_block_size() {
    digest_after_a_resend(
        "the_reported_digest_is_of_the_bytes_accepted_at_any_block_size",
        768 << 10,
    );
}

fn digest_after_a_resend(test: &str, block_size: usize) {
    if !usable(test) {
        return;
    }
    let c = Case::new();
    let sdir = c.fs.mnt().join("src");
    fs::create_dir_all(&sdir).unwrap();
    let src = sdir.join("data.bin");
    fs::write(&src, &c.data).unwrap();
    let at = 2 * BS as u64 + 99;
    let f = File::open(&src).unwrap();
    // Device wrong, then the wrong byte read into the cache, then the
    // device put right again: the cache alone holds the wrong byte.
    c.fs.flip_bit_under(&f, at).unwrap();
    let ev = intact_cache::evict(&f, 0, SIZE as u64).unwrap();
    assert_eq!(ev.resident, 0);
    let cached = fs::read(&src).unwrap();
    assert_eq!(
        cached[at as usize],
        c.data[at as usize] ^ 1,
        "cache not wrong"
    );
    c.fs.flip_bit_under(&f, at).unwrap();
    assert_eq!(
        c.device_byte(&f, at),
        c.data[at as usize],
        "device not right"
    );
    drop(f);

    let o = SendOptions {
        block_size,
        ..opts(VerifyMode::Riva)
    };
    let r = send_once(&src, &c.root, &o, None).unwrap();
    let rep = the_file(&r);
    assert_eq!(r.failed, 0, "{:?}", rep.error);
    assert!(
        rep.blocks_resent >= 1,
        "the wrong cached block was not refused"
    );
    let truth = blake3::hash(&c.data).to_hex().to_string();
    assert_eq!(rep.digest.as_deref(), Some(truth.as_str()));
    assert!(c.stored() == c.data);
}
