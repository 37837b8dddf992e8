//! The read-ahead window between a link and the receiver's session
//! thread: at most `max` deliveries wait in memory, and a link that had to
//! wait is woken only once the session has taken the queue down to `low`.
//!
//! A bounded channel of `max` (what this replaces) wakes a waiting link
//! for every delivery the session takes, so on a busy machine the two
//! threads take turns one message at a time: the link reads one frame and
//! waits again, and each wake-up lands on the session's core and preempts
//! it (measured in docs/benchmarks.md, "The reader woken less often").
//! Woken at `low`, the link may hand over `max - low` deliveries before it
//! can wait again; the bound on memory is unchanged.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

#[derive(Default)]
struct State {
    /// Deliveries handed over and not yet taken.
    out: usize,
    /// The link waits for room.
    waiting: bool,
    /// The session is gone: a waiting link gives up.
    closed: bool,
}

struct Shared {
    state: Mutex<State>,
    room: Condvar,
    max: usize,
    low: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The link's end: takes a credit before each delivery.
#[derive(Clone)]
pub(crate) struct CreditTaker(Arc<Shared>);

/// The session's end: gives a credit back per delivery taken; closes the
/// window when dropped, so a link waiting on it stops.
pub(crate) struct CreditGiver(Arc<Shared>);

/// The session's end went away.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Closed;

/// A window of `max` deliveries (at least 1); a waiting link is woken when
/// at most `low` are left (clamped below `max`).
pub(crate) fn window(max: usize, low: usize) -> (CreditTaker, CreditGiver) {
    let max = max.max(1);
    let shared = Arc::new(Shared {
        state: Mutex::new(State::default()),
        room: Condvar::new(),
        max,
        low: low.min(max - 1),
    });
    (CreditTaker(Arc::clone(&shared)), CreditGiver(shared))
}

impl CreditTaker {
    /// Counts one more delivery out. If `max` are out, first waits until
    /// the giver has brought them down to `low` (or a spurious wake-up
    /// finds room); fails once the giver is gone.
    pub(crate) fn take(&self) -> Result<(), Closed> {
        let s = &self.0;
        let mut st = s.lock();
        while !st.closed && st.out >= s.max {
            st.waiting = true;
            st = s.room.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        // No longer waiting, however it woke (a spurious wake-up that
        // found room included).
        st.waiting = false;
        if st.closed {
            return Err(Closed);
        }
        st.out += 1;
        Ok(())
    }
}

impl CreditGiver {
    /// One delivery was taken. With none out nothing happens: an
    /// in-process link's close arrives without a credit.
    pub(crate) fn give_back(&self) {
        let s = &self.0;
        let mut st = s.lock();
        st.out = st.out.saturating_sub(1);
        if st.waiting && st.out <= s.low {
            st.waiting = false;
            drop(st);
            s.room.notify_all();
        }
    }
}

#[cfg(test)]
impl CreditGiver {
    /// The link waits for room now.
    fn link_waits(&self) -> bool {
        self.0.lock().waiting
    }

    /// Waits (up to 30 s) until the link waits for room.
    fn until_link_waits(&self) {
        let t = std::time::Instant::now();
        while !self.link_waits() {
            assert!(t.elapsed().as_secs() < 30, "the link never waited");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

impl Drop for CreditGiver {
    fn drop(&mut self) {
        self.0.lock().closed = true;
        self.0.room.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn a_link_waits_at_max_and_wakes_only_at_low() {
        let (taker, giver) = window(4, 1);
        for _ in 0..4 {
            taker.take().unwrap();
        }
        let (tx, rx) = mpsc::channel();
        let t = {
            let taker = taker.clone();
            std::thread::spawn(move || tx.send(taker.take()).unwrap())
        };
        giver.until_link_waits();
        // Out: 4, then 3, then 2: room, but above low; the link still
        // waits (a link woken at every credit would have gone on).
        for _ in 0..2 {
            giver.give_back();
            assert!(giver.link_waits(), "woken above the low mark");
        }
        assert!(rx.try_recv().is_err(), "took a credit above the low mark");
        giver.give_back();
        let r = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("woken at the low mark");
        assert_eq!(r, Ok(()));
        assert!(!giver.link_waits());
        t.join().unwrap();
    }

    #[test]
    fn a_link_never_has_more_than_max_out_and_stops_when_the_giver_goes() {
        let (taker, giver) = window(3, 0);
        for _ in 0..3 {
            taker.take().unwrap();
        }
        let (tx, rx) = mpsc::channel();
        let t = {
            let taker = taker.clone();
            std::thread::spawn(move || {
                for _ in 0..3 {
                    taker.take().unwrap();
                    tx.send(()).unwrap();
                }
            })
        };
        giver.until_link_waits();
        for _ in 0..3 {
            giver.give_back();
        }
        // Three given back: three more taken.
        for _ in 0..3 {
            rx.recv_timeout(Duration::from_secs(30)).unwrap();
        }
        t.join().unwrap();
        // Three out again: a fourth waits until the giver is dropped.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || tx.send(taker.take()));
        giver.until_link_waits();
        assert!(
            rx.try_recv().is_err(),
            "a fourth credit while three are out"
        );
        drop(giver);
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(30)).unwrap(),
            Err(Closed)
        );
    }
}
