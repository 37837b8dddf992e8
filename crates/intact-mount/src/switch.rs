//! Checksum switching, made concrete (Z²FS §III): a page the kernel holds
//! in the mount's cache was checked when it was read, and is unprotected
//! while it stays there. The reliability model says how long that may
//! last before the chance of an undetected memory error passes the
//! Zettabyte goal (t_switch: 92 s for the paper's middle memory error
//! rate and a regular disk); after that the mount invalidates the file's
//! cached pages (FUSE's inode invalidation), so the next read checks them
//! again from the disk.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use intact_reliability::{solve_switch_time, Disk, Environment, Memory, SwitchTime};

use crate::Stats;

/// The memory and disk the reliability model is asked about.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reliability {
    /// Memory reliability index (−log10 λ; the paper's middle, non-ECC
    /// DRAM, is 14.2).
    pub mem_index: f64,
    /// Disk reliability index (−log10 UBER; a regular disk is 12).
    pub disk_index: f64,
}

impl Default for Reliability {
    /// The paper's configuration 2: non-ECC memory at the middle error
    /// rate, a regular disk.
    fn default() -> Self {
        let env = Environment::paper_config(2).expect("config 2 exists");
        Reliability {
            mem_index: env.memory.index(),
            disk_index: env.disk.index(),
        }
    }
}

/// How long cached pages may stay before they are checked again, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Switch {
    /// None: never (the model needs no switch).
    pub after: Option<Duration>,
    /// Where the value came from, for the mount to print.
    pub why: String,
}

/// t_switch from `--t-switch` if given, else from the model for `r`.
pub fn choose(given: Option<Duration>, r: Reliability) -> Switch {
    if let Some(t) = given {
        return Switch {
            after: Some(t),
            why: format!("--t-switch {}", secs(t)),
        };
    }
    let mut env = Environment::paper_config(2).expect("config 2 exists");
    env.memory = Memory::from_index(r.mem_index);
    env.disk = Disk::from_index(r.disk_index);
    let model = format!(
        "the reliability model (Z²FS) for memory index {:.1} and disk index {:.1}, 4 KiB pages, goal: Zettabyte reliability",
        r.mem_index, r.disk_index
    );
    match solve_switch_time(&env) {
        SwitchTime::After(s) => {
            // At least 1 ms: a page must be read before it can be dropped.
            let t = Duration::from_secs_f64(s.max(0.001));
            Switch {
                after: Some(t),
                why: format!("{model}: t_switch = {}", secs(t)),
            }
        }
        SwitchTime::Immediately => Switch {
            after: Some(Duration::from_millis(1)),
            why: format!(
                "{model}: even a page read at once misses the goal, so cached pages are dropped at once"
            ),
        },
        SwitchTime::Never => Switch {
            after: None,
            why: format!("{model}: the goal holds for over 10^12 s, so cached pages are never dropped"),
        },
    }
}

fn secs(t: Duration) -> String {
    format!("{:.1} s", t.as_secs_f64())
}

/// Drops the kernel's cached pages of each inode once they are `after`
/// old, until `stop` is set.
pub(crate) fn spawn(
    cached: Arc<Mutex<HashMap<u64, Instant>>>,
    notifier: fuser::Notifier,
    after: Duration,
    stop: Arc<AtomicBool>,
    stats: Arc<Stats>,
) -> std::io::Result<JoinHandle<()>> {
    let tick = (after / 4).clamp(Duration::from_millis(20), Duration::from_secs(5));
    std::thread::Builder::new()
        .name("intact-switch".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // Unparked at unmount.
                std::thread::park_timeout(tick);
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let now = Instant::now();
                let due: Vec<u64> = {
                    let mut c = cached.lock().unwrap_or_else(|p| p.into_inner());
                    let due: Vec<u64> = c
                        .iter()
                        .filter(|(_, t)| now.duration_since(**t) >= after)
                        .map(|(i, _)| *i)
                        .collect();
                    for i in &due {
                        c.remove(i);
                    }
                    due
                };
                for ino in due {
                    // An inode the kernel has forgotten has nothing cached.
                    if notifier.inval_inode(fuser::INodeNo(ino), 0, 0).is_ok() {
                        stats.invalidations.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_papers_middle_memory_gives_its_92_seconds() {
        let s = choose(None, Reliability::default());
        let t = s.after.expect("a switch").as_secs_f64();
        assert!(
            (85.0..100.0).contains(&t),
            "t_switch {t} s, the paper says 92 s"
        );
        assert!(s.why.contains("14.2"), "{}", s.why);
    }

    #[test]
    fn better_memory_switches_later_and_a_given_value_wins() {
        let mid = choose(None, Reliability::default()).after.unwrap();
        let better = choose(
            None,
            Reliability {
                mem_index: 16.0,
                disk_index: 12.0,
            },
        );
        assert!(better.after.is_none_or(|t| t > mid * 10), "{better:?}");
        let given = choose(Some(Duration::from_secs(3)), Reliability::default());
        assert_eq!(given.after, Some(Duration::from_secs(3)));
        assert!(given.why.contains("--t-switch"));
    }
}
