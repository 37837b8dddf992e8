//! Faults on the wire: a flipped bit, a cut connection, a stall.

use std::time::Duration;

use intact_faults::{FlipProxy, ProxyFault};
use intact_transfer::send;

use super::{Ctx, Verdict};
use crate::judge::{judge_during, Said};
use crate::server::{with_server, IDLE};
use crate::{Fault, LabError, Outcome};

/// network-flip: a proxy flips one bit inside the middle block's data.
pub(crate) fn flip(ctx: &Ctx) -> Result<Verdict, LabError> {
    let (report, flipped) = with_server(&ctx.root, ctx.receive(), IDLE, |addr| {
        let proxy = FlipProxy::start(addr, ProxyFault::FlipAt(vec![4096 + ctx.size / 2]))
            .expect("proxy on loopback");
        let r = send(
            &[ctx.src.to_path_buf()],
            &proxy.addr(),
            &ctx.opts(ctx.mode),
            &|_| {},
        );
        (r, proxy.flipped())
    });
    let said = Said::from_report(&report, false);
    let named = ctx.final_path.exists();
    let (o, d) = judge_during(&said, flipped > 0, ctx.truth()?, named);
    Ok((o, format!("{flipped} bit(s) flipped on the wire"), d))
}

/// network-cut and network-stall: the first send interrupted halfway, then
/// the same send again.
pub(crate) fn interrupt(ctx: &Ctx) -> Result<Verdict, LabError> {
    let half = 4096 + ctx.size / 2;
    let (fault, idle) = if ctx.fault == Fault::NetworkCut {
        (ProxyFault::CutAfter(half), IDLE)
    } else {
        (ProxyFault::StallAfter(half), Duration::from_secs(2))
    };
    let (first, hit) = with_server(&ctx.root, ctx.receive(), idle, |addr| {
        let proxy = FlipProxy::start(addr, fault).expect("proxy on loopback");
        let r = send(
            &[ctx.src.to_path_buf()],
            &proxy.addr(),
            &ctx.opts(ctx.mode),
            &|_| {},
        );
        (r, proxy.cut())
    });
    let failed = first.as_ref().map_or(true, |r| r.failed > 0);
    if hit == 0 || !failed {
        return Ok((
            Outcome::NoEffect,
            "the connection was not interrupted".into(),
            String::new(),
        ));
    }
    if ctx.final_path.exists() && !ctx.truth()? {
        return Ok((
            Outcome::Missed,
            "interrupted".into(),
            "a wrong file has its final name".into(),
        ));
    }
    ctx.resume(format!(
        "the first send failed after {half} bytes on the wire"
    ))
}
