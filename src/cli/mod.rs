//! The `tensorfold` command line: each command's arguments, the settings table's flags, and the dispatch.

mod bench;
mod generate;
mod lend;
mod serve;
mod speak;

use clap::{Parser, Subcommand};

use crate::settings::cli::{MODEL, SERVE, SPEECH};
use crate::settings::{Key, Settings, TableArgs};

#[derive(Parser)]
#[command(name = "tensorfold", version, about = "A streaming inference server for text and speech")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt and stream it to stdout.
    Generate(generate::GenerateArgs),
    /// Measure prompt and decode tokens/s on one stream.
    Bench(bench::BenchArgs),
    /// Greedy-decode token-id prompts and write every step's logits, for comparison with a reference.
    Logits(bench::LogitsArgs),
    /// Fetch the default text model and voice into the cache (if needed) and print their paths.
    Fetch,
    /// Serve the OpenAI-compatible HTTP API.
    Serve(serve::ServeArgs),
    /// Speak text (default: the hibari voice) and write it to a WAV file.
    Speak(speak::SpeakArgs),
    /// Print every setting (flags and environment variables) with its type, default and the value in force.
    Settings(SettingsArgs),
    /// Lend host or GPU memory (--device) to servers' KV pools, to clients presenting the key (see docs/carveout.md).
    Lend(lend::LendArgs),
}

#[derive(clap::Args)]
struct SettingsArgs {
    #[command(flatten)]
    table: TableArgs<{ MODEL | SERVE | SPEECH }>,
}

/// The flags a command gave the table.
fn given(command: &Command) -> Vec<(Key, String)> {
    match command {
        Command::Generate(a) => a.table.given.clone(),
        Command::Bench(a) => a.table.given.clone(),
        Command::Logits(a) => a.table.given.clone(),
        Command::Serve(a) => a.table.given.clone(),
        Command::Settings(a) => a.table.given.clone(),
        Command::Speak(a) => a.table.given.clone(),
        Command::Lend(a) => {
            lend::FORCED.iter().map(|(k, v)| (*k, v.to_string())).chain(a.table.given.clone()).collect()
        }
        Command::Fetch => Vec::new(),
    }
}

/// Parses the command line, checks every setting once, and runs the command; returns the exit status.
pub fn main() -> i32 {
    let cli = Cli::parse();
    let settings = match Settings::from_process(&given(&cli.command)) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_new(settings.text(Key::Log).unwrap_or("info"))
        .unwrap_or_else(|_| "info".into());
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    #[cfg(target_arch = "x86_64")]
    if settings.text(Key::Kernels) == Some("avx2") {
        tensorfold_kernels::simd512::limit_to_avx2();
    }
    let result = match cli.command {
        Command::Generate(args) => generate::generate(args, &settings),
        Command::Bench(args) => bench::bench(args, &settings),
        Command::Logits(args) => bench::logits(args, &settings),
        Command::Serve(_) => serve::serve(&settings),
        Command::Speak(args) => speak::speak(args, &settings),
        Command::Fetch => fetch(&settings),
        Command::Lend(_) => lend::lend(&settings),
        Command::Settings(_) => {
            print!("{}", settings.render());
            Ok(())
        }
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}

fn fetch(settings: &Settings) -> anyhow::Result<()> {
    let fetcher = settings.fetcher()?;
    println!("{}", fetcher.default_model_path()?.display());
    println!("{}", fetcher.hibari_dir()?.display());
    Ok(())
}
