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
