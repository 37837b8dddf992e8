//! `block_auto` with a choice other than the default: the receiver half
//! writes blocks of the chosen size (seen by its write hook, not taken
//! from the sender's report), and the file arrives whole at level device.
//!
//! No device on the test machine costs enough per block for the probe to
//! choose another size than 4 MiB (see the `block_size` module), so the
//! stage costs are given: a disk whose every block's write-back and
//! eviction is a 1 ms round trip.

use std::fs;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use intact_transfer::{
    copy, send, CopyOptions, Cost, LocalServer, SendOptions, ServerConfig, Stages, VerifyMode,
};

const MIB: u64 = 1 << 20;

fn disk_like() -> Stages {
    let per = |mb_s: f64| 1.0 / (mb_s * 1e6);
    let evict = Cost {
        per_block: 1e-3,
        per_byte: per(2000.0),
    };
    Stages {
        transfer: Cost {
            per_block: 50e-6,
            per_byte: per(1500.0),
        },
        verify: Cost {
            per_block: 0.2e-3,
            per_byte: per(900.0),
        }
        .then(evict),
        evict,
    }
}

#[test]
fn the_receiver_writes_blocks_of_the_size_auto_chose() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    fs::create_dir_all(&src).unwrap();
    let size = 1024 * MIB + 777;
    // Data at the head and the tail, a hole between: every block is
    // written, read back and checked all the same.
    let head = intact_sample::bytes(40 << 20, 5);
    {
        let f = fs::File::create(src.join("big.dat")).unwrap();
        f.write_all_at(&head, 0).unwrap();
        f.write_all_at(b"tail", size - 4).unwrap();
    }
    let writes = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&writes);
    let o = CopyOptions {
        verify: VerifyMode::Riva,
        block_auto: true,
        block_stages: Some(disk_like()),
        after_write: Some(Arc::new(
            move |_: &fs::File, _: &str, index, offset, len| {
                seen.lock().unwrap().push((index, offset, len));
            },
        )),
        ..CopyOptions::default()
    };
    let r = copy(&[src.join("big.dat")], &dst, &o, &|_| {}).unwrap();
    assert_eq!(r.failed, 0, "{r:?}");
    let b = r.block_size.as_ref().expect("auto reports its choice");
    assert_eq!(b.chosen, 16 * MIB, "{b:?}");
    // What the receiver wrote: 16 MiB blocks, the last one short.
    let mut w = writes.lock().unwrap().clone();
    w.sort();
    let blocks = size.div_ceil(16 * MIB);
    assert_eq!(w.len() as u64, blocks, "{:?}…", &w[..w.len().min(3)]);
    for (i, &(index, offset, len)) in w.iter().enumerate() {
        assert_eq!(index, i as u64);
        assert_eq!(offset, i as u64 * 16 * MIB);
        let want = (size - offset).min(16 * MIB);
        assert_eq!(len as u64, want, "block {i}");
    }
    let f = r.files.iter().find(|f| f.kind == "file").unwrap();
    assert_eq!(f.level, Some(intact_transfer::VerifyLevel::Device), "{f:?}");
    let got = fs::File::open(dst.join("big.dat")).unwrap();
    let mut back = vec![0u8; head.len()];
    got.read_exact_at(&mut back, 0).unwrap();
    assert!(back == head);
    let mut tail = [0u8; 4];
    got.read_exact_at(&mut tail, size - 4).unwrap();
    assert_eq!(&tail, b"tail");
    assert_eq!(got.metadata().unwrap().len(), size);

    // Run again with costs under which Eq. 1 keeps 4 MiB: the journal
    // holds the file at 16 MiB, so auto keeps 16 MiB without probing and
    // nothing is sent again (at 4 MiB the whole file would be).
    let flat = Stages {
        transfer: Cost {
            per_block: 0.0,
            per_byte: 1e-9,
        },
        verify: Cost {
            per_block: 0.0,
            per_byte: 1e-9,
        },
        evict: Cost::default(),
    };
    let again = CopyOptions {
        verify: VerifyMode::Riva,
        block_auto: true,
        block_stages: Some(flat),
        ..CopyOptions::default()
    };
    let r = copy(&[src.join("big.dat")], &dst, &again, &|_| {}).unwrap();
    let b = r.block_size.as_ref().unwrap();
    assert_eq!(b.chosen, 16 * MIB, "{b:?}");
    assert!(b.why.contains("journal holds big.dat"), "{b:?}");
    assert_eq!(r.bytes_sent, 0, "{r:?}");
}

#[test]
fn the_server_writes_blocks_of_the_size_a_send_chose() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (src, root) = (dir.path().join("src"), dir.path().join("root"));
    fs::create_dir_all(&src).unwrap();
    let size = 1024 * MIB + 5;
    {
        let f = fs::File::create(src.join("big.dat")).unwrap();
        f.write_all_at(&intact_sample::bytes(8 << 20, 9), 0)
            .unwrap();
        f.write_all_at(b"tail!", size - 5).unwrap();
    }
    let writes = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&writes);
    let mut cfg = ServerConfig::local(&root);
    cfg.receive.after_write = Some(Arc::new(move |_: &fs::File, _: &str, _, offset, len| {
        seen.lock().unwrap().push((offset, len));
    }));
    let server = LocalServer::start(cfg).unwrap();
    let o = SendOptions {
        verify: VerifyMode::Riva,
        block_auto: true,
        block_stages: Some(disk_like()),
        ..SendOptions::default()
    };
    let r = send(&[src.join("big.dat")], &server.addr(), &o, &|_| {}).unwrap();
    server.stop().unwrap();
    assert_eq!(r.failed, 0, "{r:?}");
    let b = r.block_size.as_ref().expect("auto reports its choice");
    assert_eq!(b.chosen, 16 * MIB, "{b:?}");
    // What the server wrote: 16 MiB blocks, the last one short.
    let mut w = writes.lock().unwrap().clone();
    w.sort();
    assert_eq!(
        w.len() as u64,
        size.div_ceil(16 * MIB),
        "{:?}…",
        &w[..w.len().min(3)]
    );
    for (i, &(offset, len)) in w.iter().enumerate() {
        assert_eq!(offset, i as u64 * 16 * MIB);
        assert_eq!(len as u64, (size - offset).min(16 * MIB), "block {i}");
    }
    let got = fs::File::open(root.join("big.dat")).unwrap();
    let mut tail = [0u8; 5];
    got.read_exact_at(&mut tail, size - 5).unwrap();
    assert_eq!(&tail, b"tail!");
}

#[test]
fn without_auto_the_given_costs_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), intact_sample::bytes(9 << 20, 1)).unwrap();
    let o = CopyOptions {
        block_stages: Some(disk_like()),
        ..CopyOptions::default()
    };
    let r = copy(&[src.join("f")], &dst, &o, &|_| {}).unwrap();
    assert!(r.block_size.is_none());
    assert_eq!(r.files.iter().find(|f| f.kind == "file").unwrap().blocks, 3);
}
