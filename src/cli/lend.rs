//! `tensorfold lend`: the reference lending daemon, lending host memory (or with `--device cuda` GPU 0's memory) in
//! whole slices until it is stopped.

use anyhow::{Context, Result};
use clap::Args;
use tensorfold_lend::daemon::Daemon;
use tensorfold_lend::pool::{MemfdPool, Pool};
use tensorfold_lend::{round_to_slices, SLICE_BYTES};

use crate::carveout::{requested, Source};
use crate::cuda_setup::Device;
use crate::lend_pool::DevicePool;
use crate::settings::cli::LEND;
use crate::settings::{Key, Settings, TableArgs};

#[derive(Args)]
pub struct LendArgs {
    #[command(flatten)]
    pub table: TableArgs<LEND>,
}

/// The rows the daemon reads are the server's carveout rows, so both ends agree on the socket and the key.
pub const FORCED: [(Key, &str); 2] = [(Key::Carveout, "1"), (Key::CarveoutSource, "daemon")];

pub fn lend(settings: &Settings) -> Result<()> {
    let Some(Source::Daemon(claim)) = requested(settings).map(|r| r.source) else {
        anyhow::bail!("the lending daemon's rows were not read");
    };
    let mib = settings.count(Key::LendPoolMib).expect("the table gives it a default");
    let num_slices = (round_to_slices(mib << 20) / SLICE_BYTES) as usize;
    // The pool first, so a machine without a GPU is told so before any socket is made.
    let pool: Box<dyn Pool> = match settings.device() {
        Device::Cpu => Box::new(MemfdPool::new(num_slices)),
        Device::Cuda => Box::new(DevicePool::open(0, num_slices).context("--device cuda: lending GPU 0's memory")?),
    };
    let key = claim.key.read()?;
    let mut daemon = Daemon::bind(&claim.socket, key, pool)?;
    tracing::info!("lending {}", daemon.describe());
    daemon.serve(None).context("the lending daemon stopped")
}
