//! Test hosts for the benchmarks: network namespaces joined by veth pairs
//! shaped to 1 Gbit/s in both directions with tbf (this kernel has no
//! netem). Deleted, with their veths, on drop.

use std::path::Path;
use std::process::Command;

use crate::transfer::run_cmd;

/// A network namespace of this process.
pub(crate) struct Netns {
    pub name: String,
    /// This namespace's address on its link.
    pub inner_ip: String,
    /// The other end of its veth, where that end is in this namespace
    /// (deleted too, in case it never reached its namespace).
    outer: Option<String>,
}

/// Runs `ip` with `args`, inside `ns` if given.
fn ip_in(ns: Option<&str>, args: &[&str]) -> anyhow::Result<()> {
    let mut cmd = Command::new("ip");
    if let Some(n) = ns {
        cmd.args(["-n", n]);
    }
    run_cmd(cmd.args(args))
}

/// Shapes `dev` (in `ns`, if given) to 1 Gbit/s.
fn shape(ns: Option<&str>, dev: &str) -> anyhow::Result<()> {
    let mut cmd = Command::new("tc");
    if let Some(n) = ns {
        cmd.args(["-n", n]);
    }
    run_cmd(cmd.args([
        "qdisc", "add", "dev", dev, "root", "tbf", "rate", "1gbit", "burst", "256kb", "latency",
        "10ms",
    ]))
}

/// A benchmark killed by a signal leaves its namespaces: removes those
/// whose process is gone.
fn remove_stale() {
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if let Some(pid) = name
                .strip_prefix("intact-bench-")
                .and_then(|r| r.split('-').next())
            {
                if !Path::new("/proc").join(pid).exists() {
                    let _ = Command::new("ip").args(["netns", "del", name]).status();
                }
            }
        }
    }
}

impl Netns {
    /// A new, empty namespace `intact-bench-PID-tag` with its loopback up.
    fn add(tag: &str) -> anyhow::Result<Netns> {
        let name = format!("intact-bench-{}-{tag}", std::process::id());
        ip_in(None, &["netns", "add", &name])?;
        let ns = Netns {
            name,
            inner_ip: String::new(),
            outer: None,
        };
        ip_in(Some(&ns.name), &["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Namespace `index` (0 to 99) of this process, joined to this one on
    /// 10.77.`index`.0/24: 10.77.`index`.1 here, 10.77.`index`.2 inside.
    pub fn start(index: u32) -> anyhow::Result<Netns> {
        remove_stale();
        let mut ns = Netns::add(&index.to_string())?;
        let tag = format!("ib{}x{index}", std::process::id() % 100000);
        let (outer, inner) = (format!("{tag}o"), format!("{tag}i"));
        ip_in(
            None,
            &[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ],
        )?;
        ns.outer = Some(outer.clone());
        ns.inner_ip = format!("10.77.{index}.2");
        let n = Some(ns.name.as_str());
        ip_in(None, &["link", "set", &inner, "netns", &ns.name])?;
        ip_in(
            None,
            &["addr", "add", &format!("10.77.{index}.1/24"), "dev", &outer],
        )?;
        ip_in(None, &["link", "set", &outer, "up"])?;
        ip_in(
            n,
            &["addr", "add", &format!("{}/24", ns.inner_ip), "dev", &inner],
        )?;
        ip_in(n, &["link", "set", &inner, "up"])?;
        shape(None, &outer)?;
        shape(n, &inner)?;
        Ok(ns)
    }

    /// Two namespaces of this process joined only to each other, hosts of
    /// their own: a sender at 10.78.`index`.1 and a receiver at
    /// 10.78.`index`.2 (index 0 to 99).
    pub fn pair(index: u32) -> anyhow::Result<(Netns, Netns)> {
        remove_stale();
        let mut a = Netns::add(&format!("s{index}"))?;
        let mut b = Netns::add(&format!("r{index}"))?;
        let tag = format!("ib{}p{index}", std::process::id() % 100000);
        let (ea, eb) = (format!("{tag}a"), format!("{tag}b"));
        ip_in(
            None,
            &["link", "add", &ea, "type", "veth", "peer", "name", &eb],
        )?;
        a.outer = Some(ea.clone());
        for (ns, dev, host) in [(&mut a, &ea, 1), (&mut b, &eb, 2)] {
            ns.inner_ip = format!("10.78.{index}.{host}");
            ip_in(None, &["link", "set", dev, "netns", &ns.name])?;
            let n = Some(ns.name.as_str());
            ip_in(
                n,
                &["addr", "add", &format!("{}/24", ns.inner_ip), "dev", dev],
            )?;
            ip_in(n, &["link", "set", dev, "up"])?;
            shape(n, dev)?;
        }
        Ok((a, b))
    }

    /// `program` to be run inside this namespace.
    pub fn command(&self, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace deletes its veth end, and with it the pair.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        if let Some(outer) = &self.outer {
            let _ = Command::new("ip")
                .args(["link", "del", outer])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}
