//! `intact reliability`: prints the reliability model's numbers.

use std::process::ExitCode;

use intact_reliability::{
    block_risk, default_scores, lambda, p_sys_udc, solve_switch_time, zettabyte_goal, BlockRisk,
    DefaultScore, Disk, Environment, Memory, Prob, SwitchTime, System, Verification,
};
use intact_transfer::VerifyMode;
use serde::Serialize;

use crate::args::ReliabilityArgs;
use crate::exit::usage;
use crate::stdout::outln;

pub fn run(args: &ReliabilityArgs) -> anyhow::Result<ExitCode> {
    let env = environment(args)?;
    if args.transfer {
        transfer(args, &env)?;
    } else if args.defaults {
        defaults(args, &env)?;
    } else {
        systems(args, &env)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The environment the flags describe: a paper configuration, or the
/// paper's non-ECC memory and regular disk, with any flag overriding.
fn environment(args: &ReliabilityArgs) -> anyhow::Result<Environment> {
    let mut env = Environment::paper_config(args.config.unwrap_or(2)).expect("1..=4 by clap");
    if let Some(i) = args.mem_index {
        env.memory = Memory::from_index(i);
    }
    if let Some(l) = args.lambda {
        env.memory = Memory::from_lambda(l);
    }
    if let Some(f) = args.fit_per_mbit {
        env.memory = Memory::from_fit_per_mbit(f);
    }
    if let Some(i) = args.disk_index {
        env.disk = Disk::from_index(i);
    }
    if let Some(u) = args.uber {
        env.disk = Disk::from_uber(u);
    }
    let bytes = args.block_size.unwrap_or(if args.transfer {
        intact_digest::defaults::BLOCK_BYTES
    } else {
        4096
    });
    env.block_bits = bytes as u64 * 8;
    env.t_resident = args.resident;
    env.t_flush = args.flush;
    let l = env.memory.lambda;
    let u = env.disk.uber;
    // Out-of-range values are usage errors (exit 2), like clap's own.
    if !(l > 0.0 && l < 1.0) {
        return Err(usage(format!(
            "memory error rate λ must be in (0, 1), got {l:e} (e.g. --mem-index 14.2 or --lambda 6e-15)"
        )));
    }
    if !(u > 0.0 && u < 1.0) {
        return Err(usage(format!(
            "disk UBER must be in (0, 1), got {u:e} (e.g. --uber 1e-12 or --disk-index 12)"
        )));
    }
    if !(env.t_resident >= 0.0 && env.t_flush >= 0.0) {
        return Err(usage(
            "residency and flush times must not be negative (--resident, --flush: seconds)",
        ));
    }
    Ok(env)
}

fn describe(env: &Environment) -> String {
    format!(
        "memory: λ = {:.3e} flips/bit/s (index {:.2}, {:.1} FIT/Mbit); disk: UBER = {:.3e} (index {:.2})\n\
         block {}, reader residency {} s, writer flush {} s",
        env.memory.lambda,
        env.memory.index(),
        env.memory.fit_per_mbit(),
        env.disk.uber,
        env.disk.index(),
        human_bytes(env.block_bytes() as u64),
        env.t_resident,
        env.t_flush
    )
}

#[derive(Serialize)]
struct SystemRow {
    system: System,
    p_sys_udc: Prob,
    score: f64,
    meets_goal: bool,
}

#[derive(Serialize)]
struct SystemsReport<'a> {
    environment: &'a Environment,
    goal: Prob,
    goal_score: f64,
    t_switch: SwitchTime,
    systems: Vec<SystemRow>,
}

fn systems(args: &ReliabilityArgs, env: &Environment) -> anyhow::Result<()> {
    let goal = zettabyte_goal(env.block_bytes());
    let solved = solve_switch_time(env);
    let t_switch = args.t_switch.unwrap_or(match solved {
        SwitchTime::Immediately => 0.0,
        SwitchTime::After(t) => t,
        SwitchTime::Never => f64::INFINITY,
    });
    let rows: Vec<SystemRow> = System::ALL
        .into_iter()
        .filter(|s| args.system.is_none_or(|only| only == *s))
        .map(|system| {
            let p = p_sys_udc(system, env, t_switch);
            SystemRow {
                system,
                p_sys_udc: p,
                score: p.score(),
                meets_goal: p <= goal,
            }
        })
        .collect();
    if args.json {
        let report = SystemsReport {
            environment: env,
            goal,
            goal_score: goal.score(),
            t_switch: solved,
            systems: rows,
        };
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
        return Ok(());
    }
    outln!("{}", describe(env))?;
    outln!(
        "goal: one undetected corruption per 2^70 bytes read in {} reads: P_goal = {goal}, score {:.2}\n",
        human_bytes(env.block_bytes() as u64),
        goal.score()
    )?;
    outln!("{:<16} {:>12} {:>7}  goal", "system", "P_sys-udc", "score")?;
    for r in &rows {
        let note = if r.system == System::Z2fsDynamic && t_switch <= 0.0 {
            "  (Fletcher throughout: xor cannot meet the goal)".to_string()
        } else if r.system == System::Z2fsDynamic {
            format!("  (switches at {})", seconds(t_switch))
        } else {
            String::new()
        };
        outln!(
            "{:<16} {:>12} {:>7.2}  {}{note}",
            r.system.name(),
            r.p_sys_udc.to_string(),
            r.score,
            if r.meets_goal { "meets" } else { "MISSES" }
        )?;
    }
    if args.solve_switch {
        let text = match solved {
            SwitchTime::Immediately => "immediately: xor misses the goal even for a block read at once; use Fletcher throughout".to_string(),
            SwitchTime::After(t) => format!("after {}", seconds(t)),
            SwitchTime::Never => "never within 10^12 s: xor alone meets the goal".to_string(),
        };
        outln!("\nt_switch (Z²FS dynamic, xor → Fletcher in memory): {text}")?;
    }
    Ok(())
}

#[derive(Serialize)]
struct TransferRow {
    verify: &'static str,
    catches: Verification,
    #[serde(flatten)]
    risk: BlockRisk,
}

#[derive(Serialize)]
struct TransferReport {
    uber: f64,
    block_bytes: u64,
    modes: Vec<TransferRow>,
}

/// Which I/O a verification mode's checksum reads.
fn verification_of(mode: VerifyMode) -> Verification {
    if mode == VerifyMode::None {
        Verification::None
    } else if mode.reads_device() {
        Verification::Device
    } else {
        Verification::Cache
    }
}

fn transfer(args: &ReliabilityArgs, env: &Environment) -> anyhow::Result<()> {
    let bits = env.block_bits as f64;
    let rows: Vec<TransferRow> = VerifyMode::ALL
        .into_iter()
        .filter(|m| args.verify.is_none_or(|only| only == *m))
        .map(|m| TransferRow {
            verify: m.name(),
            catches: verification_of(m),
            risk: block_risk(verification_of(m), bits, env.disk.uber),
        })
        .collect();
    if args.json {
        let report = TransferReport {
            uber: env.disk.uber,
            block_bytes: env.block_bytes() as u64,
            modes: rows,
        };
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
        return Ok(());
    }
    outln!(
        "undetected disk errors (UBER {:.3e} per I/O) in one {} block: probability that one escapes verification\n",
        env.disk.uber,
        human_bytes(env.block_bytes() as u64)
    )?;
    outln!(
        "{:<11} {:<12} {:>12} {:>14} {:>13}",
        "verify",
        "checksum of",
        "exact",
        "paper approx",
        "paper bound"
    )?;
    for r in &rows {
        let of = match r.catches {
            Verification::None => "nothing",
            Verification::Cache => "page cache",
            Verification::Device => "device",
        };
        outln!(
            "{:<11} {:<12} {:>12} {:>14} {:>13}",
            r.verify,
            of,
            r.risk.exact.to_string(),
            r.risk.paper_approx.to_string(),
            r.risk.paper_bound.to_string()
        )?;
    }
    outln!("\npaper approx: 2bE (none), bE (page cache), 2bE² (device, the RIVA paper's derivation; the exact value is ≈ bE²); bound: 12bE².")?;
    Ok(())
}

#[derive(Serialize)]
struct DefaultsRow {
    config: String,
    #[serde(flatten)]
    score: DefaultScore,
}

fn defaults(args: &ReliabilityArgs, env: &Environment) -> anyhow::Result<()> {
    let custom = args.config.is_some()
        || args.mem_index.is_some()
        || args.lambda.is_some()
        || args.fit_per_mbit.is_some()
        || args.disk_index.is_some()
        || args.uber.is_some();
    let envs: Vec<(String, Environment)> = if custom {
        vec![("given".into(), *env)]
    } else {
        (1..=4)
            .map(|n| {
                let mut e = Environment::paper_config(n).expect("1..=4");
                e.t_resident = env.t_resident;
                e.t_flush = env.t_flush;
                (n.to_string(), e)
            })
            .collect()
    };
    let rows: Vec<DefaultsRow> = envs
        .iter()
        .flat_map(|(name, e)| {
            default_scores(e).into_iter().map(|score| DefaultsRow {
                config: name.clone(),
                score,
            })
        })
        .collect();
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&rows)?)?;
        return Ok(());
    }
    outln!(
        "intact's default checksums (reader residency {} s, writer flush {} s); goal = one undetected corruption per 2^70 bytes read in reads of that size\n",
        env.t_resident, env.t_flush
    )?;
    outln!(
        "{:<7} {:<6} {:<8} {:>8} {:>12} {:>7} {:>11}  goal",
        "config",
        "unit",
        "digest",
        "size",
        "P_udc",
        "score",
        "goal score"
    )?;
    for r in &rows {
        let s = &r.score;
        outln!(
            "{:<7} {:<6} {:<8} {:>8} {:>12} {:>7.1} {:>11.1}  {}",
            r.config,
            s.unit,
            s.algorithm.name(),
            human_bytes(s.bytes),
            s.p_udc.to_string(),
            s.score,
            s.goal_score,
            if s.meets_goal { "meets" } else { "MISSES" }
        )?;
    }
    if !custom {
        outln!("\nconfigs (Z²FS Table I): 1 λ={:.2e} UBER=1e-10; 2 λ={:.2e} UBER=1e-12; 3 λ={:.2e} UBER=1e-12; 4 λ={:.2e} UBER=1e-20",
            lambda::MAX, lambda::MID, lambda::MIN, lambda::MIN)?;
    }
    Ok(())
}

fn seconds(t: f64) -> String {
    match t {
        t if t.is_infinite() => "never".into(),
        t if t < 120.0 => format!("{t:.1} s"),
        t if t < 7200.0 => format!("{:.1} min", t / 60.0),
        t if t < 2.0 * 86400.0 => format!("{:.1} h", t / 3600.0),
        t if t < 8.0 * 7.0 * 86400.0 * 10.0 => {
            format!("{:.1} days ({:.1} weeks)", t / 86400.0, t / 604800.0)
        }
        t => format!("{:.2e} s ({:.1} years)", t, t / 31_557_600.0),
    }
}

/// Bytes in the largest binary unit that divides them exactly.
fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut v, mut u) = (b, 0);
    while v >= 1024 && v % 1024 == 0 && u + 1 < UNITS.len() {
        v /= 1024;
        u += 1;
    }
    format!("{v} {}", UNITS[u])
}
