//! The tensorfold binary's library: the command line, the settings table, the HTTP server, and the wiring that
//! builds models and speakers from settings.

pub mod backend;
pub mod carveout;
pub mod cli;
pub mod cuda_setup;
pub mod lend_pool;
pub mod server;
pub mod settings;
pub mod wiring;
