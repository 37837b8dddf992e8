//! `intact serve`: the receiving daemon.

use std::io::Write;
use std::net::TcpListener;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use intact_transfer::{wake, Server, ServerConfig};
use signal_hook::consts::{SIGINT, SIGTERM};

use crate::args::ServeArgs;

pub fn run(args: &ServeArgs) -> anyhow::Result<ExitCode> {
    let key = match &args.key_file {
        Some(f) => match intact_proto::Key::from_file(f) {
            Ok(k) => Some(k),
            Err(e) => {
                eprintln!("intact serve: {e}");
                return Ok(ExitCode::from(2));
            }
        },
        None => None,
    };
    intact_transfer::raise_open_file_limit();
    let cfg = ServerConfig {
        root: args.root.clone(),
        key,
        max_sessions: args.max_sessions as usize,
        max_streams_per_session: args.max_streams_per_session as usize,
        idle_timeout: Duration::from_secs(args.idle_timeout.max(1)),
        verbose: args.verbose,
        receive: intact_transfer::ReceiveOptions {
            max_delete_paths: Some(args.max_delete_paths),
            ..Default::default()
        },
    };
    // The root first: a server that could not write there must not listen.
    let server = match Server::open(cfg) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("intact serve: {e}");
            return Ok(if e.is_usage() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            });
        }
    };
    let listener = TcpListener::bind(&args.listen)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener.local_addr()?;
    let shutdown = Arc::new(AtomicBool::new(false));
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    let flag = Arc::clone(&shutdown);
    std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            eprintln!("intact serve: signal {sig}, shutting down");
            flag.store(true, Ordering::SeqCst);
            wake(addr);
        }
    });
    println!(
        "intact serve: listening on {addr}, root {}, {}",
        args.root.display(),
        if args.key_file.is_some() {
            "key required"
        } else {
            "no key: loopback clients only"
        }
    );
    std::io::stdout().flush()?;
    server.run(
        listener,
        shutdown,
        Arc::new(|line| eprintln!("intact serve: {line}")),
    );
    Ok(ExitCode::SUCCESS)
}
