//! `tensorfold generate`: one text request through the runtime's rounds, streamed to stdout.

use std::io::Write;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use tensorfold_actors::coordinator::{Drafting, Schedule};
use tensorfold_actors::request_types::{Event, Output, TokenWork, ValidRequest, Work};
use tensorfold_actors::runtime::RuntimeConfig;
use tensorfold_engine::generate::PAGE_TOKENS;
use tensorfold_engine::llama::cuda::Sizing;
use tensorfold_engine::sampling::SamplingParams;
use tensorfold_engine::text::chat::{render_chat, ChatMessage};

use crate::server::text::validate::TokenizerDecoder;
use crate::settings::cli::MODEL;
use crate::settings::{Settings, TableArgs};
use crate::wiring::{load, start_runtime};

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub table: TableArgs<MODEL>,
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

pub fn generate(args: GenerateArgs, settings: &Settings) -> Result<()> {
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
    let model = load(settings, sizing, None)?;
    let tok = model.tokenizer();
    let text = if args.chat {
        let template = tok.chat_template().context("the model has no chat template; drop --chat")?;
        let mut messages = Vec::new();
        if let Some(system) = args.system {
            messages.push(ChatMessage::new("system", system));
        }
        messages.push(ChatMessage::new("user", args.prompt));
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
    let (spec, tokenizer, device) = model.into_spec(context, 512, 1);
    let tokenizer = Arc::new(tokenizer);
    let cfg = RuntimeConfig {
        page_tokens: PAGE_TOKENS,
        kv_pages: Some((prompt.len() + max_tokens).div_ceil(PAGE_TOKENS)),
        memory_limit: None,
        schedule: Schedule { round_tokens: 512, parallel: 1, max_waiting: 1, drafting: Drafting::OFF },
        prefix_cache_tokens: 0,
    };
    let work = TokenWork {
        stop_ids: tokenizer.eos_ids().to_vec(),
        prompt,
        max_tokens,
        sampling: params,
        stop_strings: args.stop,
        logprobs: None,
        cache: false,
        keep_reply: false,
        draft: false,
        rules: Default::default(),
        constraint: None,
        output: Output::Text(Box::new(TokenizerDecoder::new(tokenizer))),
    };
    let request = ValidRequest { model: spec.name.clone(), work: Work::Tokens(work) };
    // The CLI is one lane of the same rounds the server runs.
    actix_web::rt::System::new().block_on(async move {
        let runtime = start_runtime(device, vec![spec], cfg, None).await?;
        let mut events = runtime.submit(request).await?;
        let mut out = std::io::stdout().lock();
        while let Some(event) = events.recv().await {
            match event {
                Event::Token { text, .. } => out.write_all(text.as_bytes()).and_then(|()| out.flush())?,
                Event::Done { .. } => break,
                Event::Error(e) => bail!("generation failed: {e}"),
                Event::Audio { .. } | Event::Embedding { .. } => bail!("the text model sent audio"),
            }
        }
        writeln!(out).context("writing to stdout")
    })
}
