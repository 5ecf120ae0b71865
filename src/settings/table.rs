//! The rows of the settings table.

use super::{Key, Kind, Only, Scope, Setting};

const fn row(key: Key, flag: Option<&'static str>, env: Option<&'static str>, kind: Kind, scope: Scope) -> Setting {
    Setting { key, flag, env, kind, default: None, help: "", scope, secret: false, only: Only::Always }
}

const fn count(min: u64, max: u64) -> Kind {
    Kind::Count { min, max }
}

const MAX_LANES: u64 = 4096;

/// Every setting tensorfold reads, in the order `tensorfold settings` prints them.
pub static SETTINGS: &[Setting] = &[
    Setting {
        help: "a .gguf file or a Hugging Face model directory; unset: SmolLM2-135M-Instruct Q4_1, fetched on first use",
        ..row(Key::Model, Some("model"), Some("TF_MODEL"), Kind::Path, Scope::Model)
    },
    Setting {
        help: "compute threads; unset: all cores",
        ..row(Key::Threads, Some("threads"), None, count(1, 4096), Scope::Model)
    },
    Setting {
        default: Some("cpu"),
        help:
            "where the model runs: cpu, or cuda (the first NVIDIA GPU, bf16 weights); for lend, whose memory it lends",
        ..row(Key::Device, Some("device"), None, Kind::Choice(&["cpu", "cuda"]), Scope::ModelAndLend)
    },
    Setting {
        default: Some("127.0.0.1"),
        help: "address to listen on",
        ..row(Key::Host, Some("host"), None, Kind::Text, Scope::Serve)
    },
    Setting {
        default: Some("8000"),
        help: "port to listen on; 0 picks a free one",
        ..row(Key::Port, Some("port"), None, count(0, 65535), Scope::Serve)
    },
    Setting {
        default: Some("16"),
        help: "most requests generating at once (lanes)",
        ..row(Key::Parallel, Some("parallel"), None, count(1, MAX_LANES), Scope::Serve)
    },
    Setting {
        help: "most positions per request, prompt plus output; unset: the model's, at most 4096",
        ..row(Key::Context, Some("context"), None, count(1, 1 << 24), Scope::Serve)
    },
    Setting {
        help: "keys, comma-separated: every route but /health needs one, as 'Authorization: Bearer KEY' or 'x-api-key'",
        secret: true,
        ..row(Key::ApiKey, Some("api-key"), Some("TF_API_KEY"), Kind::Text, Scope::Serve)
    },
    Setting {
        default: Some("256"),
        help: "most requests waiting for a lane before new ones get 429",
        ..row(Key::MaxWaiting, Some("max-waiting"), None, count(0, 1 << 20), Scope::Serve)
    },
    Setting {
        default: Some("4194304"),
        help: "largest accepted request body, in bytes; larger ones get 413",
        ..row(Key::MaxBodyBytes, Some("max-body-bytes"), None, count(1, 1 << 32), Scope::Serve)
    },
    Setting {
        default: Some("20"),
        help: "on SIGTERM or SIGINT, seconds running requests have to finish before they end with an error",
        ..row(Key::DrainSeconds, Some("drain-seconds"), None, count(0, 3600), Scope::Serve)
    },
    Setting {
        help:
            "seconds a request may take, queued and running, before it ends with a request_timeout error; unset: none",
        ..row(Key::RequestTimeout, Some("request-timeout"), None, count(1, 1 << 32), Scope::Serve)
    },
    Setting {
        default: Some("120"),
        help: "seconds from a connection's opening until its first request's head is whole, else 408; as long as \
               --keep-alive by default, since routers' pools open connections before they use them",
        ..row(Key::HeaderTimeout, Some("header-timeout"), None, count(1, 3600), Scope::Serve)
    },
    Setting {
        default: Some("30"),
        help: "seconds a client has to send a request's body before it gets 408",
        ..row(Key::BodyTimeout, Some("body-timeout"), None, count(1, 3600), Scope::Serve)
    },
    Setting {
        default: Some("120"),
        help: "seconds an idle kept-alive connection stays open (longer than routers' pools keep theirs)",
        ..row(Key::KeepAlive, Some("keep-alive"), None, count(1, 86400), Scope::Serve)
    },
    Setting {
        default: Some("16"),
        help: "positions per KV page",
        ..row(Key::PageTokens, Some("page-tokens"), None, count(1, 4096), Scope::Serve)
    },
    Setting {
        help: "KV pages to allocate; unset: what --memory-limit leaves, or enough for every lane",
        ..row(Key::KvPages, Some("kv-pages"), None, count(1, 1 << 32), Scope::Serve)
    },
    Setting {
        default: Some("1"),
        help: "keep the KV pages of prompts and resume later prompts from their longest cached prefix",
        ..row(Key::PrefixCache, Some("prefix-cache"), None, Kind::Switch, Scope::Serve)
    },
    Setting {
        help: "most positions the prefix cache holds; unset: as many as the KV pool has",
        ..row(Key::PrefixCacheTokens, Some("prefix-cache-tokens"), None, count(0, 1 << 40), Scope::Serve)
    },
    Setting {
        help: "most tokens a decoding lane drafts from its own prompt and output and verifies in one step; 0: off; \
               unset: 3 on the CPU, 12 on CUDA",
        ..row(Key::DraftTokens, Some("draft-tokens"), None, count(0, 16), Scope::Serve)
    },
    Setting {
        default: Some("1"),
        help: "drafting weighs a verify row by step times measured at start-up; 0 counts verify rows as free, so \
               drafts follow only what they have earned, whatever else the machine is doing",
        ..row(Key::DraftTiming, None, Some("TF_DRAFT_TIMING"), Kind::Switch, Scope::Env)
    },
    Setting {
        help: "a smaller model with the same vocabulary (.gguf or Hugging Face directory) whose greedy tokens are the \
               drafts; unset: drafts come from each lane's own text",
        ..row(Key::DraftModel, Some("draft-model"), None, Kind::Path, Scope::Serve)
    },
    Setting {
        default: Some("512"),
        help: "most tokens in one round's forward pass (prefill chunks share it)",
        ..row(Key::RoundTokens, Some("round-tokens"), None, count(1, 1 << 16), Scope::Serve)
    },
    Setting {
        help: "cap on weights, KV pages and activations together, in bytes; unset on a GPU: 90% of its memory",
        ..row(Key::MemoryLimit, Some("memory-limit"), Some("TF_MEMORY_LIMIT"), count(1, u64::MAX), Scope::Serve)
    },
    Setting {
        help: "a Drama speech checkpoint (Orpheus layout, SNAC codec in DIR/snac) served at /v1/audio/speech",
        ..row(Key::SpeechModel, Some("speech-model"), None, Kind::Path, Scope::Speech)
    },
    Setting {
        help: "the SQLite file keeping /v1/responses; 'none' keeps nothing; unset: responses.sqlite3 in the cache",
        ..row(Key::ResponsesStore, Some("responses-store"), Some("TF_RESPONSES_STORE"), Kind::Text, Scope::Serve)
    },
    Setting {
        default: Some("256"),
        help: "most MiB of stored responses; the oldest go first",
        ..row(Key::ResponsesStoreMb, Some("responses-store-mb"), None, count(1, 1 << 20), Scope::Serve)
    },
    Setting {
        default: Some("30"),
        help: "days a stored response is kept",
        ..row(Key::ResponsesStoreDays, Some("responses-store-days"), None, count(1, 36500), Scope::Serve)
    },
    Setting {
        help: "do not load the default voice (hibari, fetched on first use)",
        ..row(Key::NoVoice, Some("no-voice"), None, Kind::Flag, Scope::Serve)
    },
    Setting {
        help: "where fetched models, voices and compiled kernels are cached; unset: $XDG_CACHE_HOME/tensorfold",
        ..row(Key::CacheDir, None, Some("TF_CACHE_DIR"), Kind::Path, Scope::Env)
    },
    Setting {
        help: "the cache's parent when TF_CACHE_DIR is unset",
        ..row(Key::XdgCacheHome, None, Some("XDG_CACHE_HOME"), Kind::Path, Scope::Env)
    },
    Setting {
        help: "the cache is $HOME/.cache/tensorfold when neither is set",
        ..row(Key::Home, None, Some("HOME"), Kind::Path, Scope::Env)
    },
    Setting {
        default: Some("python3"),
        help: "the python whose pip fetches the default model and voice",
        ..row(Key::Python, None, Some("TF_PYTHON"), Kind::Text, Scope::Env)
    },
    Setting {
        default: Some("info"),
        help: "what is logged to stderr",
        ..row(Key::Log, None, Some("TF_LOG"), Kind::LogFilter, Scope::Env)
    },
    Setting {
        default: Some("auto"),
        help: "CPU kernels: auto uses AVX-512 where the CPU has it, avx2 keeps to AVX2",
        ..row(Key::Kernels, None, Some("TF_KERNELS"), Kind::Choice(&["auto", "avx2"]), Scope::Env)
    },
    Setting {
        default: Some("1"),
        help: "decode rounds replay recorded CUDA graphs",
        only: Only::Cuda,
        ..row(Key::CudaGraphs, None, Some("TF_CUDA_GRAPHS"), Kind::Switch, Scope::Env)
    },
    Setting {
        default: Some("0"),
        help: "decode rounds do RoPE and the KV write inside the attention kernel",
        only: Only::Cuda,
        ..row(Key::CudaFuseRope, None, Some("TF_CUDA_FUSE_ROPE"), Kind::Switch, Scope::Env)
    },
    Setting {
        default: Some("1"),
        help: "rounds of up to 8 rows fold each RMSNorm into the GEMM that reads it",
        only: Only::Cuda,
        ..row(Key::CudaFoldNorms, None, Some("TF_CUDA_FOLD_NORMS"), Kind::Switch, Scope::Env)
    },
    Setting {
        default: Some("1"),
        help: "greedy lanes take their pick on the GPU and bring back the id alone",
        only: Only::Cuda,
        ..row(Key::CudaGpuArgmax, None, Some("TF_CUDA_GPU_ARGMAX"), Kind::Switch, Scope::Env)
    },
    Setting {
        default: Some("0"),
        help: "wide rounds multiply on Hopper's warpgroup MMA (wgmma): the same bits, not yet faster",
        only: Only::Cuda,
        ..row(Key::CudaWgmma, None, Some("TF_CUDA_WGMMA"), Kind::Switch, Scope::Env)
    },
    Setting {
        default: Some("1"),
        help: "on sm_90a, weights whose K is a multiple of 64 multiply on the exact TMA + wgmma family",
        only: Only::Cuda,
        ..row(Key::CudaTma, None, Some("TF_CUDA_TMA"), Kind::Switch, Scope::Env)
    },
    Setting {
        default: Some("1"),
        help: "rounds of one token per lane attend one warp (or a few) per lane and KV head (sm_90+), same bits",
        only: Only::Cuda,
        ..row(Key::CudaWideDecode, None, Some("TF_CUDA_WIDE_DECODE"), Kind::Switch, Scope::Env)
    },
    Setting {
        default: Some("1"),
        help: "prompt rounds attend on wgmma with TMA (sm_90a, head size 128), with the same bits",
        only: Only::Cuda,
        ..row(Key::CudaWgPrompt, None, Some("TF_CUDA_WG_PROMPT"), Kind::Switch, Scope::Env)
    },
    Setting {
        default: Some("0"),
        help: "decode rounds of experts split their TMA column tiles so every SM streams weights; same bits",
        only: Only::Cuda,
        ..row(Key::CudaMoeSplit, None, Some("TF_CUDA_MOE_SPLIT"), Kind::Switch, Scope::Env)
    },
    Setting {
        default: Some("1"),
        help: "mixture-of-experts and hybrid layers run on the GPU's kernels; off, CUDA refuses such models",
        only: Only::Cuda,
        ..row(Key::CudaExperts, None, Some("TF_CUDA_EXPERTS"), Kind::Switch, Scope::Env)
    },
    Setting {
        default: Some("1"),
        help: "kernels of narrow rounds start while the previous one ends (Hopper and later)",
        only: Only::Cuda,
        ..row(Key::CudaOverlap, None, Some("TF_CUDA_OVERLAP"), Kind::Switch, Scope::Env)
    },
    Setting {
        default: Some("16"),
        help: "fewest 32-wide chunks in one K segment of a GEMM; fixes the reduction order per weight shape",
        only: Only::Cuda,
        ..row(Key::CudaGemmMinTiles, None, Some("TF_CUDA_GEMM_MIN_TILES"), count(1, 1024), Scope::Env)
    },
    Setting {
        default: Some("256"),
        help: "most blocks a decode GEMM grid aims for, 0 for no limit; fixes the reduction order per weight shape",
        only: Only::Cuda,
        ..row(Key::CudaGemmMaxBlocks, None, Some("TF_CUDA_GEMM_MAX_BLOCKS"), count(0, 1 << 20), Scope::Env)
    },
    Setting {
        default: Some("0"),
        help: "put KV pages in memory another process lends (see docs/carveout.md); a refusal is logged, never fatal",
        ..row(Key::Carveout, None, Some("TF_CARVEOUT"), Kind::Switch, Scope::Env)
    },
    Setting {
        default: Some("daemon"),
        help: "where lent memory comes from: daemon (a lending daemon's unix socket) or drm (a display card's dumb \
               buffer; refused where this build has no route)",
        only: Only::Carveout,
        ..row(Key::CarveoutSource, None, Some("TF_CARVEOUT_SOURCE"), Kind::Choice(&["daemon", "drm"]), Scope::Env)
    },
    Setting {
        default: Some("1024"),
        help: "MiB of lent memory to ask for, rounded up to whole 2 MiB slices",
        only: Only::Carveout,
        ..row(Key::CarveoutMib, None, Some("TF_CARVEOUT_MIB"), count(1, 1 << 24), Scope::Env)
    },
    Setting {
        default: Some("/run/tensorfold/lend.sock"),
        help: "the lending daemon's SOCK_SEQPACKET socket; tensorfold lend listens here",
        only: Only::CarveoutDaemon,
        ..row(Key::CarveoutSocket, None, Some("TF_CARVEOUT_SOCKET"), Kind::Path, Scope::Env)
    },
    Setting {
        help: "the key the lending daemon expects (or TF_CARVEOUT_KEY_FILE)",
        secret: true,
        only: Only::CarveoutDaemon,
        ..row(Key::CarveoutKey, None, Some("TF_CARVEOUT_KEY"), Kind::Text, Scope::Env)
    },
    Setting {
        help: "a file whose first line is the daemon's key, read when the claim is made",
        secret: true,
        only: Only::CarveoutDaemon,
        ..row(Key::CarveoutKeyFile, None, Some("TF_CARVEOUT_KEY_FILE"), Kind::Path, Scope::Env)
    },
    Setting {
        default: Some("1024"),
        help: "MiB tensorfold lend lends (host memory, or the GPU's with --device cuda), in whole 2 MiB slices",
        ..row(Key::LendPoolMib, Some("pool-mib"), None, count(2, 1 << 24), Scope::Lend)
    },
];
