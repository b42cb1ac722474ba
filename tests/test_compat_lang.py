"""Quadrants' module layout and runtime queries (qd_numba/lang/): ``qd.lang.impl``/``exception``/
``misc``/``util``/``ops``, ``qd.cfg``, ``qd.extension``, error names, and fields across ``qd.init``."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import qd_numba as qd

# quadrants.lang.exception.__all__ (Quadrants 1.4), plus QuadrantsIndexError, which it defines
ERROR_NAMES = ["QuadrantsSyntaxError", "QuadrantsTypeError", "QuadrantsCompilationError", "QuadrantsNameError",
               "QuadrantsRuntimeError", "QuadrantsRuntimeTypeError", "QuadrantsAssertionError"]


@pytest.fixture
def reinit(arch):
    yield lambda **options: qd.init(arch=getattr(qd, arch), **options)
    qd.init(arch=getattr(qd, arch))


def test_lang_is_a_package_keeping_its_names():
    from qd_numba.lang import ATOMIC_FUNCTIONS, grouped, loop_config, ndrange, static

    assert qd.ndrange is ndrange and qd.grouped is grouped and qd.static is static
    assert qd.loop_config is loop_config and qd.atomic_add in ATOMIC_FUNCTIONS
    for module in ("impl", "exception", "misc", "util", "ops"):
        assert getattr(qd.lang, module).__name__ == f"qd_numba.lang.{module}"


@pytest.mark.parametrize("name", ERROR_NAMES + ["QuadrantsIndexError"])
def test_error_names_from_both_places_are_our_classes(name):
    from qd_numba.lang import exception

    cls = getattr(exception, name)
    assert getattr(qd, name) is cls and issubclass(cls, qd.QuadrantsError)
    assert set(ERROR_NAMES) <= set(exception.__all__)


def test_error_hierarchy_as_quadrants():
    assert issubclass(qd.QuadrantsRuntimeTypeError, qd.QuadrantsRuntimeError)
    assert issubclass(qd.QuadrantsRuntimeTypeError, TypeError)
    assert issubclass(qd.QuadrantsAssertionError, qd.QuadrantsRuntimeError)
    assert issubclass(qd.QuadrantsAssertionError, AssertionError)
    assert issubclass(qd.QuadrantsSyntaxError, qd.QuadrantsCompilationError)
    e = qd.QuadrantsRuntimeTypeError.get(2, "i32", "str")
    assert isinstance(e, qd.QuadrantsRuntimeTypeError) and "Argument 2 (type=str)" in str(e)
    assert "Return (type=f64)" in str(qd.QuadrantsRuntimeTypeError.get_ret("i32", "f64"))


def test_runtime_config_follows_init(reinit, arch):
    runtime = qd.lang.impl.get_runtime()
    reinit(debug=True, default_fp=qd.f64, default_ip=qd.i64, random_seed=5)
    cfg = runtime.prog.config()
    assert cfg.arch == getattr(qd, arch) and cfg.debug and cfg.random_seed == 5
    assert runtime.default_fp == qd.f64 and runtime.default_ip == qd.i64 and runtime.default_up == qd.u64
    assert qd.lang.impl.current_cfg().default_fp == qd.f64 and qd.cfg.default_ip == qd.i64
    reinit()
    assert not cfg.debug and cfg.default_fp == qd.f32 and qd.cfg.default_up == qd.u32


@qd.kernel
def halve(x: float) -> float:
    return x / 2.0


def test_set_default_fp_recompiles_and_num_compiled_functions_counts(reinit, rng):
    runtime = qd.lang.impl.get_runtime()
    reinit()
    assert runtime.get_num_compiled_functions() == 0
    x = 1.0 + rng.random() * 1e-9
    assert halve(x) == np.float32(x) / 2
    assert runtime.get_num_compiled_functions() == 1
    runtime.set_default_fp(qd.f64)
    assert runtime.get_num_compiled_functions() == 0
    assert halve(x) == x / 2
    with pytest.raises(qd.QuadrantsConfigError, match="default_ip"):
        runtime.set_default_ip(qd.f32)
    runtime.set_default_ip(qd.i64)
    assert qd.cfg.default_ip == qd.i64 and qd.cfg.default_up == qd.u64


def test_extensions_report_what_qd_numba_has(reinit):
    ext = qd.extension
    assert {e.name for e in ext} == {"sparse", "quant", "mesh", "quant_basic", "data64", "adstack", "bls",
                                     "assertion", "extfunc"}
    for arch in (qd.cpu, qd.cuda):
        assert qd.is_extension_enabled(arch, ext.data64) and qd.is_extension_enabled(arch, ext.adstack)
        assert qd.lang.misc.is_extension_supported(arch, ext.assertion)
        assert qd.lang.misc.is_extension_supported(arch, ext.sparse)
        for missing in (ext.quant, ext.quant_basic, ext.mesh, ext.bls, ext.extfunc):
            assert not qd.is_extension_enabled(arch, missing)
    assert not qd.lang.misc.is_extension_supported(qd.vulkan, ext.data64)
    assert qd.is_extension_enabled(ext.data64) and not qd.is_extension_enabled(ext.quant)   # the arch in force


def test_misc_queries():
    assert qd.lang.misc.get_host_arch_list() == [qd.cpu]
    assert qd.lang.misc.is_arch_supported(qd.cpu) and not qd.lang.misc.is_arch_supported(qd.metal)


def test_util_dtype_helpers(reinit):
    util = qd.lang.util
    reinit(default_fp=qd.f64)
    assert util.cook_dtype(float) == qd.f64 and util.cook_dtype(int) == qd.i32 and util.cook_dtype(qd.u8) == qd.u8
    assert util.to_numpy_type(qd.f16) is np.float16 and util.to_numpy_type(qd.i64) is np.int64
    assert util.to_quadrants_type(np.float32) == qd.f32 and util.to_quadrants_type(np.dtype("u2")) == qd.u16
    assert util.in_python_scope() and not util.in_quadrants_scope()


def test_ops_are_the_same_operations(rng):
    ops = qd.lang.ops
    for name in ops.__all__:
        assert getattr(ops, name) is getattr(qd, name), name

    @qd.kernel
    def apply(a: qd.types.ndarray(dtype=qd.f32, ndim=1), total: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in a:
            a[i] = ops.sqrt(a[i]) + ops.max(a[i], 0.5)
            ops.atomic_add(total[0], a[i])

    a = rng.random(64).astype(np.float32)
    expected = np.sqrt(a) + np.maximum(a, np.float32(0.5))
    total = np.zeros(1, np.float32)
    apply(a, total)
    np.testing.assert_allclose(a, expected, rtol=1e-6)
    np.testing.assert_allclose(total[0], expected.sum(dtype=np.float64), rtol=1e-5)


def test_field_used_before_a_later_init_is_our_error_naming_it(reinit, rng):
    reinit()
    temperature = qd.field(qd.f32, shape=8, name="temperature")
    values = rng.random(8).astype(np.float32)
    temperature.from_numpy(values)

    @qd.kernel
    def warm():
        for i in temperature:
            temperature[i] += 1.0

    warm()
    np.testing.assert_array_equal(temperature.to_numpy(), values + np.float32(1))
    reinit()
    for use in (lambda: temperature[0], lambda: temperature.to_numpy(), lambda: temperature.fill(1), warm):
        with pytest.raises(qd.QuadrantsRuntimeError, match="field 'temperature'.*belongs to an earlier qd.init"):
            use()
    late = qd.field(qd.f32, shape=4, name="late")
    late[1] = 2.0
    qd.reset()
    with pytest.raises(qd.QuadrantsRuntimeError, match="field 'late'"):
        late[1] = 3.0


def test_field_declared_before_init_and_unused_moves_to_it(reinit, rng):
    declared = qd.field(qd.f32, shape=16, name="declared")
    reinit(debug=True)
    values = rng.random(16).astype(np.float32)

    @qd.kernel
    def load(src: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in declared:
            declared[i] = src[i] * 2.0

    load(values)
    np.testing.assert_array_equal(declared.to_numpy(), values * np.float32(2))


def test_fields_and_kernels_before_any_init_run_on_the_cpu(rng):
    values = rng.random(5).round(3).tolist()
    script = textwrap.dedent(f"""
        import numpy as np
        import qd_numba as qd
        x = qd.field(qd.f32, shape=5)
        x.from_numpy(np.array({values}, np.float32))

        @qd.kernel
        def total() -> float:
            s = 0.0
            for i in range(5):
                s += x[i]
            return s

        print(repr(float(total())), qd.cfg.arch)
        qd.init()
        try:
            x[0]
        except qd.QuadrantsRuntimeError:
            print("released")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    assert float(out[0]) == pytest.approx(float(np.float32(values).sum()), rel=1e-6)
    assert out[1:] == ["cpu", "released"]
