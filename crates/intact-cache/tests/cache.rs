//! Eviction, device reads and extents, proven on a device each test makes
//! itself (an ext4 on a loop device, root only): a byte is changed on the
//! device under a file while the page cache keeps the right one, so the
//! bytes a read returns say where they came from.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use intact_cache::{evict, extents, resident, DeviceCounter, DeviceReader, ReadPath, PAGE};
use intact_digest::AlignedBuf;
use intact_faults::LoopFs;

/// A fresh ext4 of `mib` MiB on a loop device, or None after a loud skip
/// where loop devices cannot be made (not root, tools missing).
fn loop_ext4(test: &str, mib: u64) -> Option<LoopFs> {
    if let Err(why) = intact_faults::usable() {
        intact_testkit::skip(test, &why);
        return None;
    }
    Some(LoopFs::new(Path::new(env!("CARGO_TARGET_TMPDIR")), mib).unwrap())
}

fn write_file(path: &PathBuf, len: usize) -> Vec<u8> {
    let data = intact_sample::bytes(len, 7);
    let mut f = File::create(path).unwrap();
    f.write_all(&data).unwrap();
    data
}

/// `data` as the device holds it after `flip_every_page_under` over all of
/// it: the lowest bit of each page's first byte flipped.
fn flipped(data: &[u8]) -> Vec<u8> {
    let mut d = data.to_vec();
    for p in (0..d.len()).step_by(PAGE as usize) {
        d[p] ^= 1;
    }
    d
}

/// Pages of `a` and `b` (same length) that differ, by index.
fn differing_pages(a: &[u8], b: &[u8]) -> Vec<usize> {
    a.chunks(PAGE as usize)
        .zip(b.chunks(PAGE as usize))
        .enumerate()
        .filter(|(_, (x, y))| x != y)
        .map(|(i, _)| i)
        .collect()
}

#[test]
fn eviction_really_evicts_a_fresh_256_mib_file() {
    const T: &str = "eviction_really_evicts_a_fresh_256_mib_file";
    let Some(fs) = loop_ext4(T, 320) else {
        return;
    };
    let path = fs.mnt().join("big");
    let len = 256u64 << 20;
    let data = write_file(&path, len as usize);
    let f = File::open(&path).unwrap();
    // Just written: its pages are in the cache (dirty, most of them).
    let before = resident(&f, 0, len).unwrap();
    assert!(before > 0, "a freshly written file should be cached");
    // The device gets a wrong first byte in every page (the file is synced
    // first); the cache keeps the right ones, as far as memory allows (not
    // checked: a page dropped by the kernel, or by a drop_caches elsewhere
    // on the machine, only reads from the device sooner).
    assert_eq!(fs.flip_every_page_under(&f, 0, len).unwrap(), len / PAGE);
    let ev = evict(&f, 0, len).unwrap();
    assert_eq!(ev.pages, len / PAGE);
    assert_eq!(ev.resident, 0, "pages left after eviction: {ev:?}");
    assert_eq!(resident(&f, 0, len).unwrap(), 0, "mincore disagrees");
    // The fact: every page now read comes from the device.
    let mut buf = vec![0u8; len as usize];
    f.read_exact_at(&mut buf, 0).unwrap();
    let want = flipped(&data);
    assert!(
        buf == want,
        "{} of {} pages were still served by the cache after eviction",
        differing_pages(&buf, &want).len(),
        len / PAGE
    );
}

#[test]
fn reading_back_brings_pages_in_and_evicting_a_range_leaves_far_pages() {
    const T: &str = "reading_back_brings_pages_in_and_evicting_a_range_leaves_far_pages";
    let Some(fs) = loop_ext4(T, 64) else {
        return;
    };
    let path = fs.mnt().join("f");
    let pages = 2048u64; // 8 MiB
    let len = pages * PAGE;
    let data = write_file(&path, len as usize);
    let f = File::open(&path).unwrap();
    // Wrong bytes on the device under every page (the file is synced
    // first), so a page read later shows whether the device served it.
    fs.flip_every_page_under(&f, 0, len).unwrap();
    evict(&f, 0, len).unwrap();
    let mut buf = vec![0u8; len as usize];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert!(
        buf == flipped(&data),
        "the read back did not reach the device"
    );
    assert_eq!(resident(&f, 0, len).unwrap(), pages);
    // Flipped back on the device only: now the device holds the right
    // bytes and the cache the wrong ones.
    fs.flip_every_page_under(&f, 0, len).unwrap();
    // An unaligned range covers its partial pages too (pages 10..=14).
    let ev = evict(&f, 10 * PAGE + 100, 4 * PAGE).unwrap();
    assert_eq!(ev.pages, 5);
    assert_eq!(ev.resident, 0);
    assert_eq!(resident(&f, 10 * PAGE, 5 * PAGE).unwrap(), 0);
    f.read_exact_at(&mut buf, 0).unwrap();
    let p = PAGE as usize;
    for page in 10..15 {
        let r = page * p..(page + 1) * p;
        assert!(
            buf[r.clone()] == data[r],
            "page {page} was evicted but not read from the device"
        );
    }
    // Eviction may widen to a large folio's bounds (2 MiB), never further.
    // (mincore, not bytes: those pages are clean, so a drop_caches elsewhere
    // on the machine could drop them in either case.)
    assert_eq!(resident(&f, 1024 * PAGE, 1024 * PAGE).unwrap(), 1024);
}

#[test]
fn device_reads_return_the_device_bytes_at_boundary_sizes() {
    const T: &str = "device_reads_return_the_device_bytes_at_boundary_sizes";
    let Some(fs) = loop_ext4(T, 64) else {
        return;
    };
    let block = 64 * 1024usize;
    for size in [
        0,
        1,
        PAGE as usize - 1,
        block - 1,
        block,
        block + 1,
        3 * block + 123,
    ] {
        let path = fs.mnt().join(format!("f{size}"));
        let data = write_file(&path, size);
        let f = File::options().read(true).write(true).open(&path).unwrap();
        // The device holds a wrong byte in every page, the cache the right
        // ones: device reads must return the device's bytes. Then the right
        // bytes are written again (dirty pages, which nothing but a flush
        // drops; the device keeps the wrong ones) and the cached read must
        // return the cache's.
        fs.flip_every_page_under(&f, 0, size as u64).unwrap();
        let device = flipped(&data);
        for (wanted, expect) in [
            (ReadPath::Direct, &device),
            (ReadPath::Evict, &device),
            (ReadPath::Cached, &data),
        ] {
            if wanted == ReadPath::Cached {
                f.write_all_at(&data, 0).unwrap();
            }
            let mut r = DeviceReader::new(&f, wanted).unwrap();
            assert_eq!(r.path(), wanted, "{wanted}: {:?}", r.fallback());
            let mut buf = AlignedBuf::new(block);
            let mut offset = 0;
            while offset < size {
                let len = (size - offset).min(block);
                let out = r.read(&f, offset as u64, len, &mut buf).unwrap();
                assert!(
                    buf[..len] == expect[offset..offset + len],
                    "{wanted} size {size} at {offset}: pages {:?} are not the {}'s",
                    differing_pages(&buf[..len], &expect[offset..offset + len]),
                    if wanted == ReadPath::Cached {
                        "cache"
                    } else {
                        "device"
                    }
                );
                // The reader's claim agrees with where the bytes came from.
                assert_eq!(
                    out.device,
                    wanted != ReadPath::Cached,
                    "{wanted} size {size} at {offset}: {out:?}"
                );
                offset += len;
            }
        }
    }
}

#[test]
fn an_unaligned_offset_is_read_from_the_device_by_eviction_instead() {
    const T: &str = "an_unaligned_offset_is_read_from_the_device_by_eviction_instead";
    let Some(fs) = loop_ext4(T, 64) else {
        return;
    };
    let path = fs.mnt().join("f");
    let data = write_file(&path, 10_000);
    let f = File::open(&path).unwrap();
    // Wrong bytes on the device (page 1 starts at 4096, inside the range
    // read below); the cache holds the right ones.
    fs.flip_every_page_under(&f, 0, 10_000).unwrap();
    let mut r = DeviceReader::new(&f, ReadPath::Direct).unwrap();
    let mut buf = AlignedBuf::new(8192);
    let out = r.read(&f, 100, 5000, &mut buf).unwrap();
    assert!(
        buf[..5000] == flipped(&data)[100..5100],
        "the unaligned read was not served by the device"
    );
    assert!(out.device);
}

/// A prefetch counts a later read as a device read only where it found
/// the file cold: the device holds a wrong byte in every page, so the
/// bytes read say where they came from.
#[test]
fn a_prefetched_read_counts_as_a_device_read_only_when_the_file_was_cold() {
    const T: &str = "a_prefetched_read_counts_as_a_device_read_only_when_the_file_was_cold";
    let Some(fs) = loop_ext4(T, 64) else {
        return;
    };
    let path = fs.mnt().join("f");
    let size = 40_000usize;
    let data = write_file(&path, size);
    let f = File::open(&path).unwrap();
    fs.flip_every_page_under(&f, 0, size as u64).unwrap();
    let mut buf = AlignedBuf::new(size);
    // Cached (the right bytes): no prefetch, and no cold read.
    let mut r = DeviceReader::new(&f, ReadPath::Evict).unwrap();
    assert!(resident(&f, 0, size as u64).unwrap() > 0);
    assert!(!r.prefetch_if_cold(&f, 0, size as u64).unwrap());
    assert!(r.read_if_cold(&f, 0, size, &mut buf).unwrap().is_none());
    // Evicted: the prefetch brings the device's bytes in, and a read of
    // any part of the range, though its pages are cached by then, counts
    // as a device read; the bytes prove it.
    assert_eq!(evict(&f, 0, size as u64).unwrap().resident, 0);
    let mut r = DeviceReader::new(&f, ReadPath::Evict).unwrap();
    assert!(r.prefetch_if_cold(&f, 0, size as u64).unwrap());
    let out = r
        .read_if_cold(&f, 8192, 20_000, &mut buf)
        .unwrap()
        .expect("a read inside the cold range is a device read");
    assert!(out.device);
    assert!(
        buf[..20_000] == flipped(&data)[8192..28_192],
        "the prefetched read was not the device's bytes"
    );
    // A new reader finds the pages cached now: no prefetch, no cold read.
    let mut r = DeviceReader::new(&f, ReadPath::Evict).unwrap();
    assert!(
        !r.prefetch_if_cold(&f, 0, size as u64).unwrap(),
        "cached now"
    );
    assert!(r.read_if_cold(&f, 0, 4096, &mut buf).unwrap().is_none());
}

#[test]
fn tmpfs_has_no_device() {
    let Some(tmp) = intact_testkit::tmpfs("tmpfs_has_no_device") else {
        return;
    };
    let mut f = tempfile::tempfile_in(tmp.path()).unwrap();
    f.write_all(&[1u8; 10_000]).unwrap();
    let mut r = DeviceReader::new(&f, ReadPath::Evict).unwrap();
    let mut buf = AlignedBuf::new(10_000);
    let out = r.read(&f, 0, 10_000, &mut buf).unwrap();
    assert!(!out.device, "tmpfs claimed a device read");
    assert_eq!(&buf[..10_000], &[1u8; 10_000][..]);
}

#[test]
fn extents_say_where_the_bytes_are_on_the_device() {
    const T: &str = "extents_say_where_the_bytes_are_on_the_device";
    let Some(fs) = loop_ext4(T, 64) else {
        return;
    };
    let path = fs.mnt().join("f");
    let data = write_file(&path, 1 << 20);
    let f = File::open(&path).unwrap();
    f.sync_all().unwrap();
    let ext = extents(&f).unwrap();
    let covered: u64 = ext.iter().filter(|e| e.is_plain()).map(|e| e.length).sum();
    assert!(covered >= 1 << 20, "{ext:?}");
    assert_eq!(ext[0].logical, 0);
    // The fact: the device holds the file's bytes where the extents say.
    let dev = File::options()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(fs.device())
        .unwrap();
    for e in ext.iter().filter(|e| e.is_plain()) {
        let mut buf = AlignedBuf::new(e.length.div_ceil(PAGE) as usize * PAGE as usize);
        dev.read_exact_at(&mut buf, e.physical).unwrap();
        let lo = e.logical as usize;
        let hi = (e.logical + e.length).min(data.len() as u64) as usize;
        assert!(
            buf[..hi - lo] == data[lo..hi],
            "the device does not hold the file's bytes at {e:?}"
        );
    }
}

/// A ramfs mounted for one test (root only), unmounted on every path.
struct Ramfs(tempfile::TempDir);

impl Drop for Ramfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

#[test]
fn on_ramfs_a_reader_neither_evicts_nor_tries_o_direct() {
    const T: &str = "on_ramfs_a_reader_neither_evicts_nor_tries_o_direct";
    if !intact_testkit::is_root() {
        intact_testkit::skip(T, "needs root to mount a ramfs");
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "ramfs", "none"])
        .arg(dir.path())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        intact_testkit::skip(T, "root, but mount -t ramfs failed");
        return;
    }
    let fs = Ramfs(dir);
    let path = fs.0.path().join("f");
    let data = write_file(&path, 10_000);
    let f = File::open(&path).unwrap();
    // ramfs keeps its data in memory: no device to reach, no page can
    // leave, so the reader reads plainly whatever path was asked for, and
    // says so (no O_DIRECT attempt, no eviction and its retries).
    for path in [ReadPath::Direct, ReadPath::Evict] {
        let mut r = DeviceReader::new(&f, path).unwrap();
        assert_eq!(r.path(), ReadPath::Cached, "{path}");
        assert!(r.backing().in_memory());
        assert_eq!(r.fallback(), None);
        let mut buf = AlignedBuf::new(16_384);
        let out = r.read(&f, 0, 10_000, &mut buf).unwrap();
        assert_eq!(&buf[..10_000], &data[..]);
        assert_eq!(out.evict_time, std::time::Duration::ZERO);
        assert_eq!(out.resident, 0);
        assert!(!out.device);
    }
    let mut r = DeviceReader::new(&f, ReadPath::Evict).unwrap();
    let mut buf = AlignedBuf::new(16_384);
    let out = r.read(&f, 0, 10_000, &mut buf).unwrap();
    // The test mounted a ramfs, which has no device: the read cannot
    // count as a device read.
    assert!(!out.device);
}

#[test]
fn a_loop_device_counts_the_bytes_written_to_it_and_tmpfs_has_no_counter() {
    const T: &str = "a_loop_device_counts_the_bytes_written_to_it_and_tmpfs_has_no_counter";
    let Some(fs) = loop_ext4(T, 64) else {
        return;
    };
    let path = fs.mnt().join("f");
    let f = File::create(&path).unwrap();
    let c = DeviceCounter::for_file(&f).unwrap().expect("a loop device");
    // The counter is the loop device's, the one the test made.
    assert_eq!(format!("/dev/{}", c.name()), fs.device());
    assert_eq!(c.capacity(), 64 << 20);
    let before = c.bytes_written().unwrap();
    (&f).write_all(&intact_sample::bytes(4 << 20, 3)).unwrap();
    f.sync_all().unwrap();
    let after = c.bytes_written().unwrap();
    assert_eq!(c.disks(), [c.name()], "a loop device is its own disk");
    assert!(
        after[0] - before[0] >= 4 << 20,
        "4 MiB written and synced, the device counted {}",
        after[0] - before[0]
    );
    drop(f);
    fs.close().unwrap();
    let Some(tmp) = intact_testkit::tmpfs(T) else {
        return;
    };
    let f = tempfile::tempfile_in(tmp.path()).unwrap();
    assert!(DeviceCounter::for_file(&f).unwrap().is_none());
}
