//! Memory: the device actor and its capped ledger, KV pages and leases, the prefix cache, and the room lent to
//! other processes.

pub mod cuda_driver;
pub mod device;
pub mod kv;
pub(crate) mod kv_room;
pub mod ledger;
pub mod prefix;

#[cfg(test)]
mod lent_tests;
