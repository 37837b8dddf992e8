//! Device-level verification over the network: a server in this process
//! (so that a fault hook can sit in its receiver), `send` as the client.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use intact_transfer::{
    send, CopyReport, LocalServer, ReceiveOptions, SendOptions, ServerConfig, VerifyLevel,
    VerifyMode, WriteHook,
};

const BS: usize = 256 * 1024;

/// Runs a server on 127.0.0.1:0 rooted at `root` for the length of `f`.
fn with_server<T>(root: &Path, hook: Option<WriteHook>, f: impl FnOnce(String) -> T) -> T {
    let server = LocalServer::start(ServerConfig {
        receive: ReceiveOptions {
            after_write: hook,
            after_check: None,
            ..ReceiveOptions::default()
        },
        ..ServerConfig::local(root)
    })
    .unwrap();
    let out = f(server.addr());
    server.stop().unwrap();
    out
}

fn opts(verify: VerifyMode, require: Option<VerifyLevel>) -> SendOptions {
    SendOptions {
        verify,
        block_size: BS,
        streams: 2,
        retries: 2,
        require_level: require,
        ..SendOptions::default()
    }
}

fn source(dir: &Path, files: usize, size: usize) -> Vec<PathBuf> {
    let src = dir.join("src");
    fs::create_dir_all(&src).unwrap();
    for i in 0..files {
        fs::write(
            src.join(format!("f{i}")),
            intact_sample::bytes(size, i as u64),
        )
        .unwrap();
    }
    vec![src]
}

fn files(r: &CopyReport) -> impl Iterator<Item = &intact_transfer::FileReport> {
    r.files.iter().filter(|f| f.kind == "file")
}

#[test]
fn a_tmpfs_destination_reaches_only_cache_and_require_level_device_fails_there() {
    // A tmpfs the test mounted (root) or saw to be one (/dev/shm).
    let Some(tmp) = intact_testkit::tmpfs(
        "a_tmpfs_destination_reaches_only_cache_and_require_level_device_fails_there",
    ) else {
        return;
    };
    let root = tempfile::tempdir_in(tmp.path()).unwrap();
    let src_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let src = source(src_dir.path(), 3, BS + 10);
    let r = with_server(root.path(), None, |addr| {
        send(&src, &addr, &opts(VerifyMode::Riva, None), &|_| {}).unwrap()
    });
    assert_eq!(r.failed, 0, "{r:?}");
    for f in files(&r) {
        assert_eq!(f.level, Some(VerifyLevel::Cache), "{f:?}");
        assert!(f.note.as_deref().unwrap_or("").contains("tmpfs"), "{f:?}");
    }
    let root2 = tempfile::tempdir_in(tmp.path()).unwrap();
    let r = with_server(root2.path(), None, |addr| {
        let o = opts(VerifyMode::Riva, Some(VerifyLevel::Device));
        send(&src, &addr, &o, &|_| {}).unwrap()
    });
    assert_eq!(r.failed, 3, "{r:?}");
    for f in files(&r) {
        let e = f.error.as_deref().unwrap();
        assert!(
            e.contains("--require-level device") && e.contains("tmpfs"),
            "{e}"
        );
        assert!(!root2.path().join("src").join(&f.path[4..]).exists());
    }
}

#[test]
fn riva_over_the_network_repairs_a_write_error_that_fiver_leaves_resending_only_the_bad_page() {
    if let Err(why) = intact_faults::usable() {
        intact_testkit::skip(
            "riva_over_the_network_repairs_a_write_error_that_fiver_leaves_resending_only_the_bad_page",
            &why,
        );
        return;
    }
    for (mode, resent) in [(VerifyMode::Fiver, 0), (VerifyMode::Riva, 1)] {
        let lfs = Arc::new(
            intact_faults::LoopFs::new(Path::new(env!("CARGO_TARGET_TMPDIR")), 64).unwrap(),
        );
        let src_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let src = source(src_dir.path(), 1, 3 * BS + 77);
        let fired = Arc::new(AtomicBool::new(false));
        let hook: WriteHook = {
            let (lfs, fired) = (Arc::clone(&lfs), Arc::clone(&fired));
            Arc::new(
                move |file: &File, _p: &str, index: u64, offset: u64, _l: usize| {
                    if index == 2 && !fired.swap(true, Ordering::SeqCst) {
                        lfs.flip_bit_under(file, offset + 9).unwrap();
                    }
                },
            )
        };
        let root = lfs.mnt().join("root");
        let r = with_server(&root, Some(hook), |addr| {
            send(&src, &addr, &opts(mode, None), &|_| {}).unwrap()
        });
        assert!(fired.load(Ordering::SeqCst), "the fault was never injected");
        assert_eq!(r.failed, 0, "{mode}: {r:?}");
        let f = files(&r).next().unwrap();
        assert_eq!(f.blocks_resent, resent, "{mode}: {f:?}");
        let path = root.join("src/f0");
        let file = File::open(&path).unwrap();
        assert_eq!(
            intact_cache::evict(&file, 0, 3 * BS as u64 + 77)
                .unwrap()
                .resident,
            0
        );
        let stored = fs::read(&path).unwrap();
        let diff = intact_sample::bytes(3 * BS + 77, 0)
            .iter()
            .zip(&stored)
            .filter(|(a, b)| a != b)
            .count();
        match mode {
            VerifyMode::Riva => {
                assert_eq!(diff, 0, "riva left the device wrong");
                assert_eq!(f.level, Some(VerifyLevel::Device), "{f:?}");
                // The re-read named the one bad page: only it came again.
                assert_eq!(f.pages_resent, 1, "{f:?}");
                assert_eq!(f.bytes_sent, 3 * BS as u64 + 77 + 4096, "{f:?}");
            }
            _ => assert_eq!(diff, 1, "fiver should have left the flipped bit"),
        }
    }
}

#[test]
fn a_source_that_changes_during_the_send_is_never_named_at_the_destination() {
    let src_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let src = source(src_dir.path(), 2, 3 * BS + 5);
    let victim = src[0].join("f0");
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    // When the receiver has written the first block of f0, the source
    // grows: the sender must notice before it ends the file.
    let grow_once = || -> WriteHook {
        let victim = victim.clone();
        let fired = Arc::new(AtomicBool::new(false));
        Arc::new(move |_: &File, path: &str, index: u64, _: u64, _: usize| {
            if path.ends_with("f0") && index == 0 && !fired.swap(true, Ordering::SeqCst) {
                let mut f = fs::OpenOptions::new().append(true).open(&victim).unwrap();
                std::io::Write::write_all(&mut f, b"late").unwrap();
            }
        })
    };
    for mode in [VerifyMode::Fiver, VerifyMode::Riva] {
        let hook = grow_once();
        let dest = root.path().join(mode.name());
        let r = with_server(&dest, Some(hook), |addr| {
            send(&src, &addr, &opts(mode, None), &|_| {}).unwrap()
        });
        assert_eq!(r.failed, 1, "{mode}: {r:?}");
        let f0 = files(&r).find(|f| f.path.ends_with("f0")).unwrap();
        let e = f0.error.as_deref().unwrap_or("");
        assert!(
            e.contains("changed") || e.contains("modified"),
            "{mode}: {e}"
        );
        assert!(
            !dest.join("src/f0").exists(),
            "{mode}: a changed file was named"
        );
        assert!(
            dest.join("src/f1").exists(),
            "{mode}: the other file must arrive"
        );
        // Put the source back for the next mode.
        let len = 3 * BS as u64 + 5;
        fs::OpenOptions::new()
            .write(true)
            .open(&victim)
            .unwrap()
            .set_len(len)
            .unwrap();
    }
}
