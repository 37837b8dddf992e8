//! How the command line names and describes the verification modes: all
//! of it comes from [`VerifyMode`] (its modes, names, descriptions and
//! default), so `--help`, the man page, shell completions and `intact
//! reliability --transfer` list exactly the modes `copy` and `send` run.

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use intact_transfer::VerifyMode;

/// Parses `--verify`: one of [`VerifyMode::ALL`], each listed with its
/// description in `--help` and offered by shell completions.
pub fn verify_parser() -> impl TypedValueParser<Value = VerifyMode> {
    PossibleValuesParser::new(
        VerifyMode::ALL.map(|m| PossibleValue::new(m.name()).help(m.description())),
    )
    .map(|s| s.parse().expect("a possible value is a mode's name"))
}

/// The long description of `intact copy`, with the default mode filled in.
pub fn copy_about() -> String {
    format!(
        "\
Copy files and trees locally through intact's block pipeline (the same
one `intact send` and `intact serve` run across the network).

Each SRC goes into the directory DST (created if missing) under its own
name, like `rsync -r SRC... DST`; `SRC/` (a trailing slash) copies the
directory's contents into DST instead. A single file copied to a DST that
is not a directory becomes the file DST (a new name, or replacing it, as
with cp). A directory is never copied into itself. Files are cut into
blocks; every block is digested (XXH3-128), checked at the receiving end
as the verification mode says, and resent if it fails (--retries). A file
is written under a hidden partial name (.intact-partial-*) and gets its
final name only after it is verified and fsynced; its directory is
fsynced after the rename. Modes and modification times are kept;
symlinks, also those named on the command line, are copied as symlinks
(-L copies what they point to; `LINK/` the contents of the directory it
points to), and no destination path is ever resolved through a symlink.
--include/--exclude choose entries with rsync's patterns; --delete then
removes what the source no longer has, only after everything was copied
and verified; --dry-run shows all of it; --bwlimit caps the rate.

Resume: a copy keeps a journal of the blocks verified in DST, as a server
does for its root (SQLite, in $XDG_STATE_HOME/intact/copies/, else
~/.local/state/intact/copies/, one private directory per DST, removed by a
later copy once DST is gone; DST is locked while a copy writes into it,
and nothing of intact's stays in DST but partial files of an interrupted
copy, .intact-partial-*). Running the same copy
again after it was interrupted (even by SIGKILL) writes only the blocks
not yet verified, and a file DST already holds whole is not written at all
if its source has the same digest (size and mtime only pick the
candidate; the source's digest comes from a cache, see
--no-source-cache). Held data counts only at the level it was verified
at; --reverify re-verifies every held file by the mode's own means.

{}

Exit status: 0 if every entry was copied and verified; 1 if any failed
(the others are still copied); 2 for usage errors.",
        levels()
    )
}

/// The paragraph on modes and levels that `copy` and `send` share.
pub fn levels() -> String {
    let d = VerifyMode::DEFAULT;
    format!(
        "\
Verification (--verify, default {d}; every mode is listed under --verify
below): the report says the level each file really reached: media (flash: as
device, and every block re-read only after the device's write cache had
turned over, --device-cache), device (every block re-read from the disk
after its cached copy was evicted, at both ends), cache (re-read through the page cache, so a device that
stored other bytes goes unseen), network (checked as it crossed the
link) or none. {d} reaches {} only where a device is under both ends;
on tmpfs, network and FUSE file systems it reaches cache and says why
(--require-level turns that into a failure).",
        d.level()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_parses_and_nothing_else_does() {
        let cmd = clap::Command::new("t");
        let p = verify_parser();
        for m in VerifyMode::ALL {
            let got = p
                .parse_ref(&cmd, None, std::ffi::OsStr::new(m.name()))
                .unwrap();
            assert_eq!(got, m);
        }
        assert!(p
            .parse_ref(&cmd, None, std::ffi::OsStr::new("media"))
            .is_err());
    }
}
