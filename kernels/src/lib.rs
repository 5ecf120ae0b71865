//! Batch-invariant compute kernels: a row never depends on the other rows of its call.

pub mod attention;
pub mod conv;
pub mod cuda;
pub mod cuda_pack;
pub mod dot8;
mod dot8_block;
mod dot8_k;
#[cfg(target_arch = "x86_64")]
mod dot8_x86;
pub mod gelu;
pub mod int8;
pub mod matmul;
pub mod ops;
mod out_ptr;
pub mod packed;
pub mod quant;
pub mod sampling;
pub mod simd;
#[cfg(target_arch = "x86_64")]
pub mod simd512;
pub mod weight;

pub use quant::GgmlType;
pub use weight::{QuantBytes, Weight};
