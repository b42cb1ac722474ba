"""The offline cache on CUDA (qd_numba/targets/cuda/plan.py: PlanBinary, launch_plan): what an
entry stores is the output of compilation (cubins, parameter slots, host iteration counts, return
slot), pickled without device state; a hit loads the cubins and rebuilds the LaunchPlan with no
frontend and no compile.

Without a GPU: the PlanBinary of a compile-check compile survives pickling and computes the same
iteration counts with this process's fields; the key has the compute capability; entries go
through the cache's checks (a fake runtime loads the cubins). With a GPU (``-m cuda``): a second
process hits, editing the kernel recompiles, a debug kernel keeps its checks.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import warnings

import numba_cuda
import numpy as np
import pytest
from numba.core import types

import qd_numba as qd
from qd_numba import config, offline_cache
from qd_numba.errors import QuadrantsWarning
from qd_numba.field import ArrayData
from qd_numba.targets.cuda import plan as cuda_plan
from qd_numba.targets.cuda import toolchain

pytestmark = pytest.mark.no_cuda_compile_check   # the tests compile for CUDA themselves

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pythonpath() -> str:
    """This checkout first, then the caller's path (where a GPU machine keeps its numpy)."""
    return os.pathsep.join([REPO, *filter(None, [os.environ.get("PYTHONPATH")])])

SOURCE = """
@qd.kernel
def step(a: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32) -> qd.f32:
    for i in x:
        y[i] = x[i] * s + OFFSET
    for j in range(a.shape[0]):
        a[j] = a[j] * 2.0 - s
    return y[0] + y[1]
"""


@pytest.fixture
def cache_dir(tmp_path):
    path = tmp_path / "qdcache"
    qd.init(arch=qd.cpu, offline_cache=True, offline_cache_file_path=str(path))
    offline_cache.stats.__init__()
    yield path
    offline_cache._loaded.clear()
    qd.init(arch=qd.cpu)


def define(n=48, source=SOURCE, offset=0.5):
    ns = {"qd": qd, "x": qd.field(qd.f32, shape=n), "y": qd.field(qd.f32, shape=n), "OFFSET": offset,
          "__name__": "cached_cuda_kernels"}
    exec(compile(textwrap.dedent(source), "<cell>", "exec"), ns)
    return ns


PARAM_TYPES = {"a": types.Array(types.float32, 1, "C"), "s": types.float32}


def compiled_binary(kernel, cc=(9, 0), param_types=PARAM_TYPES):
    """(PlanBinary, fields) of ``kernel`` compiled for CUDA as the compile check does (no GPU)."""
    state = cuda_plan.compile_state(kernel, param_types, {})
    plan_ir, compiled, temp_types = cuda_plan.compile_tasks(kernel, state, cc, cuda_plan.kernel_field_slots(state))
    return cuda_plan.plan_binary(kernel, state, plan_ir, compiled, temp_types, cuda_plan.cache_target(cc)), state.hidden


# -- the stored part, without a GPU ------------------------------------------------------------------------

def test_the_plan_binary_survives_pickling_and_binds_this_process_fields(rng):
    ns = define(n=37)
    binary, fields = compiled_binary(ns["step"])
    again = pickle.loads(pickle.dumps(binary))
    assert [t.task.name for t in again.tasks] == [t.task.name for t in binary.tasks]
    assert [t.kind for t in again.tasks] == ["range_for", "range_for", "serial"]
    for t, u in zip(binary.tasks, again.tasks):
        assert u.cubin == t.cubin and u.cubin[:4] == b"\x7fELF"
        assert (u.entry_name, u.runtime_args, u.slots, u.error_symbol) == (t.entry_name, t.runtime_args, t.slots,
                                                                           t.error_symbol)
    # the array argument's 5 + 2 slots (meminfo, parent, nitems, itemsize, data, shape, strides)
    assert [fmt for name, fmt in again.tasks[1].slots if name == "a"] == ["Q", "Q", "q", "q", "Q", "q", "q"]
    assert again.ret == binary.ret and again.ret[1] == np.float32 and again.temp_slots == binary.temp_slots
    assert again.artifact_key == binary.artifact_key is not None
    env = again.totals[1].values()    # fields are stored as slots, never with their data
    assert any(isinstance(v, cuda_plan.FieldSlot) for v in env) and not any(isinstance(v, ArrayData) for v in env)
    # iteration counts: the field's loop from the fields bound now, the array's from the call
    n = int(rng.integers(5, 500))
    other = define(n=n)    # another process's fields of another shape bind by slot
    fn, static = cuda_plan.host_totals(ns["step"], again.totals, [other["x"], other["y"]])
    assert static is None
    a = rng.random(int(rng.integers(1, 99))).astype(np.float32)
    assert fn((a, 1.0)) == (n, a.shape[0])
    assert len(fields) == 2


FIELD_LOOPS = """
@qd.kernel
def scale(s: qd.f32):
    for i in x:
        y[i] = x[i] * s
    for j in range(y.shape[0] // 2):
        x[j] = y[j] + OFFSET
"""


def test_iteration_counts_of_field_loops_are_stored_computed(rng):
    """Loops over fields only have counts fixed by the fields' shapes, which are in the key: the
    binary stores the counts, and a cache hit runs no host code for them."""
    n = int(rng.integers(5, 500))
    binary, _ = compiled_binary(define(n=n, source=FIELD_LOOPS)["scale"], param_types={"s": types.float32})
    again = pickle.loads(pickle.dumps(binary))
    assert again.totals is None and again.static_totals == (n, n // 2)


# an inner range() with a runtime step: Numba's range raises ValueError for a zero step, an
# exception numbered by numba-cuda's own table (qd_numba's raises use stable global codes)
STEPPED = """
@qd.kernel
def step(a: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32, m: qd.i32) -> qd.f32:
    for i in x:
        y[i] = x[i] * s + OFFSET
    for j in range(a.shape[0]):
        for k in range(0, 2, m):
            a[j] = a[j] * 2.0 - s
    return y[0] + y[1]
"""


def test_a_debug_plan_binary_keeps_its_error_words_and_raises():
    config.current.debug = True
    try:
        binary, _ = compiled_binary(define(source=STEPPED)["step"], param_types={**PARAM_TYPES, "m": types.int32})
    finally:
        config.current.debug = False
    again = pickle.loads(pickle.dumps(binary))
    assert all(t.error_symbol == t.entry_name + "__errcode__" for t in again.tasks)
    assert [t.exceptions for t in again.tasks] == [t.exceptions for t in binary.tasks]
    assert [exc for exc, *_ in again.tasks[1].exceptions.values()] == [ValueError]   # range()'s step check


def test_the_key_has_the_compute_capability_and_the_toolchain(cache_dir):
    kernel = define()["step"]
    cfg = config.current.for_kernel(fuse=kernel.fuse, graph=kernel.graph)
    keys = {target: offline_cache.lookup(kernel, PARAM_TYPES, {}, cfg, target).key
            for target in ("cpu", cuda_plan.cache_target((9, 0)), cuda_plan.cache_target((8, 0)))}
    assert len(set(keys.values())) == 3
    assert cuda_plan.cache_target((9, 0)).startswith("cuda-sm90-nvvm") and "nvjitlink" in cuda_plan.cache_target((9, 0))
    assert offline_cache.lookup(kernel, PARAM_TYPES, {}, cfg, cuda_plan.cache_target((9, 0))).key == \
        keys[cuda_plan.cache_target((9, 0))]


class FakeRuntime:
    """What _load_modules asks of the runtime: a driver that loads the cubins it is given."""

    def __init__(self, refuse=False):
        self.loaded, self.refuse = [], refuse

    def load_function(self, cubin, entry):
        if self.refuse:
            raise qd.QuadrantsRuntimeError("cuModuleLoadData: CUDA_ERROR_NO_BINARY_FOR_GPU")
        self.loaded.append((cubin, entry))
        return ("module", entry), ("function", entry)


def stored_entry(cache_dir, monkeypatch):
    ns = define()
    kernel = ns["step"]
    binary, fields = compiled_binary(kernel)
    cfg = config.current.for_kernel(fuse=kernel.fuse, graph=kernel.graph)
    place = offline_cache.lookup(kernel, PARAM_TYPES, {}, cfg, cuda_plan.cache_target((9, 0)))
    paths = place.hidden_paths(fields)
    offline_cache.store(place, (binary, paths), None)
    offline_cache._loaded.clear()
    return place, binary, paths


def test_an_entry_loads_its_cubins_and_rebinds_its_fields(cache_dir, monkeypatch):
    place, binary, paths = stored_entry(cache_dir, monkeypatch)
    fake = FakeRuntime()
    monkeypatch.setattr(cuda_plan.CudaRuntime, "get", classmethod(lambda cls: fake))
    loaded, got_paths, functions = offline_cache.load(place, cuda_plan._load_modules)
    assert offline_cache.stats.hits == 1 and got_paths == paths
    assert fake.loaded == [(t.cubin, t.entry_name) for t in binary.tasks]
    assert functions == [(("module", t.entry_name), ("function", t.entry_name)) for t in binary.tasks]
    assert [place.arrays[p] for p in got_paths] == [place.arrays[p] for p in paths]
    assert loaded.artifact_key == binary.artifact_key


@pytest.mark.parametrize("how", ["truncated", "random bytes", "cpu entry", "driver refuses"])
def test_a_bad_cuda_entry_is_discarded_with_a_warning(cache_dir, monkeypatch, rng, how):
    place, _, _ = stored_entry(cache_dir, monkeypatch)
    data = open(place.path, "rb").read()
    if how == "truncated":
        data = data[:len(data) // 2]
    elif how == "random bytes":
        data = rng.integers(0, 256, len(data), dtype=np.uint8).tobytes()
    elif how == "cpu entry":   # an entry of the right version and key that holds something else
        data = pickle.dumps((offline_cache.versions(), place.key, ("not", "a plan")))
    with open(place.path, "wb") as f:
        f.write(data)
    monkeypatch.setattr(cuda_plan.CudaRuntime, "get", classmethod(lambda cls: FakeRuntime(how == "driver refuses")))
    with pytest.warns(QuadrantsWarning, match="discarding the unusable entry"):
        assert offline_cache.load(place, cuda_plan._load_modules) is None
    assert offline_cache.stats.discarded == 1 and not os.path.exists(place.path)


# -- on a GPU ---------------------------------------------------------------------------------------------

SCRIPT = """
import sys
import numpy as np
import qd_numba as qd
from qd_numba import offline_cache

qd.init(arch=qd.cuda, offline_cache=True, offline_cache_file_path=sys.argv[1])
x = qd.field(qd.f32, shape=300)
y = qd.field(qd.f32, shape=300)
ns = {"qd": qd, "x": x, "y": y, "OFFSET": float(sys.argv[3]), "__name__": "cached_cuda_kernels"}
exec(compile(sys.argv[4], "<cell>", "exec"), ns)
rng = np.random.default_rng(int(sys.argv[2]))
xs = rng.random(300).astype(np.float32)
a = rng.random(int(rng.integers(10, 1000))).astype(np.float32)
want_a = a * 2.0 - 1.5
x.from_numpy(xs)
got = ns["step"](a, 1.5)
want_y = xs * 1.5 + ns["OFFSET"]
assert np.allclose(y.to_numpy(), want_y, rtol=1e-6), "wrong field result"
assert np.allclose(a, want_a, rtol=1e-6), "wrong array result"
assert abs(got - (want_y[0] + want_y[1])) <= 1e-5 * abs(want_y[0] + want_y[1]), "wrong return value"
s = offline_cache.stats
print(ns["step"].compile_count, len(ns["step"]._ir), s.hits, s.writes, s.discarded)
"""


def run_script(path, seed, offset=0.5, source=SOURCE):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(path), str(seed), str(offset), textwrap.dedent(source)],
                         cwd=REPO, env={**os.environ, "PYTHONPATH": _pythonpath()}, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    return tuple(int(v) for v in out.stdout.split())


@pytest.mark.cuda
def test_a_second_cuda_process_hits_without_frontend_or_compile(tmp_path):
    path = tmp_path / "qdcache"
    # compiles, frontend IRs, hits, writes, discarded
    assert run_script(path, 1) == (1, 1, 0, 1, 0)
    assert run_script(path, 2) == (0, 0, 1, 0, 0)
    assert run_script(path, 3, offset=-2.0) == (1, 1, 0, 1, 0)   # a global constant the kernel reads


@pytest.mark.cuda
def test_editing_a_cached_cuda_kernel_recompiles_and_never_runs_stale_code(tmp_path):
    path = tmp_path / "qdcache"
    assert run_script(path, 4) == (1, 1, 0, 1, 0)
    edited = SOURCE.replace("y[i] = x[i] * s + OFFSET", "y[i] = OFFSET + s * x[i]")
    assert run_script(path, 5, source=edited) == (1, 1, 0, 1, 0)
    assert run_script(path, 6, source=edited) == (0, 0, 1, 0, 0)
    assert run_script(path, 7) == (0, 0, 1, 0, 0)


@pytest.mark.cuda
def test_a_cached_cuda_debug_kernel_still_raises_out_of_bounds(tmp_path, rng):
    def init():
        offline_cache._loaded.clear()
        offline_cache.stats.__init__()
        qd.init(arch=qd.cuda, debug=True, offline_cache=True, offline_cache_file_path=str(tmp_path))

    init()
    try:
        ns = define(n=64, source="""
        @qd.kernel
        def total(n: qd.i32) -> qd.f32:
            for i in range(n):
                y[i] = x[i] * 2.0
            return y[0] + y[n - 1]
        """)
        data = rng.random(64).astype(np.float32)
        ns["x"].from_numpy(data)
        assert ns["total"](64) == pytest.approx(2 * (data[0] + data[63]), rel=1e-5)
        init()   # a new process's view: the cache, and fields x, y made again holding the same data
        ns["x"], ns["y"] = qd.field(qd.f32, shape=64), qd.field(qd.f32, shape=64)
        ns["x"].from_numpy(data)
        assert ns["total"](10) == pytest.approx(2 * (data[0] + data[9]), rel=1e-5)
        assert offline_cache.stats.hits == 1 and ns["total"].compile_count == 1
        with warnings.catch_warnings():
            warnings.simplefilter("error", QuadrantsWarning)
            with pytest.raises(qd.QuadrantsRuntimeError, match="total"):
                ns["total"](65)
    finally:
        offline_cache._loaded.clear()
        qd.init(arch=qd.cpu)



@pytest.fixture
def fresh_toolchain(tmp_path, monkeypatch):
    """The toolchain module as in a new process, with the offline cache in ``tmp_path``."""
    monkeypatch.setattr(toolchain, "_known", None)
    monkeypatch.setattr(toolchain, "_asked", False)
    qd.init(arch=qd.cpu, offline_cache=True, offline_cache_file_path=str(tmp_path))
    yield tmp_path
    qd.init()


def _new_process(monkeypatch):
    monkeypatch.setattr(toolchain, "_known", None)
    monkeypatch.setattr(toolchain, "_asked", False)


def test_toolchain_versions_are_recorded_and_then_read_without_loading_the_libraries(fresh_toolchain, monkeypatch):
    """The first process asks NVVM and nvJitLink and records them; a later one takes the record
    while the recorded libraries are unchanged on disk, and asks again when one changed."""
    real, libraries = toolchain._ask()
    assert toolchain.versions() == real and toolchain._asked
    assert cuda_plan.cache_target((9, 0)) == f"cuda-sm90-{real}-numba-cuda{numba_cuda.__version__}"

    _new_process(monkeypatch)
    asked = []
    monkeypatch.setattr(toolchain, "_ask", lambda: asked.append(1) or (real, libraries))
    assert toolchain.versions() == real and not asked

    _new_process(monkeypatch)
    stale = tuple((path, size + 1, mtime) for path, size, mtime in libraries)
    offline_cache.store_blob(toolchain._record_key(), ("nvvm-old", stale))
    assert toolchain.versions() == real and asked == [1]


def test_the_set_up_thread_reads_the_record_before_the_first_lookup(fresh_toolchain, monkeypatch):
    """qd.init(arch=cuda)'s thread (runtime._set_up) takes the versions from the record, so the
    first lookup reads nothing; a stale record is left alone there and asked at that lookup."""
    from qd_numba.targets.cuda import runtime

    real, libraries = toolchain._ask()
    offline_cache.store_blob(toolchain._record_key(), (real, libraries))
    asked, built = [], []
    monkeypatch.setattr(toolchain, "_ask", lambda: asked.append(1) or (real, libraries))
    monkeypatch.setattr(runtime, "_build_launchers", lambda entry_points: built.append(toolchain._known))
    _new_process(monkeypatch)
    runtime._set_up(None)
    assert built == [real] and not asked
    load_blob = offline_cache.load_blob
    monkeypatch.setattr(offline_cache, "load_blob", lambda *a: pytest.fail("read again"))
    assert toolchain.versions() == real
    monkeypatch.setattr(offline_cache, "load_blob", load_blob)

    _new_process(monkeypatch)
    stale = tuple((path, size + 1, mtime) for path, size, mtime in libraries)
    offline_cache.store_blob(toolchain._record_key(), ("nvvm-old", stale))
    toolchain.read_record()
    assert toolchain._known is None and not asked
    assert toolchain.versions() == real and asked == [1]


def test_a_record_that_disagrees_with_the_libraries_is_rewritten_by_the_first_compile(fresh_toolchain, monkeypatch):
    real, libraries = toolchain._ask()
    offline_cache.store_blob(toolchain._record_key(), ("nvvm-recorded", libraries))
    assert toolchain.versions() == "nvvm-recorded"            # lookups use the record ...
    assert toolchain.confirm() == real                         # ... a compile asks the libraries
    assert cuda_plan.cache_target((9, 0)) == f"cuda-sm90-{real}-numba-cuda{numba_cuda.__version__}"
    _new_process(monkeypatch)
    assert toolchain.versions() == real and not toolchain._asked


def test_a_damaged_toolchain_record_is_discarded_and_asked_again(fresh_toolchain, monkeypatch):
    real, _ = toolchain._ask()
    toolchain.versions()
    path = offline_cache.Lookup(toolchain._record_key(), {}, offline_cache.cache_root()).path
    with open(path, "r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(b"\x00" * 8)
    _new_process(monkeypatch)
    with pytest.warns(QuadrantsWarning, match="discarding"):
        assert toolchain.versions() == real
    assert toolchain._asked
