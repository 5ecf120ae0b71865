//! The `tensorfold` command line.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use actix::Addr;
use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use std::sync::Arc;
use tensorfold::chat::{render_chat, ChatMessage};
use tensorfold::config::ModelConfig;
use tensorfold::cuda_llama::Sizing;
use tensorfold::cuda_setup::{CudaDevice, Device};
use tensorfold::generate::{Sequence, PAGE_TOKENS};
use tensorfold::model::{CudaModel, LoadedModel};
use tensorfold::sampling::SamplingParams;
use tensorfold::tokenizer::Tokenizer;
use tensorfold_actors::device::DeviceActor;

use tensorfold::server::validate::TokenizerDecoder;
use tensorfold::server::ServeConfig;
use tensorfold::speech::{Speaker, Speakers, SpeechFrontEnd};
use tensorfold_actors::coordinator::Schedule;
use tensorfold_actors::engine::Logits;
use tensorfold_actors::request_types::{Event, Output, ValidRequest};
use tensorfold_actors::runtime::{ModelKind, ModelSpec, Runtime, RuntimeConfig};

#[derive(Parser)]
#[command(name = "tensorfold", version, about = "A streaming inference server for text and speech")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt and stream it to stdout.
    Generate(GenerateArgs),
    /// Measure prompt and decode tokens/s on one stream.
    Bench(BenchArgs),
    /// Greedy-decode token-id prompts and write every step's logits, for comparison with a reference.
    Logits(LogitsArgs),
    /// Fetch the default text model and voice into the cache (if needed) and print their paths.
    Fetch,
    /// Serve the OpenAI-compatible HTTP API.
    Serve(ServeArgs),
    /// Speak text (default: the hibari voice) and write it to a WAV file.
    Speak(SpeakArgs),
}

#[derive(Args)]
struct SpeakArgs {
    /// A Drama speech checkpoint (an Orpheus-layout Llama directory with its SNAC codec in DIR/snac); default: the hibari voice.
    #[arg(long, value_name = "DIR")]
    speech_model: Option<PathBuf>,
    /// The text to speak.
    #[arg(long)]
    text: String,
    /// The voice; default: the checkpoint's default voice.
    #[arg(long)]
    voice: Option<String>,
    /// Random seed; the same seed gives the same audio.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Speaking rate, 0.25 to 4.0 (the default voice only; Drama speaks at 1.0).
    #[arg(long, default_value_t = 1.0)]
    speed: f32,
    /// Where to write the 16-bit mono WAV file.
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
}

#[derive(Args)]
struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on; 0 picks a free one.
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Most requests generating at once (lanes).
    #[arg(long, default_value_t = 16)]
    parallel: usize,
    /// Most positions per request, prompt plus output; default: the model's, at most 4096.
    #[arg(long)]
    context: Option<usize>,
    /// Require `Authorization: Bearer KEY` on every route but /health.
    #[arg(long, env = "TF_API_KEY")]
    api_key: Option<String>,
    /// Most requests waiting for a lane before new ones get 429.
    #[arg(long, default_value_t = 256)]
    max_waiting: usize,
    /// Largest accepted request body.
    #[arg(long, default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// Positions per KV page.
    #[arg(long, default_value_t = 16)]
    page_tokens: usize,
    /// KV pages to allocate; default: what --memory-limit leaves, or enough for every lane.
    #[arg(long)]
    kv_pages: Option<usize>,
    /// Most tokens in one round's forward pass (prefill chunks share it).
    #[arg(long, default_value_t = 512)]
    round_tokens: usize,
    /// Cap on weights, KV pages and activations together, in bytes.
    #[arg(long, env = "TF_MEMORY_LIMIT")]
    memory_limit: Option<usize>,
    /// A Drama speech checkpoint (Orpheus layout, SNAC codec in DIR/snac) served at /v1/audio/speech; its voices come first.
    #[arg(long, value_name = "DIR")]
    speech_model: Option<PathBuf>,
    /// Do not load the default voice (hibari, fetched on first use).
    #[arg(long)]
    no_voice: bool,
}

#[derive(Args)]
struct ModelArgs {
    /// A `.gguf` file or a Hugging Face model directory; default: SmolLM2-135M-Instruct Q4_1, fetched on first use.
    #[arg(long, env = "TF_MODEL")]
    model: Option<PathBuf>,
    /// Compute threads; default: all cores.
    #[arg(long)]
    threads: Option<usize>,
    /// Where the model runs: cpu, or cuda (the first NVIDIA GPU; weights in bf16).
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    device: Device,
}

#[derive(Args)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt text.
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// A system message for --chat.
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    /// Keep the smallest set of tokens whose probability reaches P.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep the K most likely tokens; 0 keeps all.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Drop tokens less likely than P times the most likely one.
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Penalize tokens already in the sequence (1 is off).
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// Random seed; the same seed gives the same text.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop when this text appears (repeatable); it is not printed.
    #[arg(long)]
    stop: Vec<String>,
}

#[derive(Args)]
struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt tokens processed in one pass.
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Tokens decoded one at a time, after `--decode-after` tokens of context.
    #[arg(long, default_value_t = 128)]
    decode_tokens: usize,
    /// Context the decode starts from, prefilled in passes of `--prompt-tokens` (0: an empty context, as llama.cpp's tg).
    #[arg(long, default_value_t = 0)]
    decode_after: usize,
    /// Times each measurement is repeated; the best is reported.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
}

#[derive(Args)]
struct LogitsArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// JSON {"prompts": [[ids]], "steps": N}.
    #[arg(long, value_name = "FILE")]
    prompts: PathBuf,
    /// Writes DIR/tokens.json and DIR/logits.f32 ([prompts][steps][vocab], little-endian f32).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

fn main() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TF_LOG").unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(args) => generate(args),
        Command::Bench(args) => bench(args),
        Command::Logits(args) => logits(args),
        Command::Serve(args) => serve(args),
        Command::Speak(args) => tensorfold::speak::speak(tensorfold::speak::SpeakArgs {
            speech_model: args.speech_model,
            text: args.text,
            voice: args.voice,
            speed: args.speed,
            seed: args.seed,
            output: args.output,
        }),
        Command::Fetch => fetch(),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn fetch() -> Result<()> {
    println!("{}", tensorfold::fetch::default_model_path()?.display());
    println!("{}", tensorfold::fetch::hibari_dir()?.display());
    Ok(())
}

fn model_path(args: &ModelArgs) -> Result<PathBuf> {
    match &args.model {
        Some(p) => Ok(p.clone()),
        None => Ok(tensorfold::fetch::default_model_path()?),
    }
}

fn same_path(a: &Path, b: &Path) -> bool {
    matches!((a.canonicalize(), b.canonicalize()), (Ok(a), Ok(b)) if a == b)
}

/// A model loaded on its backend.
enum Loaded {
    Cpu(LoadedModel),
    Cuda(CudaDevice, CudaModel),
}

impl Loaded {
    fn config(&self) -> &ModelConfig {
        match self {
            Loaded::Cpu(m) => m.llama.config(),
            Loaded::Cuda(_, m) => m.llama.config(),
        }
    }

    fn tokenizer(&self) -> &Tokenizer {
        match self {
            Loaded::Cpu(m) => &m.tokenizer,
            Loaded::Cuda(_, m) => &m.tokenizer,
        }
    }

    /// The runtime's model, its name and tokenizer, and the device actor a GPU model's memory is held by.
    fn into_spec(
        self,
        context: usize,
        round_tokens: usize,
        parallel: usize,
    ) -> (ModelSpec, String, Tokenizer, Option<Addr<DeviceActor>>) {
        match self {
            Loaded::Cpu(LoadedModel { name, llama, tokenizer }) => {
                let spec = ModelSpec {
                    weight_bytes: llama.num_weight_bytes(),
                    activation_bytes: llama.activation_bytes(round_tokens, parallel),
                    kind: ModelKind::Tokens { engine: Box::new(llama), codec: None },
                    context,
                };
                (spec, name, tokenizer, None)
            }
            Loaded::Cuda(dev, CudaModel { name, llama, tokenizer }) => {
                // Weights and activations are already held in the GPU ledger.
                let kind = ModelKind::Tokens { engine: Box::new(llama), codec: None };
                (ModelSpec { weight_bytes: 0, activation_bytes: 0, kind, context }, name, tokenizer, Some(dev.device))
            }
        }
    }
}

async fn start_runtime(
    device: Option<Addr<DeviceActor>>,
    models: Vec<ModelSpec>,
    cfg: RuntimeConfig,
) -> Result<Runtime> {
    Ok(match device {
        Some(d) => Runtime::start_on(d, models, cfg).await?,
        None => Runtime::start(models, cfg).await?,
    })
}

/// Loads the model on `--device`; a GPU model gets buffers for rounds of `sizing` under `memory_limit`.
fn load(args: &ModelArgs, sizing: Sizing, memory_limit: Option<usize>) -> Result<Loaded> {
    if let Some(n) = args.threads {
        if n == 0 {
            bail!("--threads must be at least 1");
        }
        rayon::ThreadPoolBuilder::new().num_threads(n).build_global().context("starting the compute threads")?;
    }
    let path = model_path(args)?;
    let started = Instant::now();
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(indicatif::ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} layers").unwrap());
        bar.set_message(path.display().to_string());
        bar
    });
    let mut progress = |done: usize, total: usize| match &bar {
        Some(b) => {
            b.set_length(total as u64);
            b.set_position(done as u64);
        }
        None if done == total => tracing::info!(path = %path.display(), layers = total, "model loaded"),
        None => {}
    };
    let (model, weight_bytes) = match args.device {
        Device::Cpu => {
            let m = tensorfold::model::load(&path, &mut progress)?;
            let bytes = m.llama.num_weight_bytes();
            (Loaded::Cpu(m), bytes)
        }
        Device::Cuda => {
            let dev = CudaDevice::open(memory_limit)?;
            let m = dev.load(&path, sizing, &mut progress)?;
            let bytes = m.llama.num_weight_bytes();
            tracing::info!(activation_bytes = m.llama.activation_bytes(), "GPU buffers");
            (Loaded::Cuda(dev, m), bytes)
        }
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let cfg = model.config();
    tracing::info!(
        arch = %cfg.arch,
        layers = cfg.num_layers,
        device = ?args.device,
        weight_bytes,
        threads = rayon::current_num_threads(),
        seconds = format!("{:.2}", started.elapsed().as_secs_f64()),
        "ready"
    );
    Ok(model)
}

fn generate(args: GenerateArgs) -> Result<()> {
    let params = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repetition_penalty,
        seed: args.seed,
    };
    if let Err(e) = params.validate() {
        bail!("{}", e.replacen('_', "-", 1));
    }
    let sizing = Sizing { max_tokens: 512, max_lanes: 1, context: 1 << 17 };
    let model = load(&args.model, sizing, None)?;
    let tok = model.tokenizer();
    let text = if args.chat {
        let template = tok.chat_template().context("the model has no chat template; drop --chat")?;
        let mut messages = Vec::new();
        if let Some(system) = args.system {
            messages.push(ChatMessage { role: "system".into(), content: system });
        }
        messages.push(ChatMessage { role: "user".into(), content: args.prompt });
        render_chat(template, &messages, true, tok.bos_token().unwrap_or(""), tok.eos_token().unwrap_or(""))?
    } else {
        args.prompt
    };
    let prompt = tok.encode(&text, true)?;
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    let context = model.config().max_position.min(sizing.context);
    if prompt.len() >= context {
        bail!("the prompt has {} tokens but the model's context is {context}", prompt.len());
    }
    let max_tokens = args.max_tokens.min(context - prompt.len());
    let (model, _, tokenizer, device) = model.into_spec(context, 512, 1);
    let tokenizer = Arc::new(tokenizer);
    let cfg = RuntimeConfig {
        page_tokens: PAGE_TOKENS,
        kv_pages: Some((prompt.len() + max_tokens).div_ceil(PAGE_TOKENS)),
        memory_limit: None,
        schedule: Schedule { round_tokens: 512, parallel: 1, max_waiting: 1 },
    };
    let request = ValidRequest {
        model: 0,
        stop_ids: tokenizer.eos_ids().to_vec(),
        prompt,
        max_tokens,
        sampling: params,
        stop_strings: args.stop,
        logprobs: None,
        output: Output::Text(Box::new(TokenizerDecoder::new(tokenizer))),
    };
    // The CLI is one lane of the same rounds the server runs.
    actix_web::rt::System::new().block_on(async move {
        let runtime = start_runtime(device, vec![model], cfg).await?;
        let mut events = runtime.submit(request).await?;
        let mut out = std::io::stdout().lock();
        while let Some(event) = events.recv().await {
            match event {
                Event::Token { text, .. } => out.write_all(text.as_bytes()).and_then(|()| out.flush())?,
                Event::Done { .. } => break,
                Event::Error { message } => bail!("generation failed: {message}"),
                Event::Audio { .. } => bail!("the text model sent audio"),
            }
        }
        writeln!(out).context("writing to stdout")
    })
}

fn serve(args: ServeArgs) -> Result<()> {
    for (name, value) in
        [("--parallel", args.parallel), ("--page-tokens", args.page_tokens), ("--round-tokens", args.round_tokens)]
    {
        if value == 0 {
            bail!("{name} must be at least 1");
        }
    }
    if args.model.device == Device::Cuda && args.speech_model.is_some() {
        bail!("--speech-model runs on the CPU only; drop it or --device cuda");
    }
    let max_tokens = args.round_tokens.max(args.parallel);
    let sizing = Sizing { max_tokens, max_lanes: args.parallel, context: args.context.unwrap_or(4096) };
    let model = load(&args.model, sizing, args.memory_limit)?;
    let model_context = model.config().max_position;
    let context = args.context.unwrap_or(model_context.min(4096));
    if context == 0 || context > model_context {
        bail!("--context {context} must be between 1 and the model's context of {model_context}");
    }
    // On a GPU the KV pages take what the ledger's cap leaves.
    let memory_limit = match &model {
        Loaded::Cuda(dev, _) => Some(dev.cap),
        Loaded::Cpu(_) => args.memory_limit,
    };
    let (spec, name, tokenizer, device) = model.into_spec(context, args.round_tokens, args.parallel);
    let text_path = model_path(&args.model)?;
    let cfg = RuntimeConfig {
        page_tokens: args.page_tokens,
        kv_pages: args.kv_pages,
        memory_limit,
        schedule: Schedule { round_tokens: args.round_tokens, parallel: args.parallel, max_waiting: args.max_waiting },
    };
    let mut models = vec![spec];
    let mut speakers = Speakers::default();
    if let Some(dir) = &args.speech_model {
        let (spec, mut front) = SpeechFrontEnd::open(dir, models.len(), args.round_tokens, args.parallel)
            .with_context(|| format!("loading the speech model {}", dir.display()))?;
        tracing::info!(dir = %dir.display(), voices = front.voices().names().join(","), "speech model loaded");
        if same_path(dir, &text_path) {
            // One checkpoint for both: speech and text lanes share every batched forward.
            if let (ModelKind::Tokens { codec, .. }, ModelKind::Tokens { codec: speech_codec, .. }) =
                (&mut models[0].kind, spec.kind)
            {
                *codec = speech_codec;
            }
            front.model = 0;
        } else {
            models.push(spec);
        }
        speakers.push(Speaker::Drama(Arc::new(front)));
    }
    if !args.no_voice {
        let (spec, speaker) = tensorfold::speak::hibari_speaker(models.len())?;
        tracing::info!(voices = speaker.voices().names().join(","), "default voice loaded");
        models.push(spec);
        speakers.push(speaker);
    }
    let serve =
        ServeConfig { host: args.host, port: args.port, max_body_bytes: args.max_body_bytes, api_key: args.api_key };
    actix_web::rt::System::new().block_on(async move {
        let runtime = start_runtime(device, models, cfg).await?;
        tensorfold::server::run(serve, runtime, Arc::new(tokenizer), name, speakers).await?;
        Ok(())
    })
}

/// One lane driven straight through the engine, with room for `capacity` positions on the model's device.
fn sequence(model: &Loaded, capacity: usize) -> Result<Sequence<'_>> {
    Ok(match model {
        Loaded::Cpu(m) => Sequence::new(&m.llama, capacity),
        Loaded::Cuda(dev, m) => {
            let pool = dev.kv_pool(&m.llama, PAGE_TOKENS, capacity.div_ceil(PAGE_TOKENS).max(1))?;
            Sequence::with_pool(&m.llama, pool)
        }
    })
}

fn bench(args: BenchArgs) -> Result<()> {
    let sizing = Sizing {
        max_tokens: args.prompt_tokens.max(1),
        max_lanes: 1,
        context: args.prompt_tokens.max(args.decode_after) + args.decode_tokens + 2,
    };
    let model = load(&args.model, sizing, None)?;
    let model_context = model.config().max_position;
    if sizing.context > model_context {
        bail!(
            "--prompt-tokens or --decode-after plus --decode-tokens needs {} positions; the model has {model_context}",
            sizing.context
        );
    }
    let vocab = model.tokenizer().vocab_size() as u32;
    let ids = |n: usize| -> Vec<u32> { (0..n as u32).map(|i| (i * 7919 + 13) % vocab).collect() };
    let (prompt, context) = (ids(args.prompt_tokens), ids(args.decode_after.max(1)));
    let (mut best_pp, mut best_tg) = (0f64, 0f64);
    for _ in 0..args.repeats.max(1) {
        let mut seq = sequence(&model, args.prompt_tokens + args.decode_tokens + 1)?;
        let t = Instant::now();
        seq.extend(&prompt, args.prompt_tokens, Logits::Last);
        best_pp = best_pp.max(args.prompt_tokens as f64 / t.elapsed().as_secs_f64());
        drop(seq);
        let mut seq = sequence(&model, context.len() + args.decode_tokens + 1)?;
        seq.extend(&context, args.prompt_tokens.max(1), Logits::Last);
        let t = Instant::now();
        for i in 0..args.decode_tokens {
            seq.extend(&prompt[i % prompt.len()..][..1], 1, Logits::Last);
        }
        best_tg = best_tg.max(args.decode_tokens as f64 / t.elapsed().as_secs_f64());
    }
    println!(
        "{{\"threads\": {}, \"prompt_tokens\": {}, \"prompt_tok_s\": {best_pp:.2}, \"decode_tokens\": {}, \"decode_after\": {}, \"decode_tok_s\": {best_tg:.2}}}",
        rayon::current_num_threads(),
        args.prompt_tokens,
        args.decode_tokens,
        args.decode_after
    );
    Ok(())
}

#[derive(serde::Deserialize)]
struct PromptSet {
    prompts: Vec<Vec<u32>>,
    steps: usize,
}

fn logits(args: LogitsArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.prompts).with_context(|| format!("reading {}", args.prompts.display()))?;
    let set: PromptSet = serde_json::from_str(&text)
        .with_context(|| format!("{}: expected {{\"prompts\": [[ids]], \"steps\": N}}", args.prompts.display()))?;
    let longest = set.prompts.iter().map(Vec::len).max().unwrap_or(0);
    if longest == 0 || set.steps == 0 {
        bail!("{}: every prompt needs a token and steps must be at least 1", args.prompts.display());
    }
    let sizing = Sizing { max_tokens: 512, max_lanes: 1, context: longest + set.steps + 1 };
    let model = load(&args.model, sizing, None)?;
    let vocab = model.config().vocab_size;
    if let Some(bad) = set.prompts.iter().flatten().find(|&&id| id as usize >= vocab) {
        bail!("{}: token id {bad} is outside the vocabulary of {vocab}", args.prompts.display());
    }
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let mut rows: Vec<u8> = Vec::new();
    let mut generated = Vec::new();
    for prompt in &set.prompts {
        let mut seq = sequence(&model, prompt.len() + set.steps + 1)?;
        let mut logits = seq.extend(prompt, 512, Logits::Last);
        let mut ids = Vec::new();
        for _ in 0..set.steps {
            rows.extend(logits.iter().flat_map(|v| v.to_le_bytes()));
            let id = tensorfold_kernels::ops::argmax(&logits) as u32;
            ids.push(id);
            logits = seq.extend(&[id], 1, Logits::Last);
        }
        generated.push(ids);
    }
    std::fs::write(args.out.join("logits.f32"), rows).context("writing logits.f32")?;
    std::fs::write(args.out.join("tokens.json"), serde_json::json!({ "tokens": generated }).to_string())
        .context("writing tokens.json")?;
    Ok(())
}
