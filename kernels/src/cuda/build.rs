//! Our kernels compiled by NVRTC: the sources split into programs that compile side by side, each to the GPU's own
//! machine code (a cubin, which the driver loads without a second compile), cached on disk by a hash of its text.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys, CompileOptions, Ptx};
use sha2::{Digest, Sha256};

use super::GpuError;

/// The kernel sources, one file per family of operations.
pub const SOURCES: [(&str, &str); 15] = [
    ("prelude.cu", include_str!("../../cuda/prelude.cu")),
    ("norm.cu", include_str!("../../cuda/norm.cu")),
    ("gemm.cu", include_str!("../../cuda/gemm.cu")),
    ("gemm_tiled.cu", include_str!("../../cuda/gemm_tiled.cu")),
    ("gemm_wgmma.cu", include_str!("../../cuda/gemm_wgmma.cu")),
    ("gemm_tma.cu", include_str!("../../cuda/gemm_tma.cu")),
    ("gemm_stream.cu", include_str!("../../cuda/gemm_stream.cu")),
    ("attention.cu", include_str!("../../cuda/attention.cu")),
    ("attention_decode.cu", include_str!("../../cuda/attention_decode.cu")),
    ("attention_wg.cu", include_str!("../../cuda/attention_wg.cu")),
    ("sampling.cu", include_str!("../../cuda/sampling.cu")),
    ("pack.cu", include_str!("../../cuda/pack.cu")),
    ("conv.cu", include_str!("../../cuda/conv.cu")),
    ("moe.cu", include_str!("../../cuda/moe.cu")),
    ("deltanet.cu", include_str!("../../cuda/deltanet.cu")),
];

/// Files every program that uses the older GEMM's helpers starts with.
const BASE: [&str; 3] = ["prelude.cu", "norm.cu", "gemm.cu"];

/// The programs compiled side by side: (a define, or "" for none; files after BASE, or after the prelude alone when
/// the first is `-`). Together they hold every kernel; a kernel in two programs is taken from the first.
const PARTS: [(&str, &[&str]); 9] = [
    ("", &["attention.cu", "attention_decode.cu"]),
    ("", &["gemm_tiled.cu"]),
    ("", &["gemm_wgmma.cu"]),
    ("", &["sampling.cu", "pack.cu", "conv.cu", "moe.cu", "deltanet.cu"]),
    ("", &["-", "gemm_stream.cu"]),
    ("TMA_PART 0", &["-", "gemm_tma.cu"]),
    ("TMA_PART 1", &["-", "gemm_tma.cu"]),
    ("TMA_PART 2", &["-", "gemm_tma.cu"]),
    ("TMA_PART 3", &["gemm_tma.cu", "attention.cu", "attention_wg.cu"]),
];

fn file(name: &str) -> &'static str {
    SOURCES.iter().find(|(n, _)| *n == name).map(|(_, text)| *text).expect("a listed kernel source")
}

fn join(names: &[&str]) -> String {
    names.iter().map(|name| format!("// {name}\n{}\n", file(name))).collect()
}

/// All kernel sources as one program.
pub fn source() -> String {
    join(&SOURCES.map(|(name, _)| name))
}

/// The text of program `i` of PARTS.
fn part_source(i: usize) -> String {
    let (define, files) = PARTS[i];
    let head = if define.is_empty() { String::new() } else { format!("#define {define}\n") };
    match files.split_first() {
        Some((&"-", rest)) => head + &join(&[&["prelude.cu"], rest].concat()),
        _ => head + &join(&[&BASE[..], files].concat()),
    }
}

fn options(arch: &str) -> Vec<String> {
    vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()]
}

/// Compiles the kernels to PTX for `arch` (such as `sm_90`); needs NVRTC but no GPU.
pub fn compile_ptx(arch: &str) -> Result<String, GpuError> {
    // SAFETY: only opens the library.
    if !unsafe { nvrtc_sys::is_culib_present() } {
        return Err(GpuError::NoNvrtc);
    }
    let opts = CompileOptions { options: options(arch), ..Default::default() };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(source(), opts).map_err(|e| GpuError::Compile(e.to_string()))?;
    Ok(ptx.to_src())
}

/// Compiles `src` for the real architecture `arch` (such as `sm_90a`) to a cubin.
fn compile_cubin(src: &str, arch: &str) -> Result<Vec<u8>, GpuError> {
    let fail = |e: nvrtc::NvrtcError| GpuError::Compile(format!("{e:?}"));
    let text = std::ffi::CString::new(src).map_err(|e| GpuError::Compile(e.to_string()))?;
    let prog = nvrtc::create_program(&text, None).map_err(fail)?;
    // SAFETY: prog was just created and is destroyed once, below.
    let built = unsafe {
        match nvrtc::compile_program(prog, &options(arch)) {
            Ok(()) => {
                let mut size = 0usize;
                nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size).result().map_err(fail).and_then(|_| {
                    let mut bytes = vec![0u8; size];
                    nvrtc_sys::nvrtcGetCUBIN(prog, bytes.as_mut_ptr().cast()).result().map_err(fail)?;
                    Ok(bytes)
                })
            }
            Err(e) => {
                let log = nvrtc::get_program_log(prog).unwrap_or_default();
                let log: Vec<u8> = log.iter().map(|&c| c as u8).take_while(|&c| c != 0).collect();
                Err(GpuError::Compile(format!("{e:?}: {}", String::from_utf8_lossy(&log))))
            }
        }
    };
    // SAFETY: prog came from create_program and is not used again.
    let _ = unsafe { nvrtc::destroy_program(prog) };
    built
}

/// Program `i`'s cubin for `arch`, from `cache_dir` when a build of the same text and options is there.
fn cached_cubin(i: usize, arch: &str, cache_dir: Option<&Path>) -> Result<Vec<u8>, GpuError> {
    let src = part_source(i);
    let mut hash = Sha256::new();
    hash.update(&src);
    hash.update(options(arch).join(" "));
    let key: String = hash.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect();
    let path: Option<PathBuf> = cache_dir.map(|d| d.join(format!("kernels-{key}.cubin")));
    if let Some(bytes) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
        return Ok(bytes);
    }
    let cubin = compile_cubin(&src, arch)?;
    if let Some(p) = &path {
        // A cache that cannot be written only costs a compile next time; the rename keeps a torn file out.
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        let written = p.parent().map(std::fs::create_dir_all).transpose().and_then(|_| std::fs::write(&tmp, &cubin));
        if written.and_then(|_| std::fs::rename(&tmp, p)).is_err() {
            tracing::warn!(path = %p.display(), "could not cache the compiled kernels");
        }
    }
    Ok(cubin)
}

/// The loaded programs; a kernel is looked up by name in each in PARTS order.
pub(super) struct Kernels {
    modules: Vec<Arc<CudaModule>>,
}

impl Kernels {
    /// Compiles (or reads from `cache_dir`) every program for `arch` at once, one thread each, and loads them.
    pub(super) fn load(ctx: &Arc<CudaContext>, arch: &str, cache_dir: Option<&Path>) -> Result<Kernels, GpuError> {
        let cubins: Vec<Result<Vec<u8>, GpuError>> = std::thread::scope(|s| {
            let jobs: Vec<_> = (0..PARTS.len()).map(|i| s.spawn(move || cached_cubin(i, arch, cache_dir))).collect();
            jobs.into_iter()
                .map(|j| j.join().unwrap_or_else(|_| Err(GpuError::Compile("NVRTC panicked".into()))))
                .collect()
        });
        let mut modules = Vec::with_capacity(cubins.len());
        for cubin in cubins {
            modules.push(ctx.load_module(Ptx::from_binary(cubin?))?);
        }
        Ok(Kernels { modules })
    }

    /// The kernel `name` from the first program that has it.
    pub(super) fn function(&self, name: &str) -> Result<CudaFunction, GpuError> {
        let mut last = None;
        for module in &self.modules {
            match module.load_function(name) {
                Ok(f) => return Ok(f),
                Err(e) => last = Some(e),
            }
        }
        Err(last.map_or_else(|| GpuError::Compile(format!("no kernel {name}")), GpuError::Driver))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_every_source_is_in_some_program() {
        for (name, _) in SOURCES {
            let held =
                name == "prelude.cu" || BASE.contains(&name) || PARTS.iter().any(|(_, files)| files.contains(&name));
            assert!(held, "{name} is compiled in no program");
        }
    }

    #[test]
    fn test_the_three_tma_programs_each_define_their_part() {
        let defines: Vec<String> = (5..8).map(|i| part_source(i).lines().next().unwrap_or("").to_string()).collect();
        assert_eq!(defines, ["#define TMA_PART 0", "#define TMA_PART 1", "#define TMA_PART 2"]);
    }
}
