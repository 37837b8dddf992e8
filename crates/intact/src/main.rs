//! The `intact` command: flag parsing and dispatch. The work lives in the
//! library crates under `crates/`.

mod args;
mod block_size;
mod check;
mod copy;
mod delete;
mod demo;
mod dry_run;
mod exit;
mod generate;
mod hashing;
mod interrupt;
mod keygen;
mod ordered;
mod reliability;
mod resolve;
mod serve;
mod stdout;
mod sum;
mod summary;
mod throttle;
mod tree_args;
mod verify_help;

use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Copy(a) => copy::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Send(a) => copy::run_send(a),
        Command::Keygen(a) => keygen::run(a),
        Command::Sum(a) if a.check => check::run(a),
        Command::Sum(a) => sum::run(a),
        Command::Demo(a) => demo::run(a),
        Command::Reliability(a) => reliability::run(a),
        Command::Completions(a) => generate::completions(a),
        Command::Man(a) => generate::man(a),
    };
    result.unwrap_or_else(|e| {
        eprintln!("intact: {}", describe(&e));
        exit::status_of(&e)
    })
}

/// The error and its causes, without repeating a cause that the message
/// already states (intact's errors name the OS reason themselves).
fn describe(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        let bare = match c.rfind(" (os error ") {
            Some(i) if c.ends_with(')') => &c[..i],
            _ => &c,
        };
        if !msg.contains(bare) {
            msg.push_str(": ");
            msg.push_str(&c);
        }
    }
    msg
}
