//! The fault lab's emulated SSD (intact-faults' `EmulatedSsd`: a write
//! buffer in front of NAND, through FUSE under a loop device, ext4 on
//! top), first checked against facts the test establishes itself (what
//! a read after the page cache was emptied returns, what the NAND file
//! holds under the file, the emulator's log), then used as the
//! destination of a `riva` copy for the two layers below the host in
//! Kim et al.'s Table 2: a fault in the buffered copy is caught and
//! repaired by riva's re-read; a fault in programming the flash is not,
//! because the re-read is answered by the buffer. `--verify flash` closes
//! that gap: its re-read waits until the device's write cache has turned
//! over, so it catches both faults and says `media`; where the window
//! could not pass (no filler allowed, the block still in the emulator's
//! buffer), it says `device` and misses the flash fault, as it must.

use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::Path;

use intact_faults::{loop_devices_of, mounts_under, ssd_usable, EmulatedSsd, SsdLayer, SSD_PAGE};
use intact_transfer::{copy, CopyReport, FlashSettings, VerifyLevel, VerifyMode};

mod common;

/// The emulated device's write buffer: small, so that a few MiB of later
/// writes turn it over.
const BUFFER: u64 = 2 << 20;
const BS: usize = 256 * 1024;

fn ssd(name: &str) -> Option<EmulatedSsd> {
    if let Err(why) = ssd_usable() {
        intact_testkit::skip(name, &why);
        return None;
    }
    Some(EmulatedSsd::new(Path::new(env!("CARGO_TARGET_TMPDIR")), 64, BUFFER).unwrap())
}

fn page(data: &[u8], i: usize) -> &[u8] {
    &data[i * SSD_PAGE..(i + 1) * SSD_PAGE]
}

/// Closes the SSD and proves nothing is left mounted or attached.
fn close(ssd: EmulatedSsd) {
    let dir = ssd.dir().to_path_buf();
    ssd.close().unwrap();
    assert!(mounts_under(&dir).is_empty(), "{:?}", mounts_under(&dir));
    assert!(
        loop_devices_of(&dir).is_empty(),
        "{:?}",
        loop_devices_of(&dir)
    );
}

#[test]
fn the_emulated_ssd_answers_from_its_buffer_until_it_turns_over() {
    let Some(ssd) = ssd("the_emulated_ssd_answers_from_its_buffer_until_it_turns_over") else {
        return;
    };
    let data = intact_sample::bytes(1 << 20, 5);
    ssd.arm(SsdLayer::Media, page(&data, 5));
    ssd.arm(SsdLayer::Buffer, page(&data, 9));
    let path = ssd.mnt().join("f");
    fs::write(&path, &data).unwrap();
    let f = File::open(&path).unwrap();
    f.sync_all().unwrap();
    assert_eq!(ssd.model().armed(), 0, "both pages were written");

    // NAND, read by the test from the emulator's file under the file's
    // extents: page 5 was programmed wrong, page 9 carries the buffer's
    // corruption, page 6 is right.
    let at = |i: usize| (i * SSD_PAGE) as u64;
    assert_ne!(
        ssd.nand_bytes_under(&f, at(5), SSD_PAGE).unwrap(),
        page(&data, 5)
    );
    assert_ne!(
        ssd.nand_bytes_under(&f, at(9), SSD_PAGE).unwrap(),
        page(&data, 9)
    );
    assert_eq!(
        ssd.nand_bytes_under(&f, at(6), SSD_PAGE).unwrap(),
        page(&data, 6)
    );
    assert!(ssd.buffered_under(&f, at(5)).unwrap());
    drop(f);

    // A read after a remount comes from the device: the buffer answers,
    // good for page 5, corrupted for page 9.
    ssd.remount().unwrap();
    let read = |i: usize| {
        let mut b = vec![0; SSD_PAGE];
        File::open(&path)
            .unwrap()
            .read_exact_at(&mut b, at(i))
            .unwrap();
        b
    };
    assert_eq!(read(5), page(&data, 5), "the buffer's good copy");
    assert_ne!(read(9), page(&data, 9));

    // New writes push the file's pages out of the buffer; then the read
    // reaches NAND and page 5 is wrong too.
    ssd.write_filler(3 * BUFFER).unwrap();
    let f = File::open(&path).unwrap();
    assert!(!ssd.buffered_under(&f, at(5)).unwrap());
    drop(f);
    ssd.remount().unwrap();
    assert_ne!(read(5), page(&data, 5), "NAND's corrupted program");
    let log: Vec<_> = ssd
        .model()
        .log()
        .iter()
        .map(|e| (e.layer, e.what))
        .collect();
    for want in [
        (SsdLayer::Buffer, "buffered copy corrupted"),
        (SsdLayer::Media, "programmed corrupted to NAND"),
        (SsdLayer::Media, "left the buffer"),
    ] {
        assert!(log.contains(&want), "{want:?} not in {log:?}");
    }
    close(ssd);
}

/// A copy in `mode` of `data` onto the emulated SSD with `layer` armed
/// on the page at `fault_page`; returns the copy's report, whether the
/// file's first page was still in the emulator's buffer right after the
/// copy, and the file's bytes read after the buffer turned over and the
/// page cache was emptied.
fn copy_onto(
    ssd: &EmulatedSsd,
    data: &[u8],
    mode: VerifyMode,
    flash: FlashSettings,
    (layer, fault_page): (SsdLayer, usize),
) -> (CopyReport, bool, Vec<u8>) {
    let src = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    fs::write(src.path().join("f"), data).unwrap();
    ssd.arm(layer, page(data, fault_page));
    let dst = ssd.mnt().join("dst");
    let o = intact_transfer::CopyOptions {
        flash,
        ..common::copy_opts(mode, BS)
    };
    let r = copy(&[src.path().join("f")], &dst, &o, &|_| {}).unwrap();
    assert_eq!(ssd.model().armed(), 0, "the armed page was written");
    let buffered = ssd
        .buffered_under(&File::open(dst.join("f")).unwrap(), 0)
        .unwrap();
    ssd.write_filler(3 * BUFFER).unwrap();
    ssd.remount().unwrap();
    (r, buffered, fs::read(dst.join("f")).unwrap())
}

/// A riva copy (see [`copy_onto`]).
fn riva_onto(
    ssd: &EmulatedSsd,
    data: &[u8],
    layer: SsdLayer,
    fault_page: usize,
) -> (CopyReport, Vec<u8>) {
    let (r, _, after) = copy_onto(
        ssd,
        data,
        VerifyMode::Riva,
        FlashSettings::default(),
        (layer, fault_page),
    );
    (r, after)
}

/// The pages of `after` that differ from `data`.
fn bad_pages(data: &[u8], after: &[u8]) -> Vec<usize> {
    (0..data.len() / SSD_PAGE)
        .filter(|&i| page(after, i) != page(data, i))
        .collect()
}

#[test]
fn riva_catches_a_fault_in_the_ssds_buffer() {
    let Some(ssd) = ssd("riva_catches_a_fault_in_the_ssds_buffer") else {
        return;
    };
    let data = intact_sample::bytes(4 * BS, 17);
    let (r, after) = riva_onto(&ssd, &data, SsdLayer::Buffer, 70);
    assert_eq!(r.failed, 0, "{r:?}");
    let f = &r.files[0];
    assert_eq!(f.blocks_resent, 1, "the block with the bad page: {f:?}");
    // Named by its CRC, the bad page alone came again.
    assert_eq!(f.pages_resent, 1, "{f:?}");
    assert_eq!(f.bytes_sent, data.len() as u64 + SSD_PAGE as u64, "{f:?}");
    assert_eq!(f.level, Some(VerifyLevel::Device));
    assert!(after == data, "the device holds the source's bytes");
    close(ssd);
}

#[test]
fn riva_does_not_see_a_fault_in_programming_the_flash() {
    let Some(ssd) = ssd("riva_does_not_see_a_fault_in_programming_the_flash") else {
        return;
    };
    let data = intact_sample::bytes(4 * BS, 23);
    let (r, after) = riva_onto(&ssd, &data, SsdLayer::Media, 70);
    // riva's re-read was answered by the buffer's good copy: the copy
    // says device level and resent nothing ...
    assert_eq!(r.failed, 0, "{r:?}");
    let f = &r.files[0];
    assert_eq!((f.blocks_resent, f.level), (0, Some(VerifyLevel::Device)));
    // ... and once the buffer turned over, the flash's copy is wrong.
    assert_eq!(
        bad_pages(&data, &after),
        [70],
        "exactly the page the emulator programmed wrong"
    );
    close(ssd);
}

/// flash's window on the emulator: twice its buffer, so that the bytes
/// the device counts after a block (the file system's journal and
/// metadata among them) surely pushed the block out.
fn window() -> FlashSettings {
    FlashSettings::new(Some(2 * BUFFER), None)
}

/// A flash copy of `data` with `layer` armed on page 70, which must
/// resend the one block holding it and say `media`, the device holding
/// the source's bytes after the buffer turned over. Returns the report.
fn flash_repairs(ssd: &EmulatedSsd, data: &[u8], layer: SsdLayer) -> CopyReport {
    let (r, _, after) = copy_onto(ssd, data, VerifyMode::Flash, window(), (layer, 70));
    assert_eq!(r.failed, 0, "{r:?}");
    let f = &r.files[0];
    assert_eq!(f.blocks_resent, 1, "the block with the bad page: {f:?}");
    // Named by its CRC, the bad page alone came again.
    assert_eq!(f.pages_resent, 1, "{f:?}");
    assert_eq!(f.level, Some(VerifyLevel::Media), "{f:?}");
    // Read after the buffer turned over: the flash holds the source's bytes.
    assert!(bad_pages(data, &after).is_empty());
    r
}

#[test]
fn flash_catches_a_fault_in_programming_the_flash() {
    let Some(ssd) = ssd("flash_catches_a_fault_in_programming_the_flash") else {
        return;
    };
    // 16 blocks, the data twice the window (Kim et al.'s fault: NAND
    // programmed wrong while the buffer keeps the good copy).
    let data = intact_sample::bytes(16 * BS, 29);
    let r = flash_repairs(&ssd, &data, SsdLayer::Media);
    let f = &r.files[0];
    assert_eq!(f.bytes_sent, data.len() as u64 + SSD_PAGE as u64, "{f:?}");
    let note = f.note.as_deref().unwrap_or("");
    assert!(note.contains("W = 4.0 MiB (--device-cache)"), "{note}");
    assert!(note.contains("sectors-written counter"), "{note}");
    // The last blocks were pushed past the window by filler.
    let filler = r.filler_bytes.expect("a flash copy reports its filler");
    assert!(filler > 0 && filler <= 2 * 2 * BUFFER, "{filler}");
    let log: Vec<_> = ssd.model().log().iter().map(|e| e.what).collect();
    assert!(log.contains(&"programmed corrupted to NAND"), "{log:?}");
    close(ssd);
}

#[test]
fn a_small_copy_reaches_media_even_after_a_resend() {
    let Some(ssd) = ssd("a_small_copy_reaches_media_even_after_a_resend") else {
        return;
    };
    // 2 blocks, far less than W (4 MiB): the first drain writes W of
    // filler, the resent block needs another W after it. A server caps a
    // stream's filler at 4x its data (2 MiB here): its first drain would
    // write nothing, the early re-read would be answered by the buffer's
    // good copy, and the fault would go unseen at level device. A copy's
    // sender is the user's own process, so it may write two drains of
    // --max-filler (W) more.
    let data = intact_sample::bytes(2 * BS, 31);
    let r = flash_repairs(&ssd, &data, SsdLayer::Media);
    let filler = r.filler_bytes.expect("a flash copy reports its filler");
    assert!(
        filler > 2 * BUFFER && filler <= 2 * 2 * BUFFER,
        "two drains, the second after the resend: {filler}"
    );
    let log: Vec<_> = ssd.model().log().iter().map(|e| e.what).collect();
    assert!(log.contains(&"programmed corrupted to NAND"), "{log:?}");
    close(ssd);
}

#[test]
fn flash_catches_a_fault_in_the_ssds_buffer() {
    let Some(ssd) = ssd("flash_catches_a_fault_in_the_ssds_buffer") else {
        return;
    };
    let data = intact_sample::bytes(16 * BS, 31);
    flash_repairs(&ssd, &data, SsdLayer::Buffer);
    close(ssd);
}

#[test]
fn flash_never_says_media_when_the_window_has_not_passed() {
    let Some(ssd) = ssd("flash_never_says_media_when_the_window_has_not_passed") else {
        return;
    };
    // One block, far less than the window, and no filler allowed: the
    // block is still in the emulator's buffer when it is re-read, so the
    // re-read cannot have reached the flash, and the fault programmed
    // into the flash goes unseen. The level must say so.
    let data = intact_sample::bytes(BS, 37);
    let no_filler = FlashSettings::new(Some(2 * BUFFER), Some(0));
    let (r, buffered, after) = copy_onto(
        &ssd,
        &data,
        VerifyMode::Flash,
        no_filler,
        (SsdLayer::Media, 3),
    );
    assert!(
        buffered,
        "the emulator still buffered the file after the copy"
    );
    assert_eq!(r.failed, 0, "{r:?}");
    let f = &r.files[0];
    assert_eq!(
        (f.blocks_resent, f.level),
        (0, Some(VerifyLevel::Device)),
        "{f:?}"
    );
    let note = f.note.as_deref().unwrap_or("");
    assert!(
        note.contains("before the device's write cache had turned over"),
        "{note}"
    );
    assert!(note.contains("were allowed"), "{note}");
    assert_eq!(r.filler_bytes, Some(0));
    assert_eq!(
        bad_pages(&data, &after),
        [3],
        "the fault flash could not see"
    );
    close(ssd);
}
