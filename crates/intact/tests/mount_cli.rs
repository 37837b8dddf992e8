//! `intact mount` as programs use it: reads and writes through a real FUSE
//! mount, faults flipped on a loop device's ext4 under cataloged files,
//! and the catalog the mount leaves held against the bytes by `intact
//! scrub` afterwards (an independent check: it re-reads from the device).
//! Root only (FUSE mounts, loop devices).

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use intact_faults::LoopFs;

mod common;
use common::{intact_in, s, stderr, stdout};

/// Whether FUSE mounts can be made here (else a loud skip).
fn fuse_usable(test: &str) -> bool {
    if !intact_testkit::is_root() {
        intact_testkit::skip(test, "FUSE mounts need root here (no fusermount3)");
        return false;
    }
    if !Path::new("/dev/fuse").exists() {
        intact_testkit::skip(test, "no /dev/fuse");
        return false;
    }
    true
}

fn loop_ext4(test: &str) -> Option<LoopFs> {
    if let Err(why) = intact_faults::usable() {
        intact_testkit::skip(test, &why);
        return None;
    }
    Some(LoopFs::new(Path::new(env!("CARGO_TARGET_TMPDIR")), 64).unwrap())
}

/// `intact mount ROOT MNT` running; unmounted (and waited for) on drop.
struct Mount {
    child: Option<Child>,
    mnt: PathBuf,
    log: PathBuf,
}

fn dev_of(p: &Path) -> u64 {
    fs::metadata(p).map(|m| m.dev()).unwrap_or(0)
}

impl Mount {
    fn start(state: &Path, root: &Path, mnt: &Path, extra: &[&str]) -> Mount {
        fs::create_dir_all(mnt).unwrap();
        let log = mnt.with_extension("log");
        let child = Command::new(env!("CARGO_BIN_EXE_intact"))
            .args(["mount", "--json", s(root), s(mnt)])
            .args(extra)
            .env("XDG_STATE_HOME", state)
            .stdout(File::create(mnt.with_extension("out")).unwrap())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut m = Mount {
            child: Some(child),
            mnt: mnt.to_path_buf(),
            log,
        };
        let parent = dev_of(mnt.parent().unwrap());
        let deadline = Instant::now() + Duration::from_secs(20);
        while dev_of(mnt) == parent {
            if let Some(st) = m.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("intact mount ended ({st}): {}", m.log());
            }
            assert!(Instant::now() < deadline, "not mounted: {}", m.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Unmounts and returns the exit code and the JSON report.
    fn stop(mut self) -> (Option<i32>, serde_json::Value) {
        let code = self.unmount();
        let out = fs::read(self.mnt.with_extension("out")).unwrap();
        let v = serde_json::from_slice(&out)
            .unwrap_or_else(|e| panic!("{e}: {:?} {}", String::from_utf8_lossy(&out), self.log()));
        (code, v)
    }

    fn unmount(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while child.try_wait().unwrap().is_none() {
            let _ = Command::new("umount")
                .arg(&self.mnt)
                .stderr(Stdio::null())
                .status();
            if Instant::now() > deadline {
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
                let _ = child.kill();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        child.wait().unwrap().code()
    }

    /// Kills the mount process (SIGKILL: no unmount, no commit), then
    /// detaches the dead mount.
    fn crash(mut self) {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        let st = Command::new("umount")
            .arg("-l")
            .arg(&self.mnt)
            .status()
            .unwrap();
        assert!(st.success());
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.unmount();
    }
}

/// A cataloged `f` of `len` bytes under `root` on a fresh loop ext4.
struct OnLoop {
    lfs: LoopFs,
    t: tempfile::TempDir,
    state: PathBuf,
    root: PathBuf,
    data: Vec<u8>,
}

fn on_loop(test: &str, len: usize) -> Option<OnLoop> {
    let lfs = loop_ext4(test)?;
    let t = tempfile::tempdir().unwrap();
    let (state, root) = (t.path().join("state"), lfs.mnt().join("root"));
    let data = cataloged(t.path(), &state, &root, len);
    Some(OnLoop {
        lfs,
        t,
        state,
        root,
        data,
    })
}

/// `src/f` (seeded bytes of `len`) copied into `root` by `intact copy`
/// (riva, 64 KiB blocks); returns the bytes.
fn cataloged(t: &Path, state: &Path, root: &Path, len: usize) -> Vec<u8> {
    let src = t.join("src");
    fs::create_dir_all(&src).unwrap();
    let data = intact_sample::bytes(len, 11);
    fs::write(src.join("f"), &data).unwrap();
    let o = intact_in(
        state,
        &[
            "copy",
            "--block-size",
            "64KiB",
            &format!("{}/", s(&src)),
            s(root),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    data
}

fn status(state: &Path, root: &Path) -> serde_json::Value {
    let o = intact_in(state, &["status", "--json", s(root)]);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn scrub_is_clean(state: &Path, root: &Path) {
    let o = intact_in(state, &["scrub", s(root)]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "scrub: {}{}",
        stdout(&o),
        stderr(&o)
    );
    assert!(stdout(&o).contains(" 0 rotten"), "{}", stdout(&o));
}

fn eio(r: std::io::Result<usize>) -> bool {
    matches!(r, Err(e) if e.raw_os_error() == Some(libc::EIO))
}

const PAGE: u64 = 4096;

#[test]
fn a_flipped_bit_on_the_device_fails_only_its_page_and_status_counts_it() {
    let test = "a_flipped_bit_on_the_device_fails_only_its_page_and_status_counts_it";
    if !fuse_usable(test) {
        return;
    }
    let len = 40 * PAGE as usize + 123;
    let Some(OnLoop {
        lfs,
        t,
        state,
        root,
        data,
    }) = on_loop(test, len)
    else {
        return;
    };
    // The fault: one bit of page 5 on the device, the page cache dropped.
    let under = File::open(root.join("f")).unwrap();
    let at = 5 * PAGE + 10;
    lfs.flip_bit_under(&under, at).unwrap();
    intact_cache::evict(&under, 0, len as u64).unwrap();
    assert_ne!(
        lfs.device_byte_under(&under, at).unwrap(),
        data[at as usize],
        "the device holds the flipped bit"
    );

    let mnt = t.path().join("mnt");
    let m = Mount::start(&state, &root, &mnt, &[]);
    let f = File::open(mnt.join("f")).unwrap();
    let mut page = vec![0u8; PAGE as usize];
    assert!(eio(f.read_at(&mut page, 5 * PAGE)), "page 5 refused");
    // A read across it gets the good bytes before it (a short read, as
    // the kernel reads page by page) or EIO; never a byte of page 5.
    let mut two = [0u8; 20];
    match f.read_at(&mut two, 5 * PAGE - 10) {
        Ok(n) => {
            assert!(n <= 10, "{n} bytes, some from the bad page");
            let lo = 5 * PAGE as usize - 10;
            assert_eq!(&two[..n], &data[lo..lo + n]);
        }
        r => assert!(eio(r), "a read across it"),
    }
    // Every other page reads right.
    for p in (0..41u64).filter(|&p| p != 5) {
        let n = f.read_at(&mut page, p * PAGE).unwrap();
        let lo = (p * PAGE) as usize;
        assert_eq!(&page[..n], &data[lo..(lo + n)], "page {p}");
    }
    drop(f);
    let (code, report) = m.stop();
    assert_eq!(code, Some(1), "a bad page refused is a failure");
    assert!(report["bad_pages"].as_u64().unwrap() >= 1, "{report}");
    // One bad page, however often the kernel asked for it.
    let v = status(&state, &root);
    assert_eq!(v["mount_bad_pages"], 1, "{v}");
    assert_eq!(v["mount_bad_bytes"], PAGE, "{v}");
    assert_eq!(report["bad_pages"], 1, "{report}");
}

#[test]
fn an_application_that_ignores_a_failed_write_gets_the_error_at_fsync() {
    let test = "an_application_that_ignores_a_failed_write_gets_the_error_at_fsync";
    if !fuse_usable(test) {
        return;
    }
    let len = 8 * PAGE as usize;
    let Some(OnLoop {
        lfs,
        t,
        state,
        root,
        data,
    }) = on_loop(test, len)
    else {
        return;
    };
    let under = File::open(root.join("f")).unwrap();
    lfs.flip_bit_under(&under, 3).unwrap();
    intact_cache::evict(&under, 0, len as u64).unwrap();

    let mnt = t.path().join("mnt");
    let m = Mount::start(&state, &root, &mnt, &[]);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(mnt.join("f"))
        .unwrap();
    let reader = File::open(mnt.join("f")).unwrap();
    // Part of page 0: read-verify-modify-write finds the flip.
    let ignored = f.write_at(b"0123456789", 100);
    let why = format!("{ignored:?}");
    assert!(eio(ignored), "{why}");
    // Another program's close does not take the error away.
    drop(reader);
    // Nor does the close of a copy of the writer's own descriptor (what a
    // child forked by another thread and exec'd closes): that close is
    // told, and the error stays owed.
    use std::os::fd::AsRawFd;
    // SAFETY: a new descriptor of `f`'s open file, closed at once.
    let closed = unsafe {
        let copy = libc::dup(f.as_raw_fd());
        assert!(copy >= 0);
        libc::close(copy)
    };
    let err = std::io::Error::last_os_error();
    assert_eq!(
        (closed, err.raw_os_error()),
        (-1, Some(libc::EIO)),
        "{}",
        m.log()
    );
    let synced = f.sync_all();
    assert_eq!(
        synced.as_ref().err().and_then(|e| e.raw_os_error()),
        Some(libc::EIO),
        "{synced:?}: {}",
        m.log()
    );
    drop(f);
    drop(m);
    // Nothing of the refused write reached the file.
    intact_cache::evict(&under, 0, len as u64).unwrap();
    let mut b = [0u8; 10];
    under.read_exact_at(&mut b, 100).unwrap();
    assert_eq!(&b, &data[100..110]);
}

#[test]
fn cached_pages_are_checked_again_after_t_switch() {
    let test = "cached_pages_are_checked_again_after_t_switch";
    if !fuse_usable(test) {
        return;
    }
    let len = 4 * PAGE as usize;
    let Some(OnLoop {
        lfs,
        t,
        state,
        root,
        data,
    }) = on_loop(test, len)
    else {
        return;
    };
    let mnt = t.path().join("mnt");
    let m = Mount::start(&state, &root, &mnt, &["--t-switch", "1500ms"]);
    let mut page = vec![0u8; PAGE as usize];
    let f = File::open(mnt.join("f")).unwrap();
    f.read_exact_at(&mut page, PAGE).unwrap();
    assert_eq!(&page[..], &data[PAGE as usize..2 * PAGE as usize]);
    // Rot under it now: the device changes, the mount's cache does not.
    let under = File::open(root.join("f")).unwrap();
    lfs.flip_bit_under(&under, PAGE + 7).unwrap();
    intact_cache::evict(&under, 0, len as u64).unwrap();
    let t0 = Instant::now();
    f.read_exact_at(&mut page, PAGE).unwrap();
    assert_eq!(
        &page[..],
        &data[PAGE as usize..2 * PAGE as usize],
        "before t_switch the page comes from the mount's cache"
    );
    // After t_switch the cached page is dropped and read again: refused.
    let mut refused = false;
    while t0.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(250));
        if eio(f.read_at(&mut page, PAGE)) {
            refused = true;
            break;
        }
    }
    assert!(refused, "still served after 15 s: {}", m.log());
    assert!(
        t0.elapsed() >= Duration::from_millis(1000),
        "refused before t_switch could pass"
    );
    drop(f);
    let (_, report) = m.stop();
    assert!(
        report["cache_invalidations"].as_u64().unwrap() >= 1,
        "{report}"
    );
    assert!(
        report["t_switch_why"]
            .as_str()
            .unwrap()
            .contains("--t-switch"),
        "{report}"
    );
}

/// Offsets at every boundary: pages (4 KiB), blocks (64 KiB), the end.
fn boundaries(len: u64) -> Vec<u64> {
    let mut v = Vec::new();
    for base in [0, PAGE, 65_536, 2 * 65_536, len] {
        for d in [-1i64, 0, 1, 4095, 4096, 4097] {
            let o = base as i64 + d;
            if o >= 0 {
                v.push(o as u64);
            }
        }
    }
    v.sort_unstable();
    v.dedup();
    v
}

#[test]
fn unaligned_reads_and_writes_at_every_boundary_match_a_model_and_scrub_clean() {
    let test = "unaligned_reads_and_writes_at_every_boundary_match_a_model_and_scrub_clean";
    if !fuse_usable(test) {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (state, root) = (t.path().join("state"), t.path().join("root"));
    let len = 3 * 65_536 + 5_000;
    let mut model = cataloged(t.path(), &state, &root, len);
    let mnt = t.path().join("mnt");
    let m = Mount::start(&state, &root, &mnt, &[]);
    // O_DIRECT: each read and write reaches the mount exactly as made,
    // unaligned, past the kernel's page cache.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(mnt.join("f"))
        .unwrap();
    let lens = [1usize, 4095, 4096, 4097, 65_539];
    let mut seed = 1u64;
    for o in boundaries(len as u64) {
        for &n in &lens {
            let mut got = vec![0u8; n];
            let k = f.read_at(&mut got, o).unwrap();
            let lo = (o as usize).min(model.len());
            let hi = (o as usize + n).min(model.len());
            assert_eq!(&got[..k], &model[lo..hi], "read {o}+{n}");
        }
    }
    for o in boundaries(len as u64) {
        for &n in &lens {
            seed += 1;
            let d = intact_sample::bytes(n, seed);
            f.write_all_at(&d, o).unwrap();
            let end = o as usize + n;
            if model.len() < end {
                model.resize(end, 0);
            }
            model[o as usize..end].copy_from_slice(&d);
        }
    }
    f.sync_all().unwrap();
    let mut all = vec![0u8; model.len() + 10];
    let k = f.read_at(&mut all, 0).unwrap();
    assert_eq!(k, model.len());
    assert_eq!(&all[..k], &model[..], "the whole file");
    drop(f);
    let (code, _) = m.stop();
    assert_eq!(code, Some(0));
    assert_eq!(fs::read(root.join("f")).unwrap(), model, "on disk");
    scrub_is_clean(&state, &root);
    let v = status(&state, &root);
    assert_eq!(v["written_through_mount"], 1, "{v}");
}

#[test]
fn names_sizes_and_attributes_changed_through_the_mount_keep_the_catalog_right() {
    let test = "names_sizes_and_attributes_changed_through_the_mount_keep_the_catalog_right";
    if !fuse_usable(test) {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (state, root) = (t.path().join("state"), t.path().join("root"));
    let data = cataloged(t.path(), &state, &root, 100_000);
    let mnt = t.path().join("mnt");
    let m = Mount::start(&state, &root, &mnt, &[]);
    assert!(
        !mnt.join(".intact").exists() && fs::read_dir(&mnt).unwrap().count() == 1,
        "only f is shown"
    );
    // Checksums as attributes.
    let b3 = blake3::hash(&data).to_hex().to_string();
    assert_eq!(xattr(&mnt.join("f"), "user.intact.blake3"), Some(b3));
    assert_eq!(
        xattr(&mnt.join("f"), "user.intact.state").unwrap(),
        "cataloged"
    );
    let level = xattr(&mnt.join("f"), "user.intact.level").unwrap();
    assert!(["device", "cache"].contains(&level.as_str()), "{level}");
    assert_eq!(
        set_xattr(&mnt.join("f"), "user.intact.level"),
        Some(libc::EPERM)
    );

    // Create, write, rename over, truncate, mkdir, unlink.
    fs::create_dir(mnt.join("d")).unwrap();
    fs::write(mnt.join("d/new"), intact_sample::bytes(70_000, 3)).unwrap();
    fs::rename(mnt.join("f"), mnt.join("d/g")).unwrap();
    let g = OpenOptions::new()
        .write(true)
        .open(mnt.join("d/g"))
        .unwrap();
    g.set_len(50_001).unwrap();
    drop(g);
    fs::write(mnt.join("gone"), b"x").unwrap();
    fs::remove_file(mnt.join("gone")).unwrap();
    assert_eq!(
        xattr(&mnt.join("d/g"), "user.intact.level").unwrap(),
        "none"
    );
    assert_eq!(xattr(&mnt.join("d/g"), "user.intact.blake3"), None);
    // While mounted the catalog is the mount's: status says so at once.
    let t0 = Instant::now();
    let o = intact_in(&state, &["status", s(&root)]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("in use by another intact process"),
        "{}",
        stderr(&o)
    );
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "not after SQLite's wait"
    );
    let (code, _) = m.stop();
    assert_eq!(code, Some(0));

    assert_eq!(fs::read(root.join("d/g")).unwrap(), &data[..50_001]);
    scrub_is_clean(&state, &root);
    let v = status(&state, &root);
    assert_eq!(v["files"], 2, "d/g and d/new, not f or gone: {v}");
    assert_eq!(v["written_through_mount"], 2, "{v}");

    // Read-only: no change gets through.
    let m = Mount::start(&state, &root, &mnt, &["--read-only"]);
    let r = fs::write(mnt.join("d/g"), b"no");
    assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EROFS));
    // A second mount of the same root is refused at once.
    let o = intact_in(&state, &["mount", s(&root), s(&t.path().join("other"))]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    drop(m);
}

#[test]
fn a_mount_killed_mid_write_leaves_a_catalog_that_the_next_command_reconciles() {
    let test = "a_mount_killed_mid_write_leaves_a_catalog_that_the_next_command_reconciles";
    if !fuse_usable(test) {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (state, root, log) = killed_mid_write(t.path());
    // The next command reconciles the log, and the catalog holds.
    scrub_is_clean(&state, &root);
    assert_eq!(fs::metadata(&log).unwrap().len(), 0, "the log is emptied");
}

#[test]
fn reconciling_a_killed_mounts_log_never_vouches_for_rot_beside_a_logged_page() {
    let test = "reconciling_a_killed_mounts_log_never_vouches_for_rot_beside_a_logged_page";
    if !fuse_usable(test) {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (state, root, _) = killed_mid_write(t.path());
    // Rot in page 0, which no write touched, of block 0, which the log
    // names (page 2 was written): the mtime kept, as rot leaves it.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(root.join("f"))
        .unwrap();
    let was = f.metadata().unwrap().modified().unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, 10).unwrap();
    f.write_all_at(&[b[0] ^ 1], 10).unwrap();
    f.set_modified(was).unwrap();
    drop(f);
    let o = intact_in(&state, &["scrub", "--json", s(&root)]);
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rot = &v["reports"][0]["rot"];
    assert_eq!(rot[0]["offset"], 0, "{v}");
    assert_eq!(rot[0]["len"], PAGE, "only page 0: {v}");
}

/// The writes of [`killed_mid_write`]: offset, length, seed.
const CRASH_WRITES: [(u64, usize, u64); 3] = [(8192, 4096, 5), (70_000, 100, 6), (299_990, 50, 7)];

/// What the writer process prints once its writes were acknowledged.
const WRITTEN: &str = "intact crash-test writer: written";

/// Names the file [`writer_process_of_the_crash_tests`] writes, in the
/// process [`Writer::start`] starts.
const WRITER_ENV: &str = "INTACT_TEST_CRASH_WRITER";

/// Not a check: in a process of its own that [`Writer::start`] starts
/// (this test binary, running only this), writes [`CRASH_WRITES`] into
/// the file named by [`WRITER_ENV`], says [`WRITTEN`], and keeps the file
/// open until killed. Without the variable (a normal run) it does nothing.
#[test]
fn writer_process_of_the_crash_tests() {
    use std::io::Write;
    let Some(path) = std::env::var_os(WRITER_ENV) else {
        return;
    };
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    for (o, n, seed) in CRASH_WRITES {
        f.write_all_at(&intact_sample::bytes(n, seed), o).unwrap();
    }
    // On a line of its own: the harness prints "test NAME ... " before it.
    println!("\n{WRITTEN}");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(3600));
}

/// The writer process, killed (with its open file) when dropped.
struct Writer(Child);

impl Writer {
    /// Starts it on `file` and waits until its writes were acknowledged.
    fn start(file: &Path) -> Writer {
        use std::io::BufRead;
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "writer_process_of_the_crash_tests",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(WRITER_ENV, file)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut w = Writer(child);
        let written = out.lines().map_while(Result::ok).any(|l| l == WRITTEN);
        if !written {
            let st = w.0.wait().unwrap();
            panic!("the writer process ended without writing ({st})");
        }
        w
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A cataloged `f` under `root`, written through a mount (pages 2 of
/// block 0, part of block 1, past the end) and the mount killed before
/// any fsync or close; returns the state, the root and the intent log.
fn killed_mid_write(t: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let t = t.to_path_buf();
    let (state, root) = (t.join("state"), t.join("root"));
    let mut model = cataloged(&t, &state, &root, 300_000);
    let mnt = t.join("mnt");
    let m = Mount::start(&state, &root, &mnt, &[]);
    // The writes come from a process of their own that stays open: the
    // kernel sends the mount a flush (a commit) at every close of a
    // descriptor of the file, and a descriptor held here would be closed
    // by every child another test's thread forks and execs meanwhile.
    let writer = Writer::start(&mnt.join("f"));
    for (o, n, seed) in CRASH_WRITES {
        let d = intact_sample::bytes(n, seed);
        let end = o as usize + n;
        if model.len() < end {
            model.resize(end, 0);
        }
        model[o as usize..end].copy_from_slice(&d);
    }
    // Acknowledged, neither fsynced nor closed: the catalog still holds
    // the old CRCs, the intent log the new ones.
    let log = walkdir::WalkDir::new(&state)
        .into_iter()
        .filter_map(Result::ok)
        .find(|e| e.file_name() == "mount-intents")
        .expect("an intent log")
        .into_path();
    assert!(fs::metadata(&log).unwrap().len() > 0);
    m.crash();
    drop(writer);
    assert_eq!(fs::read(root.join("f")).unwrap(), model, "the bytes landed");
    let journal = intact_transfer::Journal::open_in(log.parent().unwrap()).unwrap();
    let row = journal.lookup(b"f").unwrap().unwrap();
    let pages = journal.blocks(row.id).unwrap()[0].pages.clone().unwrap();
    let crc2 = u32::from_le_bytes(pages[8..12].try_into().unwrap());
    assert_ne!(
        crc2,
        intact_digest::page_crc(&model[8192..12288]),
        "the catalog was not told before the crash"
    );
    drop(journal);
    (state, root, log)
}

#[derive(Debug, Clone)]
enum Op {
    Write(u64, usize, u64),
    Read(u64, usize),
    Truncate(u64),
    Sync,
    Reopen,
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    let offset = prop_oneof![
        (0u64..5, prop::sample::select(vec![0i64, 1, -1, 4095, 4097])).prop_map(|(k, d)| (k as i64
            * 65_536
            + d)
            .max(0)
            as u64),
        0u64..200_000,
    ];
    prop_oneof![
        4 => (offset.clone(), 0usize..70_000, any::<u64>()).prop_map(|(o, n, s)| Op::Write(o, n, s)),
        3 => (offset.clone(), 0usize..70_000).prop_map(|(o, n)| Op::Read(o, n)),
        1 => offset.prop_map(Op::Truncate),
        1 => Just(Op::Sync),
        1 => Just(Op::Reopen),
    ]
}

fn open_rw(p: &Path, direct: bool) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .custom_flags(if direct { libc::O_DIRECT } else { 0 })
        .open(p)
        .unwrap()
}

#[test]
fn random_reads_and_writes_through_the_mount_match_a_plain_file() {
    let test = "random_reads_and_writes_through_the_mount_match_a_plain_file";
    if !fuse_usable(test) {
        return;
    }
    use proptest::test_runner::{Config, TestCaseError, TestRunner};
    let t = tempfile::tempdir().unwrap();
    let (state, root) = (t.path().join("state"), t.path().join("root"));
    cataloged(t.path(), &state, &root, 1000);
    let plain = t.path().join("plain");
    fs::create_dir_all(&plain).unwrap();
    let mnt = t.path().join("mnt");
    let m = Mount::start(&state, &root, &mnt, &[]);
    let case = std::sync::atomic::AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 24,
        failure_persistence: None,
        ..Config::default()
    });
    let r = runner.run(
        &(proptest::collection::vec(op(), 1..30), proptest::bool::ANY),
        |(ops, direct)| {
            let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            let name = format!("case{n}");
            let (a, b) = (mnt.join(&name), plain.join(&name));
            let (mut fa, mut fb) = (open_rw(&a, direct), open_rw(&b, false));
            for op in ops {
                match op {
                    Op::Write(o, n, seed) => {
                        let d = intact_sample::bytes(n, seed);
                        fa.write_all_at(&d, o).unwrap();
                        fb.write_all_at(&d, o).unwrap();
                    }
                    Op::Read(o, n) => {
                        let (mut x, mut y) = (vec![0u8; n], vec![0u8; n]);
                        let k = fa.read_at(&mut x, o).unwrap();
                        let l = fb.read_at(&mut y, o).unwrap();
                        if (k, &x[..k]) != (l, &y[..l]) {
                            return Err(TestCaseError::fail(format!(
                                "read {o}+{n}: {k} vs {l} bytes"
                            )));
                        }
                    }
                    Op::Truncate(s) => {
                        fa.set_len(s).unwrap();
                        fb.set_len(s).unwrap();
                    }
                    Op::Sync => fa.sync_all().unwrap(),
                    Op::Reopen => {
                        (fa, fb) = (open_rw(&a, direct), open_rw(&b, false));
                    }
                }
            }
            drop((fa, fb));
            // As stored under the root, not as the mount's cache has it.
            if fs::read(root.join(&name)).unwrap() != fs::read(&b).unwrap() {
                return Err(TestCaseError::fail("the files differ"));
            }
            Ok(())
        },
    );
    let (code, _) = m.stop();
    r.unwrap();
    assert_eq!(code, Some(0));
    // Every file the cases left, as the catalog describes it.
    scrub_is_clean(&state, &root);
    let n = case.into_inner();
    assert_eq!(
        status(&state, &root)["written_through_mount"],
        n,
        "every case's file"
    );
}

fn xattr(p: &Path, name: &str) -> Option<String> {
    use std::ffi::CString;
    let (cp, cn) = (
        CString::new(p.to_str().unwrap()).unwrap(),
        CString::new(name).unwrap(),
    );
    let mut buf = vec![0u8; 256];
    // SAFETY: valid C strings and a buffer of the length given.
    let n = unsafe { libc::getxattr(cp.as_ptr(), cn.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (n >= 0).then(|| String::from_utf8_lossy(&buf[..n as usize]).into_owned())
}

/// Tries to set `name`; the errno it fails with.
fn set_xattr(p: &Path, name: &str) -> Option<i32> {
    use std::ffi::CString;
    let (cp, cn) = (
        CString::new(p.to_str().unwrap()).unwrap(),
        CString::new(name).unwrap(),
    );
    // SAFETY: valid C strings and a value of the length given.
    let r = unsafe { libc::setxattr(cp.as_ptr(), cn.as_ptr(), b"x".as_ptr().cast(), 1, 0) };
    (r != 0).then(|| std::io::Error::last_os_error().raw_os_error().unwrap())
}
