//! `intact-lab`: runs intact's fault matrix and prints it (test support,
//! not part of the user CLI). Needs root (loop devices, mount).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use intact_lab::{run_matrix, size_name, Fault, Matrix, MatrixConfig};
use intact_transfer::VerifyMode;

#[derive(Parser)]
#[command(
    name = "intact-lab",
    about = "intact's fault lab: inject real faults, print the detection matrix"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Every fault against every verification mode and size; ground truth
    /// is read from the device after a remount. Exit 1 on any LIE, if a
    /// riva cell does not end as its fault requires, a fault left no trace,
    /// or a loop device or mount was left behind.
    Matrix(MatrixArgs),
}

#[derive(clap::Args)]
struct MatrixArgs {
    /// File sizes (e.g. 1MiB,100MiB,1GiB).
    #[arg(long, value_delimiter = ',', default_value = "1MiB,100MiB,1GiB", value_parser = parse_size)]
    sizes: Vec<u64>,
    /// Verification modes [default: all].
    #[arg(long, value_delimiter = ',')]
    modes: Vec<VerifyMode>,
    /// Faults [default: all]: device-write, device-write-extreme,
    /// source-read, network-flip, network-cut, network-stall, memory,
    /// crash-sender, crash-server, disk-full, held-block-resume,
    /// unchanged-damaged, direct-data-journal; and Kim et al.'s Table 2 on
    /// the emulated SSD: host-memory, ssd-buffer, ssd-media.
    #[arg(long, value_delimiter = ',')]
    faults: Vec<Fault>,
    /// Kill-and-resume trials per crash cell.
    #[arg(long, default_value_t = 5)]
    crash_trials: u32,
    /// Work directory, on a real disk.
    #[arg(long, default_value = "/var/tmp/intact-lab")]
    dir: PathBuf,
    /// The intact binary for the crash faults [default: next to this one].
    #[arg(long)]
    intact: Option<PathBuf>,
    /// The negative control: the receiver's riva re-reads through the page
    /// cache (broken on purpose); the riva device-write cells must come out
    /// MISSED, or the lab cannot fail. Defaults to those cells (riva;
    /// device-write, device-write-extreme) unless --modes/--faults are given.
    #[arg(long)]
    negative_control: bool,
    /// The emulated SSD's write buffer for the Table 2 faults; their
    /// blocks are 1/16 of it and flash's W (--device-cache) twice it.
    #[arg(long, default_value = "4MiB", value_parser = parse_size)]
    ssd_buffer: u64,
    /// Print the matrix as JSON.
    #[arg(long)]
    json: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let (num, unit) = s.trim().split_at(
        s.trim()
            .find(|c: char| c.is_alphabetic())
            .unwrap_or(s.trim().len()),
    );
    let n: u64 = num.parse().map_err(|_| format!("bad size '{s}'"))?;
    let m = match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return Err(format!("bad unit in '{s}' (B, KiB, MiB, GiB)")),
    };
    Ok(n * m)
}

fn main() -> anyhow::Result<ExitCode> {
    let Cmd::Matrix(a) = Cli::parse().cmd;
    let intact = a.intact.clone().or_else(|| {
        let me = std::env::current_exe().ok()?;
        let sibling = me.with_file_name("intact");
        sibling.exists().then_some(sibling)
    });
    let cfg = MatrixConfig {
        dir: a.dir.clone(),
        sizes: a.sizes.clone(),
        modes: if a.modes.is_empty() && a.negative_control {
            vec![VerifyMode::Riva]
        } else if a.modes.is_empty() {
            VerifyMode::ALL.to_vec()
        } else {
            a.modes.clone()
        },
        faults: if a.faults.is_empty() && a.negative_control {
            Fault::NEGATIVE_CONTROL.to_vec()
        } else if a.faults.is_empty() {
            Fault::ALL.to_vec()
        } else {
            a.faults.clone()
        },
        crash_trials: a.crash_trials,
        intact,
        negative_control: a.negative_control,
        ssd_buffer: a.ssd_buffer,
    };
    let json = a.json;
    let m = run_matrix(&cfg, &|c| {
        if !json {
            eprintln!(
                "  {}: {} ({:.1} s)",
                c.label(),
                c.outcome.short(),
                c.seconds
            );
        }
    })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&m)?);
    } else {
        print_table(&m, &cfg);
    }
    let problems = m.problems();
    for p in &problems {
        eprintln!("intact-lab: {p}");
    }
    Ok(if problems.is_empty() && m.skipped.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn print_table(m: &Matrix, cfg: &MatrixConfig) {
    println!(
        "intact-lab matrix{}: ground truth read from the device after a remount of the loop file system (nothing of it cached); {} of RAM here, so every file below stays cached; files larger than RAM cannot be made here",
        if m.negative_control {
            " (NEGATIVE CONTROL: riva re-reads through the cache)"
        } else {
            ""
        },
        size_name(m.ram_bytes / (1 << 20) * (1 << 20))
    );
    for &size in &cfg.sizes {
        println!("\n{}:\n", size_name(size));
        let mut head = "| fault |".to_string();
        let mut rule = "|---|".to_string();
        for mode in &cfg.modes {
            head += &format!(" {mode} |");
            rule += "---|";
        }
        println!("{head}\n{rule}");
        for &fault in &cfg.faults {
            let mut row = format!("| {} |", fault.name());
            for &mode in &cfg.modes {
                let c = m
                    .cells
                    .iter()
                    .find(|c| c.fault == fault && c.mode == mode && c.size == size);
                row += &format!(" {} |", c.map_or("–", |c| c.outcome.short()));
            }
            println!("{row}");
        }
    }
    if cfg.faults.iter().any(|f| f.on_ssd()) {
        println!(
            "\nhost-memory, ssd-buffer, ssd-media (Kim et al.'s Table 2) ran on the emulated SSD: a {} write buffer over NAND, blocks of {}, flash's W = {}; ground truth is what a reader gets through the page cache (host-memory) and what the emulator's NAND file holds under the file once new writes turned the buffer over",
            size_name(cfg.ssd_buffer),
            size_name(intact_lab::ssd_block(cfg.ssd_buffer)),
            size_name(intact_lab::ssd_window(cfg.ssd_buffer))
        );
    }
    println!("\nrepaired = detected, resent or resumed, device right; failed = detected, run failed, nothing wrong under a final name; MISSED = silent corruption (exit 0, device wrong, no device level claimed); LIE = exit 0, device wrong, yet level `device` reported or --require-level device passed; NO-EFFECT = the fault left no trace (a lab bug)");
    for s in &m.skipped {
        println!("skipped: {s}");
    }
}
