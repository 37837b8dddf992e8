//! The `intact` command: flag parsing and dispatch. The work lives in the
//! library crates under `crates/`.

// The entry point is `main` below, without std's wrapper (see entry.rs).
#![cfg_attr(not(test), no_main)]

mod args;
mod block_size;
mod cache;
mod catalog;
mod check;
mod copy;
mod delete;
mod demo;
mod dry_run;
mod entry;
mod exit;
mod generate;
mod hashing;
mod interrupt;
mod keygen;
mod mount;
mod ordered;
mod reliability;
mod resolve;
mod scrub;
mod serve;
mod shard;
mod stdout;
mod sum;
mod sum_parse;
mod sum_plain;
mod summary;
mod throttle;
mod tree_args;
mod unwinder;
mod verify_help;

use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command};

/// The C entry point: `intact_main` under entry.rs's wrapper.
#[cfg(not(test))]
#[no_mangle]
extern "C" fn main(
    _argc: std::ffi::c_int,
    _argv: *const *const std::ffi::c_char,
) -> std::ffi::c_int {
    entry::run(intact_main)
}

// Unit tests have the harness's main instead of ours; it is still the root.
#[cfg_attr(test, allow(dead_code))]
fn intact_main() -> ExitCode {
    // `intact sum` is run once per file by scripts: parse only its own
    // arguments (see sum_parse), everything else through the whole `Cli`.
    let result = match sum_parse::parse() {
        Some(a) => run_sum(&a),
        None => run(&Cli::parse().command),
    };
    result.unwrap_or_else(|e| {
        eprintln!("intact: {}", describe(&e));
        exit::status_of(&e)
    })
}

fn run_sum(a: &args::SumArgs) -> anyhow::Result<ExitCode> {
    if a.check {
        check::run(a)
    } else {
        sum::run(a)
    }
}

fn run(command: &Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Copy(a) => copy::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Send(a) => copy::run_send(a),
        Command::Keygen(a) => keygen::run(a),
        Command::Sum(a) => run_sum(a),
        Command::Demo(a) => demo::run(a),
        Command::Reliability(a) => reliability::run(a),
        Command::Completions(a) => generate::completions(a),
        Command::Man(a) => generate::man(a),
        Command::Scrub(a) => scrub::run(a),
        Command::Status(a) => scrub::status(a),
        Command::Catalog(a) => catalog::run(a),
        Command::Mount(a) => mount::run(a),
        Command::Plan(a) => shard::run_plan(a),
        Command::Report(a) => shard::run_report(a),
        Command::Cache(a) => cache::run(a),
    }
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
