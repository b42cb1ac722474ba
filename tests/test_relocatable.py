"""Compiled code is relocatable: nothing in it depends on the process that compiled it.

The same program compiled in two processes, one of which created other fields and compiled
other kernels first, gives the same artefact key, the same CUDA code (fields reached through
kernel-local context slots, exception codes hashed from content) and the same device exception
codes. Template values are described by content (frontend/keys.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import qd_numba as qd
from qd_numba import config as qd_config
from qd_numba.frontend.keys import value_key
from qd_numba.targets.cuda.compile import numba_cuda_importable

_PROGRAM = textwrap.dedent('''
    import json, re, sys
    import numpy as np
    import qd_numba as qd
    from numba.core import types
    qd.init(arch=qd.cpu, debug=True)
    if sys.argv[1] == "busy":   # other fields and kernels first: global slots would shift
        extra = [qd.field(qd.f32, shape=(3 + k,)) for k in range(7)]
        @qd.kernel
        def other(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
            for i in range(a.shape[0]):
                extra[5][0] += a[i]
        other(np.ones(4, np.float32))
    x = qd.field(qd.f32, shape=(16,))
    y = qd.field(qd.f32, shape=(16,))
    @qd.kernel
    def k(a: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32, t: qd.template()):
        for i in range(a.shape[0]):
            x[i] = a[i] * s
        for i in y:
            y[i] += x[i] + t[i]
    t = qd.field(qd.f32, shape=(16,))
    a = np.arange(16, dtype=np.float32)
    k(a, 2.0, t)
    out = {"key": k.last_instance.artifact_key, "ptx": []}
    from qd_numba.lowering.raising import device_code
    out["code"] = device_code(IndexError, ("index out of bounds on axis 0",))
    if sys.argv[2] == "1":
        from qd_numba.targets.cuda.plan import compile_check
        compiled = compile_check(k, {"a": types.Array(types.float32, 1, "C"), "s": types.float32}, {"t": t})
        for _unit, _tk, c in compiled:
            # Numba emits module-level declarations in the order its caches were filled, and names
            # the (never dereferenced) environment placeholders of inlined overloads with its
            # per-process function counter (the ``v<n>`` ABI tag): neither is an address
            lines = [re.sub(r"B\\d+v\\d+B", "B_vN_B", ln) if "NumbaEnv" in ln else ln for ln in c.ptx.splitlines()]
            decls = sorted(ln for ln in lines if ln.startswith((".common", ".extern", ".global", ".visible .global")))
            out["ptx"].append([ln for ln in lines if ln not in decls] + decls)
    print(json.dumps(out))
''')


def _run(mode: str, cuda: bool) -> dict:
    proc = subprocess.run([sys.executable, "-c", _PROGRAM, mode, "1" if cuda else "0"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.no_cuda_compile_check
def test_same_program_compiles_to_the_same_code_in_another_process():
    cuda = numba_cuda_importable()
    quiet, busy = _run("quiet", cuda), _run("busy", cuda)
    assert quiet["key"] is not None and quiet["key"] == busy["key"]
    assert quiet["code"] == busy["code"]
    if cuda:
        assert len(quiet["ptx"]) == 2
        assert quiet["ptx"] == busy["ptx"]


def test_template_values_are_keyed_by_content():
    a, b = qd.field(qd.f32, shape=(8,)), qd.field(qd.f32, shape=(8,))
    assert value_key(a) == value_key(b)
    assert value_key(a) != value_key(qd.field(qd.f32, shape=(9,)))
    assert value_key(a) != value_key(qd.field(qd.i32, shape=(8,)))
    assert value_key(a) != value_key(qd.Vector.field(2, qd.f32, shape=(8,)))
    assert value_key((1, 2.5, "s")) == value_key((1, 2.5, "s")) != value_key((1, 2.5, "t"))
    assert value_key(1) != value_key(1.0) and value_key(True) != value_key(1)
    assert value_key(object()) is None and value_key((1, object())) is None


def _artifact_key(kernel, *args):
    """The content key of the compiled code these arguments select, on the suite's arch."""
    if qd_config.current.arch == "cpu":
        return kernel.last_instance.artifact_key
    return kernel.backend().plan_for(args).artifact_key


def test_artifact_key_follows_what_changes_the_code(rng):
    @qd.kernel
    def scale(t: qd.template(), s: qd.f32):
        for i in t:
            t[i] *= s

    keys = []
    for shape in ((8,), (8,), (9,)):
        f = qd.field(qd.f32, shape=shape)
        data = rng.random(shape).astype(np.float32)
        f.from_numpy(data)
        scale(f, 3.0)
        np.testing.assert_allclose(f.to_numpy(), data * 3.0, rtol=1e-6)
        keys.append(_artifact_key(scale, f, 3.0))
    assert keys[0] == keys[1] != keys[2]

    class Opaque:
        pass

    @qd.kernel
    def with_object(o: qd.template(), a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] += 1.0

    arr = rng.random(4).astype(np.float32)
    opaque = Opaque()
    with_object(opaque, arr.copy())
    assert _artifact_key(with_object, opaque, arr) is None  # no content description: this process only


@pytest.mark.no_cuda_compile_check   # a CPU calling convention: the CUDA compile check adds nothing
def test_cpu_kernel_takes_one_field_table_however_many_fields(rng):
    """The CPU entry point takes the runtime arguments and one field-table address, not one array
    per field; fields read in serial code and in tasks, strided SNode views (AoS, blocked) and
    fields created after a kernel compiled are all reached through it."""
    if qd_config.current.arch != "cpu":
        pytest.skip("the CPU target's entry point")
    n = 12
    many = tuple(qd.field(qd.f32, shape=(n,)) for _ in range(20))
    aos_x, aos_y = qd.field(qd.f32), qd.field(qd.f32)
    qd.root.dense(qd.i, n).place(aos_x, aos_y)
    blocked = qd.field(qd.f64)
    qd.root.dense(qd.i, 3).dense(qd.i, 4).place(blocked)
    total = qd.field(qd.f32, shape=())

    @qd.kernel
    def spread(s: qd.f32):
        total[None] = many[0][1] * s              # serial code reads fields too
        for i in range(n):
            for j in qd.static(range(1, 20)):
                many[j][i] = many[0][i] * j + total[None]
        for i in aos_x:
            aos_y[i] = aos_x[i] + blocked[i]
        for i in blocked:
            blocked[i] = blocked[i] * 2.0

    data = [rng.random(n).astype(np.float32) for _ in range(3)]
    base_blocked = rng.random(n)
    many[0].from_numpy(data[0])
    aos_x.from_numpy(data[1])
    blocked.from_numpy(base_blocked)
    spread(2.0)
    inst = spread.last_instance
    assert len(inst.hidden) == 1 and len(inst.fields) == 24 and inst.table.shape == (24,)
    t = np.float32(data[0][1] * np.float32(2.0))
    assert total[None] == pytest.approx(t)
    for j in range(1, 20):
        np.testing.assert_allclose(many[j].to_numpy(), data[0] * np.float32(j) + t, rtol=1e-6)
    np.testing.assert_allclose(aos_y.to_numpy(), data[1] + base_blocked.astype(np.float32), rtol=1e-6)
    np.testing.assert_allclose(blocked.to_numpy(), base_blocked * 2.0)

    later = qd.field(qd.f32, shape=(n,))       # a field created after a kernel compiled

    @qd.kernel
    def gather():
        for i in later:
            later[i] = aos_y[i] + many[19][i]

    gather()
    np.testing.assert_allclose(later.to_numpy(), aos_y.to_numpy() + many[19].to_numpy(), rtol=1e-6)
