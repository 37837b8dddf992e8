//! The recovery cache fed by mirrored packets, on the paper's testbed
//! (Nazarov & Arslan, Fig. 4) in network namespaces: source, its link to
//! the switch the paper's WAN (1 Gbit/s, 30 ms round trip, through the
//! lab's user-space delay line), a switch that mirrors the source's
//! traffic with the destination onto the cache's link (tc mirred),
//! destination, cache. The cache captures on its interface (AF_PACKET), rebuilds the
//! TCP connections and keeps the blocks; a device write error at the
//! destination (a bit flipped under a written block of a loop-mounted
//! ext4) is repaired from it, and the source sends nothing again. Junk
//! and hostile frames on the capture interface afterwards leave the cache
//! running and serving. Root only (namespaces, loop devices).

use std::fs::{self, File};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use intact_faults::{Host, Netbed, Wan};
use intact_netcache::capture::{self, CaptureOptions};
use intact_netcache::service::Service;
use intact_netcache::{Counters, RecoveryCaches, Store};
use intact_proto::Key;
use intact_transfer::{send, ReceiveOptions, SendOptions, ServerConfig, VerifyMode};

mod common;
use common::ServerIn;

const BS: usize = 1 << 20;

use common::bed_usable as usable;

/// Sends `frames` as they are onto `dev` of `host` (a packet socket).
fn inject(host: &Host, dev: &'static str, frames: Vec<Vec<u8>>) {
    host.spawn(move || {
        // SAFETY: plain socket calls on a descriptor this thread owns.
        unsafe {
            let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
            assert!(
                fd >= 0,
                "packet socket: {}",
                std::io::Error::last_os_error()
            );
            let name = std::ffi::CString::new(dev).unwrap();
            let mut addr: libc::sockaddr_ll = std::mem::zeroed();
            addr.sll_family = libc::AF_PACKET as u16;
            addr.sll_ifindex = libc::if_nametoindex(name.as_ptr()) as i32;
            addr.sll_halen = 6;
            for f in &frames {
                libc::sendto(
                    fd,
                    f.as_ptr().cast(),
                    f.len(),
                    0,
                    (&addr as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                );
            }
            libc::close(fd);
        }
    })
    .unwrap()
    .join()
    .unwrap();
}

/// Ethernet frames that are junk at every layer: random bytes; TCP
/// segments of a connection seen from its SYN whose bytes are not intact's;
/// one that starts with a true Hello and goes on with lies (a frame
/// length of 4 GiB, a Block whose BLAKE3 is wrong).
fn hostile(server: std::net::SocketAddrV4) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..300 {
        let len = 1 + (next() % 1514) as usize;
        out.push((0..len).map(|_| next() as u8).collect());
    }
    let seg = |port: u16, seq: u32, syn: bool, payload: &[u8]| {
        let b = etherparse::PacketBuilder::ethernet2([2; 6], [4; 6]).ipv4(
            [10, 91, 1, 1],
            server.ip().octets(),
            64,
        );
        let b = if syn {
            b.tcp(port, server.port(), seq, 65535).syn()
        } else {
            b.tcp(port, server.port(), seq, 65535).ack(1)
        };
        let mut v = Vec::new();
        b.write(&mut v, payload).unwrap();
        v
    };
    // A connection of another protocol.
    out.push(seg(40001, 100, true, &[]));
    out.push(seg(40001, 101, false, b"GET / HTTP/1.1\r\n\r\n"));
    // A connection that says Hello, then lies.
    let mut hello = Vec::new();
    intact_proto::Message::Hello {
        version: intact_proto::VERSION,
        keyed: false,
        nonce: [1; 32],
        session: [2; 16],
        suite: 0,
        share: [0; 32],
    }
    .encode(&mut hello);
    intact_proto::Message::Join {
        payload: vec![3; 32],
    }
    .encode(&mut hello);
    let mut lie = hello.clone();
    intact_proto::Message::Block(intact_proto::Block {
        file: 1,
        index: 0,
        source_level: 0,
        digest: vec![0; 16],
        crcs: Vec::new(),
        patch: Vec::new(),
        strong: vec![9; 32],
        data: vec![7; 1000],
    })
    .encode(&mut lie);
    lie.extend_from_slice(&u32::MAX.to_be_bytes());
    out.push(seg(40002, 500, true, &[]));
    for (i, chunk) in lie.chunks(700).enumerate() {
        out.push(seg(40002, 501 + 700 * i as u32, false, chunk));
    }
    out
}

#[test]
fn mirrored_packets_feed_the_cache_and_a_device_write_error_is_repaired_from_it() {
    let name = "mirrored_packets_feed_the_cache_and_a_device_write_error_is_repaired_from_it";
    if !usable(name) {
        return;
    }
    let bed = Netbed::with_wan(Wan {
        rtt: std::time::Duration::from_millis(30),
        rate: 1_000_000_000,
        loss: 0.0,
        mtu: 1500,
    })
    .unwrap();
    let lfs =
        Arc::new(intact_faults::LoopFs::new(Path::new(env!("CARGO_TARGET_TMPDIR")), 128).unwrap());
    let src = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let data = intact_sample::bytes(24 * BS + 777, 3);
    let file = src.path().join("big.dat");
    fs::write(&file, &data).unwrap();

    // The cache.
    let store = Arc::new(Store::new(256 << 20));
    let counters = Arc::new(Counters::default());
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let cache = {
        let (store, counters, stop) = (store.clone(), counters.clone(), stop.clone());
        bed.cache
            .spawn(move || {
                let opts = CaptureOptions {
                    iface: Netbed::MIRROR_IFACE.into(),
                    ring: 64 << 20,
                    reassembly: 64 << 20,
                };
                let cap = capture::open(&opts).unwrap();
                let svc = Service::start(
                    "10.91.3.1:0",
                    store.clone(),
                    counters.clone(),
                    intact_netcache::service::MISS_WAIT,
                )
                .unwrap();
                tx.send(svc.addr()).unwrap();
                capture::run(cap, store, counters, &stop).unwrap();
            })
            .unwrap()
    };
    let cache_addr = rx.recv().unwrap();

    // The destination: a server whose device flips a bit under block 5.
    let key = Key::generate().unwrap();
    let fired = Arc::new(AtomicBool::new(false));
    let hook: intact_transfer::WriteHook = {
        let (lfs, fired) = (Arc::clone(&lfs), Arc::clone(&fired));
        Arc::new(move |f: &File, _p: &str, i: u64, offset: u64, _l: usize| {
            if i == 5 && !fired.swap(true, Ordering::SeqCst) {
                lfs.flip_bit_under(f, offset + 4097).unwrap();
            }
        })
    };
    let root = lfs.mnt().join("recv");
    fs::create_dir_all(&root).unwrap();
    let server = ServerIn::start(
        &bed.destination,
        ServerConfig {
            key: Some(key.clone()),
            encrypt: false,
            receive: ReceiveOptions {
                after_write: Some(hook),
                recovery: Some(RecoveryCaches::new(vec![cache_addr.to_string()])),
                ..ReceiveOptions::default()
            },
            ..ServerConfig::local(root)
        },
    );
    let server_addr = server.addr.clone();

    // The source sends across the shaped link.
    let report = {
        let (file, addr) = (file.clone(), server_addr.clone());
        bed.source
            .spawn(move || {
                let o = SendOptions {
                    verify: VerifyMode::Riva,
                    block_size: BS,
                    streams: 2,
                    key: Some(key),
                    ..SendOptions::default()
                };
                send(&[file], &addr, &o, &|_| {}).unwrap()
            })
            .unwrap()
            .join()
            .unwrap()
    };
    assert!(
        fired.load(Ordering::SeqCst),
        "the device fault was injected"
    );
    common::assert_line_lived(&bed);
    assert_eq!(report.failed, 0, "{report:?}");
    let f = report.files.iter().find(|f| f.kind == "file").unwrap();
    assert_eq!(f.blocks_from_cache, 1, "{f:?}");
    assert_eq!(f.blocks_resent, 0, "{f:?}");
    assert_eq!(
        f.bytes_sent,
        data.len() as u64,
        "the source sent every byte once"
    );
    // Long enough for the capture to give up any hole that would never
    // fill, and to forget the closed connections.
    std::thread::sleep(intact_netcache::tcp::GAP_TIMEOUT + std::time::Duration::from_secs(1));
    let seen = counters.report(store.stats());
    assert_eq!(seen.served, 1, "{seen:?}");
    assert_eq!(
        seen.cached, 25,
        "every block was seen on the mirror: {seen:?}"
    );
    assert_eq!(
        (seen.kernel_drops, seen.truncated, seen.not_followed),
        (0, 0, 0),
        "{seen:?}"
    );
    assert!(seen.complete, "{seen:?}");
    assert_eq!(
        seen.store.blocks, 0,
        "the verified file's blocks were dropped: {seen:?}"
    );

    // Junk on the capture interface, straight from the switch.
    let target: std::net::SocketAddrV4 = server_addr.parse().unwrap();
    inject(&bed.switch, "sw3", hostile(target));
    // The cache still runs and serves: a block it holds is given back.
    let probe = intact_sample::bytes(1000, 99);
    let k = *blake3::hash(&probe).as_bytes();
    store.insert(k, probe.clone().into(), false);
    let back = bed
        .destination
        .spawn(move || RecoveryCaches::new(vec![cache_addr.to_string()]).fetch(&k, 1000))
        .unwrap()
        .join()
        .unwrap()
        .expect("the cache answers after the junk");
    assert_eq!(back.data, probe);
    // The capture thread counts what it reads on its own time: under load
    // the junk may still be in the ring when the fetch is answered.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let after = loop {
        let a = counters.report(store.stats());
        let counted = a.packets + a.own_packets > seen.packets + seen.own_packets + 300
            && a.not_intact >= 1
            && a.malformed >= 1;
        if counted || std::time::Instant::now() > deadline {
            break a;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(
        after.packets + after.own_packets > seen.packets + seen.own_packets + 300,
        "the junk reached the capture: {after:?}"
    );
    assert!(after.not_intact >= 1 && after.malformed >= 1, "{after:?}");

    stop.store(true, Ordering::SeqCst);
    cache.join().expect("the capture ended without a panic");
    drop(server);
    lfs.remount().unwrap();
    assert_eq!(fs::read(lfs.mnt().join("recv/big.dat")).unwrap(), data);
}
