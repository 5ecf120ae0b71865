"""ctypes access to NVRTC and the CUDA driver for the GEMM bench (tools/gemm_bench.py) and its variant modules.

Compiles the engine's GEMM sources plus extra .cu files as one NVRTC program, loads the PTX into torch's CUDA
context and launches kernels on torch's current stream; builds TMA tensor maps. Needs torch (imported lazily, so
the compile alone also runs on a machine without a GPU).
"""

import ctypes
import ctypes.util
import glob
import os
import sys
from dataclasses import dataclass
from typing import Callable, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The engine's GEMM sources in the order kernels/src/cuda/mod.rs concatenates them; gemm.cu uses norm.cu's row norm.
ENGINE_SOURCES = [
    "kernels/cuda/prelude.cu",
    "kernels/cuda/norm.cu",
    "kernels/cuda/gemm.cu",
    "kernels/cuda/gemm_tiled.cu",
    "kernels/cuda/gemm_wgmma.cu",
    "kernels/cuda/pack.cu",
]


@dataclass
class Variant:
    name: str
    sources: list  # extra .cu files (repo-relative), compiled with the engine's GEMM sources
    min_m: int
    max_m: int
    run: Callable  # run(cuda, a, w, c, m, n, k, segs) on torch's current stream, segs = segments(n, k)
    setup: Optional[Callable] = None  # setup(cuda) once after the compile
    fits: Optional[Callable] = None  # fits(n, k): whether the variant has a kernel for the shape's segments


# Weight rows (8 a tile) times segments that the decode kernel wants in flight: about 16 tile segments an SM.
SEGMENT_ROWS = 16384
# Shortest K segment: 384 k keep a segment's chain several stages long.
MIN_SEGMENT_K = 384


def segments(n, k):
    """The family's K split of an N x K weight, fixed per shape (never by M): the smallest power of two S with
    N S >= SEGMENT_ROWS, halving K only while K / S stays a multiple of 64 and at least MIN_SEGMENT_K."""
    s = 1
    while n * s < SEGMENT_ROWS and (k // (2 * s)) % 64 == 0 and k // (2 * s) >= MIN_SEGMENT_K and k % (2 * s) == 0:
        s *= 2
    return s


class CudaError(RuntimeError):
    pass


def _load_library(env, names, patterns):
    # An explicit path wins; then the loader's own search; then the usual install places.
    candidates = [os.environ[env]] if os.environ.get(env) else []
    candidates += names
    found = ctypes.util.find_library(names[-1].split(".so")[0][3:])
    if found:
        candidates.append(found)
    for pattern in patterns:
        candidates += sorted(glob.glob(pattern), reverse=True)
    errors = []
    for path in candidates:
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise CudaError(f"cannot load {names[0]}: " + "; ".join(errors))


def _nvrtc_patterns():
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    pats = [f"{home}/lib64/libnvrtc.so*", f"{home}/targets/x86_64-linux/lib/libnvrtc.so*"]
    for p in sys.path:
        pats += [f"{p}/nvidia/cu13/lib/libnvrtc.so*", f"{p}/nvidia/cuda_nvrtc/lib/libnvrtc.so*"]
    return pats


_nvrtc = None


def nvrtc():
    global _nvrtc
    if _nvrtc is None:
        lib = _load_library("NVRTC_LIB", ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"], _nvrtc_patterns())
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        _nvrtc = lib
    return _nvrtc


def _nvrtc_check(rc, what):
    if rc != 0:
        raise CudaError(f"{what}: {nvrtc().nvrtcGetErrorString(rc).decode()}")


def read_sources(paths):
    """One program text: each file behind a #line directive, so the compiler's messages name the file."""
    parts = []
    for rel in paths:
        with open(os.path.join(REPO, rel)) as f:
            parts.append(f'#line 1 "{rel}"\n{f.read()}\n')
    return "".join(parts)


def compile_ptx(paths, arch="sm_90a", extra_options=()):
    """PTX of the files in `paths` (repo-relative) compiled as one program; raises with the log on failure."""
    lib = nvrtc()
    src = read_sources(paths).encode()
    prog = ctypes.c_void_p()
    _nvrtc_check(lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"gemm_bench.cu", 0, None, None), "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={arch}", "--std=c++17", "-lineinfo", *extra_options]
        arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        text = log.value.decode(errors="replace").strip()
        if rc != 0:
            print(text, file=sys.stderr)
            raise CudaError(f"nvrtcCompileProgram: {lib.nvrtcGetErrorString(rc).decode()} ({', '.join(paths)})")
        if text:
            print(text, file=sys.stderr)
        _nvrtc_check(lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
        ptx = ctypes.create_string_buffer(size.value)
        _nvrtc_check(lib.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        return ptx.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


class _LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint32), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint32 * 16)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [
        ("gridDimX", ctypes.c_uint32),
        ("gridDimY", ctypes.c_uint32),
        ("gridDimZ", ctypes.c_uint32),
        ("blockDimX", ctypes.c_uint32),
        ("blockDimY", ctypes.c_uint32),
        ("blockDimZ", ctypes.c_uint32),
        ("sharedMemBytes", ctypes.c_uint32),
        ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttribute)),
        ("numAttrs", ctypes.c_uint32),
    ]


CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3
CU_FUNC_ATTRIBUTE_NUM_REGS = 4
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
CU_JIT_ERROR_LOG_BUFFER = 5
CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9
SWIZZLE = {0: 0, 32: 1, 64: 2, 128: 3}
CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3


class Cuda:
    """One NVRTC-compiled module in torch's context: look up, configure and launch its kernels."""

    def __init__(self, extra_sources, arch="sm_90a", options=("-DGEMM_TMA_ALL",)):
        import torch

        seen = []
        for s in ENGINE_SOURCES + list(extra_sources):
            if s not in seen:
                seen.append(s)
        self.sources = seen
        self.ptx = compile_ptx(seen, arch, tuple(options))
        torch.cuda.init()
        torch.zeros(1, device="cuda")  # makes torch's primary context current on this thread
        self.torch = torch
        self.lib = _load_library("CUDA_DRIVER_LIB", ["libcuda.so.1", "libcuda.so"], [])
        self.lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self.lib.cuTensorMapEncodeTiled.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p]
        self.lib.cuTensorMapEncodeTiled.argtypes += [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
        ctx = ctypes.c_void_p()
        self._check(self.lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:
            dev = ctypes.c_int()
            self._check(self.lib.cuDeviceGet(ctypes.byref(dev), torch.cuda.current_device()), "cuDeviceGet")
            self._check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
            self._check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self.ctx = ctx
        self.module = ctypes.c_void_p()
        log = ctypes.create_string_buffer(1 << 16)
        opts = (ctypes.c_int * 2)(CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
        vals = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p), ctypes.c_void_p(len(log)))
        rc = self.lib.cuModuleLoadDataEx(ctypes.byref(self.module), self.ptx + b"\0", 2, opts, vals)
        if rc != 0:
            print(log.value.decode(errors="replace"), file=sys.stderr)
        self._check(rc, "cuModuleLoadDataEx")
        self._functions = {}

    def _check(self, rc, what):
        if rc != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(name))
            raise CudaError(f"{what}: {(name.value or b'error %d' % rc).decode()}")

    def function(self, name):
        f = self._functions.get(name)
        if f is None:
            f = ctypes.c_void_p()
            self._check(self.lib.cuModuleGetFunction(ctypes.byref(f), self.module, name.encode()), f"cuModuleGetFunction({name})")
            self._functions[name] = f
        return f

    def has(self, name):
        return f".entry {name}(".encode() in self.ptx

    def attribute(self, name, attr):
        v = ctypes.c_int()
        self._check(self.lib.cuFuncGetAttribute(ctypes.byref(v), attr, self.function(name)), f"cuFuncGetAttribute({name})")
        return v.value

    def registers(self, name):
        """(registers a thread, local memory bytes a thread): spills show as local memory."""
        return self.attribute(name, CU_FUNC_ATTRIBUTE_NUM_REGS), self.attribute(name, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)

    def set_smem(self, name, nbytes):
        attr = CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        self._check(self.lib.cuFuncSetAttribute(self.function(name), attr, int(nbytes)), f"cuFuncSetAttribute({name}, smem {nbytes})")

    def sm_count(self):
        return self.torch.cuda.get_device_properties(self.torch.cuda.current_device()).multi_processor_count

    def launch(self, name, grid, block, smem, args, cluster=(1, 1, 1)):
        keep = []
        params = (ctypes.c_void_p * max(1, len(args)))()
        for i, (kind, value) in enumerate(args):
            if kind == "ptr":
                slot = ctypes.c_uint64(int(value))
            elif kind == "i32":
                slot = ctypes.c_int32(int(value))
            elif kind == "f32":
                slot = ctypes.c_float(float(value))
            elif kind == "map":
                assert len(value) == 128, "a CUtensorMap is 128 bytes"
                slot = (ctypes.c_uint64 * 16).from_buffer_copy(value)
            else:
                raise ValueError(f"unknown argument kind {kind}")
            keep.append(slot)
            params[i] = ctypes.cast(ctypes.pointer(slot), ctypes.c_void_p)
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        cfg = _LaunchConfig(*[int(v) for v in grid], *[int(v) for v in block], int(smem))
        cfg.hStream = ctypes.c_void_p(self.torch.cuda.current_stream().cuda_stream)
        attr = _LaunchAttribute()
        cluster = tuple(cluster) + (1,) * (3 - len(cluster))
        if cluster != (1, 1, 1):
            attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value[0], attr.value[1], attr.value[2] = cluster
            cfg.attrs = ctypes.pointer(attr)
            cfg.numAttrs = 1
        rc = self.lib.cuLaunchKernelEx(ctypes.byref(cfg), self.function(name), params, None)
        self._check(rc, f"cuLaunchKernelEx({name}, grid {grid}, block {block}, smem {smem}, cluster {cluster})")

    def tensor_map_2d(self, ptr, rows, cols, box_rows, box_cols, swizzle_bytes):
        """A CUtensorMap (128 bytes) of a row-major bf16 [rows][cols] matrix at `ptr`, boxes of box_rows x box_cols."""
        out = (ctypes.c_uint64 * 16)()
        dims = (ctypes.c_uint64 * 2)(cols, rows)
        strides = (ctypes.c_uint64 * 1)(cols * 2)
        box = (ctypes.c_uint32 * 2)(box_cols, box_rows)
        estrides = (ctypes.c_uint32 * 2)(1, 1)
        rc = self.lib.cuTensorMapEncodeTiled(
            ctypes.byref(out), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, ctypes.c_void_p(int(ptr)), dims, strides, box,
            estrides, 0, SWIZZLE[swizzle_bytes], CU_TENSOR_MAP_L2_PROMOTION_L2_256B, 0)
        self._check(rc, f"cuTensorMapEncodeTiled({rows}x{cols}, box {box_rows}x{box_cols}, swizzle {swizzle_bytes})")
        return bytes(out)


_maps = {}
_sms = {}


def swizzled_map(cuda, t, rows, cols, box_rows):
    """The 128-byte-swizzled tensor map of a row-major bf16 tensor, boxes of box_rows x 64; one per (pointer, shape,
    box), as a map holds only those and serves every later call."""
    key = (t.data_ptr(), rows, cols, box_rows)
    found = _maps.get(key)
    if found is None:
        found = cuda.tensor_map_2d(t.data_ptr(), rows, cols, box_rows, 64, 128)
        _maps[key] = found
    return found


def sm_count(device):
    """The device's multiprocessor count, asked of torch once."""
    import torch

    if device not in _sms:
        _sms[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return _sms[device]


_scratch = {}


def scratch(device, floats, counters=4096):
    """(f32 workspace of at least `floats`, int32 arrival counters) for the segmented decode kernel, one pair per
    device, grown only outside graph capture (the bench asks for each shape's most before timing); the kernels
    leave the counters zero."""
    import torch

    ws, cnt = _scratch.get(device, (None, None))
    if ws is None or ws.numel() < floats:
        ws = torch.empty(max(floats, 1), dtype=torch.float32, device=device)
        cnt = cnt if cnt is not None else torch.zeros(counters, dtype=torch.int32, device=device)
        _scratch[device] = (ws, cnt)
    return ws, cnt
