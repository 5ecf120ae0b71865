//! The settings table: every flag and environment variable with its type, default, range and help, validated once.

use std::path::{Path, PathBuf};

use tensorfold_engine::error::LoadError;
use tensorfold_engine::fetch::Fetcher;
use tensorfold_engine::llama::cuda::CudaOptions;
use tensorfold_kernels::cuda::{GemmTuning, KernelOptions};

use crate::cuda_setup::Device;

pub mod cli;
mod table;

pub use cli::TableArgs;
pub use table::SETTINGS;

/// Names a setting in code; the table gives it its flag, variable and rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    Model,
    Threads,
    Device,
    Host,
    Port,
    Parallel,
    Context,
    ApiKey,
    MaxWaiting,
    MaxBodyBytes,
    DrainSeconds,
    RequestTimeout,
    HeaderTimeout,
    BodyTimeout,
    KeepAlive,
    PageTokens,
    KvPages,
    PrefixCache,
    PrefixCacheTokens,
    DraftTokens,
    DraftTiming,
    ResponsesStore,
    ResponsesStoreMb,
    ResponsesStoreDays,
    RoundTokens,
    MemoryLimit,
    SpeechModel,
    DraftModel,
    NoVoice,
    CacheDir,
    XdgCacheHome,
    Home,
    Python,
    Log,
    Kernels,
    CudaGraphs,
    CudaFuseRope,
    CudaFoldNorms,
    CudaGpuArgmax,
    CudaOverlap,
    CudaWgmma,
    CudaTma,
    CudaWideDecode,
    CudaWgPrompt,
    CudaMoeSplit,
    CudaExperts,
    CudaGemmMinTiles,
    CudaGemmMaxBlocks,
    Carveout,
    CarveoutSource,
    CarveoutMib,
    CarveoutSocket,
    CarveoutKey,
    CarveoutKeyFile,
    LendPoolMib,
}

/// What a setting's value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A whole number in `min..=max`.
    Count {
        min: u64,
        max: u64,
    },
    /// `0` or `1`.
    Switch,
    /// A flag without a value: given or not.
    Flag,
    /// One of a fixed set of words.
    Choice(&'static [&'static str]),
    Path,
    Text,
    /// A `tracing` filter such as `info` or `tensorfold_actors=debug`.
    LogFilter,
}

impl Kind {
    fn describe(self) -> String {
        match self {
            Kind::Count { min, max } => format!("integer {min}..={max}"),
            Kind::Switch => "0 or 1".into(),
            Kind::Flag => "flag".into(),
            Kind::Choice(words) => words.join("|"),
            Kind::Path => "path".into(),
            Kind::Text => "text".into(),
            Kind::LogFilter => "log filter".into(),
        }
    }
}

/// Which commands take a setting's flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every command that loads a text model.
    Model,
    /// `serve` only.
    Serve,
    /// `serve` and `speak`.
    Speech,
    /// `lend` only.
    Lend,
    /// Every command that loads a text model, and `lend` (where the lent memory lives).
    ModelAndLend,
    /// The environment only; no flag.
    Env,
}

/// When a setting is read and validated; rows behind a gate are skipped while it is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Only {
    Always,
    /// While the model runs on a GPU.
    Cuda,
    /// While `TF_CARVEOUT` is 1.
    Carveout,
    /// While `TF_CARVEOUT` is 1 and its source is the daemon.
    CarveoutDaemon,
}

impl Only {
    /// Gates in the order they are resolved: each opens on rows resolved before it.
    const ORDER: [Only; 4] = [Only::Always, Only::Cuda, Only::Carveout, Only::CarveoutDaemon];

    /// What the printed table says of a row whose gate is closed.
    fn closed(self) -> &'static str {
        match self {
            Only::Always => "unset",
            Only::Cuda => "(not used on the CPU)",
            Only::Carveout => "(not used: TF_CARVEOUT is 0)",
            Only::CarveoutDaemon => "(not used: no carveout from the daemon)",
        }
    }
}

/// One row of the table.
#[derive(Debug)]
pub struct Setting {
    pub key: Key,
    /// The flag is `--` and this.
    pub flag: Option<&'static str>,
    pub env: Option<&'static str>,
    pub kind: Kind,
    pub default: Option<&'static str>,
    pub help: &'static str,
    pub scope: Scope,
    /// Shown as set or unset, never by value.
    pub secret: bool,
    /// When the row is read and validated.
    pub only: Only,
}

impl Setting {
    /// The name errors and the printed table use: the flag where there is one, else the variable.
    pub fn name(&self) -> String {
        match (self.flag, self.env) {
            (Some(flag), _) => format!("--{flag}"),
            (None, Some(env)) => env.to_string(),
            (None, None) => format!("{:?}", self.key),
        }
    }
}

/// The fetcher the process environment names, for tools and tests that load the default model.
pub fn process_fetcher() -> Result<Fetcher, LoadError> {
    let settings = Settings::from_process(&[]).map_err(|e| LoadError::Fetch(e.to_string()))?;
    settings.fetcher()
}

/// The row of `key`.
pub fn setting(key: Key) -> &'static Setting {
    SETTINGS.iter().find(|s| s.key == key).expect("every key has a row")
}

/// A value the table accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Count(u64),
    Bool(bool),
    Text(String),
    Path(PathBuf),
}

/// Where a value in force came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Flag,
    Env,
    Default,
    Unset,
    /// A row whose gate is closed: GPU-only on the CPU, a carveout row with the carveout off.
    NotUsed,
}

/// A setting refused at start-up: its name and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{name}: {fault}")]
pub struct SettingError {
    pub name: String,
    pub fault: String,
}

/// Every setting's value in force, checked.
#[derive(Clone, Debug)]
pub struct Settings {
    values: Vec<(Option<Value>, Source)>,
}

impl Settings {
    /// Flags given on the command line, then the environment, then defaults; every value checked once.
    pub fn resolve(given: &[(Key, String)], env: &dyn Fn(&str) -> Option<String>) -> Result<Settings, SettingError> {
        let mut values = vec![(None, Source::Unset); SETTINGS.len()];
        for only in Only::ORDER {
            let open = Settings { values: values.clone() }.opens(only);
            for (i, s) in SETTINGS.iter().enumerate().filter(|(_, s)| s.only == only) {
                if !open {
                    values[i] = (None, Source::NotUsed);
                    continue;
                }
                let flag = given.iter().rev().find(|(k, _)| *k == s.key).map(|(_, v)| (v.clone(), Source::Flag));
                let from_env = s.env.and_then(env).filter(|v| !v.is_empty()).map(|v| (v, Source::Env));
                let from_default = s.default.map(|d| (d.to_string(), Source::Default));
                values[i] = match flag.or(from_env).or(from_default) {
                    Some((raw, source)) => (Some(parse(s, &raw, source)?), source),
                    None => (None, Source::Unset),
                };
            }
        }
        let settings = Settings { values };
        settings.check_carveout_key()?;
        Ok(settings)
    }

    /// Whether rows behind `only` are read, given the rows resolved before them.
    fn opens(&self, only: Only) -> bool {
        match only {
            Only::Always => true,
            Only::Cuda => self.text(Key::Device) == Some("cuda"),
            Only::Carveout => self.is_on(Key::Carveout),
            Only::CarveoutDaemon => self.is_on(Key::Carveout) && self.text(Key::CarveoutSource) == Some("daemon"),
        }
    }

    /// The daemon source needs exactly one of the inline key and the key file.
    fn check_carveout_key(&self) -> Result<(), SettingError> {
        if !self.opens(Only::CarveoutDaemon) {
            return Ok(());
        }
        let (inline, file) = (setting(Key::CarveoutKey).name(), setting(Key::CarveoutKeyFile).name());
        let fault = match (self.text(Key::CarveoutKey).is_some(), self.path(Key::CarveoutKeyFile).is_some()) {
            (true, true) => format!("set {inline} or {file}, not both"),
            (false, false) => format!("the daemon source needs {inline} or {file}"),
            _ => return Ok(()),
        };
        Err(SettingError { name: inline, fault })
    }

    /// The settings from the process environment, and these flags; the one place tensorfold reads its environment.
    pub fn from_process(given: &[(Key, String)]) -> Result<Settings, SettingError> {
        Settings::resolve(given, &|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    fn value(&self, key: Key) -> Option<&Value> {
        let i = SETTINGS.iter().position(|s| s.key == key).expect("every key has a row");
        self.values[i].0.as_ref()
    }

    pub fn count(&self, key: Key) -> Option<u64> {
        match self.value(key) {
            Some(Value::Count(n)) => Some(*n),
            _ => None,
        }
    }

    /// A count as `usize`; the table's ranges fit.
    pub fn size(&self, key: Key) -> Option<usize> {
        self.count(key).map(|n| usize::try_from(n).unwrap_or(usize::MAX))
    }

    pub fn is_on(&self, key: Key) -> bool {
        matches!(self.value(key), Some(Value::Bool(true)))
    }

    pub fn text(&self, key: Key) -> Option<&str> {
        match self.value(key) {
            Some(Value::Text(t)) => Some(t),
            _ => None,
        }
    }

    pub fn path(&self, key: Key) -> Option<&Path> {
        match self.value(key) {
            Some(Value::Path(p)) => Some(p),
            _ => None,
        }
    }

    pub fn device(&self) -> Device {
        match self.text(Key::Device) {
            Some("cuda") => Device::Cuda,
            _ => Device::Cpu,
        }
    }

    /// The CUDA backend's switches; defaults where the model runs on the CPU.
    pub fn cuda_options(&self) -> CudaOptions {
        let on = |key: Key, default: bool| match self.value(key) {
            Some(Value::Bool(b)) => *b,
            _ => default,
        };
        let defaults = CudaOptions::default();
        let gemm = GemmTuning {
            min_segment_tiles: self.size(Key::CudaGemmMinTiles).unwrap_or(defaults.kernels.gemm.min_segment_tiles),
            max_decode_blocks: self.size(Key::CudaGemmMaxBlocks).unwrap_or(defaults.kernels.gemm.max_decode_blocks),
        };
        CudaOptions {
            kernels: KernelOptions {
                overlap: on(Key::CudaOverlap, defaults.kernels.overlap),
                wgmma: on(Key::CudaWgmma, defaults.kernels.wgmma),
                gemm,
                family: on(Key::CudaTma, defaults.kernels.family),
                wide_decode: on(Key::CudaWideDecode, defaults.kernels.wide_decode),
                wg_prompt: on(Key::CudaWgPrompt, defaults.kernels.wg_prompt),
                moe_split: on(Key::CudaMoeSplit, defaults.kernels.moe_split),
            },
            graphs: on(Key::CudaGraphs, defaults.graphs),
            fuse_rope: on(Key::CudaFuseRope, defaults.fuse_rope),
            fold_norms: on(Key::CudaFoldNorms, defaults.fold_norms),
            gpu_argmax: on(Key::CudaGpuArgmax, defaults.gpu_argmax),
            experts: on(Key::CudaExperts, defaults.experts),
        }
    }

    /// Where fetched files are cached, and the python that fetches them.
    pub fn fetcher(&self) -> Result<Fetcher, LoadError> {
        let dir = |key| self.path(key).map(Path::to_path_buf);
        let cache_dir = Fetcher::cache_dir_from(dir(Key::CacheDir), dir(Key::XdgCacheHome), dir(Key::Home))?;
        Ok(Fetcher { cache_dir, python: self.text(Key::Python).unwrap_or("python3").to_string() })
    }

    /// The table with the value in force of each setting, one row a line.
    pub fn render(&self) -> String {
        let mut rows = vec![["setting", "environment", "type", "default", "value", "help"].map(String::from)];
        for (s, (value, source)) in SETTINGS.iter().zip(&self.values) {
            let shown = match (value, source) {
                (_, Source::NotUsed) => s.only.closed().to_string(),
                (None, _) => "unset".to_string(),
                (Some(_), _) if s.secret => format!("set ({})", source_name(*source)),
                (Some(v), _) => format!("{} ({})", show(v), source_name(*source)),
            };
            let flag = s.flag.map_or_else(|| "-".to_string(), |f| format!("--{f}"));
            let cells = [flag, s.env.unwrap_or("-").into(), s.kind.describe(), s.default.unwrap_or("-").into(), shown];
            let [a, b, c, d, e] = cells;
            rows.push([a, b, c, d, e, s.help.to_string()]);
        }
        let widths: Vec<usize> = (0..5).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
        let mut out = String::new();
        for r in &rows {
            for (c, w) in widths.iter().enumerate() {
                out.push_str(&format!("{:<w$}  ", r[c], w = w));
            }
            out.push_str(&r[5]);
            out.push('\n');
        }
        out
    }
}

fn source_name(source: Source) -> &'static str {
    match source {
        Source::Flag => "flag",
        Source::Env => "environment",
        Source::Default => "default",
        Source::Unset | Source::NotUsed => "unset",
    }
}

fn show(v: &Value) -> String {
    match v {
        Value::Count(n) => n.to_string(),
        Value::Bool(b) => u8::from(*b).to_string(),
        Value::Text(t) => t.clone(),
        Value::Path(p) => p.display().to_string(),
    }
}

/// Checks one raw value against its row; the error names the setting where the value came from.
fn parse(s: &Setting, raw: &str, source: Source) -> Result<Value, SettingError> {
    let name = match (source, s.env) {
        (Source::Env, Some(env)) => env.to_string(),
        _ => s.name(),
    };
    let err = |fault: String| SettingError { name: name.clone(), fault };
    match s.kind {
        Kind::Count { min, max } => {
            let n: u64 = raw.trim().parse().map_err(|_| err(format!("expected a whole number, got {raw:?}")))?;
            if !(min..=max).contains(&n) {
                return Err(err(format!("must be between {min} and {max}, not {n}")));
            }
            Ok(Value::Count(n))
        }
        Kind::Switch => match raw.trim() {
            "0" => Ok(Value::Bool(false)),
            "1" => Ok(Value::Bool(true)),
            other => Err(err(format!("must be 0 or 1, not {other:?}"))),
        },
        Kind::Flag => Ok(Value::Bool(raw == "1")),
        Kind::Choice(words) if words.contains(&raw) => Ok(Value::Text(raw.to_string())),
        Kind::Choice(words) => Err(err(format!("must be one of {}, not {raw:?}", words.join(", ")))),
        Kind::Path => Ok(Value::Path(PathBuf::from(raw))),
        Kind::Text if s.key == Key::Host && raw.trim().is_empty() => Err(err("must not be empty".into())),
        Kind::Text => Ok(Value::Text(raw.to_string())),
        Kind::LogFilter => match tracing_subscriber::EnvFilter::try_new(raw) {
            Ok(_) => Ok(Value::Text(raw.to_string())),
            Err(e) => Err(err(format!("not a log filter ({e}): {raw:?}"))),
        },
    }
}

#[cfg(test)]
mod tests;
