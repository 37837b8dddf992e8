//! Eviction, device reads and extents on the disk under the build tree.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use intact_cache::{backing, evict, extents, resident, DeviceReader, ReadPath, PAGE};
use intact_digest::AlignedBuf;

/// A directory on the disk that holds the build (not tmpfs), or None with
/// a loud line when that disk has no device under it.
fn disk_dir(test: &str) -> Option<tempfile::TempDir> {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let probe = File::create(dir.path().join("probe")).unwrap();
    let b = backing(&probe).unwrap();
    if !b.has_device() {
        eprintln!(
            "SKIP {test}: the build tree is on {} (no device to evict to)",
            b.fs()
        );
        return None;
    }
    Some(dir)
}

fn write_file(path: &PathBuf, len: usize) -> Vec<u8> {
    let data = intact_sample::bytes(len, 7);
    let mut f = File::create(path).unwrap();
    f.write_all(&data).unwrap();
    data
}

#[test]
fn eviction_really_evicts_a_fresh_256_mib_file() {
    let Some(dir) = disk_dir("eviction_really_evicts_a_fresh_256_mib_file") else {
        return;
    };
    let path = dir.path().join("big");
    let len = 256u64 << 20;
    write_file(&path, len as usize);
    let f = File::open(&path).unwrap();
    // Just written: its pages are in the cache (dirty, most of them).
    let before = resident(&f, 0, len).unwrap();
    assert!(before > 0, "a freshly written file should be cached");
    let ev = evict(&f, 0, len).unwrap();
    assert_eq!(ev.pages, len / PAGE);
    assert_eq!(ev.resident, 0, "pages left after eviction: {ev:?}");
    assert_eq!(resident(&f, 0, len).unwrap(), 0, "mincore disagrees");
}

#[test]
fn reading_back_brings_pages_in_and_evicting_a_range_leaves_far_pages() {
    let Some(dir) = disk_dir("evicting_a_range_leaves_far_pages") else {
        return;
    };
    let path = dir.path().join("f");
    let pages = 2048u64; // 8 MiB
    write_file(&path, (pages * PAGE) as usize);
    let f = File::open(&path).unwrap();
    evict(&f, 0, pages * PAGE).unwrap();
    let mut buf = vec![0u8; (pages * PAGE) as usize];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(resident(&f, 0, pages * PAGE).unwrap(), pages);
    // An unaligned range covers its partial pages too.
    let ev = evict(&f, 10 * PAGE + 100, 4 * PAGE).unwrap();
    assert_eq!(ev.pages, 5);
    assert_eq!(ev.resident, 0);
    assert_eq!(resident(&f, 10 * PAGE, 5 * PAGE).unwrap(), 0);
    // Eviction may widen to a large folio's bounds (2 MiB), never further.
    assert_eq!(resident(&f, 1024 * PAGE, 1024 * PAGE).unwrap(), 1024);
}

#[test]
fn device_reads_return_the_bytes_at_boundary_sizes() {
    let Some(dir) = disk_dir("device_reads_return_the_bytes_at_boundary_sizes") else {
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
        let path = dir.path().join(format!("f{size}"));
        let data = write_file(&path, size);
        let f = File::options().read(true).write(true).open(&path).unwrap();
        for wanted in [ReadPath::Evict, ReadPath::Direct, ReadPath::Cached] {
            let mut r = DeviceReader::new(&f, wanted).unwrap();
            let mut buf = AlignedBuf::new(block);
            let mut offset = 0;
            while offset < size {
                let len = (size - offset).min(block);
                let out = r.read(&f, offset as u64, len, &mut buf).unwrap();
                assert_eq!(
                    &buf[..len],
                    &data[offset..offset + len],
                    "{wanted} at {offset}"
                );
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
fn an_unaligned_offset_is_read_by_eviction_instead() {
    let Some(dir) = disk_dir("an_unaligned_offset_is_read_by_eviction_instead") else {
        return;
    };
    let path = dir.path().join("f");
    let data = write_file(&path, 10_000);
    let f = File::open(&path).unwrap();
    let mut r = DeviceReader::new(&f, ReadPath::Direct).unwrap();
    let mut buf = AlignedBuf::new(8192);
    let out = r.read(&f, 100, 5000, &mut buf).unwrap();
    assert_eq!(&buf[..5000], &data[100..5100]);
    assert!(out.device);
}

#[test]
fn tmpfs_has_no_device() {
    let Ok(f) = tempfile::tempfile_in("/dev/shm") else {
        eprintln!("SKIP tmpfs_has_no_device: no /dev/shm here");
        return;
    };
    let mut f = f;
    f.write_all(&[1u8; 10_000]).unwrap();
    let mut r = DeviceReader::new(&f, ReadPath::Evict).unwrap();
    let mut buf = AlignedBuf::new(10_000);
    let out = r.read(&f, 0, 10_000, &mut buf).unwrap();
    assert!(!out.device, "tmpfs claimed a device read");
    assert_eq!(&buf[..10_000], &[1u8; 10_000][..]);
}

#[test]
fn extents_cover_a_synced_file() {
    let Some(dir) = disk_dir("extents_cover_a_synced_file") else {
        return;
    };
    let path = dir.path().join("f");
    write_file(&path, 1 << 20);
    let f = File::open(&path).unwrap();
    let ext = match extents(&f) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("SKIP extents_cover_a_synced_file: FIEMAP not supported here: {e}");
            return;
        }
    };
    let covered: u64 = ext.iter().filter(|e| e.is_plain()).map(|e| e.length).sum();
    assert!(covered >= 1 << 20, "{ext:?}");
    assert_eq!(ext[0].logical, 0);
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
fn direct_falls_back_to_eviction_where_o_direct_is_refused() {
    // SAFETY: no arguments, no memory.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP direct_falls_back_to_eviction: needs root to mount a ramfs");
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "ramfs", "none"])
        .arg(dir.path())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("SKIP direct_falls_back_to_eviction: cannot mount a ramfs here");
        return;
    }
    let fs = Ramfs(dir);
    let path = fs.0.path().join("f");
    let data = write_file(&path, 10_000);
    let f = File::open(&path).unwrap();
    // ramfs refuses O_DIRECT: the reader says so and reads by eviction.
    let mut r = DeviceReader::new(&f, ReadPath::Direct).unwrap();
    assert_eq!(r.path(), ReadPath::Evict);
    assert!(
        r.fallback().unwrap().contains("O_DIRECT"),
        "{:?}",
        r.fallback()
    );
    let mut buf = AlignedBuf::new(16_384);
    let out = r.read(&f, 0, 10_000, &mut buf).unwrap();
    assert_eq!(&buf[..10_000], &data[..]);
    // And ramfs has no device: the read cannot count as one.
    assert!(!out.device);
    assert!(!r.backing().has_device());
}
