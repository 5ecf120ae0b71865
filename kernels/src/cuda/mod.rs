//! The CUDA device: one context and stream, and our kernels (build.rs compiles and caches them).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub use cudarc;
use cudarc::driver::{result, sys, CudaContext, CudaFunction, CudaStream};

mod attention;
mod build;
mod conv;
mod deltanet;
mod family;
mod gemm;
mod moe;
mod nccl;
mod pack;
mod sampling;
mod vmm;
pub use crate::cuda_pack::{gate_up_order, gemm_segments, pack_weight, packed_index, packed_rows, GemmTuning, Graph};
pub use attention::{attention_group_rows, AttentionArgs, QkvArgs, ATTENTION_SPLIT, HEAD_DIMS};
pub use build::{compile_ptx, source, SOURCES};
pub use conv::{ConvLaunch, Windows};
pub use deltanet::{
    deltanet_unfit, DeltaNetLayer, DeltaNetRound, HiddenPlane, PageRows, DELTANET_KEY_DIMS, DELTANET_MAX_VALUE_DIM,
};
pub use family::{family_segments, family_workspace, GemmScratch, GEMM_COUNTERS, STREAM_ROWS};
pub use gemm::NormIn;
pub use moe::{moe_gate_up_order, moe_unfit, MoeScratch, MoeShape, MoeWeights, MOE_MAX_TOPK};
pub use nccl::NcclComm;
pub use pack::{packed_vector, Event, PackPlace};
pub use sampling::{KeepRows, KEEP_SCRATCH};
pub use vmm::{Mapped, Physical, Vmm};

/// A device address.
pub type DevPtr = u64;

/// Most tensor-parallel ranks one sum adds.
pub const MAX_RANKS: usize = 8;

/// Most query heads sharing one KV head.
pub const MAX_GROUP: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no CUDA driver (libcuda.so.1) was found: --device cuda needs an NVIDIA GPU and its driver")]
    NoDriver,
    #[error("no NVRTC library (libnvrtc.so) was found: --device cuda needs the CUDA runtime compiler")]
    NoNvrtc,
    #[error("no CUDA device was found")]
    NoDevice,
    #[error("the GPU has compute capability {0}.{1}; the kernels need 8.0 or newer")]
    TooOld(i32, i32),
    #[error("CUDA driver call failed: {0}")]
    Driver(#[from] result::DriverError),
    #[error("compiling the CUDA kernels failed: {0}")]
    Compile(String),
    #[error("recording a CUDA graph failed: {0}")]
    Graph(String),
    #[error("{0}")]
    Collective(String),
}

impl GpuError {
    /// Whether the driver refused for want of memory.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, GpuError::Driver(e) if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    }
}

struct Functions {
    embed_rows: CudaFunction,
    rms_norm: CudaFunction,
    add_rms_norm: CudaFunction,
    /// The same two with NORM_NARROW threads a row, for rows of at most NORM_NARROW_WIDTH.
    rms_norm_narrow: CudaFunction,
    add_rms_norm_narrow: CudaFunction,
    add_rows: CudaFunction,
    sum_ranks: CudaFunction,
    swiglu: CudaFunction,
    gemm_m8: CudaFunction,
    gemm_m16: CudaFunction,
    gemm_norm_m8: CudaFunction,
    gemm_m64: CudaFunction,
    gemm_m64_r2: CudaFunction,
    gemm_t128: CudaFunction,
    gemm_t128_fold: CudaFunction,
    gemm_t64: CudaFunction,
    /// The wgmma kernel for wide rounds, where the GPU has it and `KernelOptions::wgmma` asks for it.
    gemm_wg128: Option<CudaFunction>,
    /// The exact Hopper family (gemm_tma.cu, gemm_stream.cu), where the GPU has it and `KernelOptions::family` asks.
    family: Option<family::Family>,
    qkv_rope_store: CudaFunction,
    /// `attention_d{D}` for each of `HEAD_DIMS`.
    attention: [CudaFunction; 5],
    /// `attention_decode_d{D}` for each of `HEAD_DIMS`, then `attention_spread_d{D}` (rows spread over warps),
    /// where `KernelOptions::wide_decode` asks for them.
    attention_decode: Option<[CudaFunction; 10]>,
    /// `attention_wg_d128`, prompt attention on wgmma, where `KernelOptions::wg_prompt` asks for it on sm_90a.
    attention_wg: Option<CudaFunction>,
    argmax_rows: CudaFunction,
    keep_count: CudaFunction,
    keep_write: CudaFunction,
    pack_rows: CudaFunction,
    snac_latent: CudaFunction,
    snac_snake: CudaFunction,
    snac_depthwise: CudaFunction,
    snac_conv_gemm: CudaFunction,
    snac_conv_rows: CudaFunction,
    moe: moe::MoeKernels,
    deltanet: deltanet::DeltaNetKernels,
    /// Whether launches may overlap the previous kernel's tail (programmatic dependent launch, sm_90 on).
    overlap: bool,
}

/// Threads of a norm block; the kernels declare it as their launch bound, which caps their registers to fit.
const NORM_THREADS: u32 = 1024;

/// Threads of a norm block for rows of at most NORM_NARROW_WIDTH (NORM_NARROW in norm.cu): the same bits.
const NORM_NARROW: u32 = 256;
pub const NORM_NARROW_WIDTH: usize = 4096;

/// One kernel argument, passed by value.
#[derive(Clone, Copy)]
enum Arg {
    Ptr(DevPtr),
    Int(i32),
    Float(f32),
    Double(f64),
    /// A CUtensorMap, passed as its 128 bytes.
    Map([u64; 16]),
}

/// One GPU: its context, the stream every kernel and copy runs on, and the loaded kernels.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    f: Functions,
    /// Whether the round being queued has at most `OVERLAP_ROWS` rows.
    narrow: AtomicBool,
    gemm: GemmTuning,
    /// Tensor maps of the family's operands, encoded once each.
    maps: std::sync::Mutex<family::MapCache>,
    /// Streaming multiprocessors.
    sms: usize,
}

/// How the kernels are launched; chosen once when the GPU is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelOptions {
    /// Kernels of narrow rounds start while the previous one ends (programmatic launch), on Hopper and later.
    pub overlap: bool,
    /// Wide rounds multiply on the warpgroup MMA of an sm_90 GPU (gemm_wgmma.cu), with the same bits.
    pub wgmma: bool,
    pub gemm: GemmTuning,
    /// Every weight whose K is a multiple of 64 multiplies on the exact Hopper family (TMA, wgmma) on an sm_90a GPU.
    pub family: bool,
    /// Rounds of one row per lane attend one warp (or a few) per (row, KV head) (attention_decode.cu) on sm_90 and
    /// later, with the same bits as the row kernel.
    pub wide_decode: bool,
    /// Prompt rounds of head size 128 over pages of 16 positions attend on wgmma with TMA (attention_wg.cu) on an
    /// sm_90a GPU, with the same bits.
    pub wg_prompt: bool,
    /// Decode rounds of experts split their TMA column tiles until every SM streams weights (moe.rs), same bits.
    pub moe_split: bool,
}

impl Default for KernelOptions {
    fn default() -> Self {
        KernelOptions {
            overlap: true,
            wgmma: false,
            gemm: GemmTuning::default(),
            family: true,
            wide_decode: true,
            wg_prompt: true,
            moe_split: false,
        }
    }
}

/// Rounds of at most this many rows overlap their launches: in wider ones a waiting early block would hold the
/// place of one of the previous kernel's blocks.
pub const OVERLAP_ROWS: usize = 16;

/// Whether the driver and NVRTC libraries can be loaded; checked before any call that would panic without them.
pub fn libraries_present() -> Result<(), GpuError> {
    // SAFETY: these only try to open the shared libraries.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(GpuError::NoDriver);
    }
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(GpuError::NoNvrtc);
    }
    Ok(())
}

impl Gpu {
    /// Opens device `ordinal` and loads the kernels, compiling them unless `cache_dir` holds this build.
    pub fn open(ordinal: usize, cache_dir: Option<&Path>, options: KernelOptions) -> Result<Arc<Gpu>, GpuError> {
        libraries_present()?;
        if CudaContext::device_count()? <= ordinal as i32 {
            return Err(GpuError::NoDevice);
        }
        let ctx = CudaContext::new(ordinal)?;
        let (major, minor) = ctx.compute_capability()?;
        if major < 8 {
            return Err(GpuError::TooOld(major, minor));
        }
        // sm_90 builds for sm_90a, whose warpgroup MMA the wgmma kernel needs; every other kernel is the same there.
        let arch = if (major, minor) == (9, 0) { "sm_90a".to_string() } else { format!("sm_{major}{minor}") };
        let kernels = build::Kernels::load(&ctx, &arch, cache_dir)?;
        let load = |name: &str| kernels.function(name);
        let sms = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize;
        let f = Functions {
            embed_rows: load("embed_rows")?,
            rms_norm: load("rms_norm")?,
            add_rms_norm: load("add_rms_norm")?,
            rms_norm_narrow: load("rms_norm_narrow")?,
            add_rms_norm_narrow: load("add_rms_norm_narrow")?,
            add_rows: load("add_rows")?,
            sum_ranks: load("sum_ranks")?,
            swiglu: load("swiglu")?,
            gemm_m8: load("gemm_m8")?,
            gemm_m16: load("gemm_m16")?,
            gemm_norm_m8: load("gemm_norm_m8")?,
            gemm_m64: load("gemm_m64")?,
            gemm_m64_r2: load("gemm_m64_r2")?,
            gemm_t128: load("gemm_t128")?,
            gemm_t128_fold: load("gemm_t128_fold")?,
            gemm_t64: load("gemm_t64")?,
            gemm_wg128: match options.wgmma && arch == "sm_90a" {
                true => Some(load("gemm_wg128")?),
                false => None,
            },
            family: match options.family && arch == "sm_90a" {
                true => Some(family::Family::load(&kernels, sms)?),
                false => None,
            },
            qkv_rope_store: load("qkv_rope_store")?,
            attention: [
                load("attention_d32")?,
                load("attention_d64")?,
                load("attention_d96")?,
                load("attention_d128")?,
                load("attention_d256")?,
            ],
            attention_decode: match options.wide_decode && major >= 9 {
                true => Some([
                    load("attention_decode_d32")?,
                    load("attention_decode_d64")?,
                    load("attention_decode_d96")?,
                    load("attention_decode_d128")?,
                    load("attention_decode_d256")?,
                    load("attention_spread_d32")?,
                    load("attention_spread_d64")?,
                    load("attention_spread_d96")?,
                    load("attention_spread_d128")?,
                    load("attention_spread_d256")?,
                ]),
                false => None,
            },
            attention_wg: match options.wg_prompt && arch == "sm_90a" {
                true => Some(load("attention_wg_d128")?),
                false => None,
            },
            argmax_rows: load("argmax_rows")?,
            keep_count: load("keep_count")?,
            keep_write: load("keep_write")?,
            pack_rows: load("pack_rows")?,
            snac_latent: load("snac_latent")?,
            snac_snake: load("snac_snake")?,
            snac_depthwise: load("snac_depthwise")?,
            snac_conv_gemm: load("snac_conv_gemm")?,
            snac_conv_rows: load("snac_conv_rows")?,
            moe: moe::MoeKernels::load(&kernels, options.family && arch == "sm_90a", options.moe_split)?,
            deltanet: deltanet::DeltaNetKernels::load(&kernels)?,
            overlap: major >= 9 && options.overlap,
        };
        gemm::allow_shared_memory(&f)?;
        let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        for (func, d) in f.attention.iter().zip(HEAD_DIMS) {
            func.set_attribute(attr, attention::attention_smem(d) as i32)?;
        }
        for (func, d) in f.attention_decode.iter().flatten().zip(HEAD_DIMS.iter().chain(&HEAD_DIMS)) {
            func.set_attribute(attr, attention::decode_smem(*d) as i32)?;
        }
        if let Some(func) = &f.attention_wg {
            func.set_attribute(attr, attention::WG_SMEM as i32)?;
        }
        // Graph capture needs a stream of our own, not the legacy default one.
        let stream = ctx.new_stream()?;
        let maps = Default::default();
        Ok(Arc::new(Gpu { ctx, stream, f, narrow: AtomicBool::new(false), gemm: options.gemm, maps, sms }))
    }

    pub fn name(&self) -> String {
        self.ctx.name().unwrap_or_else(|_| "unknown GPU".into())
    }

    pub fn total_memory(&self) -> Result<usize, GpuError> {
        Ok(self.ctx.total_mem()?)
    }

    /// Device memory, or with `host` pinned host memory, straight from the driver; `Err(true)` means out of memory.
    pub fn malloc(&self, bytes: usize, host: bool) -> Result<DevPtr, (bool, String)> {
        self.bind().map_err(|e| (false, e.to_string()))?;
        // SAFETY: plain allocation calls with the context current; the ledger frees each pointer once.
        let got = unsafe {
            match host {
                true => result::malloc_host(bytes.max(1), 0).map(|p| p as DevPtr),
                false => result::malloc_sync(bytes.max(1)),
            }
        };
        got.map_err(|e| (e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY, e.to_string()))
    }

    /// Frees what `malloc` returned.
    pub fn free(&self, ptr: DevPtr, host: bool) {
        if self.bind().is_err() {
            return;
        }
        // SAFETY: `ptr` came from `malloc` with the same `host` and is freed once.
        let freed = unsafe {
            match host {
                true => result::free_host(ptr as *mut std::ffi::c_void),
                false => result::free_sync(ptr),
            }
        };
        if let Err(e) = freed {
            tracing::warn!(error = %e, "freeing GPU memory failed");
        }
    }

    /// Makes this GPU's context current on the calling thread.
    pub fn bind(&self) -> Result<(), GpuError> {
        Ok(self.ctx.bind_to_thread()?)
    }

    /// Copies host bytes to device memory, waiting for the copy.
    pub fn upload<T>(&self, dst: DevPtr, src: &[T]) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: callers pass an allocation of at least `size_of_val(src)` bytes.
        unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream())? };
        Ok(self.stream.synchronize()?)
    }

    /// Queues a copy of host memory to the device; `src` must stay untouched until `sync`.
    ///
    /// # Safety
    /// `dst` must hold `size_of_val(src)` bytes and `src` must outlive the copy (pinned memory is best).
    pub unsafe fn upload_async<T>(&self, dst: DevPtr, src: &[T]) -> Result<(), GpuError> {
        unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream())? };
        Ok(())
    }

    /// Queues a copy of device memory to the host.
    ///
    /// # Safety
    /// `src` must hold `size_of_val(dst)` bytes and `dst` must stay alive and unread until `sync`.
    pub unsafe fn download_async<T>(&self, dst: &mut [T], src: DevPtr) -> Result<(), GpuError> {
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream())? };
        Ok(())
    }

    /// Waits for everything queued on the stream.
    pub fn sync(&self) -> Result<(), GpuError> {
        Ok(self.stream.synchronize()?)
    }

    /// Records the launches `queue` makes, without running them, as a graph to replay.
    pub fn capture(&self, queue: impl FnOnce() -> Result<(), GpuError>) -> Result<Graph, GpuError> {
        self.stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
        let queued = queue();
        let graph = self.stream.end_capture(sys::CUgraphInstantiate_flags(0));
        queued?;
        graph?.map(Graph).ok_or_else(|| GpuError::Graph("the capture recorded nothing".into()))
    }

    /// Sets how many rows the launches that follow compute, until the next call.
    pub fn begin_round(&self, rows: usize) {
        self.narrow.store(rows <= OVERLAP_ROWS, Ordering::Relaxed);
    }

    /// Queues `func` on the stream; in a narrow round with `overlap`, it may start while the previous kernel finishes, and waits
    /// for it (griddepcontrol.wait in every kernel) before reading what that kernel wrote.
    fn launch(
        &self,
        func: &CudaFunction,
        grid: (usize, usize, usize),
        block: u32,
        smem: u32,
        args: &[Arg],
    ) -> Result<(), GpuError> {
        // Each argument's bytes: one slot for a scalar, sixteen for a tensor map.
        let mut slots: Vec<[u64; 16]> = args
            .iter()
            .map(|a| match *a {
                Arg::Ptr(p) => [p; 16],
                Arg::Int(v) => [v as u32 as u64; 16],
                Arg::Float(v) => [v.to_bits() as u64; 16],
                Arg::Double(v) => [v.to_bits(); 16],
                Arg::Map(m) => m,
            })
            .collect();
        let mut params: Vec<*mut std::ffi::c_void> = slots.iter_mut().map(|s| s.as_mut_ptr().cast()).collect();
        // SAFETY: a zeroed attribute is valid plain data; its id and value are set before use.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0 as u32,
            gridDimY: grid.1 as u32,
            gridDimZ: grid.2 as u32,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: (self.f.overlap && self.narrow.load(Ordering::Relaxed)) as u32,
        };
        // SAFETY: each slot holds one argument of at most 8 bytes, little-endian, in the kernel's parameter order;
        // callers pass buffers that hold what the kernel reads and writes for this grid.
        unsafe { sys::cuLaunchKernelEx(&config, func.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }
            .result()?;
        Ok(())
    }

    /// x[r] = table[tokens[r]] as f32, for `rows` rows of width `h`; the table is laid out as a `vocab x h` weight
    /// (packed by `pack_weight`, or row-major where `natural`).
    pub fn embed_rows(
        &self,
        table: DevPtr,
        tokens: DevPtr,
        x: DevPtr,
        (rows, vocab, h): (usize, usize, usize),
    ) -> Result<(), GpuError> {
        let natural = Arg::Int(self.natural(vocab, h) as i32);
        let args = [Arg::Ptr(table), Arg::Ptr(tokens), Arg::Ptr(x), Arg::Int(h as i32), natural];
        self.launch(&self.f.embed_rows, (rows, 1, 1), 256, 0, &args)
    }

    /// out[r] = rms_norm(x[rows[r]]) * w as bf16; `rows` 0 means every row in order.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm(
        &self,
        x: DevPtr,
        rows: DevPtr,
        n: usize,
        w: DevPtr,
        out: DevPtr,
        h: usize,
        eps: f32,
    ) -> Result<(), GpuError> {
        let args = [Arg::Ptr(x), Arg::Ptr(rows), Arg::Ptr(w), Arg::Ptr(out), Arg::Int(h as i32), Arg::Float(eps)];
        match h <= NORM_NARROW_WIDTH {
            true => self.launch(&self.f.rms_norm_narrow, (n, 1, 1), NORM_NARROW, 0, &args),
            false => self.launch(&self.f.rms_norm, (n, 1, 1), NORM_THREADS, 0, &args),
        }
    }

    /// x += delta, then out = rms_norm(x) * w as bf16.
    #[allow(clippy::too_many_arguments)]
    pub fn add_rms_norm(
        &self,
        x: DevPtr,
        delta: DevPtr,
        w: DevPtr,
        out: DevPtr,
        n: usize,
        h: usize,
        eps: f32,
    ) -> Result<(), GpuError> {
        let args = [Arg::Ptr(x), Arg::Ptr(delta), Arg::Ptr(w), Arg::Ptr(out), Arg::Int(h as i32), Arg::Float(eps)];
        match h <= NORM_NARROW_WIDTH {
            true => self.launch(&self.f.add_rms_norm_narrow, (n, 1, 1), NORM_NARROW, 0, &args),
            false => self.launch(&self.f.add_rms_norm, (n, 1, 1), NORM_THREADS, 0, &args),
        }
    }

    /// x += delta over `n` rows of width `h`.
    pub fn add_rows(&self, x: DevPtr, delta: DevPtr, n: usize, h: usize) -> Result<(), GpuError> {
        self.launch(&self.f.add_rows, (n, 1, 1), 256, 0, &[Arg::Ptr(x), Arg::Ptr(delta), Arg::Int(h as i32)])
    }

    /// Every buffer of `parts` (one per tensor-parallel rank, at most `MAX_RANKS`) becomes the sum of all of them,
    /// added in rank order element by element, over `n` floats.
    pub fn sum_ranks(&self, parts: &[DevPtr], n: usize) -> Result<(), GpuError> {
        if parts.is_empty() || parts.len() > MAX_RANKS {
            return Err(GpuError::Collective(format!("{} ranks: the sum takes 1 to {MAX_RANKS}", parts.len())));
        }
        let mut args: Vec<Arg> = (0..MAX_RANKS).map(|r| Arg::Ptr(parts.get(r).copied().unwrap_or(0))).collect();
        args.extend([Arg::Int(parts.len() as i32), Arg::Int(n as i32)]);
        self.launch(&self.f.sum_ranks, (n.div_ceil(256).min(1024), 1, 1), 256, 0, &args)
    }

    /// act = silu(gate) * up as bf16, from rows of 2 f laid out by `gate_up_order`.
    pub fn swiglu(&self, gate_up: DevPtr, act: DevPtr, n: usize, f: usize) -> Result<(), GpuError> {
        self.launch(
            &self.f.swiglu,
            (f.div_ceil(256), n, 1),
            256,
            0,
            &[Arg::Ptr(gate_up), Arg::Ptr(act), Arg::Int(f as i32)],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_kernels_launched_with_more_than_256_threads_declare_that_bound() {
        // Without the bound the compiler may use more registers than such a block can have, and the launch fails.
        let src = source();
        let launched = [
            ("rms_norm", NORM_THREADS),
            ("add_rms_norm", NORM_THREADS),
            ("gemm_m8", 512),
            ("gemm_m16", 512),
            ("gemm_norm_m8", 512),
            ("argmax_rows", 1024),
            ("keep_count", 1024),
            ("keep_write", 1024),
            ("moe_plan", 1024),
        ];
        for (name, threads) in launched {
            let bound = format!("__launch_bounds__({threads}");
            let declared = src.lines().any(|l| l.contains(&format!(" {name}(")) && l.contains(&bound));
            assert!(declared, "kernel {name} is launched with {threads} threads but does not declare {bound})");
        }
    }

    #[test]
    fn test_kernels_compile_where_nvrtc_is_present() {
        match compile_ptx("sm_90") {
            Ok(ptx) => {
                assert!(ptx.contains(".entry gemm_m16") && ptx.contains("mma.sync"), "PTX lacks the GEMM");
                assert!(ptx.contains(".entry snac_conv_gemm"), "PTX lacks the codec kernels");
                assert!(ptx.contains(".entry moe_gate_up_m16"), "PTX lacks the expert kernels");
                assert!(ptx.contains(".entry deltanet_heads_k128"), "PTX lacks the linear-attention kernels");
                assert!(ptx.contains(".entry attention_output_gate"), "PTX lacks the attention output gate");
                assert!(ptx.contains(".entry mtp_join"), "PTX lacks the draft head's kernels");
                assert!(ptx.contains(".entry attention_spread_d256"), "PTX lacks attention for heads of 256");
            }
            Err(GpuError::NoNvrtc) => eprintln!("skipped: no NVRTC library on this machine"),
            Err(e) => panic!("{e}"),
        }
    }
}
