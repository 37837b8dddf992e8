//! The `intact` command: flag parsing and dispatch. The work lives in the
//! library crates under `crates/`.

mod args;
mod check;
mod copy;
mod demo;
mod hashing;
mod ordered;
mod reliability;
mod serve;
mod sum;

use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Copy(a) => copy::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Send(a) => copy::run_send(a),
        Command::Sum(a) if a.check => check::run(a),
        Command::Sum(a) => sum::run(a),
        Command::Demo(a) => demo::run(a),
        Command::Reliability(a) => reliability::run(a),
    };
    result.unwrap_or_else(|e| {
        eprintln!("intact: {e:#}");
        ExitCode::FAILURE
    })
}
