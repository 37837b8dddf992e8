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
    let keyring = match &args.key_file {
        Some(f) => match intact_proto::Keyring::from_file(f) {
            Ok(k) => Some(k),
            Err(e) => {
                eprintln!("intact serve: {e}");
                return Ok(ExitCode::from(2));
            }
        },
        None => None,
    };
    if keyring.is_none() {
        if let Some(why) = beyond_loopback(&args.listen) {
            eprintln!(
                "intact serve: refusing to listen on {} without a key: {why}; \
                 a keyless server serves loopback clients only, so give it a --key-file \
                 (make one with `intact keygen FILE`) or listen on 127.0.0.1 / [::1]",
                args.listen
            );
            return Ok(ExitCode::from(2));
        }
    }
    if args.allow_fetch && keyring.is_none() {
        eprintln!(
            "intact serve: --allow-fetch needs --key-file: without a key any local user could \
             read every file under the root (make one with `intact keygen FILE`)"
        );
        return Ok(ExitCode::from(2));
    }
    if args.scrub_every.is_some_and(|d| d.is_zero()) {
        eprintln!("intact serve: --scrub-every must be at least 1s (e.g. 7d)");
        return Ok(ExitCode::from(2));
    }
    intact_transfer::raise_open_file_limit();
    let described = match &keyring {
        None => "no key: loopback clients only, plain frames".to_string(),
        Some(k) => format!(
            "key required ({} client{}), frames {}",
            k.clients().len(),
            if k.clients().len() == 1 { "" } else { "s" },
            if args.no_encrypt {
                "authenticated, not encrypted"
            } else {
                "encrypted"
            }
        ),
    };
    let cfg = ServerConfig {
        root: args.root.clone(),
        key: None,
        encrypt: !args.no_encrypt,
        max_sessions: args.max_sessions as usize,
        max_streams_per_session: args.max_streams_per_session as usize,
        idle_timeout: Duration::from_secs(args.idle_timeout.max(1)),
        frame_memory: args.frame_memory as u64,
        keyring,
        verbose: args.verbose,
        scrub: args
            .scrub_every
            .map(|every| intact_transfer::ScrubSchedule {
                every,
                rate: args.scrub_rate,
            }),
        receive: intact_transfer::ReceiveOptions {
            max_delete_paths: Some(args.max_delete_paths),
            keep_special_bits: args.keep_special_bits,
            allow_fetch: args.allow_fetch,
            recovery: (!args.recovery_cache.is_empty())
                .then(|| intact_netcache::RecoveryCaches::new(args.recovery_cache.clone())),
            flash: args.flash.settings(),
            verifiers: args.flash.verifiers(),
            limits: intact_transfer::ReceiveLimits {
                admit_wait: Duration::from_secs(args.admit_wait),
                ..Default::default()
            },
            ..Default::default()
        },
    };
    // The address first, then the root: a port in use leaves nothing in
    // the root; a root that cannot be written ends the server before it
    // accepts anyone (the bound socket is closed unused).
    let listener = match TcpListener::bind(&args.listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("intact serve: cannot listen on {}: {e}", args.listen);
            return Ok(ExitCode::FAILURE);
        }
    };
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
    let scrubbing = match args.scrub_every {
        Some(every) => format!(
            ", scrubbing files not scrubbed for {} s{} in the background",
            every.as_secs(),
            args.scrub_rate
                .map_or(String::new(), |r| format!(" at most {} KiB/s", r / 1024))
        ),
        None => String::new(),
    };
    let caches = if args.recovery_cache.is_empty() {
        String::new()
    } else {
        format!(
            ", repairs asked first of {}",
            args.recovery_cache.join(", ")
        )
    };
    println!(
        "intact serve: listening on {addr}, root {}, {described}{scrubbing}{caches}",
        args.root.display(),
    );
    std::io::stdout().flush()?;
    server.run(
        listener,
        shutdown,
        Arc::new(|line| eprintln!("intact serve: {line}")),
    );
    Ok(ExitCode::SUCCESS)
}

/// Why `listen` reaches beyond loopback (`None`: every address it names
/// is a loopback address). A name that does not resolve is left to bind
/// to report.
fn beyond_loopback(listen: &str) -> Option<String> {
    use std::net::ToSocketAddrs;
    let addrs: Vec<_> = listen.to_socket_addrs().ok()?.collect();
    let open: Vec<String> = addrs
        .iter()
        .filter(|a| !a.ip().is_loopback())
        .map(|a| a.ip().to_string())
        .collect();
    if open.is_empty() {
        None
    } else if open.iter().any(|ip| ip == "0.0.0.0" || ip == "::") {
        Some("that address listens on every interface".into())
    } else {
        Some(format!("{} is not a loopback address", open.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::beyond_loopback;

    #[test]
    fn only_loopback_addresses_pass() {
        for ok in ["127.0.0.1:0", "[::1]:4750", "127.3.4.5:9", "localhost:0"] {
            assert_eq!(beyond_loopback(ok), None, "{ok}");
        }
        for bad in ["0.0.0.0:4750", "[::]:0", "192.0.2.7:1", "[2001:db8::1]:1"] {
            assert!(beyond_loopback(bad).is_some(), "{bad}");
        }
    }
}
