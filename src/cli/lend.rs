//! `tensorfold lend`: the reference lending daemon, lending host memory in whole slices until it is stopped.

use anyhow::{Context, Result};
use clap::Args;
use tensorfold_lend::daemon::Daemon;
use tensorfold_lend::pool::MemfdPool;
use tensorfold_lend::{round_to_slices, SLICE_BYTES};

use crate::carveout::{requested, Source};
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
    let key = claim.key.read()?;
    let mib = settings.count(Key::LendPoolMib).expect("the table gives it a default");
    let num_slices = (round_to_slices(mib << 20) / SLICE_BYTES) as usize;
    let mut daemon = Daemon::bind(&claim.socket, key, Box::new(MemfdPool::new(num_slices)))?;
    tracing::info!("lending {}", daemon.describe());
    daemon.serve(None).context("the lending daemon stopped")
}
