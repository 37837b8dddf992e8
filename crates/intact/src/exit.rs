//! Exit statuses: 0 success, 1 when any file (or the command's work)
//! failed, 2 for a command line that cannot be run as given. clap's own
//! errors already exit 2; [`UsageError`] carries the ones found later.

use std::fmt;
use std::process::ExitCode;

/// The exit status of a usage error.
pub const USAGE: u8 = 2;

/// A command line that cannot be run as given (exit status 2): the message
/// says what is wrong and what to write instead.
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// A usage error with `msg`, as an `anyhow::Error`.
pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UsageError(msg.into()))
}

/// The exit status for an error that ended a command: 2 if it (or any
/// cause) is a usage error, else 1.
pub fn status_of(e: &anyhow::Error) -> ExitCode {
    if e.chain().any(|c| c.is::<UsageError>()) {
        ExitCode::from(USAGE)
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_errors_are_found_under_context() {
        let e = usage("bad").context("while parsing");
        assert_eq!(status_of(&e), ExitCode::from(USAGE));
        assert_eq!(status_of(&anyhow::anyhow!("io")), ExitCode::FAILURE);
    }
}
