//! The numbers the Z²FS and RIVA papers publish, reproduced by the model.
//! Scores are compared to the paper's one printed decimal (±0.1 at most,
//! since the paper rounds and some values are read off contour plots).

use intact_reliability::{
    block_risk, lambda, p_sys_udc, solve_switch_time, zettabyte_goal, Disk, Environment, Memory,
    SwitchTime, System, Verification,
};

fn config(n: u8) -> Environment {
    Environment::paper_config(n).unwrap()
}

fn score(system: System, env: &Environment) -> f64 {
    p_sys_udc(system, env, f64::INFINITY).score()
}

fn assert_score(got: f64, paper: f64, what: &str) {
    assert!(
        (got - paper).abs() <= 0.1,
        "{what}: model {got:.3}, paper {paper}"
    );
}

#[test]
fn zettabyte_goal_and_its_score() {
    let goal = zettabyte_goal(4096.0);
    // Paper: P_goal = 3.46e-18, score 17.5 (2^-58 = 3.4694e-18 exactly).
    assert!((goal.value() - 3.4694e-18).abs() < 1e-22, "{goal}");
    assert!((goal.value() - 3.46e-18).abs() / 3.46e-18 < 0.003);
    assert_score(goal.score(), 17.5, "goal score");
}

#[test]
fn ncfs_scores_of_figure_2a() {
    // "both config 2 and 3 have a score of 7.4"; config 4 "best ... 12.8".
    // Config 3 computes to 7.48: the paper's 7.4 is read off its plot.
    assert_score(score(System::Ncfs, &config(2)), 7.4, "NCFS config 2");
    assert_score(score(System::Ncfs, &config(3)), 7.4, "NCFS config 3");
    assert_score(score(System::Ncfs, &config(4)), 12.8, "NCFS config 4");
}

#[test]
fn zfs_scores_of_figure_2b() {
    // "Both config 3 and config 4 have the highest reliability score of 12.8".
    assert_score(score(System::Zfs, &config(3)), 12.8, "ZFS config 3");
    assert_score(score(System::Zfs, &config(4)), 12.8, "ZFS config 4");
    // ...and config 4 scores the same as under NCFS: memory dominates.
    let diff = score(System::Zfs, &config(4)) - score(System::Ncfs, &config(4));
    assert!(diff.abs() < 0.01, "{diff}");
}

#[test]
fn e2zfs_scores_of_figures_2c_and_2d() {
    // Fletcher: "config 1 even gets a score of 36.6", every config above the goal.
    assert_score(
        score(System::E2zfsFletcher, &config(1)),
        36.6,
        "E2ZFS Fletcher config 1",
    );
    let goal = zettabyte_goal(4096.0).score();
    for n in 1..=4 {
        assert!(
            score(System::E2zfsFletcher, &config(n)) > goal,
            "config {n}"
        );
    }
    // xor: "Config 4 has a score of 27.8 while both config 2 and 3 have 17.1".
    assert_score(
        score(System::E2zfsXor, &config(4)),
        27.8,
        "E2ZFS xor config 4",
    );
    assert_score(
        score(System::E2zfsXor, &config(2)),
        17.1,
        "E2ZFS xor config 2",
    );
    assert_score(
        score(System::E2zfsXor, &config(3)),
        17.1,
        "E2ZFS xor config 3",
    );
    // Configs 2 and 3 fall below the 17.5 goal, config 4 meets it.
    assert!(score(System::E2zfsXor, &config(2)) < goal);
    assert!(score(System::E2zfsXor, &config(4)) > goal);
}

#[test]
fn z2fs_static_meets_the_goal_above_memory_index_13_7() {
    // "When memory corruption is severe with an index less than 13.7, the
    // reliability score is below the goal" (t_resident = 1, Figure 3).
    let goal = zettabyte_goal(4096.0);
    let at = |index: f64| {
        let env = Environment {
            memory: Memory::from_index(index),
            disk: Disk::from_index(12.0),
            ..config(2)
        };
        p_sys_udc(System::Z2fsStatic, &env, f64::INFINITY)
    };
    assert!(at(13.6) > goal);
    assert!(at(13.8) < goal);
    // The crossing itself, by bisection: 13.7 to one decimal.
    let (mut lo, mut hi) = (13.0, 15.0);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if at(mid) > goal {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    assert!((lo - 13.7).abs() < 0.05, "threshold index {lo}");
}

#[test]
fn switching_time_at_the_middle_memory_error_rate_is_92_seconds() {
    // "With ... P_goal = 3.46e-18 and λmid, we have t_switch = 92."
    match solve_switch_time(&config(2)) {
        SwitchTime::After(t) => assert!((t - 92.0).abs() < 1.0, "t_switch {t}"),
        other => panic!("{other:?}"),
    }
    // "When the memory reliability index is high (λmin, config 3 and 4),
    // t_switch is about seven weeks."
    for n in [3, 4] {
        match solve_switch_time(&config(n)) {
            SwitchTime::After(t) => {
                let weeks = t / (7.0 * 86400.0);
                assert!((6.5..=7.5).contains(&weeks), "config {n}: {weeks} weeks");
            }
            other => panic!("{other:?}"),
        }
    }
    // Config 1 (λmax): xor never meets the goal, so Fletcher throughout,
    // which then scores like E²ZFS (Fletcher).
    assert_eq!(solve_switch_time(&config(1)), SwitchTime::Immediately);
    let dynamic = p_sys_udc(System::Z2fsDynamic, &config(1), 0.0);
    assert_eq!(dynamic, p_sys_udc(System::E2zfsFletcher, &config(1), 0.0));
}

#[test]
fn dynamic_mode_stays_above_the_goal_after_switching() {
    // Figure 4d: with t_switch = 92 s the score stays above the goal.
    let goal = zettabyte_goal(4096.0);
    for t in [1.0, 50.0, 91.0, 93.0, 1e3, 1e5, 1e7] {
        let env = Environment {
            t_resident: t,
            ..config(2)
        };
        let p = p_sys_udc(System::Z2fsDynamic, &env, 92.0);
        assert!(p <= goal, "t = {t}: {p}");
        // While static falls below it once t passes ~92 s.
        let s = p_sys_udc(System::Z2fsStatic, &env, f64::INFINITY);
        assert_eq!(s <= goal, t < 92.0, "static at t = {t}: {s}");
    }
}

#[test]
fn the_misprinted_lambda_max_contradicts_figure_4a() {
    // Figure 4a: at λmax "the whole line of Z²FS is below the goal", even
    // at t_resident = 1 s. True for 4.42e-14; false for the 1.99e-14 the
    // paper prints in Section III-C2 (index 13.70, right on the threshold).
    let goal = zettabyte_goal(4096.0);
    let with = |l: f64| {
        let env = Environment {
            memory: Memory::from_lambda(l),
            ..config(1)
        };
        p_sys_udc(System::Z2fsStatic, &env, f64::INFINITY)
    };
    assert!(with(lambda::MAX) > goal);
    assert!(with(lambda::MAX_MISPRINT) < goal);
}

#[test]
fn riva_worked_examples_with_256_mb_blocks() {
    let bits = 256.0 * 1024.0 * 1024.0 * 8.0;
    // E = 1e-10: "P(error) = bE ... 0.2 for traditional ... reduced to 10^-11 with RIVA".
    let cache = block_risk(Verification::Cache, bits, 1e-10);
    assert!((cache.paper_approx.value() - 0.2).abs() < 0.02);
    assert!(
        (cache.exact.value() - 0.193).abs() < 0.001,
        "{:?}",
        cache.exact
    );
    let device = block_risk(Verification::Device, bits, 1e-10);
    assert_eq!(device.exact.log10().floor(), -11.0, "{:?}", device.exact);
    // E = 1e-15: "reduced from 10^-6 to 10^-21".
    let cache = block_risk(Verification::Cache, bits, 1e-15);
    assert_eq!(cache.exact.log10().floor(), -6.0);
    let device = block_risk(Verification::Device, bits, 1e-15);
    assert_eq!(device.exact.log10().floor(), -21.0);
    // Exact ≈ bE² (the paper's derivation says 2bE², its text bE²; see riva.rs).
    let be2 = bits * 1e-30;
    assert!((device.exact.value() / be2 - 1.0).abs() < 1e-5);
    assert!(device.exact <= device.paper_bound);
    // Device-level verification is ~15 orders of magnitude better here.
    let gain = cache.exact.log10() - device.exact.log10();
    assert!((14.5..=15.5).contains(&gain), "{gain}");
}

#[test]
fn riva_exact_formula_matches_brute_force_where_floats_can_do_it() {
    // (E² + (1−E)²)^b − (1−E)^2b, naively, for a large E where nothing cancels.
    let (b, e) = (1000.0f64, 1e-3f64);
    let naive = (e * e + (1.0 - e) * (1.0 - e)).powf(b) - (1.0 - e).powf(2.0 * b);
    let got = block_risk(Verification::Device, b, e).exact.value();
    assert!((got / naive - 1.0).abs() < 1e-9, "{got} vs {naive}");
    // And no verification: two unchecked I/Os.
    let none = block_risk(Verification::None, b, e).exact.value();
    assert!((none - (1.0 - (1.0 - e).powf(2.0 * b))).abs() < 1e-12);
}

#[test]
fn tiny_probabilities_do_not_underflow() {
    // E²ZFS(Fletcher), config 4 but UBER 1e-20: the writer's memory term
    // dominates, (bλ·30)^3/6 × 4.16e-20 with bλ·30 = 32768 × 1.48e-19 × 30.
    let env = Environment {
        disk: Disk::from_uber(1e-20),
        ..config(4)
    };
    let p = p_sys_udc(System::E2zfsFletcher, &env, f64::INFINITY);
    let mu: f64 = 32768.0 * lambda::MIN * 30.0;
    let by_hand = (mu.powi(3) / 6.0 * 4.16e-20).log10();
    assert!((p.log10() - by_hand).abs() < 0.01, "{p} vs 10^{by_hand}");
    // Far below f64's range (~1e-308): still exact in log space.
    let disk = Disk::from_uber(1e-120);
    let q = intact_reliability::ChecksumModel::fletcher().p_udc_disk(&disk, 32768.0);
    assert_eq!(q.value(), 0.0, "not representable as a plain f64");
    let c3 = (32768.0f64 * 32767.0 * 32766.0 / 6.0).log10();
    assert!(
        (q.log10() - (c3 - 360.0 + 4.16e-20f64.log10())).abs() < 1e-6,
        "{q}"
    );
}
