//! A listening socket whose connections are each served on a thread of
//! their own, within limits: at most `max` at once and `per_peer` from one
//! address (others are closed at once); a thread that cannot be started
//! gives its places back. The relay and the service are both this.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Connections held now: in all, and per peer address.
#[derive(Default)]
struct Places {
    open: usize,
    peers: HashMap<IpAddr, usize>,
}

impl Places {
    fn take(&mut self, peer: IpAddr, max: usize, per_peer: usize) -> bool {
        let n = self.peers.get(&peer).copied().unwrap_or(0);
        if self.open >= max || n >= per_peer {
            return false;
        }
        self.open += 1;
        self.peers.insert(peer, n + 1);
        true
    }

    fn give(&mut self, peer: IpAddr) {
        self.open -= 1;
        if let Some(n) = self.peers.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                self.peers.remove(&peer);
            }
        }
    }
}

fn lock(p: &Mutex<Places>) -> std::sync::MutexGuard<'_, Places> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running listener; stopped (and its accept thread joined) on drop.
pub struct Listening {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Listening {
    /// Listens on `listen` and runs `handle` for each connection (with the
    /// flag that says the listener is stopping) on a thread named `name`.
    pub fn start(
        listen: &str,
        name: &'static str,
        max: usize,
        per_peer: usize,
        handle: impl Fn(TcpStream, &AtomicBool) + Send + Sync + 'static,
    ) -> io::Result<Listening> {
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = Arc::new(handle);
        let thread = std::thread::Builder::new()
            .name(format!("{name}-accept"))
            .spawn(move || {
                let places = Arc::new(Mutex::new(Places::default()));
                while !flag.load(Ordering::SeqCst) {
                    let (s, peer) = match listener.accept() {
                        Ok(c) => c,
                        Err(_) => {
                            std::thread::sleep(Duration::from_millis(20));
                            continue;
                        }
                    };
                    if !lock(&places).take(peer.ip(), max, per_peer) {
                        continue;
                    }
                    let (handle, places2, flag2) =
                        (Arc::clone(&handle), Arc::clone(&places), Arc::clone(&flag));
                    let spawned = std::thread::Builder::new()
                        .name(name.into())
                        .spawn(move || {
                            let _ = s.set_nonblocking(false);
                            handle(s, &flag2);
                            lock(&places2).give(peer.ip());
                        });
                    if spawned.is_err() {
                        // Its closure never ran: give its places back here.
                        lock(&places).give(peer.ip());
                    }
                }
            })?;
        Ok(Listening {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
