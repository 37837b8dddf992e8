//! The wide-area benchmark's data-transfer peers beside rsync: XRootD
//! (`xrdcp --cksum` to an `xrootd` server) and GridFTP
//! (`globus-url-copy -verify-checksum` to a `globus-gridftp-server`),
//! each server in the testbed's destination namespace on a free port of
//! its address, each client run in the source's namespace
//! (`scripts/setup --bench` installs both from Debian's packages).
//!
//! Neither encrypts here: XRootD's TLS and GridFTP's GSI need
//! certificates from a CA this testbed does not make, so the server runs
//! without authentication (GridFTP anonymous) and the data goes in clear.
//! What each verifies is said in [`XROOTD_VERIFIES`] and
//! [`GRIDFTP_VERIFIES`].
//!
//! A run's CPU is the client's (a child this process waits for) plus what
//! the server used meanwhile: the daemon's own threads (xrootd serves in
//! one process) and the sessions it forked and reaped (GridFTP forks one
//! per client).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use intact_faults::Host;

use crate::linkbed::{free_port, listening, netns_command};
use crate::runner::{settled_cpu, Sample};
use crate::transfer::sshd::Across;
use crate::transfer::{run_cmd, timed_run};

/// What `xrdcp --cksum adler32` checks (`adler32:source` would only
/// print the source's).
pub const XROOTD_VERIFIES: &str = "xrdcp --cksum adler32 (end to end) compares the source's Adler-32 with the one the server computes over the file it wrote, read back through the page cache; no encryption here (XRootD's TLS needs certificates)";

/// What `globus-url-copy -verify-checksum` checks.
pub const GRIDFTP_VERIFIES: &str = "globus-url-copy -verify-checksum compares the source's MD5 with the one the server computes (CKSM) over the file it wrote, read back through the page cache; no encryption here (GSI needs certificates; anonymous, data in clear)";

/// Name resolution that answers at once inside the testbed's namespaces,
/// for the programs run there with `ip netns exec` (which bind-mounts
/// `/etc/netns/NAME/*` over `/etc`): their hosts by address in `hosts`,
/// and a resolver on the namespace's own loopback, where none listens.
/// Without it every lookup (GridFTP makes several per transfer) waits out
/// the host's resolver, which the namespaces cannot reach: seen as 25 s
/// added to a 64 MiB copy. Removed when dropped.
pub struct Resolver {
    dirs: Vec<PathBuf>,
}

impl Resolver {
    pub fn for_hosts(hosts: &[&Host]) -> anyhow::Result<Resolver> {
        let mut known = String::from("127.0.0.1 localhost\n");
        for h in hosts {
            known.push_str(&format!("{} {}\n", h.ip, h.name));
        }
        // The machine's own name, as servers look it up (xrootd will not
        // start without it), is each host's own address.
        let me = std::fs::read_to_string("/proc/sys/kernel/hostname")?;
        let me = me.trim();
        std::fs::create_dir_all("/etc/netns")?;
        let mut r = Resolver { dirs: Vec::new() };
        for h in hosts {
            let dir = Path::new("/etc/netns").join(&h.name);
            // Only a directory it made is its to remove.
            std::fs::create_dir(&dir).with_context(|| format!("{}", dir.display()))?;
            r.dirs.push(dir.clone());
            std::fs::write(dir.join("hosts"), format!("{known}{} {me}\n", h.ip))?;
            std::fs::write(
                dir.join("resolv.conf"),
                "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n",
            )?;
        }
        Ok(r)
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        for d in &self.dirs {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// A server daemon in the destination's namespace, stopped when dropped.
struct Daemon {
    child: Child,
    what: &'static str,
}

impl Daemon {
    /// CPU seconds the daemon and its reaped sessions used so far, once
    /// it has reaped every session.
    fn cpu(&self) -> anyhow::Result<f64> {
        let (own, reaped) = settled_cpu(self.child.id())?;
        Ok(own + reaped)
    }

    /// Fails if the daemon has exited.
    fn alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{} exited: {status}", self.what);
        }
        Ok(())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A directory the server's unprivileged user (nobody) may write.
fn for_nobody(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    run_cmd(Command::new("chown").arg("nobody").arg(dir))
}

/// One timed client command; its CPU includes `daemon`'s meanwhile.
fn timed(daemon: &mut Daemon, cmd: &mut Command) -> anyhow::Result<Sample> {
    daemon.alive()?;
    timed_run(cmd, || daemon.cpu())
}

/// Starts `cmd` (a server in `host`'s namespace, listening on `port`)
/// and waits until it accepts connections.
fn start(host: &Host, port: u16, what: &'static str, cmd: &mut Command) -> anyhow::Result<Daemon> {
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("{what} (scripts/setup --bench installs it)"))?;
    let mut d = Daemon { child, what };
    for _ in 0..100 {
        d.alive()?;
        if listening(host, port)? {
            return Ok(d);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("{what} did not come up on port {port}")
}

/// An `xrootd` exporting a directory (as `oss.localroot`), with Adler-32
/// checksums.
pub struct Xrootd {
    daemon: Daemon,
    url: String,
    export: PathBuf,
    client_ns: String,
}

impl Xrootd {
    /// In `across.server`'s namespace, exporting `export`; its config and
    /// log go under `dir`.
    pub fn start(dir: &Path, export: &Path, across: Across<'_>) -> anyhow::Result<Xrootd> {
        for_nobody(dir)?;
        for_nobody(export)?;
        let port = free_port(across.server)?;
        let config = dir.join("xrootd.cfg");
        std::fs::write(
            &config,
            format!(
                // Up to 8 checksums at once (xrdcp --parallel 4).
                "xrd.port {port}\nall.export /\noss.localroot {}\nxrootd.chksum max 8 adler32\n",
                export.display()
            ),
        )?;
        let daemon = start(
            across.server,
            port,
            "xrootd",
            across
                .server
                .command("xrootd")
                .arg("-c")
                .arg(&config)
                .arg("-l")
                .arg(dir.join("xrootd.log"))
                .args(["-R", "nobody"]),
        )?;
        Ok(Xrootd {
            daemon,
            url: format!("root://{}:{port}/", across.server.ip),
            export: export.to_path_buf(),
            client_ns: across.client.name.clone(),
        })
    }

    /// Where a copy of `src` lands: `export/x/NAME`.
    pub fn copy_of(&self, src: &Path) -> PathBuf {
        self.export
            .join("x")
            .join(src.file_name().expect("a named source"))
    }

    /// One timed `xrdcp` of `src` (a file, or a tree with `-r`), 4
    /// streams for a file and 4 files at once for a tree, each checked by
    /// Adler-32.
    pub fn timed_copy(&mut self, src: &Path) -> anyhow::Result<Sample> {
        for_nobody(&self.export.join("x"))?;
        let mut cmd = netns_command(Some(&self.client_ns), "xrdcp");
        cmd.args(["-f", "-s", "--cksum", "adler32"]);
        if src.is_dir() {
            // A checksum query fails now and then with 4 files at once
            // ("[3012] Program failed ... while querying the checksum",
            // 1 of 200 files, in each of three tries, `chksum max 8` and
            // `--retry 3` or not): the benchmark reports such a run failed.
            cmd.args(["-r", "--parallel", "4"])
                .arg(src)
                .arg(format!("{}/x/", self.url));
        } else {
            let name = src.file_name().expect("a named source").to_string_lossy();
            cmd.args(["--streams", "4"])
                .arg(src)
                .arg(format!("{}/x/{name}", self.url));
        }
        timed(&mut self.daemon, &mut cmd)
    }
}

/// A `globus-gridftp-server` allowing anonymous clients, as nobody.
pub struct Gridftp {
    daemon: Daemon,
    url: String,
    client_ns: String,
}

impl Gridftp {
    /// In `across.server`'s namespace; its log goes under `dir`.
    pub fn start(dir: &Path, across: Across<'_>) -> anyhow::Result<Gridftp> {
        for_nobody(dir)?;
        let port = free_port(across.server)?;
        let ip = across.server.ip;
        let daemon = start(
            across.server,
            port,
            "globus-gridftp-server",
            across
                .server
                .command("globus-gridftp-server")
                .args(["-aa", "-anonymous-user", "nobody", "-d", "error"])
                .args(["-p", &port.to_string()])
                // Listening on every address of its own namespace: bound
                // to one, or told its name (GLOBUS_HOSTNAME), it fails to
                // name itself, as the namespace has no resolver.
                .args(["-data-interface", ip])
                .arg("-l")
                .arg(dir.join("gridftp.log")),
        )?;
        Ok(Gridftp {
            daemon,
            url: format!("ftp://{ip}:{port}"),
            client_ns: across.client.name.clone(),
        })
    }

    /// One timed `globus-url-copy` of `src` into the directory `dst`
    /// (which nobody may write): 4 parallel streams per file (`-p 4`),
    /// data channels kept (`-fast`), 4 files at once for a tree (`-cc 4`),
    /// each file's MD5 compared with the server's.
    pub fn timed_copy(&mut self, src: &Path, dst: &Path) -> anyhow::Result<Sample> {
        for_nobody(dst)?;
        let name = src.file_name().expect("a named source").to_string_lossy();
        let mut cmd = netns_command(Some(&self.client_ns), "globus-url-copy");
        cmd.args(["-p", "4", "-fast", "-verify-checksum"]);
        if src.is_dir() {
            cmd.args(["-r", "-cd", "-cc", "4"])
                .arg(format!("file://{}/", src.display()))
                .arg(format!("{}{}/{name}/", self.url, dst.display()));
        } else {
            cmd.arg(format!("file://{}", src.display())).arg(format!(
                "{}{}/{name}",
                self.url,
                dst.display()
            ));
        }
        timed(&mut self.daemon, &mut cmd)
    }
}
