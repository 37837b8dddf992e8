//! The tools a transfer table compares, each a named closure that makes
//! one timed run from the source into the (fresh, empty) destination and
//! ends with `sync`: intact send (a fresh `intact serve` per run) and
//! intact copy per verification mode, the raw pipe, cp, rsync and rsync
//! over ssh.

use std::path::Path;
use std::process::Command;

use super::table::Baseline;
use crate::runner::{Meter, Sample};

use super::sshd::Sshd;
use super::{run_cmd, start_server};

/// A named tool: one timed run from the dataset into a fresh destination.
pub(super) type Tool<'a> = (String, Box<dyn Fn() -> anyhow::Result<Sample> + 'a>);

/// The binary and the two trees every tool is given.
#[derive(Clone, Copy)]
pub(super) struct Paths<'a> {
    pub intact: &'a Path,
    pub src: &'a Path,
    pub dst: &'a Path,
}

/// How an `intact send` run is keyed.
#[derive(Clone, Copy)]
pub(super) enum Keying<'a> {
    /// No key: plain frames.
    None,
    /// A key: sealed frames, encrypted or (false) authenticated only.
    Key(&'a Path, bool),
}

/// The verification modes both intact commands run in: none (the
/// pipeline's own cost) and riva (intact's default).
pub(super) const BOTH_MODES: [&str; 2] = ["none", "riva"];

/// The cold table's tools: intact send in none, fiver and riva (and keyed
/// with `key`), intact copy in none and riva, the raw pipe, cp -r,
/// rsync -a, and rsync over ssh (with `ssh`) with ssh's default cipher
/// and with AES-128-GCM.
pub(super) fn cold<'a>(
    p: Paths<'a>,
    key: Option<&'a Path>,
    ssh: Option<&'a Sshd>,
) -> Vec<Tool<'a>> {
    let mut tools = Vec::new();
    for mode in ["none", "fiver", "riva"] {
        tools.push(intact_send_tool(p, mode, Keying::None));
    }
    if let Some(key) = key {
        for encrypt in [true, false] {
            tools.push(intact_send_tool(p, "none", Keying::Key(key, encrypt)));
        }
    }
    for mode in BOTH_MODES {
        tools.push(intact_copy_tool(p, mode));
    }
    tools.push((
        "raw pipe (sendfile | socket | write+fsync)".into(),
        Box::new(move || crate::pipe::timed(p.src, p.dst)),
    ));
    tools.push(cp_tool(p));
    tools.push(rsync_tool(p));
    if let Some(s) = ssh {
        tools.push((
            format!("rsync -a -e ssh ({}, default)", s.default_cipher),
            Box::new(move || s.timed_rsync(p.src, p.dst, None)),
        ));
        tools.push((
            "rsync -a -e \"ssh -c aes128-gcm@openssh.com\"".into(),
            Box::new(move || s.timed_rsync(p.src, p.dst, Some("aes128-gcm@openssh.com"))),
        ));
    }
    tools
}

/// The warm table's tools: intact copy and send without verification
/// (the pipeline's own per-file cost), cp -r and local rsync -a.
pub(super) fn warm(p: Paths<'_>) -> Vec<Tool<'_>> {
    vec![
        intact_copy_tool(p, "none"),
        intact_send_tool(p, "none", Keying::None),
        cp_tool(p),
        rsync_tool(p),
    ]
}

/// The block-size table's tools: intact copy and intact send, riva, at
/// each of `sizes` (`--block-size` values).
pub(super) fn block_sizes<'a>(p: Paths<'a>, sizes: &'a [String]) -> Vec<Tool<'a>> {
    let mut tools: Vec<Tool<'a>> = Vec::new();
    for size in sizes {
        tools.push((
            format!("intact copy --verify riva --block-size {size}"),
            Box::new(move || intact_copy(p, &["--verify", "riva", "--block-size", size])),
        ));
    }
    for size in sizes {
        tools.push((
            format!("intact send --verify riva --block-size {size}"),
            Box::new(move || intact_send_with(p, "riva", Keying::None, &["--block-size", size])),
        ));
    }
    tools
}

/// The block-size table's ratio columns: copy and send at the default.
pub(super) const BLOCK_BASELINES: [Baseline; 2] = [
    Baseline {
        label: "copy 4MiB",
        prefix: "intact copy --verify riva --block-size 4MiB",
    },
    Baseline {
        label: "send 4MiB",
        prefix: "intact send --verify riva --block-size 4MiB",
    },
];

fn intact_send_tool<'a>(p: Paths<'a>, mode: &'static str, keying: Keying<'a>) -> Tool<'a> {
    let name = match keying {
        Keying::None => format!("intact send --verify {mode}"),
        Keying::Key(_, true) => format!("intact send --verify {mode}, key, encrypted"),
        Keying::Key(_, false) => format!("intact send --verify {mode}, key, serve --no-encrypt"),
    };
    (name, Box::new(move || intact_send(p, mode, keying)))
}

fn intact_copy_tool<'a>(p: Paths<'a>, mode: &'static str) -> Tool<'a> {
    (
        format!("intact copy --verify {mode}"),
        Box::new(move || intact_copy(p, &["--verify", mode])),
    )
}

/// `intact copy ARGS… SRC DST` with the benchmark's own state directory,
/// timed with a final sync.
fn intact_copy(p: Paths<'_>, args: &[&str]) -> anyhow::Result<Sample> {
    timed(|| {
        run_cmd(
            Command::new(p.intact)
                .env("XDG_STATE_HOME", super::copy_state_home(p.dst))
                .arg("copy")
                .args(args)
                .arg(p.src)
                .arg(p.dst),
        )
    })
}

fn cp_tool(p: Paths<'_>) -> Tool<'_> {
    (
        "cp -r".into(),
        Box::new(move || timed(|| run_cmd(Command::new("cp").arg("-r").arg(p.src).arg(p.dst)))),
    )
}

fn rsync_tool(p: Paths<'_>) -> Tool<'_> {
    (
        "rsync -a".into(),
        Box::new(move || {
            timed(|| {
                run_cmd(
                    Command::new("rsync")
                        .arg("-a")
                        .arg(p.src)
                        .arg(format!("{}/", p.dst.display())),
                )
            })
        }),
    )
}

/// Times `f` plus a final sync.
fn timed(f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<Sample> {
    let mut m = Meter::start();
    f()?;
    run_cmd(&mut Command::new("sync"))?;
    m.stop();
    Ok(m.finish(0.0))
}

/// A fresh server per run (so its journal does not skip anything), timed
/// from the send's start to the end of the final sync; the server's CPU
/// is counted.
fn intact_send(p: Paths<'_>, verify: &str, keying: Keying<'_>) -> anyhow::Result<Sample> {
    intact_send_with(p, verify, keying, &[])
}

/// [`intact_send`] with more arguments to `intact send`.
fn intact_send_with(
    p: Paths<'_>,
    verify: &str,
    keying: Keying<'_>,
    extra: &[&str],
) -> anyhow::Result<Sample> {
    let mut m = Meter::start();
    let mut cmd = Command::new(p.intact);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--root"])
        .arg(p.dst);
    let mut send = Command::new(p.intact);
    send.args(["send", "--verify", verify]).args(extra);
    if let Keying::Key(key, encrypt) = keying {
        cmd.arg("--key-file").arg(key);
        if !encrypt {
            cmd.arg("--no-encrypt");
        }
        send.arg("--key-file").arg(key);
    }
    let (mut server, addr) = start_server(&mut cmd)?;
    m.go();
    let sent =
        run_cmd(send.arg(p.src).arg(&addr)).and_then(|()| run_cmd(&mut Command::new("sync")));
    m.stop();
    let _ = server.kill();
    let _ = server.wait();
    sent?;
    Ok(m.finish(0.0))
}
