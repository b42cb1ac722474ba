"""``qd.init`` options as Quadrants documents them (config.py, runtime.py; docs/configuration.md):
every option is accepted, the honoured ones change behaviour, an unknown name is our error."""

from __future__ import annotations

import logging
import textwrap
import warnings

import numpy as np
import pytest

import qd_numba as qd
from qd_numba.targets.cuda.compile import cuda_available

# Quadrants 1.4's qd.init options: the keyword parameters of quadrants.lang.misc.init, the fields
# of its CompileConfig (quadrants_python.pyi) and of its _SpecialConfig, and the deprecated aliases.
QUADRANTS_OPTIONS = {
    "default_fp": qd.f64, "default_ip": qd.i64, "enable_fallback": True, "require_version": "1.4.0",
    "print_non_pure": True, "src_ll_cache": False,
    "opt_level": 0, "raise_on_templated_floats": True, "print_ir": False, "print_preprocessed_ir": True,
    "print_ir_dbg_info": True, "debug": True, "cfg_optimization": False, "check_out_of_bound": True,
    "print_accessor_ir": True, "print_struct_llvm_ir": True, "print_kernel_llvm_ir": True,
    "print_kernel_llvm_ir_optimized": True, "print_kernel_asm": True, "print_kernel_amdgcn": True,
    "debug_dump_path": "/tmp/qd_dump", "move_loop_invariant_outside_if": True,
    "cache_loop_invariant_global_vars": False, "cpu_fixed_block_dim": 64, "default_gpu_block_dim": 256,
    "saturating_grid_dim": 8, "max_block_dim": 512, "cpu_max_num_threads": 1, "cpu_per_worker_min_block_dim": 16,
    "random_seed": 7, "demote_dense_struct_fors": False, "kernel_profiler": True, "timeline": True,
    "device_memory_GB": 2.0, "device_memory_fraction": 0.5, "fast_math": False, "advanced_optimization": False,
    "ad_stack_experimental_enabled": True, "ad_stack_size": 64, "ad_stack_sparse_threshold_bytes": 1024,
    "flatten_if": True, "make_thread_local": False, "make_block_local": False, "detect_read_only": False,
    "real_matrix_scalarize": False, "force_scalarize_matrix": True, "half2_vectorization": True,
    "cpu_work_scheduling": "FIXED_SIZE", "quant_opt_store_fusion": False, "quant_opt_atomic_demotion": False,
    "make_mesh_block_local": False, "mesh_localize_to_end_mapping": False, "mesh_localize_from_end_mapping": True,
    "optimize_mesh_reordered_mapping": False, "mesh_localize_all_attr_mappings": True,
    "demote_no_access_mesh_fors": False, "experimental_auto_mesh_local": True,
    "auto_mesh_local_default_occupacy": 2, "offline_cache": False, "offline_cache_file_path": "/tmp/qd_cache",
    "offline_cache_cleaning_policy": "fifo", "offline_cache_max_size_of_files": 1 << 20,
    "offline_cache_cleaning_factor": 0.5, "num_compile_threads": 2, "cuda_stack_limit": 4096,
    "external_metal_command_queue": 0, "external_metal_command_queue_is_torch_queue": False,
    "log_level": "error", "gdb_trigger": False, "short_circuit_operators": True, "print_full_traceback": True,
    "unrolling_limit": 8, "make_cpu_multithreading_loop": False, "default_cpu_block_dim": 16,
}


@pytest.fixture
def reinit(arch):
    """qd.init on the test's arch; the module's configuration is restored afterwards."""
    yield lambda **options: qd.init(arch=getattr(qd, arch), **options)
    qd.init(arch=getattr(qd, arch))


def test_every_quadrants_option_is_accepted_and_readable_in_cfg(reinit):
    for name, value in QUADRANTS_OPTIONS.items():
        if name == "enable_fallback":
            continue
        reinit(**{name: value})
        expected = "error" if name == "log_level" else value
        assert getattr(qd.cfg, name) == expected, name
        assert getattr(qd.lang.impl.get_runtime().prog.config(), name) == expected, name
    reinit(**{k: v for k, v in QUADRANTS_OPTIONS.items() if k not in ("cuda_stack_limit", "kernel_profiler")})
    assert qd.cfg.opt_level == 0 and qd.cfg.default_fp == qd.f64 and qd.cfg.debug


@pytest.mark.parametrize("option", ["foo", "opt_levle", "quadrants_options"])
def test_unknown_option_is_our_error_naming_it(reinit, option):
    with pytest.raises(qd.QuadrantsConfigError, match=f"unknown option '{option}'"):
        reinit(**{option: 1})


@pytest.mark.parametrize("option, value", [("default_fp", qd.i32), ("default_fp", float), ("default_ip", qd.f32),
                                           ("default_ip", qd.u32)])
def test_default_types_outside_quadrants_choices_are_our_error(reinit, option, value):
    with pytest.raises(qd.QuadrantsConfigError, match=rf"qd.init\({option}="):
        reinit(**{option: value})


def test_default_up_is_refused_as_in_quadrants(reinit):
    with pytest.raises(qd.QuadrantsConfigError, match="'default_up' is always the unsigned type of 'default_ip'"):
        reinit(default_up=qd.u64)


@qd.kernel
def scale(x: float, a: qd.types.ndarray(dtype=float, ndim=1)) -> float:
    for i in a:
        a[i] = a[i] * x
    return x * 0.5


@qd.kernel
def offset(n: int) -> int:
    return n + 1


def test_default_fp_reaches_a_kernel_defined_and_compiled_before_init(reinit, rng):
    x = 1.0 + rng.random() * 1e-9     # not representable in f32
    a32 = rng.random(8).astype(np.float32)
    expected32 = a32 * np.float32(x)
    reinit()
    assert scale(x, a32) == pytest.approx(np.float32(np.float32(x) * np.float32(0.5)), rel=0)
    np.testing.assert_array_equal(a32, expected32)
    reinit(default_fp=qd.f64)
    a64 = rng.random(8)
    expected64 = a64 * x
    assert scale(x, a64) == x * 0.5
    np.testing.assert_array_equal(a64, expected64)
    with pytest.raises(qd.QuadrantsTypeError, match="expected dtype float64, got float32"):
        scale(x, a32)


def test_default_ip_reaches_a_kernel_defined_before_init(reinit, rng):
    n = int(rng.integers(2**33, 2**40))
    reinit(default_ip=qd.i64)
    assert offset(n) == n + 1
    reinit()
    assert offset(int(n % 2**20)) == n % 2**20 + 1


def test_default_fp_from_the_environment(reinit, monkeypatch):
    monkeypatch.setenv("QD_DEFAULT_FP", "64")
    reinit()
    assert qd.cfg.default_fp == qd.f64 and qd.field(float, shape=2).dtype == qd.f64
    monkeypatch.setenv("QD_DEFAULT_FP", "16x")
    with pytest.raises(qd.QuadrantsConfigError, match="QD_DEFAULT_FP='16x'"):
        reinit()


@qd.kernel
def draw(out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in out:
        out[i] = qd.random()


def test_random_seed_makes_qd_random_reproducible(reinit, rng):
    seed = int(rng.integers(1, 1000))
    runs = []
    for s in (seed, seed, seed + 1):
        reinit(random_seed=s)
        out = np.zeros(256, np.float32)
        draw(out)
        runs.append((out, qd.random()))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1]
    assert not np.array_equal(runs[0][0], runs[2][0])
    assert ((runs[0][0] >= 0) & (runs[0][0] < 1)).all() and np.unique(runs[0][0]).size > 200


@pytest.mark.skipif(cuda_available(), reason="a GPU is present: nothing to fall back from")
def test_enable_fallback_runs_gpu_programs_on_the_cpu(reinit, arch, rng):
    with pytest.warns(qd.QuadrantsWarning, match="falling back to qd.cpu"):
        qd.init(arch=qd.gpu)
    assert qd.cfg.arch == qd.cpu
    a = rng.random(8).astype(np.float32)
    scale(2.0, a)       # runs
    with pytest.raises(qd.QuadrantsRuntimeError, match="no usable NVIDIA GPU"):
        qd.init(arch=qd.gpu, enable_fallback=False)
    with pytest.raises(qd.QuadrantsRuntimeError, match="no usable NVIDIA GPU"):
        qd.init(arch=qd.cuda)          # an explicit qd.cuda does not fall back unless asked
    with pytest.warns(qd.QuadrantsWarning):
        qd.init(arch=qd.cuda, enable_fallback=True)
    assert qd.cfg.arch == qd.cpu
    qd.init(arch=getattr(qd, arch))


@qd.kernel
def gather(a: qd.types.ndarray(dtype=qd.f32, ndim=1), idx: qd.types.ndarray(dtype=qd.i32, ndim=1),
           out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in out:
        j = idx[i]
        if j < a.shape[0] and a[j] > 0.5:       # short-circuit: a[j] is not read out of bounds
            out[i] = a[j]


def test_check_out_of_bound_and_short_circuit_operators(reinit, rng):
    a = rng.random(16).astype(np.float32)
    idx = rng.integers(0, 32, 64).astype(np.int32)
    reinit(check_out_of_bound=True, short_circuit_operators=True)
    assert qd.cfg.check_out_of_bound and qd.cfg.debug
    out = np.zeros(64, np.float32)
    gather(a, idx, out)
    inside = idx < 16
    expected = np.where(inside, a[np.minimum(idx, 15)], 0)
    np.testing.assert_array_equal(out, np.where(expected > 0.5, expected, 0))

    @qd.kernel
    def unchecked(a: qd.types.ndarray(dtype=qd.f32, ndim=1), idx: qd.types.ndarray(dtype=qd.i32, ndim=1),
                  out: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in out:
            out[i] = a[idx[i]]

    with pytest.raises(qd.QuadrantsRuntimeError, match="unchecked"):
        unchecked(a, idx, out)


def test_advanced_optimization_off_turns_optimisations_off(reinit, rng):
    reinit(advanced_optimization=False)
    assert not qd.cfg.cfg_optimization
    a = rng.random(8).astype(np.float32)
    expected = a * np.float32(3.0)
    scale(3.0, a)
    np.testing.assert_array_equal(a, expected)


def test_log_level_and_print_ir(reinit, capfd, rng):
    reinit(log_level=qd.ERROR)
    assert logging.getLogger("qd_numba").level == logging.ERROR
    reinit(print_ir=True)

    @qd.kernel
    def twice(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in a:
            a[i] = a[i] * 2.0

    a = rng.random(4).astype(np.float32)
    twice(a)
    assert "twice" in capfd.readouterr().err


def test_num_compile_threads_is_quadrants_name_of_compile_threads(reinit):
    reinit(num_compile_threads=3)
    assert qd.cfg.compile_threads == 3
    with pytest.raises(qd.QuadrantsConfigError, match="compile_threads=-1"):
        reinit(num_compile_threads=-1)


def test_ignored_options_keep_their_quadrants_default_when_not_passed(reinit):
    reinit(opt_level=0)
    reinit()
    assert qd.cfg.opt_level == 1 and qd.cfg.default_gpu_block_dim == 128
    with pytest.raises(qd.QuadrantsConfigError, match="read-only"):
        qd.cfg.opt_level = 2


@pytest.mark.cuda
def test_cuda_stack_limit_sets_the_per_thread_stack():
    from cuda.bindings import driver

    qd.init(arch=qd.cuda, cuda_stack_limit=16384)
    try:
        err, value = driver.cuCtxGetLimit(driver.CUlimit.CU_LIMIT_STACK_SIZE)
        assert int(err) == 0 and value == 16384
    finally:
        qd.init(arch=qd.cuda)


def test_no_warning_without_fallback(reinit):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reinit()


def test_a_kernel_reads_the_fields_its_globals_name_after_a_new_init(reinit, rng):
    """The common script shape: qd.init, a module-level field and a kernel using it, then qd.init
    again and the field made again under the same name: the kernel uses the new field (its globals
    are read again after each qd.init), and the old field is refused by name."""
    source = textwrap.dedent("""
        @qd.kernel
        def double():
            for i in range(8):
                data[i] = data[i] * 2.0
    """)
    ns = {"qd": qd, "data": qd.field(qd.f32, shape=8, name="data")}
    exec(source, ns)
    old = ns["data"]
    first = rng.random(8).astype(np.float32)
    old.from_numpy(first)
    ns["double"]()
    np.testing.assert_allclose(old.to_numpy(), first * 2, rtol=1e-6)
    reinit()
    ns["data"] = qd.field(qd.f32, shape=8, name="data")
    second = rng.random(8).astype(np.float32)
    ns["data"].from_numpy(second)
    ns["double"]()
    np.testing.assert_allclose(ns["data"].to_numpy(), second * 2, rtol=1e-6)
    with pytest.raises(qd.QuadrantsRuntimeError, match="field 'data'"):
        old.to_numpy()
