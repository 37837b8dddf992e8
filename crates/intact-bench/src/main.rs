//! intact's benchmarks: programs that run intact and the public tools on
//! the same data in the same run and print tables of medians and ratios.
//! Never timed assertions: this machine is shared and noisy, so only
//! ratios measured side by side mean anything.

mod cache;
mod flash;
mod hash;
mod linkbed;
mod loop_ext4;
mod model;
mod mount;
mod netns;
mod peers;
mod pipe;
mod plot;
mod runner;
mod scale;
mod scrub;
mod split;
mod transfer;
mod verify;
mod wan;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "intact-bench", about)]
struct Cli {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// Hash one file in /dev/shm with intact and with the best public tool per algorithm.
    Hash(hash::HashArgs),
    /// Transfer datasets with intact and with cp, rsync, rsync over ssh and a raw pipe.
    Transfer(transfer::TransferArgs),
    /// Every verification mode of intact send, loopback and over a 1 Gbit/s shaped link.
    Verify(verify::VerifyArgs),
    /// intact scrub on a cold cache against a direct read (the device's limit), b3sum and sha256sum -c.
    Scrub(scrub::ScrubArgs),
    /// Kim et al.'s workload: sequential, file, riva and flash at N verifiers, on the disk and a RAM ext4.
    Flash(flash::FlashArgs),
    /// fio on intact mount, on the same FUSE code with checking off, and on the plain directory.
    Mount(mount::MountArgs),
    /// Shards of a plan at once, N = 1, 2, 4, 8: aggregate throughput and scaling efficiency, loopback and 1 Gbit/s per server.
    Scale(scale::ScaleArgs),
    /// One large file and a few small ones in N shards to one server, the plan split or --no-split: what splitting buys.
    Split(split::SplitArgs),
    /// The recovery cache: the paper's Tables I and II on its testbed in namespaces.
    Cache(cache::CacheArgs),
    /// One large file over a 1 Gbit/s link with a round trip, riva and encryption on, against iperf3 on the same link.
    Wan(wan::WanArgs),
    /// The RIVA model (Eq. 1) fed with stage times from separate runs, against riva's own run.
    Model(model::ModelArgs),
    /// The raw pipe's receiving end (run by `transfer`).
    #[command(hide = true)]
    PipeRecv(pipe::PipeRecvArgs),
    /// The raw pipe's sending end (run by `transfer`).
    #[command(hide = true)]
    PipeSend(pipe::PipeSendArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().bench {
        Bench::Hash(a) => hash::run(&a),
        Bench::Transfer(a) => transfer::run(&a),
        Bench::Verify(a) => verify::run(&a),
        Bench::Model(a) => model::run(&a),
        Bench::Flash(a) => flash::run(&a),
        Bench::Scrub(a) => scrub::run(&a),
        Bench::Mount(a) => mount::run(&a),
        Bench::Scale(a) => scale::run(&a),
        Bench::Split(a) => split::run(&a),
        Bench::Cache(a) => cache::run(&a),
        Bench::Wan(a) => wan::run(&a),
        Bench::PipeRecv(a) => pipe::recv(&a),
        Bench::PipeSend(a) => pipe::send(&a),
    }
}
