//! A budget shared by a server's sessions, in which every session keeps a
//! guaranteed share: what one client holds can never make another's work
//! fail or stall for lack of it.
//!
//! A server has a few such budgets: the memory its streams' frames may
//! hold at once (taken before a frame's body is read, see
//! [`Connection::set_budget`](crate::Connection::set_budget)), the
//! per-block state of the files its sessions receive. A budget of `total`
//! for at most `parties` sessions guarantees each of them
//! `total / (2 × parties)` (its *share*): a session may hold more, from the
//! half of the budget nobody is guaranteed, but only while every other
//! session, running or yet to come, can still get its own share. The rule
//! kept at every take is
//!
//! > Σ over the `parties` places of max(what its session holds, share) ≤ total
//!
//! (a place with no session counts as holding its share), so a session
//! that asks for no more than its share always gets it, and one client,
//! however many streams it opens, holds at most half the budget plus its
//! share. What was taken is given back when the [`Held`] is dropped.
//!
//! Takes either fail at once ([`Party::try_take`], for a file that can
//! then fail alone with a reason) or wait ([`Party::take`], for a frame:
//! its bytes are on their way). A waiting taker holds nothing of its own
//! frame yet, and every holder gives back without waiting on the budget,
//! so waits end.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::ProtoError;

/// A budget shared by the sessions of one server.
#[derive(Clone, Debug)]
pub struct Budget(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    total: u64,
    parties: u64,
    share: u64,
    state: Mutex<State>,
    freed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    /// What each party holding anything holds.
    held: HashMap<u64, u64>,
    /// Takers waiting for something to be given back: a give-back wakes
    /// them only if there are any (a wake-up is a system call).
    waiting: usize,
}

/// One session's place in a [`Budget`]; its clones (the session's
/// streams) share what it holds.
#[derive(Clone, Debug)]
pub struct Party {
    budget: Budget,
    id: u64,
    /// Set by [`Party::stop`]: waits of this handle (and its clones) end.
    stopped: Arc<AtomicBool>,
}

/// An amount taken from a budget by a party; given back when dropped.
#[derive(Debug)]
pub struct Held {
    budget: Arc<Inner>,
    party: u64,
    amount: u64,
}

/// Why a take was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// What the party holds already.
    pub holds: u64,
    /// Its guaranteed share.
    pub share: u64,
    /// The budget.
    pub total: u64,
}

impl Budget {
    /// A budget of `total` for at most `parties` sessions at once (at
    /// least one), each guaranteed `total / (2 × parties)`.
    pub fn new(total: u64, parties: usize) -> Budget {
        let parties = parties.max(1) as u64;
        Budget(Arc::new(Inner {
            total,
            parties,
            share: total / (2 * parties),
            state: Mutex::new(State::default()),
            freed: Condvar::new(),
        }))
    }

    /// A new session's place.
    pub fn party(&self) -> Party {
        let mut s = self.0.lock();
        s.next += 1;
        Party {
            budget: self.clone(),
            id: s.next,
            stopped: Arc::new(AtomicBool::new(false)),
        }
    }

    /// What all sessions hold now.
    pub fn held(&self) -> u64 {
        self.0.lock().held.values().sum()
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Counters only: a panic elsewhere cannot leave them half-updated.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `party` may take `amount` more under the rule.
    fn allows(&self, s: &State, party: u64, amount: u64) -> bool {
        let mine = s.held.get(&party).copied().unwrap_or(0);
        let Some(after) = mine.checked_add(amount) else {
            return false;
        };
        let others = s.held.iter().filter(|(p, _)| **p != party);
        let places = s.held.len() as u64 + u64::from(!s.held.contains_key(&party));
        let committed = others
            .map(|(_, h)| u128::from((*h).max(self.share)))
            .sum::<u128>()
            + u128::from(after.max(self.share))
            + u128::from(self.parties.saturating_sub(places)) * u128::from(self.share);
        committed <= u128::from(self.total)
    }

    fn grant(self: &Arc<Self>, s: &mut State, party: u64, amount: u64) -> Held {
        *s.held.entry(party).or_insert(0) += amount;
        Held {
            budget: Arc::clone(self),
            party,
            amount,
        }
    }
}

impl Party {
    /// A handle on the same place whose waits [`Party::stop`] can end
    /// without ending the other handles' (one per stream of a session).
    pub fn handle(&self) -> Party {
        Party {
            budget: self.budget.clone(),
            id: self.id,
            stopped: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Ends every wait of this handle and its clones, now and later
    /// (they fail with [`ProtoError::Closed`]): its stream has ended, and
    /// its reader must not sit out the rest of its wait.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        // Under the lock: a waiter checks the flag under it, so it either
        // sees the flag or is already waiting when the notice comes.
        let _s = self.budget.0.lock();
        self.budget.0.freed.notify_all();
    }

    /// Takes `amount` if the rule allows it now; else what this party
    /// holds and is guaranteed, for the reason.
    pub fn try_take(&self, amount: u64) -> Result<Held, Refused> {
        let inner = &self.budget.0;
        let mut s = inner.lock();
        if inner.allows(&s, self.id, amount) {
            return Ok(inner.grant(&mut s, self.id, amount));
        }
        Err(Refused {
            holds: s.held.get(&self.id).copied().unwrap_or(0),
            share: inner.share,
            total: inner.total,
        })
    }

    /// [`Party::try_take`] into `held`: what is taken joins what `held`
    /// already holds (one grant for a growing structure).
    pub fn try_add(&self, held: &mut Option<Held>, amount: u64) -> Result<(), Refused> {
        let more = self.try_take(amount)?;
        match held {
            Some(h) => h.absorb(more),
            None => *held = Some(more),
        }
        Ok(())
    }

    /// Takes `amount`, waiting up to `wait` while the rule does not allow
    /// it (other sessions, or this one's other streams, hold too much);
    /// then fails with [`ProtoError::Busy`] (or at once with
    /// [`ProtoError::Closed`] once [`Party::stop`] was called).
    pub fn take(&self, amount: u64, wait: Duration) -> Result<Held, ProtoError> {
        let inner = &self.budget.0;
        let deadline = Instant::now() + wait;
        let mut s = inner.lock();
        loop {
            if self.stopped.load(Ordering::SeqCst) {
                return Err(ProtoError::Closed);
            }
            if inner.allows(&s, self.id, amount) {
                return Ok(inner.grant(&mut s, self.id, amount));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(ProtoError::Busy(format!(
                    "its memory for what clients send ({} MiB, {} MiB guaranteed to each client) stayed in use for {} s",
                    inner.total >> 20,
                    inner.share >> 20,
                    wait.as_secs()
                )));
            }
            s.waiting += 1;
            s = inner
                .freed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            s.waiting -= 1;
        }
    }
}

impl Held {
    /// The amount held.
    pub fn amount(&self) -> u64 {
        self.amount
    }

    /// Holds `other` too, as one grant (both of one party of one budget).
    pub fn absorb(&mut self, mut other: Held) {
        debug_assert!(Arc::ptr_eq(&self.budget, &other.budget) && self.party == other.party);
        self.amount += std::mem::take(&mut other.amount);
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut s = self.budget.lock();
        if let Some(h) = s.held.get_mut(&self.party) {
            *h = h.saturating_sub(self.amount);
            if *h == 0 {
                s.held.remove(&self.party);
            }
        }
        let waiting = s.waiting > 0;
        drop(s);
        if waiting {
            self.budget.freed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_session_keeps_its_share_whatever_another_takes() {
        // 4 places, 1000 units: a share of 125 each, 500 nobody's own.
        let b = Budget::new(1000, 4);
        assert_eq!(b.0.share, 125);
        let hog = b.party();
        // Alone, a session gets half the budget plus its own share...
        let mut held: Vec<Held> = (0..625).map(|_| hog.try_take(1).unwrap()).collect();
        let refused = hog.try_take(1).unwrap_err();
        assert_eq!((refused.holds, refused.share), (625, 125));
        // ...and a second stream of it (a clone) gets no more.
        assert!(hog.clone().try_take(1).is_err());
        // Every other session still gets its whole share, at once.
        let others: Vec<Party> = (0..3).map(|_| b.party()).collect();
        let shares: Vec<Held> = others.iter().map(|p| p.try_take(125).unwrap()).collect();
        assert_eq!(b.held(), 625 + 3 * 125);
        assert!(others[0].try_take(1).is_err(), "the budget is full");
        // What the hog gives back goes to whoever asks.
        held.truncate(600);
        others[0].try_take(25).unwrap();
        drop((held, shares));
        assert_eq!(b.held(), 0, "everything given back, nothing leaked");
        assert!(
            !b.0.lock().held.contains_key(&hog.id),
            "the hog's place is gone"
        );
    }

    #[test]
    fn a_waiting_take_gets_what_is_given_back_or_fails_after_its_wait() {
        let b = Budget::new(100, 1);
        let p = b.party();
        let all = p.try_take(100).unwrap();
        let t0 = Instant::now();
        let r = p.take(1, Duration::from_millis(200));
        assert!(matches!(r, Err(ProtoError::Busy(_))), "{r:?}");
        assert!(t0.elapsed() >= Duration::from_millis(200));
        let p2 = p.clone();
        let waiter = std::thread::spawn(move || {
            p2.take(60, Duration::from_secs(30))
                .map(|h| h.amount())
                .ok()
        });
        std::thread::sleep(Duration::from_millis(20));
        drop(all);
        assert_eq!(waiter.join().unwrap(), Some(60));
        assert_eq!(b.held(), 0);
    }

    #[test]
    fn a_stopped_handle_ends_its_wait_at_once_and_leaves_the_others_waiting() {
        let b = Budget::new(100, 1);
        let p = b.party();
        let all = p.try_take(100).unwrap();
        let (mine, other) = (p.handle(), p.handle());
        let waiting = |h: Party| {
            std::thread::spawn(move || {
                let t0 = Instant::now();
                let r = h.take(1, Duration::from_secs(30));
                (r.map(|h| h.amount()), t0.elapsed())
            })
        };
        let (w1, w2) = (waiting(mine.clone()), waiting(other.clone()));
        std::thread::sleep(Duration::from_millis(100));
        mine.stop();
        let (r, took) = w1.join().unwrap();
        assert!(matches!(r, Err(ProtoError::Closed)), "{r:?}");
        assert!(took < Duration::from_secs(10), "waited {took:?} after stop");
        assert!(!w2.is_finished(), "the other handle's wait was ended too");
        drop(all);
        assert_eq!(w2.join().unwrap().0.ok(), Some(1));
        assert!(matches!(
            mine.take(1, Duration::ZERO),
            Err(ProtoError::Closed)
        ));
    }
}
