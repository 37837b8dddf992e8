//! The in-process server the lab sends into, so that fault hooks (and the
//! negative control) can sit in its receiver.

use std::path::Path;
use std::time::Duration;

use intact_transfer::{LocalServer, ReceiveOptions, ServerConfig};

/// The server's idle timeout in most cells.
pub(crate) const IDLE: Duration = Duration::from_secs(20);

/// Runs a server in this process rooted at `root` while `f` runs. When it
/// returns, the server has stopped accepting; a session thread may still
/// be closing its files (the ground truth's remount waits for that).
pub(crate) fn with_server<T>(
    root: &Path,
    receive: ReceiveOptions,
    idle_timeout: Duration,
    f: impl FnOnce(String) -> T,
) -> T {
    let server = LocalServer::start(ServerConfig {
        idle_timeout,
        receive,
        ..ServerConfig::local(root)
    })
    .expect("a server on loopback");
    let out = f(server.addr());
    let _ = server.stop();
    out
}
