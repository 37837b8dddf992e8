//! Recovery from a cache near the destination (`intact cache`, Nazarov &
//! Arslan): a block the receiver finds bad on the device is repaired from
//! the cache, not sent again by the source; what the cache could not keep
//! (a block corrupted before it, a cache down or empty) comes from the
//! source as before; the cache stays within its memory; a flash fault
//! found by `--verify flash` is repaired from the cache too.
//!
//! The faults are real: a bit flipped on the device under a written
//! block (a loop-mounted ext4, root only), a bit flipped on the wire by a
//! proxy before the cache. What the source sent is counted by the sender
//! itself (`bytes_sent`, `blocks_resent`) and what the cache served by
//! the cache; the bytes are read back after a remount.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use intact_netcache::relay::Relay;
use intact_netcache::service::Service;
use intact_netcache::{Counters, RecoveryCaches, Store};
use intact_transfer::{
    send, CopyReport, LocalServer, ReceiveOptions, SendOptions, ServerConfig, VerifyMode, WriteHook,
};

const BS: usize = 256 * 1024;

struct Cache {
    store: Arc<Store>,
    counters: Arc<Counters>,
    service: Service,
}

impl Cache {
    fn new(bound: u64) -> Cache {
        let store = Arc::new(Store::new(bound));
        let counters = Arc::new(Counters::default());
        let service = Service::start(
            "127.0.0.1:0",
            Arc::clone(&store),
            Arc::clone(&counters),
            std::time::Duration::ZERO,
        )
        .unwrap();
        Cache {
            store,
            counters,
            service,
        }
    }

    fn relay_to(&self, server: &str) -> Relay {
        Relay::start(
            "127.0.0.1:0",
            server.to_string(),
            Arc::clone(&self.store),
            Arc::clone(&self.counters),
            intact_netcache::follow::Budget::new(64 << 20),
        )
        .unwrap()
    }

    fn get(&self, f: fn(&Counters) -> &AtomicU64) -> u64 {
        f(&self.counters).load(Ordering::SeqCst)
    }
}

/// Flips one bit on the device under block `index` the first time it is
/// written; `fired` says it did.
fn flip_block(lfs: &Arc<intact_faults::LoopFs>, index: u64) -> (WriteHook, Arc<AtomicBool>) {
    let fired = Arc::new(AtomicBool::new(false));
    let (lfs, f) = (Arc::clone(lfs), Arc::clone(&fired));
    let hook: WriteHook = Arc::new(
        move |file: &File, _p: &str, i: u64, offset: u64, _l: usize| {
            if i == index && !f.swap(true, Ordering::SeqCst) {
                lfs.flip_bit_under(file, offset + 1000).unwrap();
            }
        },
    );
    (hook, fired)
}

fn server(root: &Path, hook: Option<WriteHook>, caches: Option<Vec<String>>) -> LocalServer {
    fs::create_dir_all(root).unwrap();
    LocalServer::start(ServerConfig {
        receive: ReceiveOptions {
            after_write: hook,
            recovery: caches.map(RecoveryCaches::new),
            ..ReceiveOptions::default()
        },
        ..ServerConfig::local(root)
    })
    .unwrap()
}

fn opts() -> SendOptions {
    SendOptions {
        verify: VerifyMode::Riva,
        block_size: BS,
        streams: 1,
        retries: 2,
        ..SendOptions::default()
    }
}

fn source(dir: &Path, len: usize) -> (PathBuf, Vec<u8>) {
    let data = intact_sample::bytes(len, 7);
    let p = dir.join("data.bin");
    fs::write(&p, &data).unwrap();
    (p, data)
}

fn only_file(r: &CopyReport) -> &intact_transfer::FileReport {
    assert_eq!(r.failed, 0, "{r:?}");
    r.files.iter().find(|f| f.kind == "file").unwrap()
}

fn usable(name: &str) -> bool {
    match intact_faults::usable() {
        Ok(()) => true,
        Err(why) => {
            intact_testkit::skip(name, &why);
            false
        }
    }
}

/// Reads `rel` under `root` after the file system was remounted (nothing
/// from the page cache).
fn read_after_remount(lfs: &intact_faults::LoopFs, path: &Path) -> Vec<u8> {
    lfs.remount().unwrap();
    fs::read(path).unwrap()
}

#[test]
fn a_device_write_error_is_repaired_from_the_cache_and_the_source_sends_nothing_again() {
    if !usable("a_device_write_error_is_repaired_from_the_cache_and_the_source_sends_nothing_again")
    {
        return;
    }
    let lfs =
        Arc::new(intact_faults::LoopFs::new(Path::new(env!("CARGO_TARGET_TMPDIR")), 64).unwrap());
    let src = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (file, data) = source(src.path(), 6 * BS + 123);
    let cache = Cache::new(64 << 20);
    let (hook, fired) = flip_block(&lfs, 2);
    let root = lfs.mnt().join("recv");
    let srv = server(
        &root,
        Some(hook),
        Some(vec![cache.service.addr().to_string()]),
    );
    let relay = cache.relay_to(&srv.addr());
    let r = send(&[file], &relay.addr().to_string(), &opts(), &|_| {}).unwrap();
    srv.stop().unwrap();
    drop(relay);
    assert!(
        fired.load(Ordering::SeqCst),
        "the device fault was injected"
    );
    let f = only_file(&r);
    assert_eq!(f.blocks_from_cache, 1, "{f:?}");
    assert_eq!((f.blocks_resent, f.blocks_from_source), (0, 0), "{f:?}");
    assert!(f.cache_seconds > 0.0, "the repair was timed: {f:?}");
    assert_eq!(
        f.bytes_sent,
        data.len() as u64,
        "the source sent every byte once"
    );
    assert_eq!(cache.get(|c| &c.served), 1);
    assert_eq!(cache.get(|c| &c.cached), 7);
    assert_eq!(read_after_remount(&lfs, &root.join("data.bin")), data);
    // The file verified: the cache dropped its blocks.
    assert_eq!(cache.store.stats().blocks, 0);
}

#[test]
fn with_the_cache_down_or_empty_the_source_repairs_as_before() {
    if !usable("with_the_cache_down_or_empty_the_source_repairs_as_before") {
        return;
    }
    let lfs =
        Arc::new(intact_faults::LoopFs::new(Path::new(env!("CARGO_TARGET_TMPDIR")), 64).unwrap());
    let src = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (file, data) = source(src.path(), 4 * BS + 5);
    // Down: a port nothing listens on any more.
    let down = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    // Empty: a cache the transfer never passed.
    let empty = Cache::new(64 << 20);
    for (name, caches) in [
        ("down", vec![down.to_string()]),
        ("empty", vec![empty.service.addr().to_string()]),
        (
            "down-then-empty",
            vec![down.to_string(), empty.service.addr().to_string()],
        ),
    ] {
        let (hook, fired) = flip_block(&lfs, 1);
        let root = lfs.mnt().join(name);
        let srv = server(&root, Some(hook), Some(caches));
        let r = send(std::slice::from_ref(&file), &srv.addr(), &opts(), &|_| {}).unwrap();
        srv.stop().unwrap();
        assert!(fired.load(Ordering::SeqCst));
        let f = only_file(&r);
        assert_eq!(
            (f.blocks_from_cache, f.blocks_resent),
            (0, 1),
            "{name}: {f:?}"
        );
        assert_eq!(f.blocks_from_source, 1, "{name}: {f:?}");
        assert!(f.source_repair_seconds > 0.0, "{name}: {f:?}");
        // The receiver named the bad page: only it came again.
        assert_eq!(f.pages_resent, 1, "{name}: {f:?}");
        assert_eq!(
            f.bytes_sent,
            data.len() as u64 + 4096,
            "{name}: one page again"
        );
        assert_eq!(
            read_after_remount(&lfs, &root.join("data.bin")),
            data,
            "{name}"
        );
    }
    assert_eq!(
        empty.get(|c| &c.missed),
        2,
        "the empty cache was asked, twice"
    );
    assert_eq!(empty.get(|c| &c.served), 0);
}

#[test]
fn a_block_corrupted_before_the_cache_is_rejected_there_and_comes_from_the_source() {
    let src = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dst = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (file, data) = source(src.path(), 4 * BS);
    let cache = Cache::new(64 << 20);
    let srv = server(
        dst.path(),
        None,
        Some(vec![cache.service.addr().to_string()]),
    );
    let relay = cache.relay_to(&srv.addr());
    // The wide-area link, before the mirror point: one bit flipped well
    // inside the first block's bytes.
    let proxy = intact_faults::FlipProxy::start(
        relay.addr().to_string(),
        intact_faults::ProxyFault::FlipAt(vec![100_000]),
    )
    .unwrap();
    let r = send(&[file], &proxy.addr(), &opts(), &|_| {}).unwrap();
    srv.stop().unwrap();
    assert_eq!(proxy.flipped(), 1);
    let f = only_file(&r);
    assert_eq!(
        cache.get(|c| &c.rejected),
        1,
        "the cache kept no damaged block"
    );
    assert_eq!((f.blocks_from_cache, f.blocks_resent), (0, 1), "{f:?}");
    assert_eq!(cache.get(|c| &c.served), 0);
    assert_eq!(cache.get(|c| &c.missed), 1);
    assert_eq!(fs::read(dst.path().join("data.bin")).unwrap(), data);
}

#[test]
fn the_cache_stays_within_its_memory_on_a_transfer_larger_than_it() {
    let src = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dst = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (file, data) = source(src.path(), 64 * BS);
    let bound = 4 * BS as u64 + 4 * intact_netcache::store::ENTRY_COST;
    let cache = Cache::new(bound);
    let srv = server(
        dst.path(),
        None,
        Some(vec![cache.service.addr().to_string()]),
    );
    let relay = cache.relay_to(&srv.addr());
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (store, done) = (Arc::clone(&cache.store), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut most = 0;
            while !done.load(Ordering::SeqCst) {
                most = most.max(store.stats().bytes);
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            most
        })
    };
    let r = send(&[file], &relay.addr().to_string(), &opts(), &|_| {}).unwrap();
    done.store(true, Ordering::SeqCst);
    let most = watcher.join().unwrap();
    srv.stop().unwrap();
    only_file(&r);
    let st = cache.store.stats();
    assert_eq!(
        cache.get(|c| &c.cached),
        64,
        "every block was seen and kept"
    );
    assert!(st.evicted >= 60, "the bound forced evictions: {st:?}");
    assert!(most <= bound && st.bytes <= bound, "{most} > {bound}");
    assert_eq!(fs::read(dst.path().join("data.bin")).unwrap(), data);
}

#[test]
fn files_kept_out_of_the_cache_carry_no_blake3_and_are_not_kept() {
    let src = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dst = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    fs::write(src.path().join("keep.h5"), intact_sample::bytes(2 * BS, 1)).unwrap();
    fs::write(src.path().join("skip.tmp"), intact_sample::bytes(3 * BS, 2)).unwrap();
    let cache = Cache::new(64 << 20);
    let srv = server(
        dst.path(),
        None,
        Some(vec![cache.service.addr().to_string()]),
    );
    let relay = cache.relay_to(&srv.addr());
    let o = SendOptions {
        cache_filter: intact_transfer::Filter::new(vec![intact_transfer::Rule::new(
            intact_transfer::RuleKind::Exclude,
            "*.tmp",
        )]),
        ..opts()
    };
    let r = send(
        &[src.path().join("keep.h5"), src.path().join("skip.tmp")],
        &relay.addr().to_string(),
        &o,
        &|_| {},
    )
    .unwrap();
    srv.stop().unwrap();
    assert_eq!(r.failed, 0, "{r:?}");
    assert_eq!(cache.get(|c| &c.cached), 2);
    assert_eq!(cache.get(|c| &c.uncacheable), 3);
    // Without a recovery cache the server asks for no BLAKE3 at all.
    let plain = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let cache2 = Cache::new(64 << 20);
    let srv = server(plain.path(), None, None);
    let relay = cache2.relay_to(&srv.addr());
    send(
        &[src.path().join("keep.h5")],
        &relay.addr().to_string(),
        &opts(),
        &|_| {},
    )
    .unwrap();
    srv.stop().unwrap();
    assert_eq!(
        (cache2.get(|c| &c.cached), cache2.get(|c| &c.uncacheable)),
        (0, 2)
    );
}

#[test]
fn a_cache_that_answers_wrong_bytes_is_not_believed() {
    if !usable("a_cache_that_answers_wrong_bytes_is_not_believed") {
        return;
    }
    use std::io::{Read, Write};
    // A hostile cache: it says it holds every block, and answers bytes of
    // the right length that are not the block.
    let liar = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let liar_addr = liar.local_addr().unwrap();
    let asked = Arc::new(AtomicU64::new(0));
    {
        let asked = Arc::clone(&asked);
        std::thread::spawn(move || {
            for s in liar.incoming() {
                let Ok(mut s) = s else { break };
                let asked = Arc::clone(&asked);
                std::thread::spawn(move || {
                    let mut magic = [0u8; 8];
                    s.write_all(intact_netcache::service::MAGIC).unwrap();
                    if s.read_exact(&mut magic).is_err() {
                        return;
                    }
                    let mut key = [0u8; 32];
                    while s.read_exact(&mut key).is_ok() {
                        asked.fetch_add(1, Ordering::SeqCst);
                        let mut answer = vec![1u8];
                        answer.extend_from_slice(&(BS as u32).to_be_bytes());
                        answer.extend(std::iter::repeat_n(0xA5u8, BS));
                        if s.write_all(&answer).is_err() {
                            return;
                        }
                    }
                });
            }
        });
    }
    let lfs =
        Arc::new(intact_faults::LoopFs::new(Path::new(env!("CARGO_TARGET_TMPDIR")), 64).unwrap());
    let src = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (file, data) = source(src.path(), 4 * BS);
    let (hook, fired) = flip_block(&lfs, 3);
    let root = lfs.mnt().join("recv");
    let srv = server(&root, Some(hook), Some(vec![liar_addr.to_string()]));
    let r = send(&[file], &srv.addr(), &opts(), &|_| {}).unwrap();
    srv.stop().unwrap();
    assert!(fired.load(Ordering::SeqCst));
    assert_eq!(asked.load(Ordering::SeqCst), 1, "the cache was asked");
    let f = only_file(&r);
    assert_eq!((f.blocks_from_cache, f.blocks_resent), (0, 1), "{f:?}");
    assert_eq!(read_after_remount(&lfs, &root.join("data.bin")), data);
}

/// Kim et al.'s flash fault (the SSD programs a page wrong into NAND
/// while its write buffer keeps the good copy), found by `--verify flash`
/// once the device's write cache turned over, is repaired from the cache:
/// the source sends nothing again, the repaired block waits out another
/// window (the sender is already waiting, so the receiver drains at once)
/// and the file ends at level media, the flash holding the source's bytes
/// after the buffer turned over.
#[test]
fn a_flash_fault_found_by_flash_is_repaired_from_the_cache() {
    let name = "a_flash_fault_found_by_flash_is_repaired_from_the_cache";
    if let Err(why) = intact_faults::ssd_usable() {
        intact_testkit::skip(name, &why);
        return;
    }
    // The emulated SSD's write buffer: 2 MiB; flash's window twice that.
    const BUFFER: u64 = 2 << 20;
    let ssd = intact_faults::EmulatedSsd::new(Path::new(env!("CARGO_TARGET_TMPDIR")), 64, BUFFER)
        .unwrap();
    let src = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (file, data) = source(src.path(), 16 * BS);
    let page = 70;
    let ps = intact_faults::SSD_PAGE;
    ssd.arm(
        intact_faults::SsdLayer::Media,
        &data[page * ps..(page + 1) * ps],
    );
    let cache = Cache::new(64 << 20);
    let root = ssd.mnt().join("recv");
    fs::create_dir_all(&root).unwrap();
    let srv = LocalServer::start(ServerConfig {
        receive: ReceiveOptions {
            recovery: Some(RecoveryCaches::new(vec![cache.service.addr().to_string()])),
            flash: intact_transfer::FlashSettings::new(Some(2 * BUFFER), None),
            ..ReceiveOptions::default()
        },
        ..ServerConfig::local(&root)
    })
    .unwrap();
    let relay = cache.relay_to(&srv.addr());
    let o = SendOptions {
        verify: VerifyMode::Flash,
        ..opts()
    };
    let r = send(&[file], &relay.addr().to_string(), &o, &|_| {}).unwrap();
    srv.stop().unwrap();
    drop(relay);
    assert_eq!(ssd.model().armed(), 0, "the armed page was written");
    let log: Vec<_> = ssd.model().log().iter().map(|e| e.what).collect();
    assert!(log.contains(&"programmed corrupted to NAND"), "{log:?}");
    let f = only_file(&r);
    assert_eq!(f.blocks_from_cache, 1, "{f:?}");
    assert_eq!((f.blocks_resent, f.blocks_from_source), (0, 0), "{f:?}");
    assert_eq!(
        f.bytes_sent,
        data.len() as u64,
        "the source sent every byte once"
    );
    assert_eq!(f.level, Some(intact_transfer::VerifyLevel::Media), "{f:?}");
    assert_eq!(cache.get(|c| &c.served), 1);
    // The flash's own copy, once the buffer turned over and the page
    // cache was emptied.
    ssd.write_filler(3 * BUFFER).unwrap();
    ssd.remount().unwrap();
    assert!(fs::read(root.join("data.bin")).unwrap() == data);
    let dir = ssd.dir().to_path_buf();
    ssd.close().unwrap();
    assert!(intact_faults::mounts_under(&dir).is_empty());
}
