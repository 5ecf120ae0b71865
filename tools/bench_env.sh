# Shared by the CPU benchmarks (source it): the cache directory, the bench venv with llama.cpp's builds,
# and the GGUF both sides run.
#
# After sourcing: CACHE, VENV, VPY. Functions: bench_xllamacpp (installs the pinned wheel),
# bench_native_llamacpp (builds llama-cpp-python for this CPU; returns 1, having said why, where it cannot),
# bench_model BIN (sets MODEL: BENCH_MODEL, or the default model that BIN fetches into the cache).

XLLAMACPP_VERSION="2026.10.11549"
LLAMA_CPP_PYTHON_VERSION="0.3.36"
# Build tools of the native build, from PyPI wheels into the venv, so the host needs only a C++ compiler.
CMAKE_VERSION="3.31.10"
NINJA_VERSION="1.13.2"
SCIKIT_BUILD_CORE_VERSION="1.1.2"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"

# The same rules as the binary's cache directory.
if [[ -n "${TF_CACHE_DIR:-}" ]]; then
    CACHE="$TF_CACHE_DIR"
elif [[ -n "${XDG_CACHE_HOME:-}" ]]; then
    CACHE="$XDG_CACHE_HOME/tensorfold"
else
    CACHE="$HOME/.cache/tensorfold"
fi
VENV="$CACHE/bench-venv"
VPY="$VENV/bin/python"

bench_has_version() {
    "$VPY" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null
}

bench_xllamacpp() {
    bench_has_version xllamacpp "$XLLAMACPP_VERSION" && return 0
    echo "bench: installing xllamacpp==$XLLAMACPP_VERSION into $VENV" >&2
    mkdir -p "$CACHE"
    "${PYTHON:-python3}" -m venv "$VENV"
    "$VPY" -m pip install --quiet --disable-pip-version-check "xllamacpp==$XLLAMACPP_VERSION"
}

# A build with -march=native runs only where it was built: the venv remembers the CPU it was built for.
bench_host_id() {
    { uname -m; grep -m1 '^model name' /proc/cpuinfo; grep -m1 '^flags' /proc/cpuinfo; } 2>/dev/null \
        | cksum | cut -d' ' -f1
}

bench_native_llamacpp() {
    local marker="$VENV/llama-cpp-native.host" log="$CACHE/llama-cpp-native-build.log" started
    if bench_has_version llama_cpp_python "$LLAMA_CPP_PYTHON_VERSION" \
        && [[ "$(cat "$marker" 2>/dev/null)" == "$(bench_host_id)" ]]; then
        return 0
    fi
    if ! command -v c++ >/dev/null && ! command -v g++ >/dev/null; then
        echo "bench: no C++ compiler (c++ or g++) on this machine: skipping the natively built llama.cpp" >&2
        return 1
    fi
    echo "bench: building llama.cpp for this CPU (llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION, GGML_NATIVE=ON)" \
        "into $VENV; this takes minutes, log: $log" >&2
    started=$SECONDS
    # No build isolation and no wheel cache: the build uses the venv's pinned tools and always compiles here.
    if ! { "$VPY" -m pip install --disable-pip-version-check "cmake==$CMAKE_VERSION" "ninja==$NINJA_VERSION" \
            "scikit-build-core==$SCIKIT_BUILD_CORE_VERSION" \
        && PATH="$VENV/bin:$PATH" CMAKE_ARGS="-DGGML_NATIVE=ON" FORCE_CMAKE=1 \
            "$VPY" -m pip install --disable-pip-version-check --force-reinstall --no-build-isolation --no-cache-dir \
            --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"; } >"$log" 2>&1; then
        echo "bench: the native llama.cpp build failed (log: $log): skipping that peer" >&2
        return 1
    fi
    bench_host_id >"$marker"
    echo "bench: built llama.cpp natively in $((SECONDS - started)) s" >&2
}

bench_model() {
    if [[ -n "${BENCH_MODEL:-}" ]]; then
        MODEL="$BENCH_MODEL"
    else
        # Without --model the binary fetches the default model into the cache.
        env -u TF_MODEL "$1" bench --threads 1 --prompt-tokens 1 --decode-tokens 1 --repeats 1 >/dev/null
        MODEL="$CACHE/$MODEL_FILE"
    fi
    [[ -f "$MODEL" ]] || { echo "bench: $MODEL not found" >&2; return 1; }
}
