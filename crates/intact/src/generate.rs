//! `intact completions` and `intact man`: shell completion scripts and man
//! pages generated from the same clap definitions as `--help`, so all three
//! name the same commands, options and verification modes.

use std::process::ExitCode;

use anyhow::Context;
use clap::CommandFactory;

use crate::args::{Cli, CompletionsArgs, ManArgs};
use crate::exit::usage;

pub const COMPLETIONS_ABOUT: &str = "\
Print a completion script for SHELL on standard output. For example:

  intact completions bash > /etc/bash_completion.d/intact
  intact completions zsh > \"${fpath[1]}/_intact\"
  intact completions fish > ~/.config/fish/completions/intact.fish";

pub const MAN_ABOUT: &str = "\
Print a man page (roff) on standard output: intact(1), or with COMMAND the
page of that command, e.g. `intact man copy | man -l -`. With --dir, write
intact.1 and one page per command (intact-copy.1, intact-send.1, ...) into
DIR, created if missing, e.g. `intact man --dir /usr/local/share/man/man1`.";

/// `intact completions SHELL`.
pub fn completions(args: &CompletionsArgs) -> anyhow::Result<ExitCode> {
    let mut cmd = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "intact", &mut script);
    crate::stdout::bytes(&script).context("cannot write the script to standard output")?;
    Ok(ExitCode::SUCCESS)
}

/// `intact man [COMMAND] [--dir DIR]`.
pub fn man(args: &ManArgs) -> anyhow::Result<ExitCode> {
    let mut root = Cli::command().disable_help_subcommand(true);
    root.build();
    if let Some(dir) = &args.dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        clap_mangen::generate_to(root, dir)
            .with_context(|| format!("cannot write the man pages into {}", dir.display()))?;
        return Ok(ExitCode::SUCCESS);
    }
    let cmd = match &args.command {
        None => root,
        Some(name) => root.find_subcommand(name).cloned().ok_or_else(|| {
            let names: Vec<_> = Cli::command()
                .get_subcommands()
                .map(|c| c.get_name().to_string())
                .collect();
            usage(format!(
                "intact has no command '{name}' (commands: {})",
                names.join(", ")
            ))
        })?,
    };
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd).render(&mut page)?;
    crate::stdout::bytes(&page).context("cannot write the man page to standard output")?;
    Ok(ExitCode::SUCCESS)
}
