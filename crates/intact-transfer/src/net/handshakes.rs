//! Connections still in their handshake, counted in all and per client
//! address: a server takes at most [`MAX_HANDSHAKES`] at once, and at most
//! [`MAX_HANDSHAKES_PER_ADDR`] from one address, so that sockets from one
//! host that never authenticate cannot hold every place (each is also
//! ended at its handshake deadline by the watchdog).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Connections still authenticating at once; more are refused.
pub const MAX_HANDSHAKES: usize = 64;

/// Connections still authenticating from one address at once; more from
/// it are refused while other addresses still get in. An honest client
/// opens one per stream, all at once, and authenticates within two round
/// trips.
pub const MAX_HANDSHAKES_PER_ADDR: usize = 16;

/// The handshakes running now.
#[derive(Clone, Default)]
pub(crate) struct Handshakes(Arc<Mutex<Counts>>);

#[derive(Default)]
struct Counts {
    all: usize,
    by_addr: HashMap<IpAddr, usize>,
}

/// One connection's place among the handshakes, given back when dropped.
pub(crate) struct Handshaking {
    of: Handshakes,
    addr: IpAddr,
}

impl Handshakes {
    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        // Counters only: a panic elsewhere cannot leave them inconsistent.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for a connection from `addr`, or why not (for the client).
    pub fn take(&self, addr: IpAddr) -> Result<Handshaking, String> {
        let mut c = self.lock();
        if c.all >= MAX_HANDSHAKES {
            return Err(format!(
                "busy: {MAX_HANDSHAKES} connections are still authenticating; try again later"
            ));
        }
        let here = c.by_addr.entry(addr).or_insert(0);
        if *here >= MAX_HANDSHAKES_PER_ADDR {
            return Err(format!(
                "busy: {MAX_HANDSHAKES_PER_ADDR} connections from {addr} are still authenticating; try again later"
            ));
        }
        *here += 1;
        c.all += 1;
        Ok(Handshaking {
            of: self.clone(),
            addr,
        })
    }
}

impl Drop for Handshaking {
    fn drop(&mut self) {
        let mut c = self.of.lock();
        c.all = c.all.saturating_sub(1);
        if let Some(n) = c.by_addr.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                c.by_addr.remove(&self.addr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_cannot_take_every_place() {
        let h = Handshakes::default();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let mine: Vec<_> = (0..MAX_HANDSHAKES_PER_ADDR)
            .map(|_| h.take(a).unwrap())
            .collect();
        let why = h.take(a).err().expect("a 17th from one address");
        assert!(why.contains("from 192.0.2.1"), "{why}");
        let theirs = h.take(b).expect("another address still gets in");
        drop(mine);
        drop(theirs);
        assert!(h.lock().by_addr.is_empty());
        assert_eq!(h.lock().all, 0);
        // The total still bounds many addresses.
        let many: Vec<_> = (0..MAX_HANDSHAKES)
            .map(|i| {
                h.take(IpAddr::from([10, 0, (i / 250) as u8, (i % 250) as u8]))
                    .unwrap()
            })
            .collect();
        assert!(h.take(b).is_err());
        drop(many);
        assert!(h.take(b).is_ok());
    }
}
