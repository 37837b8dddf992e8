// Each test binary uses a different part of this module.
#![allow(dead_code)]

//! Shared by the level tests: a loop-mounted ext4 per case, an in-process
//! server, faults on the device under a file with the page cache keeping
//! the good copy, and judgement by bytes read after a remount.

use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use intact_faults::{FlipProxy, LoopFs, ProxyFault};
use intact_transfer::{
    partial_name, send, CopyOptions, CopyReport, FileReport, LocalServer, SendOptions,
    ServerConfig, TransferError, VerifyLevel, VerifyMode,
};

pub const BS: usize = 1 << 20;
/// Eight blocks and a tail.
pub const SIZE: usize = 8 * BS + 4321;

pub fn usable(test: &str) -> bool {
    match intact_faults::usable() {
        Ok(()) => true,
        Err(why) => {
            intact_testkit::skip(test, &why);
            false
        }
    }
}

/// Whether the lab's network testbed (namespaces, TUN, the delay line)
/// and its loop devices can be built here; if not, the test is skipped,
/// loudly (and fails in CI).
pub fn bed_usable(test: &str) -> bool {
    for check in [intact_faults::netbed_usable, intact_faults::usable] {
        if let Err(why) = check() {
            intact_testkit::skip(test, &why);
            return false;
        }
    }
    true
}

/// Unmounts and mounts the file system again: nothing of it stays cached.
pub fn remount(fs: &LoopFs) {
    fs.remount().unwrap();
}

/// A one-stream copy in `verify` mode with blocks of `block_size`, two
/// retries.
pub fn copy_opts(verify: VerifyMode, block_size: usize) -> CopyOptions {
    CopyOptions {
        verify,
        block_size,
        streams: 1,
        retries: 2,
        ..CopyOptions::default()
    }
}

pub fn opts(verify: VerifyMode) -> SendOptions {
    SendOptions {
        verify,
        block_size: BS,
        streams: 1,
        retries: 2,
        ..SendOptions::default()
    }
}

/// One send to a fresh in-process server rooted at `root`, optionally
/// through a proxy that cuts the connection after `cut` bytes.
pub fn send_once(
    src: &Path,
    root: &Path,
    o: &SendOptions,
    cut: Option<u64>,
) -> Result<CopyReport, TransferError> {
    // Tests send blocks below the server's minimum block size on purpose
    // (many blocks from little data): lower it to what they use.
    let mut cfg = ServerConfig::local(root);
    let min = &mut cfg.receive.limits.min_block_size;
    *min = (*min).min(o.block_size as u32);
    let server = LocalServer::start(cfg).unwrap();
    let r = match cut {
        Some(n) => {
            let proxy = FlipProxy::start(server.addr(), ProxyFault::CutAfter(n)).unwrap();
            send(&[src.to_path_buf()], &proxy.addr(), o, &|_| {})
        }
        None => send(&[src.to_path_buf()], &server.addr(), o, &|_| {}),
    };
    server.stop().unwrap();
    r
}

pub fn the_file(r: &CopyReport) -> &FileReport {
    r.files.iter().find(|f| f.kind == "file").expect("one file")
}

/// Every byte of the file is accounted for exactly once: sent, held and
/// re-verified in place, or held and trusted from the journal (resends
/// are of whole blocks of `bs`).
pub fn accounted(f: &FileReport, bs: u64) {
    assert!(f.error.is_none(), "{:?}", f.error);
    assert_eq!(
        f.bytes_sent - f.blocks_resent * bs + f.bytes_reverified + f.bytes_trusted,
        f.size,
        "sent {} (resent blocks {}) + re-verified {} + trusted {} != size {}",
        f.bytes_sent,
        f.blocks_resent,
        f.bytes_reverified,
        f.bytes_trusted,
        f.size
    );
}

/// Rewrites `len` bytes of `path` at `offset` in place and puts its
/// modification time back, to the nanosecond: same size, same mtime,
/// other bytes (what a quick check cannot see).
pub fn rewrite_keeping_mtime(path: &Path, offset: u64, bytes: &[u8]) {
    let mtime = fs::metadata(path).unwrap().modified().unwrap();
    let f = fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    assert_eq!(fs::metadata(path).unwrap().modified().unwrap(), mtime);
}

pub struct Case {
    pub fs: LoopFs,
    _src_dir: tempfile::TempDir,
    pub src: PathBuf,
    pub data: Vec<u8>,
    pub root: PathBuf,
}

impl Case {
    /// A fresh 64 MiB ext4 and a source file of `SIZE` bytes beside it.
    pub fn new() -> Case {
        Case::with_options("")
    }

    /// The same, the ext4 mounted with `options` (e.g. `data=journal`).
    pub fn with_options(options: &str) -> Case {
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let fs = LoopFs::with_options(tmp, 64, options).unwrap();
        let src_dir = tempfile::tempdir_in(tmp).unwrap();
        let data = intact_sample::bytes(SIZE, 7);
        let src = src_dir.path().join("data.bin");
        fs::write(&src, &data).unwrap();
        let root = fs.mnt().join("root");
        Case {
            fs,
            _src_dir: src_dir,
            src,
            data,
            root,
        }
    }

    /// Interrupts a fiver send (the proxy cuts after about five blocks)
    /// and returns the partial file it left.
    pub fn interrupted_fiver(&self) -> PathBuf {
        let first = send_once(
            &self.src,
            &self.root,
            &opts(VerifyMode::Fiver),
            Some(5 * BS as u64),
        );
        assert!(first.is_err() || first.as_ref().unwrap().failed > 0);
        let partial = self.root.join(partial_name("data.bin".as_ref()));
        assert!(partial.exists(), "the interrupted run left no partial file");
        partial
    }

    /// The stored file's bytes after a remount (no cache survives it).
    pub fn stored(&self) -> Vec<u8> {
        remount(&self.fs);
        fs::read(self.root.join("data.bin")).unwrap()
    }

    /// A fresh case whose file one whole send in `mode` has delivered
    /// with nothing failed, reported at `level`.
    pub fn sent_whole(mode: VerifyMode, level: VerifyLevel) -> Case {
        let c = Case::new();
        let r = send_once(&c.src, &c.root, &opts(mode), None).unwrap();
        assert_eq!(r.failed, 0);
        assert_eq!(the_file(&r).level, Some(level));
        c
    }

    /// Flips a bit on the device under `path` at `offset` and proves it:
    /// the device holds the flipped byte, the page cache the good one.
    pub fn flip_under(&self, path: &Path, offset: u64) {
        let f = File::open(path).unwrap();
        self.fs.flip_bit_under(&f, offset).unwrap();
        let good = self.data[offset as usize];
        assert_eq!(self.device_byte(&f, offset), good ^ 1, "the flip missed");
        let mut cached = [0u8];
        f.read_exact_at(&mut cached, offset).unwrap();
        assert_eq!(cached[0], good, "the page cache should keep the good byte");
    }

    /// The byte at `offset` of `file` as the loop device holds it.
    pub fn device_byte(&self, file: &File, offset: u64) -> u8 {
        self.fs.device_byte_under(file, offset).unwrap()
    }
}

/// An in-process server run in a namespace of a testbed (on a thread
/// that entered it), listening on `ip`:0; stopped when dropped.
pub struct ServerIn {
    pub addr: String,
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServerIn {
    pub fn start(host: &intact_faults::Host, cfg: ServerConfig) -> ServerIn {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop, stop_rx) = std::sync::mpsc::channel::<()>();
        let ip = host.ip;
        let thread = host
            .spawn(move || {
                let srv = LocalServer::start_on(cfg, &format!("{ip}:0")).unwrap();
                addr_tx.send(srv.addr()).unwrap();
                let _ = stop_rx.recv();
                srv.stop().unwrap();
            })
            .unwrap();
        ServerIn {
            addr: addr_rx.recv().unwrap(),
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for ServerIn {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            // A server thread that panicked fails the test here, unless
            // the test is already failing.
            if t.join().is_err() && !std::thread::panicking() {
                panic!("the server in the namespace panicked");
            }
        }
    }
}

/// Asserts that no thread of the bed's delay line ended on an error (a
/// dead direction would stall what crosses it).
pub fn assert_line_lived(bed: &intact_faults::Netbed) {
    let line = bed.wan.as_ref().expect("a bed with a delay line");
    assert!(
        line.stats
            .iter()
            .all(|s| !s.died.load(std::sync::atomic::Ordering::SeqCst)),
        "{}",
        line.summary()
    );
}
