//! Test hosts for the benchmarks: a network namespace joined to this one
//! by a veth pair shaped to 1 Gbit/s with tbf (this kernel has no netem).

use std::path::Path;
use std::process::Command;

use crate::transfer::run_cmd;

/// A network namespace joined to this one by a veth pair shaped to
/// 1 Gbit/s in both directions; deleted (with its veth) on drop.
pub(crate) struct Netns {
    pub name: String,
    /// The veth end in this namespace.
    outer: String,
    /// The address inside the namespace.
    pub inner_ip: String,
}

impl Netns {
    /// Namespace `index` (0 to 99) of this process, on 10.77.`index`.0/24:
    /// 10.77.`index`.1 outside, 10.77.`index`.2 inside.
    pub fn start(index: u32) -> anyhow::Result<Netns> {
        // A benchmark killed by a signal leaves its namespace: remove
        // those whose process is gone.
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
        let name = format!("intact-bench-{}-{index}", std::process::id());
        let outer = format!("ib{}x{index}o", std::process::id() % 100000);
        let inner = format!("ib{}x{index}i", std::process::id() % 100000);
        let (outer_ip, inner_ip) = (format!("10.77.{index}.1"), format!("10.77.{index}.2"));
        let ip = |args: &[&str]| run_cmd(Command::new("ip").args(args));
        ip(&["netns", "add", &name])?;
        let ns = Netns {
            name,
            outer: outer.clone(),
            inner_ip: inner_ip.clone(),
        };
        let n = ns.name.as_str();
        ip(&[
            "link", "add", &outer, "type", "veth", "peer", "name", &inner,
        ])?;
        ip(&["link", "set", &inner, "netns", n])?;
        ip(&["addr", "add", &format!("{outer_ip}/24"), "dev", &outer])?;
        ip(&["link", "set", &outer, "up"])?;
        ip(&[
            "-n",
            n,
            "addr",
            "add",
            &format!("{inner_ip}/24"),
            "dev",
            &inner,
        ])?;
        ip(&["-n", n, "link", "set", &inner, "up"])?;
        ip(&["-n", n, "link", "set", "lo", "up"])?;
        let shape = |pre: &[&str], dev: &str| {
            let mut args: Vec<&str> = pre.to_vec();
            args.extend([
                "qdisc", "add", "dev", dev, "root", "tbf", "rate", "1gbit", "burst", "256kb",
                "latency", "10ms",
            ]);
            run_cmd(Command::new("tc").args(&args))
        };
        shape(&[], &outer)?;
        shape(&["-n", n], &inner)?;
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace deletes its veth end, and with it the pair.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        // A pair whose inner end never reached the namespace.
        let _ = Command::new("ip")
            .args(["link", "del", &self.outer])
            .stderr(std::process::Stdio::null())
            .status();
    }
}
