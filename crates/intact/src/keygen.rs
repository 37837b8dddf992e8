//! `intact keygen FILE`: a fresh random key, written private and never
//! over an existing file unless asked.

use std::process::ExitCode;

use crate::args::KeygenArgs;

pub fn run(args: &KeygenArgs) -> anyhow::Result<ExitCode> {
    let exists = std::fs::symlink_metadata(&args.file).is_ok();
    match intact_proto::write_new_key_file(&args.file, args.force) {
        Ok(_) => {
            println!(
                "intact keygen: wrote a new key to {} (mode 600)",
                args.file.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("intact keygen: {e}");
            Ok(if exists && !args.force {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            })
        }
    }
}
