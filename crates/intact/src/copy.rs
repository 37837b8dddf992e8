//! `intact copy` and `intact send`: the block pipeline, locally or to a
//! server, with the same report.

use std::process::ExitCode;

use intact_transfer::{copy, send, CopyOptions, SendOptions};

use crate::args::{CopyArgs, PipelineArgs, SendArgs};
use crate::exit::usage;
use crate::hashing::progress_bar;
use crate::summary::finish;

/// A usage error (exit 2) when the mode cannot reach the level required.
fn unreachable_level(p: &PipelineArgs) -> Option<ExitCode> {
    let want = p.require_level?;
    (want > p.verify.level()).then(|| {
        eprintln!(
            "intact: --verify {} reaches at most level {}, so --require-level {want} cannot be met (use --verify riva)",
            p.verify,
            p.verify.level()
        );
        ExitCode::from(2)
    })
}

pub fn run(args: &CopyArgs) -> anyhow::Result<ExitCode> {
    let (dest, sources) = (&args.dest, &args.sources[..]);
    let p = &args.pipeline;
    if let Some(code) = unreachable_level(p) {
        return Ok(code);
    }
    let pb = progress_bar(total_size(sources));
    let opts = CopyOptions {
        verify: p.verify,
        block_size: p.block_size,
        streams: usize::from(p.streams),
        retries: p.retries,
        read_path: p.read_path,
        require_level: p.require_level,
        link_fault: None,
        after_write: None,
    };
    let report = copy(sources, dest, &opts, &|sent| pb.set_position(sent))?;
    pb.finish_and_clear();
    finish(&report, p, &pb)
}

pub fn run_send(args: &SendArgs) -> anyhow::Result<ExitCode> {
    let (target, sources) = (&args.target, &args.sources[..]);
    let target = target
        .to_str()
        .ok_or_else(|| usage("the server address is not UTF-8; give it as HOST:PORT"))?;
    let (addr, subdir) = parse_target(target)?;
    let key = match &args.key_file {
        Some(f) => Some(intact_proto::Key::from_file(f)?),
        None => None,
    };
    let p = &args.pipeline;
    if let Some(code) = unreachable_level(p) {
        return Ok(code);
    }
    let pb = progress_bar(total_size(sources));
    let opts = SendOptions {
        verify: p.verify,
        block_size: p.block_size,
        streams: usize::from(p.streams),
        retries: p.retries,
        key,
        subdir,
        reverify: args.reverify,
        read_path: p.read_path,
        require_level: p.require_level,
    };
    let report = send(sources, &addr, &opts, &|sent| pb.set_position(sent))?;
    pb.finish_and_clear();
    finish(&report, p, &pb)
}

/// Splits HOST:PORT[:/subdir] (HOST may be [IPv6]). Anything else is a
/// usage error (exit 2) that says what was expected.
fn parse_target(t: &str) -> anyhow::Result<(String, Option<intact_proto::WirePath>)> {
    let usage_of = |what: &str| {
        usage(format!(
            "'{t}' is not HOST:PORT or HOST:PORT:/subdir ({what}); the last argument of send is the server, e.g. 127.0.0.1:4750 or [::1]:4750:/inbox"
        ))
    };
    let host_end = if t.starts_with('[') {
        t.find(']')
            .ok_or_else(|| usage_of("an IPv6 address needs its closing ']'"))?
            + 1
    } else {
        t.find(':').ok_or_else(|| usage_of("no port"))?
    };
    let (host, rest) = t.split_at(host_end);
    if host.is_empty() || host == "[]" {
        return Err(usage_of("no host"));
    }
    let rest = rest.strip_prefix(':').ok_or_else(|| usage_of("no port"))?;
    let (port, sub) = match rest.split_once(':') {
        Some((p, s)) => (p, Some(s)),
        None => (rest, None),
    };
    match port.parse::<u16>() {
        Ok(0) => return Err(usage_of("port 0 is no server's port")),
        Ok(_) => {}
        Err(_) => {
            return Err(usage_of(&format!(
                "the port '{port}' is not a number from 1 to 65535"
            )))
        }
    }
    let subdir = match sub.map(|s| s.trim_start_matches('/')) {
        None | Some("") => None,
        Some(s) => Some(
            intact_proto::WirePath::parse(s.trim_end_matches('/').as_bytes()).map_err(|e| {
                usage(format!(
                    "the subdirectory in '{t}' cannot be used: {e}; give a relative path without '..', e.g. HOST:PORT:/inbox"
                ))
            })?,
        ),
    };
    Ok((format!("{host}:{port}"), subdir))
}

/// Bytes of regular files under the sources, for the progress bar.
fn total_size(sources: &[std::path::PathBuf]) -> u64 {
    sources
        .iter()
        .flat_map(|s| walkdir::WalkDir::new(s).into_iter().filter_map(Result::ok))
        .filter(|e| e.file_type().is_file())
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::parse_target;

    #[test]
    fn targets_parse() {
        assert_eq!(parse_target("localhost:4750").unwrap().0, "localhost:4750");
        let (a, s) = parse_target("127.0.0.1:9:/in/box/").unwrap();
        assert_eq!(
            (a.as_str(), s.unwrap().to_string()),
            ("127.0.0.1:9", "in/box".to_string())
        );
        assert_eq!(parse_target("[::1]:80").unwrap().0, "[::1]:80");
        for bad in [
            "host",
            "host:x",
            "host:99999",
            "h:1:/../x",
            "[::1",
            ":4750",
            ":notaport",
            "h:0",
        ] {
            let e = parse_target(bad).unwrap_err();
            assert_eq!(
                crate::exit::status_of(&e),
                std::process::ExitCode::from(2),
                "{bad}"
            );
        }
    }
}
