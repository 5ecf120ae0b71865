use std::collections::HashMap;

use super::*;

fn resolve(flags: &[(Key, &str)], env: &[(&str, &str)]) -> Result<Settings, SettingError> {
    let given: Vec<(Key, String)> = flags.iter().map(|(k, v)| (*k, v.to_string())).collect();
    let env: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Settings::resolve(&given, &|name| env.get(name).cloned())
}

fn refused(flags: &[(Key, &str)], env: &[(&str, &str)]) -> String {
    resolve(flags, env).expect_err("the value should be refused").to_string()
}

#[test]
fn test_every_key_has_one_row_and_every_name_is_unique() {
    let mut names = std::collections::HashSet::new();
    for s in SETTINGS {
        assert_eq!(SETTINGS.iter().filter(|r| r.key == s.key).count(), 1, "{:?} has more than one row", s.key);
        assert!(names.insert(s.name()), "{} is named twice", s.name());
        assert!(!s.help.is_empty(), "{} has no help", s.name());
        if let Some(default) = s.default {
            parse(s, default, Source::Default).unwrap_or_else(|e| panic!("{}'s default is refused: {e}", s.name()));
        }
    }
}

#[test]
fn test_flags_beat_the_environment_which_beats_defaults() {
    let s = resolve(&[], &[]).unwrap();
    assert_eq!((s.size(Key::Parallel), s.size(Key::Port)), (Some(16), Some(8000)));
    assert_eq!(s.size(Key::Context), None);
    let s = resolve(&[], &[("TF_MEMORY_LIMIT", "4096")]).unwrap();
    assert_eq!(s.size(Key::MemoryLimit), Some(4096));
    let s = resolve(&[(Key::MemoryLimit, "8192")], &[("TF_MEMORY_LIMIT", "4096")]).unwrap();
    assert_eq!(s.size(Key::MemoryLimit), Some(8192));
    assert!(resolve(&[(Key::NoVoice, "1")], &[]).unwrap().is_on(Key::NoVoice));
}

#[test]
fn test_bad_values_are_refused_naming_the_setting() {
    assert_eq!(refused(&[(Key::Parallel, "0")], &[]), "--parallel: must be between 1 and 4096, not 0");
    assert_eq!(refused(&[(Key::Port, "70000")], &[]), "--port: must be between 0 and 65535, not 70000");
    assert_eq!(refused(&[(Key::RoundTokens, "many")], &[]), "--round-tokens: expected a whole number, got \"many\"");
    assert_eq!(refused(&[(Key::Device, "gpu")], &[]), "--device: must be one of cpu, cuda, not \"gpu\"");
    assert_eq!(refused(&[], &[("TF_MEMORY_LIMIT", "1G")]), "TF_MEMORY_LIMIT: expected a whole number, got \"1G\"");
    assert_eq!(refused(&[], &[("TF_KERNELS", "sse")]), "TF_KERNELS: must be one of auto, avx2, not \"sse\"");
    assert!(refused(&[], &[("TF_LOG", "info,=")]).starts_with("TF_LOG: not a log filter"));
    assert_eq!(refused(&[(Key::Host, " ")], &[]), "--host: must not be empty");
}

#[test]
fn test_gpu_settings_are_checked_only_when_the_model_runs_on_a_gpu() {
    let on_cpu = resolve(&[], &[("TF_CUDA_GRAPHS", "yes")]).unwrap();
    assert_eq!(on_cpu.cuda_options(), CudaOptions::default());
    let cuda = [(Key::Device, "cuda")];
    assert_eq!(refused(&cuda, &[("TF_CUDA_GRAPHS", "yes")]), "TF_CUDA_GRAPHS: must be 0 or 1, not \"yes\"");
    assert_eq!(
        refused(&cuda, &[("TF_CUDA_GEMM_MIN_TILES", "0")]),
        "TF_CUDA_GEMM_MIN_TILES: must be between 1 and 1024, not 0"
    );
    let env = [("TF_CUDA_GRAPHS", "0"), ("TF_CUDA_FUSE_ROPE", "1"), ("TF_CUDA_GEMM_MAX_BLOCKS", "0")];
    let options = resolve(&cuda, &env).unwrap().cuda_options();
    assert!(!options.graphs && options.fuse_rope && options.fold_norms && options.gpu_argmax);
    assert_eq!(options.kernels.gemm.max_decode_blocks, 0);
}

#[test]
fn test_the_printed_table_shows_every_setting_and_no_secret() {
    let s = resolve(&[(Key::Parallel, "3")], &[("TF_API_KEY", "hunter2"), ("TF_CUDA_GRAPHS", "0")]).unwrap();
    let table = s.render();
    for row in SETTINGS {
        assert!(table.contains(&row.name()), "{} is not printed", row.name());
    }
    assert!(!table.contains("hunter2"), "the API key was printed");
    assert!(table.contains("set (environment)"));
    assert!(table.contains("3 (flag)"));
    assert!(table.contains("(not used on the CPU)"));
}

#[test]
fn test_the_cache_follows_tf_cache_dir_then_xdg_then_home() {
    let dir = |env: &[(&str, &str)]| resolve(&[], env).unwrap().fetcher().map(|f| f.cache_dir);
    assert_eq!(dir(&[("TF_CACHE_DIR", "/c"), ("HOME", "/h")]).unwrap(), PathBuf::from("/c"));
    assert_eq!(dir(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]).unwrap(), PathBuf::from("/x/tensorfold"));
    assert_eq!(dir(&[("HOME", "/h")]).unwrap(), PathBuf::from("/h/.cache/tensorfold"));
    assert!(dir(&[]).is_err());
}
