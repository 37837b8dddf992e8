//! The benchmark's own sshd, for rsync over ssh: on a free loopback port
//! (or, for the testbed benchmarks, on a free port of a destination
//! namespace's address, its clients run in a source namespace), with its
//! own host and client keys under the benchmark's directory, stopped when
//! dropped. Its sessions' CPU (and the remote rsync's) is
//! charged to the rsync run that caused it.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::bail;
use intact_faults::Host;

use crate::linkbed::{free_port, netns_command};
use crate::runner::{settled_cpu, Sample};

use super::{run_cmd, timed_run};

/// An sshd on a free port with its own host and client keys.
pub(crate) struct Sshd {
    child: Child,
    port: u16,
    key: PathBuf,
    /// Its address.
    ip: String,
    /// The namespace its clients run in (None: this one).
    client_ns: Option<String>,
    /// The client's first cipher, used when none is asked for.
    pub(crate) default_cipher: String,
}

/// Namespaces for an sshd and its clients (the testbed's destination and
/// source).
pub(crate) struct Across<'a> {
    pub(crate) server: &'a Host,
    pub(crate) client: &'a Host,
}

impl Sshd {
    /// On loopback.
    pub(super) fn start(dir: &Path) -> anyhow::Result<Sshd> {
        Sshd::start_on(dir, None)
    }

    /// On loopback, or in `across.server`'s namespace on its address with
    /// clients in `across.client`'s.
    pub(crate) fn start_on(dir: &Path, across: Option<Across<'_>>) -> anyhow::Result<Sshd> {
        let sshd = ["/usr/sbin/sshd", "/usr/bin/sshd"]
            .into_iter()
            .find(|p| Path::new(p).exists());
        let Some(sshd) = sshd else {
            bail!("sshd is not installed: run scripts/setup --bench (or pass --no-ssh)")
        };
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir)?;
        std::fs::create_dir_all("/run/sshd")?;
        for name in ["host", "client"] {
            run_cmd(
                Command::new("ssh-keygen")
                    .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                    .arg(dir.join(name)),
            )?;
        }
        std::fs::copy(dir.join("client.pub"), dir.join("authorized_keys"))?;
        let ip = across
            .as_ref()
            .map_or("127.0.0.1", |a| a.server.ip)
            .to_string();
        let port = match &across {
            None => TcpListener::bind("127.0.0.1:0")?.local_addr()?.port(),
            Some(a) => free_port(a.server)?,
        };
        let config = dir.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress {ip}\nHostKey {}\nAuthorizedKeysFile {}\nPermitRootLogin prohibit-password\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile {}\n\
                 Subsystem sftp internal-sftp\n",
                dir.join("host").display(),
                dir.join("authorized_keys").display(),
                dir.join("sshd.pid").display()
            ),
        )?;
        let mut cmd = match &across {
            None => Command::new(sshd),
            Some(a) => a.server.command(sshd),
        };
        let child = cmd
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(&config)
            .stderr(Stdio::null())
            .spawn()?;
        let mut s = Sshd {
            child,
            port,
            key: dir.join("client"),
            ip,
            client_ns: across.map(|a| a.client.name.clone()),
            default_cipher: String::new(),
        };
        let config = Command::new("ssh").args(["-G", "127.0.0.1"]).output()?;
        s.default_cipher = String::from_utf8_lossy(&config.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("ciphers "))
            .and_then(|c| c.split(',').next())
            .unwrap_or("?")
            .to_string();
        // Ready when a command runs through it.
        for _ in 0..50 {
            if s.ssh_command().arg(&s.ip).arg("true").status()?.success() {
                return Ok(s);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        bail!("the benchmark's sshd did not come up on port {port}")
    }

    fn ssh_args(&self) -> String {
        format!(
            "ssh -p {} -i {} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR",
            self.port,
            self.key.display()
        )
    }

    /// `program` run where the clients run.
    fn client(&self, program: &str) -> Command {
        netns_command(self.client_ns.as_deref(), program)
    }

    fn ssh_command(&self) -> Command {
        let args = self.ssh_args();
        let mut parts = args.split(' ');
        let mut c = self.client(parts.next().expect("ssh"));
        c.args(parts).stdout(Stdio::null()).stderr(Stdio::null());
        c
    }

    /// One timed rsync over ssh, with `cipher` or ssh's default; its CPU
    /// includes the sshd sessions (and the remote rsync) it caused.
    pub(crate) fn timed_rsync(
        &self,
        src: &Path,
        dst: &Path,
        cipher: Option<&str>,
    ) -> anyhow::Result<Sample> {
        let mut e = self.ssh_args();
        if let Some(c) = cipher {
            e.push_str(" -c ");
            e.push_str(c);
        }
        timed_run(
            self.client("rsync")
                .args(["-a", "-e", &e])
                .arg(src)
                .arg(format!("{}:{}/", self.ip, dst.display())),
            || self.sessions_cpu(),
        )
    }

    /// One timed `rclone copy` of `src` (a file, or a tree's contents)
    /// into the directory `dst` over SFTP through this sshd, 4 files at
    /// once; rclone then compares each file's MD5 with the one `md5sum`
    /// computes at the far end. Its CPU includes the sshd's sessions
    /// (sftp-server and md5sum).
    pub(crate) fn timed_rclone(&self, src: &Path, dst: &Path) -> anyhow::Result<Sample> {
        timed_run(
            self.rclone("copy")
                .args(["--transfers", "4"])
                .arg(src)
                .arg(format!(":sftp:{}", dst.display())),
            || self.sessions_cpu(),
        )
    }

    /// `rclone VERB` with the SFTP remote `:sftp:` reaching this sshd, its
    /// hashes from `md5sum` at the far end (the shell named, so that no
    /// probe decides it per connection).
    fn rclone(&self, verb: &str) -> Command {
        let mut c = self.client("rclone");
        c.args([verb, "--config", "/dev/null"])
            .args(["--sftp-host", &self.ip, "--sftp-user", "root"])
            .args(["--sftp-port", &self.port.to_string()])
            .arg("--sftp-key-file")
            .arg(&self.key)
            .args(["--sftp-shell-type", "unix"])
            .args(["--sftp-md5sum-command", "md5sum"]);
        c
    }

    /// The MD5 rclone gets for `path` at the far end, as its copies'
    /// checks get it (the caller compares it with the right one: without
    /// it, rclone would check sizes only, silently).
    pub(crate) fn rclone_md5(&self, path: &Path) -> anyhow::Result<String> {
        let out = self
            .rclone("md5sum")
            .arg(format!(":sftp:{}", path.display()))
            .output()?;
        if !out.status.success() {
            bail!(
                "rclone gets no MD5 over SFTP here: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let text = String::from_utf8_lossy(&out.stdout);
        Ok(text.split_whitespace().next().unwrap_or("").to_string())
    }

    /// CPU seconds of the sshd's sessions it has reaped so far, once it
    /// has reaped all of them.
    fn sessions_cpu(&self) -> anyhow::Result<f64> {
        Ok(settled_cpu(self.child.id())?.1)
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
