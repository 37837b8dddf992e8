//! A path one session is committing stays its own until the journal row
//! that records the commit is written: a second session that begins the
//! same path in that window is refused, and the first session's bytes
//! are what the path holds afterwards.

use std::fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use intact_transfer::{
    send, CommitHook, LocalServer, ReceiveOptions, SendOptions, ServerConfig, VerifyMode,
};

const PATIENCE: Duration = Duration::from_secs(60);

fn opts() -> SendOptions {
    SendOptions {
        verify: VerifyMode::Fiver,
        block_size: 64 * 1024,
        streams: 1,
        retries: 0,
        ..SendOptions::default()
    }
}

#[test]
fn a_path_stays_claimed_between_its_rename_and_its_journal_row() {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let root = tmp.path().join("root");
    let (first, second) = (tmp.path().join("first"), tmp.path().join("second"));
    let ours = intact_sample::bytes(10_000, 1);
    let theirs = intact_sample::bytes(12_000, 2);
    for (dir, data) in [(&first, &ours), (&second, &theirs)] {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join("f.dat"), data).unwrap();
    }
    // The first commit of f.dat stops between its rename and its journal
    // row until the test lets it go.
    let (paused_tx, paused) = mpsc::channel::<()>();
    let (go, go_rx) = mpsc::channel::<()>();
    let (paused_tx, go_rx) = (Mutex::new(paused_tx), Mutex::new(go_rx));
    let fired = AtomicBool::new(false);
    let hook: CommitHook = Arc::new(move |paths: &[String]| {
        if paths.iter().any(|p| p == "f.dat") && !fired.swap(true, Ordering::SeqCst) {
            paused_tx.lock().unwrap().send(()).unwrap();
            let _ = go_rx.lock().unwrap().recv_timeout(PATIENCE);
        }
    });
    let server = LocalServer::start(ServerConfig {
        receive: ReceiveOptions {
            before_journal: Some(hook),
            ..ReceiveOptions::default()
        },
        ..ServerConfig::local(&root)
    })
    .unwrap();
    let addr = server.addr();
    let final_path = root.join("f.dat");
    std::thread::scope(|s| {
        let one = s.spawn(|| send(&[first.join("f.dat")], &addr, &opts(), &|_| {}).unwrap());
        paused
            .recv_timeout(PATIENCE)
            .expect("the first commit never reached its journal row");
        // Renamed already: the path holds the first session's bytes.
        assert!(fs::read(&final_path).unwrap() == ours);
        let two = send(&[second.join("f.dat")], &addr, &opts(), &|_| {}).unwrap();
        assert_eq!(two.failed, 1, "{two:?}");
        let why = two.files[0].error.as_deref().unwrap_or("");
        assert!(why.contains("this process is receiving that path"), "{why}");
        assert!(
            fs::read(&final_path).unwrap() == ours,
            "the refused session changed the file"
        );
        go.send(()).unwrap();
        let one = one.join().unwrap();
        assert_eq!(one.failed, 0, "{one:?}");
    });
    // Recorded and released: the same path now takes another session's
    // bytes.
    let three = send(&[second.join("f.dat")], &addr, &opts(), &|_| {}).unwrap();
    assert_eq!(three.failed, 0, "{three:?}");
    assert!(fs::read(&final_path).unwrap() == theirs);
    server.stop().unwrap();
}
