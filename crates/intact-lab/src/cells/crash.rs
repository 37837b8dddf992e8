//! crash-sender and crash-server: the real `intact` binary SIGKILLed at a
//! pseudo-random point, then resumed. The kill comes from outside: the
//! transfer runs through a proxy that, once that many bytes have passed,
//! forwards nothing more and SIGKILLs the sender or the server (the
//! binary has no crash hook of its own).

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};

use intact_faults::{FlipProxy, ProxyFault, Victim};
use intact_transfer::VerifyMode;

use super::{Ctx, Verdict};
use crate::judge::{judge_after, Said};
use crate::truth::device_equals;
use crate::{io, Fault, LabError, Outcome};

/// A real `intact serve` on 127.0.0.1:0; killed when dropped.
struct ServerProcess {
    child: Child,
    addr: String,
}

impl ServerProcess {
    fn start(intact: &Path, root: &Path) -> Result<Self, LabError> {
        let mut cmd = Command::new(intact);
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--root"])
            .arg(root);
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io("starting intact serve"))?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .map_err(io("reading the server's address"))?;
        let addr = line
            .split("listening on ")
            .nth(1)
            .and_then(|s| s.split(',').next())
            .unwrap_or_default()
            .to_string();
        Ok(ServerProcess { child, addr })
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn send_process(
    intact: &Path,
    src: &Path,
    addr: &str,
    mode: VerifyMode,
    victim: Option<&Victim>,
) -> Result<(ExitStatus, Option<serde_json::Value>), LabError> {
    let mut cmd = Command::new(intact);
    cmd.args(["send", "--json", "--streams", "1", "--verify", mode.name()])
        .arg(src)
        .arg(addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().map_err(io("running intact send"))?;
    if let Some(v) = victim {
        v.set(child.id());
    }
    let out = child
        .wait_with_output()
        .map_err(io("running intact send"))?;
    let mut json: Option<serde_json::Value> = serde_json::from_slice(&out.stdout).ok();
    if let Some(v) = json.as_mut() {
        v["stderr"] = String::from_utf8_lossy(&out.stderr).trim().into();
    }
    Ok((out.status, json))
}

/// Kill-and-resume trials: each kills one side at a pseudo-random point,
/// checks that no wrong file carries the final name, resumes, and checks
/// the device; a third send must find everything in place. The server
/// process is stopped before every ground truth (a remount needs its files
/// closed).
pub(crate) fn crash(ctx: &Ctx) -> Result<Verdict, LabError> {
    let (size, mode, src, intact) = (ctx.size, ctx.mode, ctx.src, ctx.intact);
    let mut seed = size ^ (mode.wire_id() as u64) << 32 ^ 0x9e37_79b9;
    let mut killed = 0;
    for trial in 0..ctx.cfg.crash_trials {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let at = 1 + (seed >> 11) % size.max(2).saturating_sub(1);
        let root = ctx.lfs.mnt().join(format!("root{trial}"));
        let final_path = root.join("data.bin");
        let victim = Victim::new();
        let first = {
            let mut server = ServerProcess::start(intact, &root)?;
            let proxy = FlipProxy::start(
                server.addr.clone(),
                ProxyFault::KillAfter(at, victim.clone()),
            )
            .map_err(io("starting the killing proxy"))?;
            let (status, _) = if ctx.fault == Fault::CrashSender {
                send_process(intact, src, &proxy.addr(), mode, Some(&victim))?
            } else {
                victim.set(server.child.id());
                send_process(intact, src, &proxy.addr(), mode, None)?
            };
            if ctx.fault == Fault::CrashServer {
                let _ = server.child.wait();
            }
            status
        };
        let was_killed = victim.killed()
            && if ctx.fault == Fault::CrashSender {
                first.signal() == Some(libc::SIGKILL)
            } else {
                !first.success()
            };
        if !was_killed {
            // The kill point fell after the last byte moved: no crash here.
            continue;
        }
        killed += 1;
        let evidence = format!("trial {trial}: killed after {at} bytes");
        if final_path.exists() && !device_equals(&ctx.lfs, &final_path, src)? {
            return Ok((
                Outcome::Missed,
                evidence,
                "an unverified file carried its final name".into(),
            ));
        }
        let (status, json) = {
            let server = ServerProcess::start(intact, &root)?;
            send_process(intact, src, &server.addr, mode, None)?
        };
        let said = Said::from_json(status.success(), json.as_ref());
        let (o, d) = judge_after(&said, device_equals(&ctx.lfs, &final_path, src)?);
        if o != Outcome::Repaired {
            return Ok((o, evidence, format!("the resumed send: {d}")));
        }
        let sent = json
            .as_ref()
            .and_then(|v| v["bytes_sent"].as_u64())
            .unwrap_or(u64::MAX);
        // The journal is consistent: a third send moves nothing.
        let (status, json) = {
            let server = ServerProcess::start(intact, &root)?;
            send_process(intact, src, &server.addr, mode, None)?
        };
        let again = json.as_ref().and_then(|v| v["bytes_sent"].as_u64());
        if !status.success() || again != Some(0) {
            return Ok((
                Outcome::FailedClean,
                evidence,
                format!("a third send was not a no-op (sent {again:?})"),
            ));
        }
        if sent > size {
            return Ok((
                Outcome::FailedClean,
                evidence,
                format!("the resume sent {sent} bytes of {size}"),
            ));
        }
        // The next trial needs the room.
        fs::remove_dir_all(&root).map_err(io("removing a trial's root"))?;
    }
    if killed == 0 {
        return Ok((
            Outcome::NoEffect,
            "no trial was killed".into(),
            "every kill point fell after the last byte moved".into(),
        ));
    }
    Ok((
        Outcome::Repaired,
        format!(
            "{killed} of {} trials killed mid-transfer",
            ctx.cfg.crash_trials
        ),
        "every resume completed with the source's bytes; a third send moved nothing".into(),
    ))
}
