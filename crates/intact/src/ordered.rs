//! Runs work on a thread pool and hands results back in input order.

use std::collections::BTreeMap;
use std::sync::mpsc;

/// Runs `work` on every item across `pool` (items are started in order),
/// and calls `consume` on the calling thread with each result in item
/// order, as soon as all earlier ones are consumed.
pub fn for_each_ordered<T, R>(
    pool: &rayon::ThreadPool,
    items: &[T],
    work: impl Fn(&T) -> R + Sync,
    mut consume: impl FnMut(&T, R),
) where
    T: Sync,
    R: Send,
{
    let (tx, rx) = mpsc::channel::<(usize, R)>();
    std::thread::scope(|s| {
        let work = &work;
        s.spawn(move || {
            pool.scope_fifo(|scope| {
                for (i, item) in items.iter().enumerate() {
                    let tx = tx.clone();
                    scope.spawn_fifo(move |_| {
                        // The receiver only goes away if the consumer panicked.
                        let _ = tx.send((i, work(item)));
                    });
                }
            });
        });
        let mut next = 0;
        let mut early = BTreeMap::new();
        for (i, r) in rx {
            early.insert(i, r);
            while let Some(r) = early.remove(&next) {
                consume(&items[next], r);
                next += 1;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_order_whatever_the_finishing_order() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        let items: Vec<u64> = (0..500).collect();
        let mut seen = Vec::new();
        // Later items finish first: earlier ones spin longer.
        for_each_ordered(
            &pool,
            &items,
            |&i| {
                let spin: u64 = (0..(500 - i) * 1000).map(std::hint::black_box).sum();
                std::hint::black_box(spin);
                i
            },
            |&i, r| seen.push((i, r)),
        );
        let want: Vec<(u64, u64)> = items.iter().map(|&i| (i, i)).collect();
        assert_eq!(seen, want);
    }
}
