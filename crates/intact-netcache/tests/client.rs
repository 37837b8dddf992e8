//! What a receiver's requests to its caches can and cannot be made to do:
//! a cache that drips its answer is given up by the request's deadline; a
//! kept connection the cache closed (it restarted) is replaced, and the
//! block still comes from the cache.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use intact_netcache::client::deadline_for;
use intact_netcache::service::{Service, MAGIC};
use intact_netcache::{Counters, RecoveryCaches, Store};

#[test]
fn a_cache_that_drips_its_answer_is_given_up_at_the_deadline() {
    let liar = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = liar.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in liar.incoming() {
            let Ok(mut s) = s else { break };
            std::thread::spawn(move || {
                let _ = s.write_all(MAGIC);
                let mut buf = [0u8; 40];
                let _ = s.read_exact(&mut buf);
                let _ = s.write_all(&[1, 0, 0, 0x10, 0]);
                // 4096 bytes announced, one every 300 ms.
                for _ in 0..4096 {
                    if s.write_all(&[0]).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(300));
                }
            });
        }
    });
    let caches = RecoveryCaches::new(vec![addr.to_string()]);
    let t = Instant::now();
    let got = caches.fetch(&[7; 32], 4096);
    assert!(got.is_err());
    let took = t.elapsed();
    // One try on a kept connection (none), one anew: at most two deadlines.
    assert!(
        took < 2 * deadline_for(4096) + Duration::from_secs(1),
        "{took:?}"
    );
}

#[test]
fn a_kept_connection_the_cache_closed_is_replaced() {
    let store = Arc::new(Store::new(1 << 20));
    let data = vec![3u8; 5000];
    let key = *blake3::hash(&data).as_bytes();
    store.insert(key, data.clone().into(), true);
    let counters = Arc::new(Counters::default());
    let svc = Service::start(
        "127.0.0.1:0",
        Arc::clone(&store),
        Arc::clone(&counters),
        Duration::ZERO,
    )
    .unwrap();
    let addr = svc.addr();
    let caches = RecoveryCaches::new(vec![addr.to_string()]);
    assert_eq!(caches.fetch(&key, 5000).unwrap().data, data);
    // The cache restarts on the same address: the kept connection is dead.
    drop(svc);
    let svc = Service::start(
        &addr.to_string(),
        Arc::clone(&store),
        counters,
        Duration::ZERO,
    )
    .unwrap();
    assert_eq!(
        caches
            .fetch(&key, 5000)
            .expect("from the restarted cache")
            .data,
        data
    );
    drop(svc);
}

#[test]
fn many_repairs_at_once_from_one_receiver_all_reach_the_cache() {
    let store = Arc::new(Store::new(1 << 20));
    let data = vec![9u8; 3000];
    let key = *blake3::hash(&data).as_bytes();
    store.insert(key, data.clone().into(), true);
    let svc = Service::start(
        "127.0.0.1:0",
        Arc::clone(&store),
        Arc::new(Counters::default()),
        Duration::ZERO,
    )
    .unwrap();
    let caches = RecoveryCaches::new(vec![svc.addr().to_string()]);
    let threads: Vec<_> = (0..24)
        .map(|_| {
            let caches = caches.clone();
            std::thread::spawn(move || caches.fetch(&key, 3000).map(|r| r.data))
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap().expect("every request served"), data);
    }
}
