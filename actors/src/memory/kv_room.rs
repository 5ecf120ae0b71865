//! A token model's KV pool: pages from the ledger's memory, and with lent memory (the carveout) its whole pages
//! after them, in one address range for keys and one for values, so page ids and their arithmetic stay the same.

use std::sync::Arc;

use actix::prelude::*;
use tensorfold_engine::boundary::{KvLayout, KvPool};
use tensorfold_lend::kv::map_kv;
use tensorfold_lend::Lent;

use crate::memory::device::{Adopt, Adoption, Allocate, DeviceActor, IsHostAddressable, MapLent};
use crate::memory::ledger::MemoryKind;
use crate::start_error::StartError;

/// A built pool: its pages (own and lent), the pages lent memory added, and the accounting it holds.
pub(crate) struct Room {
    pub pool: KvPool,
    pub num_pages: usize,
    pub num_lent_pages: usize,
    pub held: Vec<Adoption>,
}

/// `num_pages` pages of the ledger's memory, and with `lent` the lent slices' whole pages as well.
pub(crate) async fn kv_room(
    device: &Addr<DeviceActor>,
    layout: KvLayout,
    num_pages: usize,
    lent: Option<Lent>,
) -> Result<Room, StartError> {
    let gone = |_| StartError::DeviceGone;
    if let Some(lent) = lent {
        match device.send(IsHostAddressable(MemoryKind::KvCache)).await.map_err(gone)? {
            true => match lent_room(device, layout, num_pages, lent).await? {
                Ok(room) => return Ok(room),
                Err(why) => tracing::warn!("carveout not used, the KV pool keeps its ordinary room: {why}"),
            },
            false => match device_room(device, layout, num_pages, lent).await? {
                Ok(room) => return Ok(room),
                Err(why) => tracing::warn!("carveout not used, the KV pool keeps its ordinary room: {why}"),
            },
        }
    }
    let bytes = layout.buffer_bytes(num_pages);
    let keys = device.send(Allocate { kind: MemoryKind::KvCache, bytes }).await.map_err(gone)??;
    let values = device.send(Allocate { kind: MemoryKind::KvCache, bytes }).await.map_err(gone)??;
    let pool = match keys.is_host_addressable() {
        true => {
            let pool = KvPool::with_storage(layout, num_pages, Box::new(keys), Box::new(values));
            own_states(device, pool).await?
        }
        false => {
            let ptrs = [keys.ptr().0, values.ptr().0];
            device_states(device, KvPool::on_device(layout, num_pages, Box::new((keys, values)), ptrs)).await?
        }
    };
    Ok(Room { pool, num_pages, num_lent_pages: 0, held: Vec::new() })
}

/// The pool over own and lent memory; the inner error is why the lent memory could not hold pages.
async fn lent_room(
    device: &Addr<DeviceActor>,
    layout: KvLayout,
    num_pages: usize,
    lent: Lent,
) -> Result<Result<Room, String>, StartError> {
    let gone = |_| StartError::DeviceGone;
    let lent_bytes = lent.bytes() as usize;
    let buffers = match map_kv(Arc::new(lent), num_pages, layout.buffer_bytes(1)) {
        Ok(buffers) => buffers,
        Err(e) => return Ok(Err(e.to_string())),
    };
    let num_lent_pages = buffers.layout.num_pages;
    let total = num_pages + num_lent_pages;
    // The own pages are mapped here rather than by the driver, so the ledger adopts them under the cap.
    let own = Adopt { kind: MemoryKind::KvCache, bytes: 2 * layout.buffer_bytes(num_pages) };
    let held = vec![
        device.send(own).await.map_err(gone)??,
        device.send(Adopt { kind: MemoryKind::Lent, bytes: lent_bytes }).await.map_err(gone)??,
    ];
    // Every page's recurrent state stays in own memory, the lent pages' too: without room for it, no carveout.
    let states = match layout.state_bytes(total) {
        0 => None,
        bytes => match device.send(Allocate { kind: MemoryKind::KvCache, bytes }).await.map_err(gone)? {
            Ok(states) => Some(states),
            Err(e) => return Ok(Err(format!("the recurrent state of {total} pages ({bytes} bytes): {e}"))),
        },
    };
    let mut pool = KvPool::with_storage(layout, total, Box::new(buffers.keys), Box::new(buffers.values));
    if let Some(states) = states {
        pool = pool.with_states(Box::new(states));
    }
    log_lent(lent_bytes, num_lent_pages, layout, "host");
    Ok(Ok(Room { pool, num_pages: total, num_lent_pages, held }))
}

/// Device KV over own and lent device memory in one range: the lent memory, then own memory of the ordinary pool's
/// size rounded down to whole slices, holding the keys of every page and then their values. Pages may straddle
/// the two, since the range is one to the kernels; the inner error is why the lent memory could not be used.
async fn device_room(
    device: &Addr<DeviceActor>,
    layout: KvLayout,
    num_pages: usize,
    lent: Lent,
) -> Result<Result<Room, String>, StartError> {
    let slice = tensorfold_lend::SLICE_BYTES as usize;
    let (plane, lent_bytes) = (layout.buffer_bytes(1), lent.bytes() as usize);
    let own_bytes = 2 * layout.buffer_bytes(num_pages) / slice * slice;
    let total = (own_bytes + lent_bytes) / (2 * plane);
    if total <= num_pages {
        return Ok(Err(format!("{lent_bytes} lent bytes add no whole page of {} bytes", 2 * plane)));
    }
    let mapped = match device.send(MapLent { own_bytes, lent: Arc::new(lent) }).await {
        Ok(Ok(mapped)) => mapped,
        Ok(Err(e)) => return Ok(Err(e.to_string())),
        Err(_) => return Err(StartError::DeviceGone),
    };
    let base = mapped.ptr().0;
    let ptrs = [base, base + (total * plane) as u64];
    let pool = KvPool::on_device(layout, total, Box::new(mapped), ptrs);
    // Every page's recurrent state stays in own device memory, the lent pages' too: without room for it, no carveout.
    let pool = match device_states(device, pool).await {
        Ok(pool) => pool,
        Err(StartError::DeviceGone) => return Err(StartError::DeviceGone),
        Err(e) => return Ok(Err(format!("the recurrent state of {total} pages: {e}"))),
    };
    let num_lent_pages = total - num_pages;
    log_lent(lent_bytes, num_lent_pages, layout, "device");
    Ok(Ok(Room { pool, num_pages: total, num_lent_pages, held: Vec::new() }))
}

/// The pool with its pages' recurrent state (linear-attention layers) in own host memory from the ledger, never in
/// lent memory; a pool without such state as it is.
async fn own_states(device: &Addr<DeviceActor>, pool: KvPool) -> Result<KvPool, StartError> {
    let bytes = pool.layout().state_bytes(pool.num_pages());
    if bytes == 0 {
        return Ok(pool);
    }
    let states =
        device.send(Allocate { kind: MemoryKind::KvCache, bytes }).await.map_err(|_| StartError::DeviceGone)??;
    Ok(pool.with_states(Box::new(states)))
}

/// A device pool with its pages' recurrent state in own device memory from the ledger; a pool without such state
/// as it is.
async fn device_states(device: &Addr<DeviceActor>, pool: KvPool) -> Result<KvPool, StartError> {
    let bytes = pool.layout().state_bytes(pool.num_pages());
    if bytes == 0 {
        return Ok(pool);
    }
    let states =
        device.send(Allocate { kind: MemoryKind::KvCache, bytes }).await.map_err(|_| StartError::DeviceGone)??;
    let ptr = states.ptr().0;
    Ok(pool.with_device_states(ptr, Box::new(states)))
}

/// The start-up line of a pool that lent memory grew: the lent bytes, the pages they added and their tokens, and the
/// recurrent state that stays in own memory.
fn log_lent(lent_bytes: usize, lent_pages: usize, layout: KvLayout, on: &str) {
    let kv_tokens_gained = lent_pages * layout.page_tokens;
    let own_state_bytes_per_page = layout.state_bytes(1);
    tracing::info!(
        lent_bytes,
        lent_pages,
        kv_tokens_gained,
        own_state_bytes_per_page,
        on,
        "carveout: KV pages in lent memory, recurrent state in own memory"
    );
}
