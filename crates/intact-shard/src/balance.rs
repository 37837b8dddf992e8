//! Cutting work into bins of about equal weight: largest first, each to
//! the bin that holds least so far (Graham's LPT rule: the heaviest bin is
//! at most 4/3 of the best possible, and within one item of the mean when
//! items are small against it).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The bin (0..`bins`) of each item, by weight, largest first, ties to
/// the lower item and then the lower bin so that a plan is the same every
/// time for the same tree.
pub fn assign(weights: &[u64], bins: usize) -> Vec<usize> {
    assign_from(weights, &vec![0; bins])
}

/// As [`assign`], into bins that already hold `loads` (one per bin).
pub fn assign_from(weights: &[u64], loads: &[u64]) -> Vec<usize> {
    assert!(!loads.is_empty(), "at least one bin");
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by_key(|&i| (Reverse(weights[i]), i));
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = loads
        .iter()
        .enumerate()
        .map(|(b, &load)| Reverse((load, b)))
        .collect();
    let mut bin_of = vec![0; weights.len()];
    for i in order {
        let Reverse((load, b)) = heap.pop().expect("bins > 0");
        bin_of[i] = b;
        heap.push(Reverse((load.saturating_add(weights[i]), b)));
    }
    bin_of
}

/// The heaviest bin's load over the mean load (1.0: perfectly even; 1.0
/// too when there is nothing to share).
pub fn imbalance(loads: &[u64]) -> f64 {
    let total: u128 = loads.iter().map(|&l| u128::from(l)).sum();
    let max = loads.iter().copied().max().unwrap_or(0);
    if total == 0 || loads.is_empty() {
        return 1.0;
    }
    max as f64 * loads.len() as f64 / total as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn loads(weights: &[u64], bins: usize) -> Vec<u64> {
        let mut l = vec![0u64; bins];
        for (i, b) in assign(weights, bins).into_iter().enumerate() {
            l[b] += weights[i];
        }
        l
    }

    #[test]
    fn even_items_spread_evenly() {
        assert_eq!(loads(&[5; 8], 4), vec![10; 4]);
        assert_eq!(imbalance(&loads(&[5; 8], 4)), 1.0);
        // One big item alone; the small ones fill the others.
        assert_eq!(loads(&[100, 10, 10, 10, 10, 10, 10], 3), vec![100, 30, 30]);
    }

    proptest! {
        /// LPT's bound: no bin exceeds the mean by more than the largest item.
        #[test]
        fn no_bin_exceeds_mean_by_more_than_the_largest_item(
            weights in proptest::collection::vec(0u64..1_000_000, 0..200),
            bins in 1usize..9,
        ) {
            let l = loads(&weights, bins);
            prop_assert_eq!(l.iter().sum::<u64>(), weights.iter().sum::<u64>());
            let mean = weights.iter().sum::<u64>() as f64 / bins as f64;
            let largest = weights.iter().copied().max().unwrap_or(0) as f64;
            prop_assert!(l.iter().all(|&x| x as f64 <= mean + largest + 1.0));
        }
    }
}
