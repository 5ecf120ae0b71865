//! The Llama family on a CUDA GPU: bf16 weights and KV, an f32 residual stream, our batch-invariant kernels.

use std::collections::hash_map::{Entry, HashMap};
use std::sync::Arc;

use crate::boundary::{Engine, EngineError, KvLayout, KvPool, LaneRows, LaneStep, Logits};
use crate::memory::{Alloc, Held, MemoryKind};
use tensorfold_kernels::cuda::{
    attention_group_rows, family_workspace, DevPtr, GemmScratch, Gpu, GpuError, Graph, KernelOptions, MoeScratch,
    ATTENTION_SPLIT, GEMM_COUNTERS, HEAD_DIMS, MAX_GROUP,
};

use crate::checkpoint::Checkpoint;
use crate::error::LoadError;
use crate::llama::config::ModelConfig;
use crate::llama::walk::{names, MatrixSpec};
use crate::llama::{rope_inv_freq, Loader};
use crate::tp::stream::DeviceCollective;

mod experts;
mod hybrid;
mod layer;
mod logits;
mod mtp;
mod pack;
mod queue;
mod round;
mod upload;

use hybrid::HybridScratch;
use layer::GpuLayer;
use logits::{bring_back, KeepBuffers, RoundRows};
use mtp::MtpWeights;
use pack::read;
use round::{fill, Filled, Geometry, MetaLayout};
use upload::Uploader;

/// A recorded round's row count, KV pool keys, values, recurrent state and page size, RoPE fusion and norm folding.
type GraphKey = (usize, [DevPtr; 3], usize, bool, bool);

/// What one round may hold: the buffers are sized for it at load.
#[derive(Clone, Copy, Debug)]
pub struct Sizing {
    /// Most tokens in one forward.
    pub max_tokens: usize,
    /// Most lanes in one forward.
    pub max_lanes: usize,
    /// Most positions of one lane.
    pub context: usize,
}

/// One round's device buffers.
struct Scratch {
    x: DevPtr,
    /// The residual stream's second buffer, for rounds that fold the norms (up to 8 rows).
    x_spare: DevPtr,
    normed: DevPtr,
    qkv: DevPtr,
    attn: DevPtr,
    proj: DevPtr,
    gate_up: DevPtr,
    act: DevPtr,
    logits: DevPtr,
    /// Greedy picks, one id per logits row.
    picks: DevPtr,
    /// Sampled rows cut to the tokens their draws can take.
    keep: KeepBuffers,
    meta: DevPtr,
    /// Attention split states of rounds of up to `SPLIT_ROWS` rows, and of the wide decode kernel's rounds of up
    /// to `WIDE_SPLIT_ROWS` rows where they fit its `partial_bytes`.
    partial: DevPtr,
    partial_bytes: usize,
    tickets: DevPtr,
    nsplit: usize,
    /// The GEMM family's workspace and arrival counters.
    gemm: GemmScratch,
    /// Routing buffers, where the model has experts.
    moe: MoeScratch,
    /// A hybrid's buffers (linear layers, attention gates, shared experts).
    hybrid: HybridScratch,
    /// A draft head's input rows (bf16, embedding ++ hidden state); 0 without a head.
    joined: DevPtr,
}

/// Decode rounds of up to this many rows replay recorded graphs.
const GRAPH_ROWS: usize = 256;

/// Rounds of up to this many rows run attention splits in parallel blocks.
const SPLIT_ROWS: usize = 16;

/// Blocks per row that run attention splits side by side.
const SPLIT_BLOCKS: usize = 32;

/// Most bytes of attention split states; rows with more splits fold them in one block.
const PARTIAL_BYTES: usize = 64 << 20;

/// Decode rounds of up to this many rows may spread a row over several warps of the wide decode kernel.
const WIDE_SPLIT_ROWS: usize = GRAPH_ROWS;

/// Most bytes of the wide decode kernel's split states; rounds whose states do not fit keep one warp a row.
const WIDE_STATE_BYTES: usize = 256 << 20;

/// Switches of the CUDA backend, from the settings table; none changes the bits a round computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaOptions {
    /// How the kernels launch and split their sums, fixed when the GPU is opened.
    pub kernels: KernelOptions,
    /// Decode rounds replay recorded graphs instead of launching each kernel.
    pub graphs: bool,
    /// Decode rounds do RoPE and the cache write inside the attention kernel.
    pub fuse_rope: bool,
    /// Rounds of few rows fold each norm into the GEMM that reads it.
    pub fold_norms: bool,
    /// Rounds of greedy picks only find them on the GPU and bring back the ids alone.
    pub gpu_argmax: bool,
    /// Mixture-of-experts layers run on the grouped kernels (moe.cu), and hybrids (Qwen3-Next) on theirs; off, such
    /// models are refused.
    pub experts: bool,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            kernels: KernelOptions::default(),
            graphs: true,
            fuse_rope: false,
            fold_norms: true,
            gpu_argmax: true,
            experts: true,
        }
    }
}

/// The Llama family on the GPU: the network, and the buffers a round moves through the host.
pub struct CudaLlama {
    net: Net,
    /// Pinned host memory: the meta tables going up, then the logits coming down.
    staging: Held,
    /// Recorded decode rounds by `GraphKey`.
    graphs: HashMap<GraphKey, Graph>,
    options: CudaOptions,
    weight_bytes: usize,
    activation_bytes: usize,
    /// Every allocation the model holds, returned to the ledger when it drops.
    _held: Vec<Held>,
}

/// The weights and device buffers one round's kernels read and write.
struct Net {
    cfg: ModelConfig,
    gpu: Arc<Gpu>,
    sizing: Sizing,
    embed: DevPtr,
    /// The main layers, then a draft head's.
    layers: Vec<GpuLayer>,
    /// The draft head's own tensors, where the model has one.
    mtp: Option<MtpWeights>,
    norm: DevPtr,
    lm_head: DevPtr,
    inv_freq: DevPtr,
    scratch: Scratch,
    meta: MetaLayout,
    /// The tensor-parallel group this rank sums its partial outputs with; `None` for the whole model.
    collective: Option<Box<dyn DeviceCollective>>,
}

fn gpu_err(e: GpuError) -> LoadError {
    LoadError::Device(e.to_string())
}

impl CudaLlama {
    /// Loads the checkpoint onto `gpu`, every buffer through `alloc`; `progress(done, total)` follows the layers.
    pub fn load(
        ckpt: &dyn Checkpoint,
        gpu: Arc<Gpu>,
        sizing: Sizing,
        options: CudaOptions,
        alloc: &mut Alloc,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<CudaLlama, LoadError> {
        let c = ckpt.config().clone();
        let fault = |f: String| LoadError::Device(format!("{}: {f}", ckpt.path().display()));
        if !HEAD_DIMS.contains(&c.head_dim) {
            return Err(fault(format!(
                "head size {} is not one the attention kernels take: {HEAD_DIMS:?}",
                c.head_dim
            )));
        }
        if !c.num_heads.is_multiple_of(c.num_kv_heads) || c.num_heads / c.num_kv_heads > MAX_GROUP {
            return Err(fault(format!(
                "{} query heads over {} KV heads: groups of at most {MAX_GROUP} are supported",
                c.num_heads, c.num_kv_heads
            )));
        }
        if !c.hidden_size.is_multiple_of(32)
            || !c.intermediate_size.is_multiple_of(32)
            || !(c.num_heads * c.head_dim).is_multiple_of(32)
        {
            return Err(fault("the CUDA kernels need hidden and intermediate sizes that are multiples of 32".into()));
        }
        if let Some(why) = experts::unfit(&c) {
            return Err(fault(why));
        }
        if (c.moe.is_some() || c.hybrid.is_some()) && !options.experts {
            return Err(fault(
                "mixture-of-experts and hybrid layers are off on CUDA (TF_CUDA_EXPERTS=0); 1 runs them".into(),
            ));
        }
        let ld = Loader { ckpt };
        let (h, f) = (c.hidden_size, c.intermediate_size);
        let (q_dim, kv_dim) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let shared = gpu.clone();
        let started = std::time::Instant::now();
        let mut up = Uploader::new(&shared, alloc);
        let matrix = |name: &str, rows, cols| read(ckpt, &ld, name, rows, cols);
        // Each matrix is read just before its upload, so a converted layer is never whole in host memory.
        let spec = |m: &MatrixSpec| matrix(&m.name, m.rows, m.cols);
        let embed = up.matrices(&[matrix(names::EMBED, c.vocab_size, h)?])?;
        let mut layers = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            layers.push(layer::upload(&mut up, ckpt, &ld, ld.layer_tensors(i, &c)?, &c)?);
            progress(i + 1, c.num_layers);
        }
        let mtp = match mtp::upload(&mut up, ckpt, &ld, &c)? {
            Some((head_layer, weights)) => {
                layers.push(head_layer);
                Some(weights)
            }
            None => None,
        };
        let norm = up.vector(&c.centre_norm(ld.vector(names::NORM, h)?))?;
        let lm_head = match ld.lm_head(&c) {
            None => embed,
            Some(head) => up.matrices(&[spec(&head)?])?,
        };
        up.finish()?;
        let (pack_s, upload_s) = (up.pack_time.as_secs_f64(), up.upload_time.as_secs_f64());
        let seconds = started.elapsed().as_secs_f64();
        let gpu_packed_bytes = up.gpu_packed_bytes;
        tracing::info!(seconds, pack_s, upload_s, bytes = up.bytes, gpu_packed_bytes, "weights on the GPU");
        let factors = ld.rope_factors(&c)?;
        let inv_freq = up.vector(&rope_inv_freq(&c, factors.as_deref()))?;
        let weight_bytes = up.bytes;
        let (t, meta) = (sizing.max_tokens, MetaLayout::new(&sizing));
        let width = q_dim + 2 * kv_dim;
        let act = MemoryKind::Activations;
        let sizes = [
            4 * t * h,
            2 * t * h,
            4 * t * width,
            2 * t * q_dim,
            4 * t * h,
            8 * t * f,
            2 * t * f,
            4 * t * c.vocab_size,
            meta.end,
            4 * t,
            4 * t.min(8) * h,
        ];
        let mut ptrs = [0; 11];
        for (p, &bytes) in ptrs.iter_mut().zip(&sizes) {
            *p = up.buffer(act, bytes)?;
        }
        let [x, normed, qkv, attn, proj, gate_up, act_buf, logits, meta_ptr, picks, x_spare] = ptrs;
        let state_bytes = SPLIT_ROWS.min(t) * c.num_heads * (c.head_dim + 2) * 4;
        let nsplit = sizing.context.div_ceil(ATTENTION_SPLIT).min(PARTIAL_BYTES / state_bytes).max(1);
        let wide_bytes = t.min(WIDE_SPLIT_ROWS) * c.num_heads * nsplit * (c.head_dim + 2) * 4;
        let partial_bytes = (nsplit * state_bytes).max(wide_bytes.min(WIDE_STATE_BYTES));
        let partial = up.buffer(act, partial_bytes)?;
        let keep_sizes = KeepBuffers::sizes(sizing.max_lanes, sizing.context, c.vocab_size);
        let mut keep_ptrs = [0; 7];
        for (p, &bytes) in keep_ptrs.iter_mut().zip(&keep_sizes) {
            *p = up.buffer(act, bytes)?;
        }
        let [pairs, counts, rows, params, hist_off, history, scratch] = keep_ptrs;
        let history_cap = sizing.max_lanes * sizing.context;
        let keep = KeepBuffers { pairs, counts, rows, params, hist_off, history, scratch, history_cap };
        let zeros = vec![0u32; SPLIT_ROWS.max(WIDE_SPLIT_ROWS) * c.num_kv_heads];
        let tickets = up.buffer(act, 4 * zeros.len())?;
        shared.upload(tickets, &zeros).map_err(gpu_err)?;
        let mut shapes = vec![(width, h), (h, q_dim), (2 * f, h), (h, f), (c.vocab_size, h)];
        shapes.extend(hybrid::gemm_shapes(&c));
        if mtp.is_some() {
            shapes.push((h, 2 * h));
        }
        let natural = shapes.iter().filter(|&&(n, k)| shared.natural(n, k));
        let ws_floats = natural.map(|&(n, k)| family_workspace(n, k)).max().unwrap_or(0);
        let gemm_bytes = match ws_floats {
            0 => 0,
            floats => 4 * floats + 4 * GEMM_COUNTERS,
        };
        let gemm = match gemm_bytes {
            0 => GemmScratch::default(),
            _ => {
                let ws = up.buffer(act, 4 * ws_floats)?;
                let counters = up.buffer(act, 4 * GEMM_COUNTERS)?;
                shared.upload(counters, &vec![0u32; GEMM_COUNTERS]).map_err(gpu_err)?;
                GemmScratch { ws, ws_floats, counters }
            }
        };
        let (moe, moe_bytes) = match experts::moe_shape(&c) {
            Some(shape) => experts::scratch(&mut up, &shared, t, &shape)?,
            None => (MoeScratch::default(), 0),
        };
        let (hybrid, hybrid_bytes) = hybrid::scratch(&mut up, &c, t)?;
        let joined_bytes = if mtp.is_some() { 4 * t * h } else { 0 };
        let joined = if mtp.is_some() { up.buffer(act, joined_bytes)? } else { 0 };
        let scratch = Scratch {
            x,
            x_spare,
            normed,
            qkv,
            attn,
            proj,
            gate_up,
            act: act_buf,
            logits,
            picks,
            keep,
            meta: meta_ptr,
            partial,
            partial_bytes,
            tickets,
            nsplit,
            gemm,
            moe,
            hybrid,
            joined,
        };
        let staging_bytes = meta.end + 4 * t * c.vocab_size;
        let staging =
            (up.alloc)(MemoryKind::PinnedHost, staging_bytes).map_err(|e| LoadError::Device(e.to_string()))?;
        let activation_bytes = sizes.iter().chain(&keep_sizes).sum::<usize>()
            + partial_bytes
            + 4 * zeros.len()
            + staging_bytes
            + gemm_bytes
            + moe_bytes
            + hybrid_bytes
            + joined_bytes;
        let net =
            Net { cfg: c, gpu, sizing, embed, layers, mtp, norm, lm_head, inv_freq, scratch, meta, collective: None };
        let graphs = HashMap::new();
        Ok(CudaLlama { net, staging, graphs, options, weight_bytes, activation_bytes, _held: up.held })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.net.cfg
    }

    /// Makes this model a tensor-parallel rank (loaded from its shard) that sums its partial outputs with the
    /// group; its rounds launch kernel by kernel, as a recorded graph cannot wait for the other ranks.
    pub fn join(&mut self, collective: Box<dyn DeviceCollective>) {
        self.net.collective = Some(collective);
    }

    /// Bytes of weights on the GPU.
    pub fn num_weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// Bytes of activation buffers, device and pinned host.
    pub fn activation_bytes(&self) -> usize {
        self.activation_bytes
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.net.gpu
    }

    pub fn options(&self) -> CudaOptions {
        self.options
    }

    /// Switches for the rounds from now on; recorded graphs stay valid, as each is keyed by the switches it ran.
    pub fn set_options(&mut self, options: CudaOptions) {
        self.options = options;
    }

    /// Runs the round; `Err` for a device fault or a round the buffers were not sized for.
    fn run(&mut self, pool: &KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        refuse_hidden(lanes)?;
        let (cache, f) = self.upload_round(pool, lanes, false)?;
        let (net, options, e) = (&self.net, self.options, EngineError::from);
        let (c, g, t, n) = (&net.cfg, &*net.gpu, f.rows, f.logit_rows);
        // A decode round's launches depend only on its row count and the pool's addresses and page size: a graph replays them.
        let decode = lanes.iter().all(|l| l.tokens.len() == 1);
        // RoPE inside attention rotates whole heads only.
        let fuse_rope = decode && options.fuse_rope && c.rotary_dim() == c.head_dim;
        let fold = options.fold_norms;
        if decode && n == t && t <= GRAPH_ROWS && options.graphs && net.collective.is_none() {
            let key = (t, [cache.k, cache.v, cache.states], cache.page_tokens, fuse_rope, fold);
            let graph = match self.graphs.entry(key) {
                Entry::Occupied(o) => o.into_mut(),
                Entry::Vacant(v) => v.insert(g.capture(|| net.queue(&cache, &f, fuse_rope, fold)).map_err(e)?),
            };
            graph.launch().map_err(e)?;
        } else {
            net.queue(&cache, &f, fuse_rope, fold).map_err(e)?;
        }
        self.bring_back(n, lanes)
    }

    /// Checks a round (a draft head's with `head`) against the sizing and the pool, writes its tables to the staging
    /// and queues their upload.
    fn upload_round(&mut self, pool: &KvPool, lanes: &[LaneStep], head: bool) -> Result<(Caches, Filled), EngineError> {
        let cache = self.caches(pool, lanes.len())?;
        let net = &self.net;
        let t: usize = lanes.iter().map(|l| l.tokens.len()).sum();
        if t == 0 || t > net.sizing.max_tokens || lanes.len() > net.sizing.max_lanes {
            return Err(EngineError::Sizing(format!(
                "a round of {t} tokens over {} lanes exceeds the sizing {:?}",
                lanes.len(),
                net.sizing
            )));
        }
        let m = net.meta;
        let bytes = self.staging.as_bytes_mut();
        let f = fill(bytes, &m, lanes, net.geometry(&cache, t), head)?;
        let e = EngineError::from;
        net.gpu.bind().map_err(e)?;
        // SAFETY: the staging bytes are pinned, and nothing writes them again before the sync in `bring_back`, which
        // writes only past `m.end`.
        unsafe { net.gpu.upload_async(net.scratch.meta, &bytes[..f.upload_bytes(&m)]).map_err(e)? };
        Ok((cache, f))
    }

    /// The pool's device buffers and geometry for a round of `lanes` lanes.
    fn caches(&self, pool: &KvPool, lanes: usize) -> Result<Caches, EngineError> {
        let sizing_err = |m: &str| EngineError::Sizing(m.to_string());
        let [k, v] = pool.device_ptrs().ok_or_else(|| sizing_err("the KV pool is not on the GPU"))?;
        let layout = pool.layout();
        let states = pool.device_states().unwrap_or(0);
        if layout.state_elems > 0 && states == 0 {
            return Err(sizing_err("the KV pool has no recurrent state on the GPU"));
        }
        let (page_tokens, page_stride, state_elems) =
            (layout.page_tokens, layout.page_elems() as u64, layout.state_elems);
        Ok(Caches { k, v, page_tokens, page_stride, states, state_elems, lanes })
    }

    /// Each lane's rows from the round's `n` logits rows, once the queued kernels end.
    fn bring_back(&mut self, n: usize, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        let (s, g) = (&self.net.scratch, &*self.net.gpu);
        let floats = &mut self.staging[self.net.meta.end / 4..];
        let (vocab, gpu_argmax) = (self.net.cfg.vocab_size, self.options.gpu_argmax);
        let round = RoundRows { logits: s.logits, picks: s.picks, staging: floats, n, vocab, gpu_argmax };
        bring_back(g, &s.keep, round, lanes)
    }
}

impl Net {
    /// The page geometry and attention grouping of a round of `t` rows.
    fn geometry(&self, cache: &Caches, t: usize) -> Geometry {
        let c = &self.cfg;
        // Attention takes each lane's rows in groups of consecutive positions; in split rounds, one row each.
        let per_group = if t <= SPLIT_ROWS { 1 } else { attention_group_rows(c.num_heads / c.num_kv_heads) };
        Geometry {
            page_tokens: cache.page_tokens,
            kv_dim: c.num_kv_heads * c.head_dim,
            page_stride: cache.page_stride,
            per_group,
            max_pages: self.sizing.max_lanes * self.sizing.context,
        }
    }
}

/// Refuses lanes that ask for hidden states, which the CUDA engine does not return.
fn refuse_hidden(lanes: &[LaneStep]) -> Result<(), EngineError> {
    match lanes.iter().any(|l| l.logits == Logits::Hidden) {
        true => Err(EngineError::Sizing("the CUDA engine does not return hidden states".into())),
        false => Ok(()),
    }
}

/// The KV pool's device buffers and page geometry, and the round's lane count.
struct Caches {
    k: DevPtr,
    v: DevPtr,
    page_tokens: usize,
    page_stride: u64,
    /// The recurrent state plane (f32, `state_elems` floats a page), 0 for a model without linear layers.
    states: DevPtr,
    state_elems: usize,
    lanes: usize,
}

impl Engine for CudaLlama {
    fn kv_layout(&self, page_tokens: usize) -> KvLayout {
        KvLayout { elem_bytes: 2, ..self.net.cfg.kv_layout(page_tokens) }
    }

    fn vocab_size(&self) -> usize {
        self.net.cfg.vocab_size
    }

    fn forward(&mut self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        self.run(pool, lanes)
    }

    fn keeps_rows(&self) -> bool {
        true
    }

    fn has_draft_head(&self) -> bool {
        self.net.mtp.is_some()
    }

    fn draft_head(&mut self, pool: &mut KvPool, lanes: &[LaneStep]) -> Result<Vec<LaneRows>, EngineError> {
        self.run_head(pool, lanes)
    }

    fn embeds(&self) -> bool {
        false
    }
}
