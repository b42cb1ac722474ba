"""``qd.volatile_load(x[i])``: a field or ndarray element read with volatile semantics (LLVM
``load volatile`` on the CPU, ``ld.volatile.global`` in the CUDA PTX), against numpy on random
data; any argument but an element is our error naming the kernel and line."""

import numba
import numpy as np
import pytest
from numba.core import types

import qd_numba as qd
from qd_numba.ops.volatile import volatile_element_load
from qd_numba.targets.cuda.compile import numba_cuda_importable

N = 64
flags = qd.field(qd.i32, shape=N)
vecs = qd.Vector.field(3, qd.f32, shape=N)
halves = qd.field(qd.f16, shape=N)
out = qd.field(qd.f64, shape=N)


@qd.kernel
def read_volatile(a: qd.types.ndarray(dtype=qd.f64, ndim=2)):
    for i in range(N):
        v = qd.volatile_load(vecs[i])
        out[i] = qd.volatile_load(flags[(i * 7) % N]) + qd.volatile_load(a[i, 1]) + v.dot(v) \
            + qd.volatile_load(halves[N - 1 - i])


def test_volatile_load_reads_the_elements(rng):
    f = rng.integers(-1000, 1000, N).astype(np.int32)
    v = rng.normal(size=(N, 3)).astype(np.float32)
    h = rng.normal(size=N).astype(np.float16)
    a = rng.normal(size=(N, 2))
    flags.from_numpy(f)
    vecs.from_numpy(v)
    halves.from_numpy(h)
    read_volatile(a)
    ref = f[(np.arange(N) * 7) % N] + a[:, 1] + (v.astype(np.float64) ** 2).sum(1) + h[::-1].astype(np.float64)
    np.testing.assert_allclose(out.to_numpy(), ref, rtol=1e-5, atol=1e-5)


def test_cpu_lowering_is_a_volatile_load():
    @numba.njit
    def read(a, i):
        return volatile_element_load(a, i)

    a = np.arange(5, dtype=np.float32) * 1.5
    assert read(a, 3) == a[3]
    llvm = read.inspect_llvm(read.signatures[0])
    assert "load volatile float" in llvm


@pytest.mark.skipif(not numba_cuda_importable(), reason="numba-cuda (the 'cuda' extra) is not installed")
def test_cuda_ptx_has_volatile_global_loads():
    from qd_numba.targets.cuda.plan import compile_check

    compiled = compile_check(read_volatile, {"a": types.Array(types.float64, 2, "C")}, {})
    lines = [ln.strip() for *_, task in compiled for ln in task.ptx.splitlines() if "ld.volatile.global" in ln]
    kinds = {ln.split()[0] for ln in lines}
    # the i32 flag, the f64 ndarray element, the 3 f32 components, the f16 bits
    assert {"ld.volatile.global.u32", "ld.volatile.global.f64", "ld.volatile.global.f32",
            "ld.volatile.global.u16"} <= kinds, lines
    # the loop may be unrolled: three component loads per copy
    assert sum(ln.startswith("ld.volatile.global.f32") for ln in lines) % 3 == 0, lines


@qd.kernel
def unindexed_field():
    for i in range(4):
        out[i] = qd.volatile_load(flags)


@qd.kernel
def local_value(x: qd.f32):
    for i in range(4):
        y = x * 2
        out[i] = qd.volatile_load(y)


@qd.kernel
def component():
    for i in range(4):
        out[i] = qd.volatile_load(vecs[i][1])


def _raises(kernel, *fragments, args=()):
    with pytest.raises(qd.QuadrantsSyntaxError) as info:
        kernel(*args)
    text = str(info.value)
    for fragment in (f"kernel '{kernel.name}'", *fragments):
        assert fragment in text, text


def test_volatile_load_of_a_non_element_is_our_error():
    _raises(unindexed_field, "cannot pass a field or ndarray directly to qd.volatile_load; index it first",
            "out[i] = qd.volatile_load(flags)")
    _raises(local_value, "requires an element of a field or ndarray (x[i]) as its argument, got a local value",
            "out[i] = qd.volatile_load(y)", args=(1.0,))
    _raises(component, "got a component of an element", "qd.volatile_load(vecs[i][1])")
    with pytest.raises(qd.QuadrantsSyntaxError, match="only be used inside a kernel or func"):
        qd.volatile_load(flags[0])
