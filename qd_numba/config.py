"""Every user-visible knob, read in one place.

``qd.init(...)`` options override the matching ``QD_*`` environment variables, which are
read once, when ``qd.init`` runs (or at the first kernel call if ``qd.init`` was never
called). Nothing on the launch path reads the environment. docs/configuration.md lists
every knob.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
from numba.core import types

from .errors import QuadrantsConfigError

_TRUE = {"1", "on", "true", "yes"}
_FALSE = {"0", "off", "false", "no", ""}


def env_flag(name: str, default: bool = False) -> bool:
    """A boolean ``QD_*`` variable: ``1/on/true/yes`` (any case) is true."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise QuadrantsConfigError(f"{name}={raw!r}: expected one of 1/on/true/yes or 0/off/false/no")


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return float(raw)
    except ValueError:
        raise QuadrantsConfigError(f"{name}={raw!r}: expected a number") from None


CLEANING_POLICIES = ("lru", "fifo", "version", "never")   # offline_cache_cleaning_policy, as Quadrants
AD_STACK_SIZERS = ("auto", "host", "device")    # ad_stack_sizer


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return int(raw)
    except ValueError:
        raise QuadrantsConfigError(f"{name}={raw!r}: expected an integer") from None


LOG_LEVELS = ("trace", "debug", "info", "warn", "error", "critical")   # Quadrants' names, quietest last


def log_level(value: str, where: str = "log_level") -> str:
    """A log level name: one of :data:`LOG_LEVELS` (any case; ``warning`` is ``warn``)."""
    name = str(value).strip().lower()
    name = "warn" if name == "warning" else name
    if name not in LOG_LEVELS:
        raise QuadrantsConfigError(f"{where}={value!r}: expected one of {', '.join(LOG_LEVELS)} (e.g. qd.INFO)")
    return name


@dataclasses.dataclass
class Config:
    arch: str = "cpu"
    debug: bool = False                 # bounds checks on every field/ndarray access
    print_ir: bool = False              # QD_DUMP_IR: IR after each stage, per task
    dump_generated: bool = False        # QD_DUMP_GENERATED: print generated Python (call paths, runners)
    default_fp: types.Type = types.float32
    default_ip: types.Type = types.int32
    cpu_max_num_threads: int = 0        # 0: Numba's default (all cores)
    raw_errors: bool = False            # QD_RAW_ERRORS: let Numba's exceptions through
    random_seed: int | None = None
    cuda_compile_check: bool = False    # QD_CUDA_COMPILE_CHECK: also compile every CPU kernel for CUDA (no GPU)
    aggressive_kernel_fusion: bool = False       # QD_AGGRESSIVE_KERNEL_FUSION: fuse adjacent range-for tasks
    aggressive_kernel_fusion_raw: bool = True    # QD_AGGRESSIVE_KERNEL_FUSION_RAW: same-thread read-after-write rule
    aggressive_kernel_fusion_diag: bool = False  # QD_AGGRESSIVE_KERNEL_FUSION_DIAG: print fusion decisions
    kernel_fusion_budget: int = 600              # QD_KERNEL_FUSION_BUDGET: max IR statements of a fused body
    verify_each_pass: bool = False      # QD_VERIFY_EACH_PASS: full IR verifier after every pass
    kernel_profiler: bool = False       # QD_KERNEL_PROFILER: time every kernel call and task (qd.profiler)
    warp_reduce: bool = True            # QD_WARP_REDUCE: uniform-address atomics as per-thread partials
    cuda_graph: bool = True             # QD_GRAPH: @qd.kernel(graph=True) replays CUDA graphs (off: plain launches)
    auto_graph: bool = True             # QD_AUTO_GRAPH: 2+ task plans replay a CUDA graph on unchanged calls
    ad_stack_size: int = 0              # QD_AD_STACK_SIZE: adstack depth in words per thread (0: sized at launch)
    ad_stack_sizer: str = "auto"        # QD_AD_STACK_SIZER: auto | host | device (per-thread bounds' max-reduction)
    log_level: str | None = None        # QD_LOG_LEVEL: level of the "qd_numba" logger (None: logging's, warn)
    offline_cache: bool = True          # QD_OFFLINE_CACHE: reuse compiled kernels across processes (offline_cache.py)
    offline_cache_file_path: str = ""   # QD_OFFLINE_CACHE_FILE_PATH: its directory ("": ~/.cache/qd_numba/qdcache)
    offline_cache_max_size_of_files: int = 100 * 1024 * 1024   # QD_OFFLINE_CACHE_MAX_SIZE_OF_FILES: bytes
    offline_cache_cleaning_policy: str = "lru"   # QD_OFFLINE_CACHE_CLEANING_POLICY: lru | fifo | version | never
    offline_cache_cleaning_factor: float = 0.25  # QD_OFFLINE_CACHE_CLEANING_FACTOR: share removed when over the size
    compile_threads: int = 0            # QD_COMPILE_THREADS: CUDA NVVM/nvJitLink threads (0: os.cpu_count())
    compile_processes: int = 0          # QD_COMPILE_PROCESSES: processes lowering CUDA tasks (0: auto, 1: one)
    cfg_optimization: bool = True       # QD_CFG_OPTIMIZATION: store-to-load forwarding, dead stores (per task)
    cfg_optimization_per_task: bool = True   # QD_CFG_OPTIMIZATION_PER_TASK: Quadrants' name; off: no CFG pass
    task_pipeline: str = "gated"        # QD_TASK_PIPELINE: gated | full (Numba's pipeline per task, unchanged)
    check_out_of_bound: bool = False    # Quadrants' bounds-check switch: turns on ``debug`` here
    advanced_optimization: bool = True  # off: no optional optimisation (cfg_optimization off too)
    short_circuit_operators: bool = True   # kernels' and/or always short-circuit (Python's rule)
    cuda_stack_limit: int = 0           # bytes of CUDA stack per thread (0: the driver's default)
    pointer_pool_fraction: float = 1.0  # QD_POINTER_POOL_FRACTION: a pointer SNode's pool, as a share of its cells
    amdgpu_compile_check: bool = False  # QD_AMDGPU_COMPILE_CHECK: also compile every CPU kernel for AMDGPU (no GPU)
    amdgpu_arch: str = "gfx942"         # QD_AMDGPU_ARCH: AMDGPU processors to compile for, comma-separated
    amdgpu_lld: str = ""                # QD_AMDGPU_LLD: the ld.lld to link code objects ("": found, docs/amdgpu.md)
    amdgpu_device_libs: str = ""        # QD_AMDGPU_DEVICE_LIBS: ROCm's device bitcode directory ("": from ROCm)
    device_id: int | None = None        # QD_DEVICE: the CUDA device of this process (None: the thread's current one)
    quadrants_options: dict = dataclasses.field(default_factory=dict)   # accepted Quadrants options without effect

    def for_kernel(self, *, fuse: bool | None, graph: bool) -> Config:
        """This config as one kernel sees it: ``@qd.kernel(fuse=...)`` overrides the global
        fusion switch, and a ``graph=True`` kernel never fuses (each loop stays a graph node)."""
        enabled = self.aggressive_kernel_fusion if fuse is None else bool(fuse)
        enabled = enabled and not graph
        if enabled == self.aggressive_kernel_fusion:
            return self
        return dataclasses.replace(self, aggressive_kernel_fusion=enabled)


QUADRANTS_IGNORED_OPTIONS = {
    # Quadrants' qd.init options that have no effect in qd_numba, with Quadrants' default (None:
    # not known here); docs/configuration.md says why each one does not apply.
    "opt_level": 1, "raise_on_templated_floats": False, "print_preprocessed_ir": False,
    "print_ir_dbg_info": False, "print_accessor_ir": False, "print_struct_llvm_ir": False,
    "print_kernel_llvm_ir": False, "print_kernel_llvm_ir_optimized": False, "print_kernel_asm": False,
    "print_kernel_amdgcn": False, "debug_dump_path": "", "move_loop_invariant_outside_if": False,
    "cache_loop_invariant_global_vars": True, "cpu_fixed_block_dim": 32, "default_gpu_block_dim": 128,
    "saturating_grid_dim": 0, "max_block_dim": 0, "cpu_per_worker_min_block_dim": 512,
    "demote_dense_struct_fors": True, "timeline": False, "device_memory_GB": 1.0, "device_memory_fraction": 0.0,
    "fast_math": True, "ad_stack_experimental_enabled": False, "ad_stack_sparse_threshold_bytes": None,
    "flatten_if": False, "make_thread_local": True, "make_block_local": True, "detect_read_only": True,
    "real_matrix_scalarize": True, "force_scalarize_matrix": False, "half2_vectorization": False,
    "cpu_work_scheduling": None, "make_cpu_multithreading_loop": None, "default_cpu_block_dim": None,
    "quant_opt_store_fusion": True, "quant_opt_atomic_demotion": True, "make_mesh_block_local": True,
    "mesh_localize_to_end_mapping": True, "mesh_localize_from_end_mapping": False,
    "optimize_mesh_reordered_mapping": True, "mesh_localize_all_attr_mappings": False,
    "demote_no_access_mesh_fors": True, "experimental_auto_mesh_local": False,
    "auto_mesh_local_default_occupacy": 4, "external_metal_command_queue": 0,
    "external_metal_command_queue_is_torch_queue": False, "gdb_trigger": False, "print_full_traceback": False,
    "unrolling_limit": 32, "print_non_pure": False, "src_ll_cache": True, "require_version": None,
}
OPTION_ALIASES = {"num_compile_threads": "compile_threads"}   # Quadrants' name -> ours
DEFAULT_FP_TYPES = (types.float16, types.float32, types.float64)   # as Quadrants allows
DEFAULT_IP_TYPES = (types.int32, types.int64)


def checked_default_type(key: str, value) -> types.Type:
    """``default_fp``/``default_ip`` as the Numba type it names (a qd dtype or a numpy one), or
    our error naming the option."""
    allowed = DEFAULT_FP_TYPES if key == "default_fp" else DEFAULT_IP_TYPES
    if not isinstance(value, types.Type):
        from numba.np.numpy_support import from_dtype

        try:
            value = from_dtype(np.dtype(value)) if value not in (int, float, bool) else value
        except (TypeError, NotImplementedError):
            pass
    if value not in allowed:
        names = ", ".join(f"qd.{'f' if isinstance(t, types.Float) else 'i'}{t.bitwidth}" for t in allowed)
        raise QuadrantsConfigError(f"qd.init({key}={value!r}): expected one of {names}")
    return value


def _env_default_type(name: str, allowed) -> types.Type | None:
    """``QD_DEFAULT_FP``/``QD_DEFAULT_IP``: ``32`` or ``64`` (bits), as Quadrants reads them."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    for t in allowed:
        if str(t.bitwidth) == raw:
            return t
    raise QuadrantsConfigError(f"{name}={raw!r}: expected one of {', '.join(str(t.bitwidth) for t in allowed)}")


def rocm_root() -> str:
    """The ROCm installation: ``ROCM_PATH`` (ROCm's own variable), else /opt/rocm."""
    return os.environ.get("ROCM_PATH", "").strip() or "/opt/rocm"


def _rocm_bitcode_dir() -> str:
    """ROCm's device bitcode directory (``<ROCm>/amdgcn/bitcode``), or "" when there is none."""
    path = os.path.join(rocm_root(), "amdgcn", "bitcode")
    return path if os.path.isdir(path) else ""


def amdgpu_archs(cfg: Config) -> tuple[str, ...]:
    """The AMDGPU processors of ``cfg.amdgpu_arch`` (a comma-separated list or a sequence)."""
    raw = cfg.amdgpu_arch
    names = raw.split(",") if isinstance(raw, str) else list(raw)
    archs = tuple(n.strip().lower() for n in names if n.strip())
    if not archs:
        raise QuadrantsConfigError(f"amdgpu_arch={raw!r}: expected AMDGPU processor names such as 'gfx942'")
    return archs


def config_from_env(**overrides) -> Config:
    level = os.environ.get("QD_LOG_LEVEL", "").strip()
    cfg = Config(
        debug=env_flag("QD_DEBUG"),
        print_ir=env_flag("QD_DUMP_IR"),
        dump_generated=env_flag("QD_DUMP_GENERATED"),
        cuda_compile_check=env_flag("QD_CUDA_COMPILE_CHECK"),
        raw_errors=env_flag("QD_RAW_ERRORS"),
        aggressive_kernel_fusion=env_flag("QD_AGGRESSIVE_KERNEL_FUSION"),
        aggressive_kernel_fusion_raw=env_flag("QD_AGGRESSIVE_KERNEL_FUSION_RAW", True),
        aggressive_kernel_fusion_diag=env_flag("QD_AGGRESSIVE_KERNEL_FUSION_DIAG"),
        kernel_fusion_budget=env_int("QD_KERNEL_FUSION_BUDGET", 600),
        verify_each_pass=env_flag("QD_VERIFY_EACH_PASS"),
        kernel_profiler=env_flag("QD_KERNEL_PROFILER"),
        log_level=log_level(level, "QD_LOG_LEVEL") if level else None,
        offline_cache=env_flag("QD_OFFLINE_CACHE", True),
        offline_cache_file_path=os.environ.get("QD_OFFLINE_CACHE_FILE_PATH", ""),
        offline_cache_max_size_of_files=env_int("QD_OFFLINE_CACHE_MAX_SIZE_OF_FILES", 100 * 1024 * 1024),
        offline_cache_cleaning_policy=os.environ.get("QD_OFFLINE_CACHE_CLEANING_POLICY", "lru").strip().lower(),
        offline_cache_cleaning_factor=env_float("QD_OFFLINE_CACHE_CLEANING_FACTOR", 0.25),
        compile_threads=env_int("QD_COMPILE_THREADS", 0),
        compile_processes=env_int("QD_COMPILE_PROCESSES", 0),
        warp_reduce=env_flag("QD_WARP_REDUCE", True),
        cuda_graph=env_flag("QD_GRAPH", True),
        auto_graph=env_flag("QD_AUTO_GRAPH", True),
        cfg_optimization=env_flag("QD_CFG_OPTIMIZATION", True),
        cfg_optimization_per_task=env_flag("QD_CFG_OPTIMIZATION_PER_TASK", True),
        task_pipeline=os.environ.get("QD_TASK_PIPELINE", "gated").strip().lower(),
        ad_stack_size=env_int("QD_AD_STACK_SIZE", 0),
        ad_stack_sizer=os.environ.get("QD_AD_STACK_SIZER", "auto").strip().lower(),
        pointer_pool_fraction=env_float("QD_POINTER_POOL_FRACTION", 1.0),
        amdgpu_compile_check=env_flag("QD_AMDGPU_COMPILE_CHECK"),
        amdgpu_arch=os.environ.get("QD_AMDGPU_ARCH", "").strip() or "gfx942",
        amdgpu_lld=os.environ.get("QD_AMDGPU_LLD", "").strip(),
        amdgpu_device_libs=os.environ.get("QD_AMDGPU_DEVICE_LIBS", "").strip() or _rocm_bitcode_dir(),
        device_id=env_int("QD_DEVICE", 0) if os.environ.get("QD_DEVICE", "").strip() else None,
    )
    cfg.default_fp = _env_default_type("QD_DEFAULT_FP", DEFAULT_FP_TYPES) or cfg.default_fp
    cfg.default_ip = _env_default_type("QD_DEFAULT_IP", DEFAULT_IP_TYPES) or cfg.default_ip
    for key, value in overrides.items():
        key = OPTION_ALIASES.get(key, key)
        if key in QUADRANTS_IGNORED_OPTIONS:
            cfg.quadrants_options[key] = value
            continue
        if key == "default_up":
            raise QuadrantsConfigError("qd.init(default_up=...): 'default_up' is always the unsigned type of "
                                       "'default_ip'; set 'default_ip' instead")
        if key == "quadrants_options" or not hasattr(cfg, key):
            raise QuadrantsConfigError(f"qd.init() got an unknown option {key!r}")
        if key in ("default_fp", "default_ip"):
            value = checked_default_type(key, value)
        setattr(cfg, key, log_level(value) if key == "log_level" and value is not None else value)
    cfg.debug = cfg.debug or cfg.check_out_of_bound
    cfg.cfg_optimization = cfg.cfg_optimization and cfg.advanced_optimization
    if cfg.offline_cache_cleaning_policy not in CLEANING_POLICIES:
        raise QuadrantsConfigError(f"offline_cache_cleaning_policy={cfg.offline_cache_cleaning_policy!r}: "
                                   f"expected one of {', '.join(CLEANING_POLICIES)}")
    if cfg.task_pipeline not in ("gated", "full"):
        raise QuadrantsConfigError(f"task_pipeline={cfg.task_pipeline!r}: expected 'gated' or 'full'")
    if cfg.ad_stack_sizer not in AD_STACK_SIZERS:
        raise QuadrantsConfigError(f"ad_stack_sizer={cfg.ad_stack_sizer!r}: "
                                   f"expected one of {', '.join(AD_STACK_SIZERS)}")
    for name, zero in (("compile_threads", "one per CPU core"), ("compile_processes", "chosen per kernel")):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise QuadrantsConfigError(f"{name}={value!r}: expected an integer >= 0 (0: {zero})")
    if cfg.device_id is not None:
        if isinstance(cfg.device_id, bool) or not isinstance(cfg.device_id, (int, np.integer)) or cfg.device_id < 0:
            raise QuadrantsConfigError(f"device_id={cfg.device_id!r}: expected a CUDA device number >= 0 (QD_DEVICE, "
                                       "qd.init(device_id=...)) or None (the device current in the calling thread)")
        cfg.device_id = int(cfg.device_id)
    fraction = cfg.pointer_pool_fraction
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise QuadrantsConfigError(f"pointer_pool_fraction={fraction!r}: expected a number in (0, 1]")
    return cfg


current = config_from_env()
