//! `tensorfold bench` and `tensorfold logits`: one lane driven straight through the engine, for speed and for references.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use tensorfold_engine::boundary::{Engine, KvPool, LaneStep, Logits};
use tensorfold_engine::generate::PAGE_TOKENS;
use tensorfold_engine::llama::cuda::Sizing;

use crate::settings::cli::MODEL;
use crate::settings::{Settings, TableArgs};
use crate::wiring::{engine_and_pool, load, sequence};

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub table: TableArgs<MODEL>,
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
    /// Lanes decoding side by side in each round, every one after `--decode-after` tokens of its own context;
    /// decode tok/s then counts the tokens of every lane.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=256))]
    lanes: u64,
}

#[derive(Args)]
pub struct LogitsArgs {
    #[command(flatten)]
    pub table: TableArgs<MODEL>,
    /// JSON {"prompts": [[ids]], "steps": N}.
    #[arg(long, value_name = "FILE")]
    prompts: PathBuf,
    /// Writes DIR/tokens.json and DIR/logits.f32 ([prompts][steps][vocab], little-endian f32).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

pub fn bench(args: BenchArgs, settings: &Settings) -> Result<()> {
    let lanes = args.lanes as usize;
    let sizing = Sizing {
        max_tokens: args.prompt_tokens.max(lanes),
        max_lanes: lanes,
        context: args.prompt_tokens.max(args.decode_after) + args.decode_tokens + 2,
    };
    let mut model = load(settings, sizing, None)?;
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
        let mut seq = sequence(&mut model, args.prompt_tokens + args.decode_tokens + 1)?;
        let t = Instant::now();
        seq.extend(&prompt, args.prompt_tokens, Logits::Last)?;
        best_pp = best_pp.max(args.prompt_tokens as f64 / t.elapsed().as_secs_f64());
        drop(seq);
        if lanes > 1 {
            let per_lane = (context.len() + args.decode_tokens + 1).div_ceil(PAGE_TOKENS);
            let (mut engine, mut pool) = engine_and_pool(&mut model, lanes * per_lane)?;
            let seconds =
                decode_lanes(&mut *engine, &mut pool, &context, args.prompt_tokens, args.decode_tokens, lanes)?;
            best_tg = best_tg.max((lanes * args.decode_tokens) as f64 / seconds);
            continue;
        }
        let mut seq = sequence(&mut model, context.len() + args.decode_tokens + 1)?;
        seq.extend(&context, args.prompt_tokens.max(1), Logits::Last)?;
        let t = Instant::now();
        for i in 0..args.decode_tokens {
            seq.extend(&prompt[i % prompt.len()..][..1], 1, Logits::Last)?;
        }
        best_tg = best_tg.max(args.decode_tokens as f64 / t.elapsed().as_secs_f64());
    }
    println!(
        "{{\"threads\": {}, \"prompt_tokens\": {}, \"prompt_tok_s\": {best_pp:.2}, \"decode_tokens\": {}, \"decode_after\": {}, \"lanes\": {lanes}, \"decode_tok_s\": {best_tg:.2}}}",
        rayon::current_num_threads(),
        args.prompt_tokens,
        args.decode_tokens,
        args.decode_after
    );
    Ok(())
}

/// Prefills `context` into each of `lanes` lanes in rounds of up to `chunk` tokens, then times `steps` rounds in which every lane
/// decodes one token (greedy picks, as the server's greedy lanes take them); returns the rounds' seconds.
fn decode_lanes(
    engine: &mut dyn Engine,
    pool: &mut KvPool,
    context: &[u32],
    chunk: usize,
    steps: usize,
    lanes: usize,
) -> Result<f64> {
    let per_lane = pool.num_pages() / lanes;
    let pages: Vec<Vec<u32>> =
        (0..lanes).map(|l| (0..per_lane as u32).map(|p| (l * per_lane) as u32 + p).collect()).collect();
    let chunk = chunk.max(1);
    // The lanes' prompts go in rounds of up to `chunk` tokens, each lane's chunks in order, as the server packs them.
    for start in (0..context.len()).step_by(chunk) {
        let tokens = &context[start..(start + chunk).min(context.len())];
        for group in pages.chunks((chunk / tokens.len()).max(1)) {
            let round: Vec<LaneStep> = group
                .iter()
                .map(|lane| LaneStep { tokens, start_pos: start, pages: lane, logits: Logits::None, keep: None })
                .collect();
            engine.forward(pool, &round)?;
        }
    }
    let t = Instant::now();
    for i in 0..steps {
        let token = [context[i % context.len()]];
        let round: Vec<LaneStep> = pages
            .iter()
            .map(|lane| LaneStep {
                tokens: &token,
                start_pos: context.len() + i,
                pages: lane,
                logits: Logits::Argmax,
                keep: None,
            })
            .collect();
        engine.forward(pool, &round)?;
    }
    Ok(t.elapsed().as_secs_f64())
}

#[derive(serde::Deserialize)]
struct PromptSet {
    prompts: Vec<Vec<u32>>,
    steps: usize,
}

pub fn logits(args: LogitsArgs, settings: &Settings) -> Result<()> {
    let text = std::fs::read_to_string(&args.prompts).with_context(|| format!("reading {}", args.prompts.display()))?;
    let set: PromptSet = serde_json::from_str(&text)
        .with_context(|| format!("{}: expected {{\"prompts\": [[ids]], \"steps\": N}}", args.prompts.display()))?;
    let longest = set.prompts.iter().map(Vec::len).max().unwrap_or(0);
    if longest == 0 || set.steps == 0 {
        bail!("{}: every prompt needs a token and steps must be at least 1", args.prompts.display());
    }
    let sizing = Sizing { max_tokens: 512, max_lanes: 1, context: longest + set.steps + 1 };
    let mut model = load(settings, sizing, None)?;
    let vocab = model.config().vocab_size;
    if let Some(bad) = set.prompts.iter().flatten().find(|&&id| id as usize >= vocab) {
        bail!("{}: token id {bad} is outside the vocabulary of {vocab}", args.prompts.display());
    }
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let mut rows: Vec<u8> = Vec::new();
    let mut generated = Vec::new();
    for prompt in &set.prompts {
        let mut seq = sequence(&mut model, prompt.len() + set.steps + 1)?;
        let mut logits = seq.extend(prompt, 512, Logits::Last)?;
        let mut ids = Vec::new();
        for _ in 0..set.steps {
            rows.extend(logits.iter().flat_map(|v| v.to_le_bytes()));
            let id = tensorfold_kernels::ops::argmax(&logits) as u32;
            ids.push(id);
            logits = seq.extend(&[id], 1, Logits::Last)?;
        }
        generated.push(ids);
    }
    std::fs::write(args.out.join("logits.f32"), rows).context("writing logits.f32")?;
    std::fs::write(args.out.join("tokens.json"), serde_json::json!({ "tokens": generated }).to_string())
        .context("writing tokens.json")?;
    Ok(())
}
