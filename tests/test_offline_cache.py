"""The offline cache (qd_numba/offline_cache.py): hits across processes without the frontend,
a miss for every key ingredient, and bad entries rebuilt with a warning, never trusted.

Every test uses a temporary cache directory (the suite runs with ``QD_OFFLINE_CACHE=0``).
Kernels are defined from source text with ``exec`` (bytecode only, as in a notebook), so a test
can "edit" a kernel by executing other source under the same name.
"""

from __future__ import annotations

import dataclasses
import errno
import gc
import os
import re
import subprocess
import sys
import textwrap
import warnings
import weakref

import numba
import numpy as np
import pytest

import qd_numba as qd
from qd_numba import config, offline_cache
from qd_numba.errors import QuadrantsWarning

pytestmark = pytest.mark.no_cuda_compile_check   # the cache is a CPU feature; its CUDA check adds nothing

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pythonpath() -> str:
    """This checkout first, then the caller's path (where a GPU machine keeps its numpy)."""
    return os.pathsep.join([REPO, *filter(None, [os.environ.get("PYTHONPATH")])])

SOURCE = """
@qd.func
def shift(v):
    return v * v + OFFSET

@qd.kernel
def scale(a: qd.f32):
    for i in x:
        y[i] = shift(x[i]) * a
"""


@pytest.fixture
def cache_dir(tmp_path):
    path = tmp_path / "qdcache"
    qd.init(arch=qd.cpu, offline_cache=True, offline_cache_file_path=str(path))
    offline_cache.stats.__init__()
    yield path
    offline_cache._loaded.clear()
    qd.init(arch=qd.cpu)


def define(source=SOURCE, n=64, dtype=qd.f32, offset=1.0, **extra):
    """Execute ``source`` in a fresh namespace with fields x, y of ``n`` elements."""
    ns = {"qd": qd, "numba": numba, "x": qd.field(dtype, shape=n), "y": qd.field(dtype, shape=n),
          "OFFSET": offset, "__name__": "cached_kernels", **extra}
    exec(compile(textwrap.dedent(source), "<cell>", "exec"), ns)
    return ns


def run_scale(ns, rng, a=2.0):
    data = rng.random(ns["x"].shape).astype(ns["x"].to_numpy().dtype)
    ns["x"].from_numpy(data)
    ns["scale"](a)
    np.testing.assert_allclose(ns["y"].to_numpy(), (data * data + ns["OFFSET"]) * a, rtol=1e-6)


def fresh_process(*namespaces, **options):
    """What a new process sees: nothing loaded; the kernels recompile or load from disk. The fields
    of ``namespaces`` are made again under the new qd.init (which releases the old ones), of the
    same layout and holding the same data, as a new process running the same script would."""
    saved = [{name: (f, f.to_numpy()) for name, f in ns.items() if isinstance(f, qd.Field)} for ns in namespaces]
    offline_cache._loaded.clear()
    offline_cache.stats.__init__()
    qd.init(arch=qd.cpu, offline_cache=True, offline_cache_file_path=config.current.offline_cache_file_path,
            **options)
    for ns, fields in zip(namespaces, saved):
        for name, (old, data) in fields.items():
            ns[name] = qd.Field(old.dtype, old.shape, elem_type=old.elem_type)
            ns[name].from_numpy(data)


def entries(path):
    """The kernel entries under ``path`` (content keys: 64 hex digits), not the blobs beside them
    (the CUDA toolchain record a compile check writes, generated code)."""
    return sorted(p for p in path.rglob("*" + offline_cache.SUFFIX)
                  if re.fullmatch(r"[0-9a-f]{64}", p.name[: -len(offline_cache.SUFFIX)]))


# -- hits ---------------------------------------------------------------------------------------------

SCRIPT = """
import sys
import numpy as np
import qd_numba as qd
from qd_numba import offline_cache

qd.init(arch=qd.cpu, offline_cache=True, offline_cache_file_path=sys.argv[1])
x = qd.field(qd.f32, shape=500)
y = qd.field(qd.f32, shape=500)
ns = {"qd": qd, "x": x, "y": y, "OFFSET": 0.5, "__name__": "cached_kernels"}
exec(compile('''
@qd.func
def shift(v):
    return v * v + OFFSET

@qd.kernel
def scale(a: qd.f32):
    for i in x:
        y[i] = shift(x[i]) * a
''', "<cell>", "exec"), ns)
data = np.random.default_rng(int(sys.argv[2])).random(500).astype(np.float32)
x.from_numpy(data)
ns["scale"](3.0)
assert np.allclose(y.to_numpy(), (data * data + 0.5) * 3.0, rtol=1e-6), "wrong result"
s = offline_cache.stats
print(ns["scale"].compile_count, len(ns["scale"]._ir), s.hits, s.writes, s.discarded)
"""


def run_script(path, seed, env=None):
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(path), str(seed)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": _pythonpath(), "QD_CUDA_COMPILE_CHECK": "0",
                                 "QD_AMDGPU_COMPILE_CHECK": "0", **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def script_result(proc):
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    return tuple(int(v) for v in out.split())


def test_a_second_process_hits_without_running_the_frontend(tmp_path):
    path = tmp_path / "qdcache"
    # compiles, frontend IRs, hits, writes, discarded
    assert script_result(run_script(path, 1)) == (1, 1, 0, 1, 0)
    assert script_result(run_script(path, 2)) == (0, 0, 1, 0, 0)
    assert len(entries(path)) == 1


def test_two_processes_writing_one_key_at_once_leave_one_good_entry(tmp_path):
    path = tmp_path / "qdcache"
    first, second = run_script(path, 3), run_script(path, 4)
    assert script_result(first)[0] == script_result(second)[0] == 1
    assert len(entries(path)) == 1
    assert script_result(run_script(path, 5)) == (0, 0, 1, 0, 0)


def test_a_hit_in_process_loads_the_entry_and_computes_the_same(cache_dir, rng):
    ns = define()
    run_scale(ns, rng)
    assert ns["scale"].compile_count == 1 and len(entries(cache_dir)) == 1
    fresh_process(ns)
    run_scale(ns, rng, a=-1.5)
    assert ns["scale"].compile_count == 1 and offline_cache.stats.hits == 1
    assert [t.kind for t in ns["scale"].tasks(2.0)] == ["range_for"]


def test_a_kernel_defined_with_exec_and_its_fields_rebind_to_this_process_objects(cache_dir, rng):
    run_scale(define(), rng)
    fresh_process()
    ns = define()    # the same code, new field objects of the same layout: a hit on the new fields
    run_scale(ns, rng)
    assert ns["scale"].compile_count == 0 and offline_cache.stats.hits == 1


# -- a miss for every key ingredient ------------------------------------------------------------------------

def key_of(ns, kernel="scale", param_types=None, templates=None):
    param_types = param_types or {"a": numba.float32}
    k = ns[kernel]
    cfg = config.current.for_kernel(fuse=k.fuse, graph=k.graph)
    place = offline_cache.lookup(k, param_types, templates or {}, cfg, "cpu")
    assert place is not None
    return place.key


@pytest.mark.parametrize("change", [
    "kernel source", "callee source", "njit callee", "global constant", "field shape", "field dtype",
    "same field twice", "debug", "default_fp", "fusion", "version",
])
def test_every_key_ingredient_changes_the_key(cache_dir, change, monkeypatch):
    source = SOURCE.replace("@qd.func", "@numba.njit") if change == "njit callee" else SOURCE
    base = define(source)
    if change == "kernel source":
        other = define(SOURCE.replace("* a", "+ a"))
    elif change == "callee source":
        other = define(SOURCE.replace("v * v", "v * v * v"))
    elif change == "njit callee":
        other = define(source.replace("v * v", "v - v"))
    elif change == "global constant":
        other = define(offset=2.0)
    elif change == "field shape":
        other = define(n=65)
    elif change == "field dtype":
        other = define(dtype=qd.f64)
    elif change == "same field twice":   # y is x: one hidden argument instead of two
        other = define()
        other["y"] = other["x"]
    elif change in ("debug", "default_fp", "fusion"):
        option = {"debug": ("debug", True), "default_fp": ("default_fp", qd.f64),
                  "fusion": ("aggressive_kernel_fusion", True)}[change]
        key = key_of(base)
        monkeypatch.setattr(config.current, *option)
        assert key_of(base) != key
        return
    else:
        key = key_of(base)
        monkeypatch.setattr(offline_cache, "versions", lambda: ("another", "version"))
        assert key_of(base) != key
        return
    assert key_of(base) != key_of(other)
    assert key_of(base) == key_of(define(source))   # and only the change: new objects of the same content


def test_template_values_and_argument_types_are_in_the_key(cache_dir):
    ns = define("""
    @qd.kernel
    def fill(t: qd.template(), a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in a:
            a[i] = t
    """)
    f32 = numba.types.Array(numba.float32, 1, "C")
    f64 = numba.types.Array(numba.float64, 1, "C")
    keys = {key_of(ns, "fill", {"a": f32}, {"t": 2}), key_of(ns, "fill", {"a": f32}, {"t": 3}),
            key_of(ns, "fill", {"a": f64}, {"t": 2}), key_of(ns, "fill", {"a": f32}, {"t": 2.0})}
    assert len(keys) == 4


@pytest.mark.parametrize("change", ["field shape", "field dtype", "global constant", "callee source",
                                    "config option", "template value"])
def test_a_changed_ingredient_recompiles_and_never_runs_stale_code(cache_dir, rng, change):
    if change == "template value":
        source = SOURCE.replace("def scale(a: qd.f32):", "def scale(a: qd.f32, k: qd.template()):")
        source = source.replace("* a", "* a + k")
        ns = define(source)
        data = rng.random(64).astype(np.float32)
        ns["x"].from_numpy(data)
        for k, compiles in ((2, 1), (3, 2)):     # in this process, then a new one
            ns["scale"](1.5, k)
            np.testing.assert_allclose(ns["y"].to_numpy(), (data * data + 1.0) * np.float32(1.5) + k, rtol=1e-6)
            assert ns["scale"].compile_count == compiles
            fresh_process(ns)
        assert len(entries(cache_dir)) == 2
        return
    run_scale(define(), rng)
    fresh_process(**({"debug": True} if change == "config option" else {}))
    ns = {"field shape": lambda: define(n=33), "field dtype": lambda: define(dtype=qd.f64),
          "global constant": lambda: define(offset=-4.0), "config option": define,
          "callee source": lambda: define(SOURCE.replace("v * v +", "v * v * 1.0 +"))}[change]()
    run_scale(ns, rng)
    assert ns["scale"].compile_count == 1 and offline_cache.stats.hits == 0
    assert len(entries(cache_dir)) == 2


def test_kernels_whose_globals_cannot_be_described_are_not_cached(cache_dir, rng):
    class Opaque:   # no attributes to follow, and a repr that does not tell values apart
        __slots__ = ()

        def __repr__(self):
            return "opaque"

    ns = define(SOURCE.replace("* a", "* a * THING.scale"), THING=Opaque())
    assert offline_cache.snapshot(ns["scale"], {}) is None
    assert offline_cache.lookup(ns["scale"], {"a": numba.float32}, {}, config.current, "cpu") is None


# -- bad entries ------------------------------------------------------------------------------------------

def _damage(path, how):
    if how == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])
    elif how == "random bytes":
        path.write_bytes(np.random.default_rng(7).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    elif how == "empty":
        path.write_bytes(b"")
    else:   # another version's entry at this key's path
        import pickle

        _, key, payload = pickle.loads(path.read_bytes())
        path.write_bytes(pickle.dumps((("old", "versions"), key, payload)))


@pytest.mark.parametrize("how", ["truncated", "random bytes", "empty", "wrong version"])
def test_a_bad_entry_is_discarded_with_a_warning_and_rebuilt(cache_dir, rng, how):
    ns = define()
    run_scale(ns, rng)
    [entry] = entries(cache_dir)
    _damage(entry, how)
    fresh_process(ns)
    with pytest.warns(QuadrantsWarning, match="discarding the unusable entry"):
        run_scale(ns, rng)
    assert ns["scale"].compile_count == 2 and offline_cache.stats.discarded == 1
    fresh_process(ns)                     # the rebuilt entry is good
    run_scale(ns, rng)
    assert ns["scale"].compile_count == 2 and offline_cache.stats.hits == 1


def test_an_entry_removed_between_lookup_and_read_is_a_plain_miss(cache_dir, rng, recwarn):
    ns = define()
    run_scale(ns, rng)
    fresh_process(ns)
    k = ns["scale"]
    place = offline_cache.lookup(k, {"a": numba.float32}, {}, config.current, "cpu")
    os.unlink(place.path)
    assert offline_cache.load(place, offline_cache.cpu_rebuild) is None
    assert not [w for w in recwarn if issubclass(w.category, QuadrantsWarning)]
    run_scale(ns, rng)
    assert k.compile_count == 2


def test_an_unwritable_cache_directory_warns_once_and_kernels_still_run(cache_dir, rng, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(cache_dir))

    monkeypatch.setattr(offline_cache.tempfile, "mkstemp", refuse)
    offline_cache._warned.clear()
    ns = define()
    with pytest.warns(QuadrantsWarning, match="cannot write"):
        run_scale(ns, rng)
    other = define(offset=3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # once per process and directory
        run_scale(other, rng)
    assert entries(cache_dir) == []


def test_a_full_disk_leaves_no_partial_file(cache_dir, rng, monkeypatch):
    real_fdopen = os.fdopen

    class Full:
        def __init__(self, fd):
            self.f = real_fdopen(fd, "wb")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(data[:100])
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(offline_cache.os, "fdopen", lambda fd, mode: Full(fd))
    offline_cache._warned.clear()
    ns = define()
    with pytest.warns(QuadrantsWarning, match="No space left"):
        run_scale(ns, rng)
    assert [p for p in cache_dir.rglob("*") if p.is_file() and p.name != ".lock"] == []


# -- size limit, cleaning, clearing -------------------------------------------------------------------------

def test_lru_cleaning_keeps_the_recently_used_entries(cache_dir, rng, monkeypatch):
    kernels = [define(offset=float(k)) for k in range(4)]
    for ns in kernels:
        run_scale(ns, rng)
    paths = entries(cache_dir)
    size = max(p.stat().st_size for p in paths)
    for k, ns in enumerate(kernels):        # a distinct use time per entry: kernel 0 oldest
        place = offline_cache.lookup(ns["scale"], {"a": numba.float32}, {}, config.current, "cpu")
        os.utime(place.path, (1000 + k, 1000 + k))
    oldest = offline_cache.lookup(kernels[0]["scale"], {"a": numba.float32}, {}, config.current, "cpu").path
    fresh_process(*kernels)
    run_scale(kernels[0], rng)              # a hit makes kernel 0 the most recently used
    monkeypatch.setattr(config.current, "offline_cache_max_size_of_files", int(size * 4.5))
    monkeypatch.setattr(config.current, "offline_cache_cleaning_factor", 0.25)
    run_scale(define(offset=9.0), rng)      # a fifth entry: over the limit, down to 75%
    left = entries(cache_dir)
    assert len(left) == 3 and os.path.exists(oldest)


def test_version_cleaning_drops_other_versions_and_never_keeps_all(cache_dir, rng, monkeypatch):
    stale = cache_dir / "0123456789abcdef" / "aa"
    stale.mkdir(parents=True)
    (stale / ("a" * 64 + offline_cache.SUFFIX)).write_bytes(b"x" * 1000)
    monkeypatch.setattr(config.current, "offline_cache_max_size_of_files", 10)
    monkeypatch.setattr(config.current, "offline_cache_cleaning_policy", "never")
    run_scale(define(), rng)
    assert stale.exists()
    monkeypatch.setattr(config.current, "offline_cache_cleaning_policy", "version")
    run_scale(define(offset=5.0), rng)
    assert not stale.parent.exists() and len(entries(cache_dir)) == 2


def test_clear_offline_cache_removes_every_entry(cache_dir, rng):
    run_scale(define(), rng)
    assert entries(cache_dir)
    qd.clear_offline_cache()
    assert entries(cache_dir) == []
    fresh_process()
    ns = define()
    run_scale(ns, rng)
    assert ns["scale"].compile_count == 1


def test_the_knobs_come_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("QD_OFFLINE_CACHE", "1")
    monkeypatch.setenv("QD_OFFLINE_CACHE_FILE_PATH", str(tmp_path))
    monkeypatch.setenv("QD_OFFLINE_CACHE_MAX_SIZE_OF_FILES", "12345")
    monkeypatch.setenv("QD_OFFLINE_CACHE_CLEANING_POLICY", "FIFO")
    monkeypatch.setenv("QD_OFFLINE_CACHE_CLEANING_FACTOR", "0.5")
    cfg = config.config_from_env()
    assert (cfg.offline_cache, cfg.offline_cache_file_path, cfg.offline_cache_max_size_of_files,
            cfg.offline_cache_cleaning_policy, cfg.offline_cache_cleaning_factor) == (True, str(tmp_path), 12345,
                                                                                      "fifo", 0.5)
    assert offline_cache.cache_root(cfg) == str(tmp_path)
    monkeypatch.setenv("QD_OFFLINE_CACHE_CLEANING_POLICY", "sometimes")
    with pytest.raises(ValueError, match="offline_cache_cleaning_policy"):
        config.config_from_env()
    monkeypatch.setenv("QD_OFFLINE_CACHE", "0")
    monkeypatch.delenv("QD_OFFLINE_CACHE_CLEANING_POLICY")
    assert not offline_cache.enabled(config.config_from_env())


def test_template_fields_and_objects_rebind_to_the_call_arguments(cache_dir, rng):
    ns = define("""
    class Particles:
        def __init__(self, n):
            self.pos = qd.field(qd.f32, shape=n)
            self.vel = qd.field(qd.f32, shape=n)

    @qd.kernel
    def step(p: qd.template(), out: qd.template(), dt: qd.f32):
        for i in p.pos:
            out[i] = p.pos[i] + p.vel[i] * dt
    """)
    def check(compiles):
        systems = [ns["Particles"](40) for _ in range(2)]       # the fields of this qd.init
        outs = [qd.field(qd.f32, shape=40) for _ in range(2)]
        for p, out in zip(systems, outs):
            pos, vel = rng.random(40).astype(np.float32), rng.random(40).astype(np.float32)
            p.pos.from_numpy(pos)
            p.vel.from_numpy(vel)
            ns["step"](p, out, 0.5)
            np.testing.assert_allclose(out.to_numpy(), pos + vel * 0.5, rtol=1e-6)
        assert ns["step"].compile_count == compiles

    check(compiles=1)    # both calls: one entry (same layouts), each bound to its own fields
    assert len(entries(cache_dir)) == 1
    fresh_process()
    check(compiles=1)
    assert offline_cache.stats.hits == 2


def test_an_njit_callee_kernel_hits_and_computes_the_same(cache_dir, rng):
    ns = define(SOURCE.replace("@qd.func", "@numba.njit"))
    run_scale(ns, rng)
    fresh_process(ns)
    run_scale(ns, rng, a=0.25)
    assert ns["scale"].compile_count == 1 and offline_cache.stats.hits == 1


def test_a_cached_debug_kernel_still_raises_out_of_bounds_and_returns_values(cache_dir, rng):
    qd.init(arch=qd.cpu, debug=True, offline_cache=True, offline_cache_file_path=str(cache_dir))
    ns = define("""
    @qd.kernel
    def total(n: qd.i32) -> qd.f32:
        for i in range(n):
            y[i] = x[i] * 2.0
        return y[0] + y[n - 1]
    """)
    data = rng.random(64).astype(np.float32)
    ns["x"].from_numpy(data)
    assert ns["total"](64) == pytest.approx(2 * (data[0] + data[63]), rel=1e-5)
    fresh_process(ns, debug=True)
    assert ns["total"](10) == pytest.approx(2 * (data[0] + data[9]), rel=1e-5)
    assert offline_cache.stats.hits == 1 and ns["total"].compile_count == 1
    with pytest.raises(qd.QuadrantsRuntimeError, match="total"):
        ns["total"](65)


def test_a_template_objects_id_is_never_lent_to_a_new_object(cache_dir, rng):
    """Instances are keyed by the identity of template objects (a data-oriented ``self``). A
    kernel keeps every object it made or loaded an instance for alive, so no new object can take
    a used one's id and be lent its instance (its fields, its constants): dropped objects stay
    alive, and each new one gets its own instance from the cache."""
    ns = define("""
    @qd.data_oriented
    class Scaled:
        def __init__(self, n, s):
            self.s = s
            self.x = qd.field(qd.f32, shape=n)

        @qd.kernel
        def apply(self):
            for i in self.x:
                self.x[i] = self.x[i] * self.s
    """)
    kinds = [(8, 1.5), (9, 2.5), (10, 3.5)]
    for n, s in kinds:
        ns["Scaled"](n, s).apply()       # the entries: one per size and factor
    fresh_process()
    dropped = []
    for k in range(6):                   # every call a hit, each object its own instance
        n, s = kinds[k % 3]
        obj = ns["Scaled"](n, s)
        x0 = rng.random(n).astype(np.float32)
        obj.x.from_numpy(x0)
        obj.apply()
        np.testing.assert_allclose(obj.x.to_numpy(), x0 * np.float32(s), rtol=1e-6)
        dropped.append(weakref.ref(obj))
        del obj
    gc.collect()
    assert offline_cache.stats.hits == 6
    assert all(ref() is not None for ref in dropped)    # kept: their ids cannot be taken


# -- what a compile-time expression reads ---------------------------------------------------------------------

STATIC_SOURCE = """
{preamble}

@qd.kernel
def scale(a: qd.f32):
    for i in x:
        y[i] = x[i] * a + qd.static({expr})
"""

# route -> (preamble with {value}, the qd.static expression): each reads a value the kernel does
# not name as such, through a path the snapshot must follow
STATIC_ROUTES = {
    "getattr with a constant name": ("class Cfg:\n    pass\nCFG = Cfg()\nCFG.scale = {value}", 'getattr(CFG, "scale")'),
    "getattr with a global name": ("class Cfg:\n    pass\nCFG = Cfg()\nCFG.scale = {value}\nATTR = 'scale'",
                                   "getattr(CFG, ATTR)"),
    "item 299 of a long list": ("TABLE = [0.0] * 300\nTABLE[299] = {value}", "TABLE[299]"),
    "a tuple-keyed dict": ("TABLE = {{(1, 2): {value}, (3, 4): 0.5}}", "TABLE[(1, 2)]"),
    "__call__'s code": ("class Const:\n    def __call__(self):\n        return {value}\nFN = Const()", "FN()"),
    "an operator's code": ("class Shift:\n    def __radd__(self, other):\n        return other + {value}\nS = Shift()",
                           "0.0 + S"),
    "a constructor's code": ("class Made:\n    def __init__(self):\n        self.v = {value}", "Made().v"),
    "a class attribute": ("class Params:\n    shift = {value}", "Params.shift"),
}


def define_static(route, value):
    preamble, expr = STATIC_ROUTES[route]
    return define(STATIC_SOURCE.format(preamble=preamble.format(value=value), expr=expr))


@pytest.mark.parametrize("route", list(STATIC_ROUTES))
def test_what_a_static_expression_reads_is_in_the_key(cache_dir, rng, route):
    """A value a ``qd.static`` expression reads through a string attribute name, a long list, a
    dict with tuple keys or a method Python calls unnamed: another value is another entry (never
    the stale code), the same value in a new process is a hit."""
    def run(value):
        ns = define_static(route, value)
        data = rng.random(64).astype(np.float32)
        ns["x"].from_numpy(data)
        ns["scale"](2.0)
        np.testing.assert_allclose(ns["y"].to_numpy(), data * np.float32(2.0) + np.float32(value), rtol=1e-6)
        return ns

    run(1.25)
    fresh_process()
    assert run(-3.5)["scale"].compile_count == 1 and offline_cache.stats.hits == 0
    fresh_process()
    assert run(-3.5)["scale"].compile_count == 0 and offline_cache.stats.hits == 1
    assert len(entries(cache_dir)) == 2


def test_a_dict_with_a_key_that_cannot_be_described_is_not_cached(cache_dir):
    ns = define(STATIC_SOURCE.format(preamble="class K:\n    pass\nKEY = K()\nTABLE = {KEY: 2.0}",
                                     expr="TABLE[KEY]"))
    assert offline_cache.snapshot(ns["scale"], {}) is None


def test_an_entry_holding_another_full_key_is_discarded(cache_dir, rng):
    """The file name is the full key's hash; the entry holds the full key's text, compared on
    load: an entry whose text differs (a hash collision, a foreign file) is never used."""
    ns = define()
    run_scale(ns, rng)
    place = offline_cache.lookup(ns["scale"], {"a": numba.float32}, {}, config.current, "cpu")
    offline_cache._loaded.clear()
    other = dataclasses.replace(place, full=place.full.replace("cached_kernels", "other_module"))
    assert other.path == place.path and other.full != place.full
    with pytest.warns(QuadrantsWarning, match="another key"):
        assert offline_cache.load(other, offline_cache.cpu_rebuild) is None
    assert offline_cache.stats.discarded == 1 and not entries(cache_dir)


def test_a_cpu_key_does_not_depend_on_numba_cuda_being_imported(cache_dir, monkeypatch):
    """A CPU process never imports numba-cuda; the test suite's processes do (the CUDA compile
    check): a CPU entry must mean the same in both. numba-cuda's version is in the CUDA target."""
    import numba_cuda

    from qd_numba.targets.cuda.plan import cache_target

    ns = define()
    key = key_of(ns)
    for name in [m for m in sys.modules if m == "numba_cuda" or m.startswith("numba.cuda")]:
        monkeypatch.delitem(sys.modules, name)
    assert key_of(ns) == key
    assert cache_target((9, 0)).endswith(f"numba-cuda{numba_cuda.__version__}")


STREAM_LOOPS = """
        for i in x:
            y[i] = x[i] * a
{between}
        for i in x:
            z[i] = x[i] + a
"""


def test_a_kernel_with_stream_blocks_hits_and_its_blocks_are_in_the_key(cache_dir, rng):
    def run(second_block):
        # both loops in one block, or the second loop in a block of its own
        between = "    with qd.stream_parallel():" if second_block else ""
        source = ("@qd.kernel\ndef scale(a: qd.f32):\n    with qd.stream_parallel():"
                  + STREAM_LOOPS.format(between=between).replace("\n\n", "\n"))
        ns = define(source, z=qd.field(qd.f32, shape=64))
        data = rng.random(64).astype(np.float32)
        ns["x"].from_numpy(data)
        ns["scale"](1.5)
        np.testing.assert_allclose(ns["y"].to_numpy(), data * np.float32(1.5), rtol=1e-6)
        np.testing.assert_allclose(ns["z"].to_numpy(), data + np.float32(1.5), rtol=1e-6)
        return ns

    groups = [t.stream_group for t in run(False)["scale"].tasks(1.5)]
    assert groups == [1, 1]     # both loops in one block
    fresh_process()
    ns = run(False)
    assert ns["scale"].compile_count == 0 and offline_cache.stats.hits == 1
    assert [t.stream_group for t in ns["scale"].tasks(1.5)] == groups
    fresh_process()
    ns = run(True)              # the second loop in a block of its own: another entry
    assert ns["scale"].compile_count == 1 and offline_cache.stats.hits == 0
    assert [t.stream_group for t in ns["scale"].tasks(1.5)] == [1, 2]


UIDS_SCRIPT = """
import sys
import qd_numba as qd
qd.init(arch=qd.cpu, offline_cache=True, offline_cache_file_path=sys.argv[1])
x = qd.field(qd.f32, shape=16)
ns = {"qd": qd, "x": x, "__name__": "cached_kernels"}
exec(compile('''
@qd.kernel
def two_loops(a: qd.f32) -> qd.f32:
    for i in x:
        x[i] = x[i] + a
    s = 0.0
    for i in range(4):
        s += x[i]
    return s
''', "<cell>", "exec"), ns)
ns["two_loops"](1.0)
from qd_numba import offline_cache
print(offline_cache.stats.hits, *(t.uid for t in ns["two_loops"].tasks(1.0)))
"""


def test_task_uids_are_the_same_in_every_process_and_after_a_cache_hit(tmp_path):
    """Seed 001: a task's id depends on its kernel and position only, so compiled code, the
    offline cache and the runtime agree on it in any process."""
    def run(cache):
        out = subprocess.run([sys.executable, "-c", UIDS_SCRIPT, str(cache)], cwd=REPO, capture_output=True,
                             text=True, timeout=600, env={**os.environ, "PYTHONPATH": _pythonpath(),
                                                          "QD_CUDA_COMPILE_CHECK": "0", "QD_AMDGPU_COMPILE_CHECK": "0"})
        assert out.returncode == 0, out.stderr
        hits, *uids = out.stdout.split()
        return int(hits), uids

    first = run(tmp_path / "a")
    compiled_again = run(tmp_path / "b")     # another cache: compiled again in a new process
    loaded = run(tmp_path / "a")             # the first process's entry
    assert first[0] == compiled_again[0] == 0 and loaded[0] == 1
    assert len(first[1]) >= 3 and len(set(first[1])) == len(first[1])
    assert first[1] == compiled_again[1] == loaded[1]


# -- hidden fields no name reaches ----------------------------------------------------------------------------

def test_a_kernel_scope_reduction_hits_with_new_cells(cache_dir, rng):
    """A reduction into a kernel-scope local keeps its cells in a field the compiler makes: a
    hit makes a new one (the kernel fills it before reading it) instead of not caching."""
    ns = define("""
    @qd.kernel
    def total(a: qd.f32) -> qd.f32:
        s = 0.0
        for i in x:
            s += x[i] * a
        return s
    """, n=1000)

    def check():
        data = rng.random(1000).astype(np.float32)
        ns["x"].from_numpy(data)
        for a in (0.5, -2.0):       # the cells start from the local's value at every call
            assert ns["total"](a) == pytest.approx(float(np.sum(data.astype(np.float64)) * a), rel=1e-4)

    check()
    assert len(entries(cache_dir)) == 1
    fresh_process(ns)
    check()
    assert ns["total"].compile_count == 1 and offline_cache.stats.hits == 1


def test_a_kernel_calling_qd_random_hits_and_draws_the_same_numbers(cache_dir, rng):
    ns = define("""
    @qd.kernel
    def noise():
        for i in x:
            y[i] = x[i] + qd.random(qd.f32)
    """)
    ns["x"].from_numpy(rng.random(64).astype(np.float32))
    draws = []
    for _ in range(2):                   # compiled, then a hit in a new process with the same seed
        ns["noise"]()
        first = ns["y"].to_numpy() - ns["x"].to_numpy()
        ns["noise"]()                    # the state counts launches: the second launch draws anew
        draws.append((first, ns["y"].to_numpy() - ns["x"].to_numpy()))
        fresh_process(ns)
    assert offline_cache.stats.hits == 0 and ns["noise"].compile_count == 1   # stats of the last new process
    (a1, a2), (b1, b2) = draws
    np.testing.assert_array_equal(a1, b1)
    np.testing.assert_array_equal(a2, b2)
    assert not np.array_equal(a1, a2) and 0.0 <= a1.min() and a1.max() < 1.0 + 1e-6


GRAD_SOURCE = """
@qd.kernel
def energy():
    for i in x:
        loss[None] += qd.sin(x[i]) * x[i]
"""


def test_a_gradient_kernel_hits_and_writes_the_gradient_it_found(cache_dir, rng):
    """A gradient kernel's hidden fields are the ``.grad`` of fields the snapshot reaches: a hit
    finds them on this process's fields; whether a field has a gradient is in the key."""
    def run():
        ns = define(GRAD_SOURCE, x=qd.field(qd.f32, shape=64, needs_grad=True),
                    loss=qd.field(qd.f32, shape=(), needs_grad=True))
        data = rng.uniform(-2, 2, 64)
        ns["x"].from_numpy(data.astype(np.float32))
        ns["loss"].grad[None] = 1.0
        ns["energy"]()
        ns["energy"].grad()
        h = 1e-6   # central differences of the energy per element, in f64
        fd = ((np.sin(data + h) * (data + h)) - (np.sin(data - h) * (data - h))) / (2 * h)
        np.testing.assert_allclose(ns["x"].grad.to_numpy(), fd, rtol=1e-4, atol=1e-5)
        assert ns["loss"][None] == pytest.approx(float(np.sum(np.sin(data) * data)), rel=1e-4)
        return ns

    run()
    assert len(entries(cache_dir)) == 2          # the kernel and its gradient kernel
    fresh_process()
    ns = run()
    assert offline_cache.stats.hits == 2 and ns["energy"].compile_count == 0
    assert ns["energy"].grad.compile_count == 0
    with_grad = offline_cache.snapshot(ns["energy"], {})[0]
    ns["x"] = qd.field(qd.f32, shape=64)         # the same layout without a gradient: another key
    assert offline_cache.snapshot(ns["energy"], {})[0] != with_grad


# -- a warm CPU process -------------------------------------------------------------------------------------

WARM_SCRIPT = """
import sys
import numpy as np
import qd_numba as qd
from qd_numba import offline_cache
from qd_numba.targets import cpu

if sys.argv[2] == "missing-symbol":     # the loader must see one symbol it cannot resolve
    import llvmlite.binding as llvm
    real = llvm.address_of_symbol
    llvm.address_of_symbol = lambda name: 0 if name == "numba_parallel_for" else real(name)
qd.init(arch=qd.cpu, offline_cache=True, offline_cache_file_path=sys.argv[1])
x = qd.field(qd.f32, shape=1000)
ns = {"qd": qd, "x": x, "__name__": "cached_kernels"}
exec(compile('''
@qd.kernel
def total(a: qd.types.ndarray(dtype=qd.f32, ndim=1)) -> qd.f32:
    s = 0.0
    for i in x:
        x[i] = qd.sin(a[i]) * 2.0
        s += x[i]
    return s

@qd.kernel
def other():
    for i in x:
        x[i] = x[i] + 1.0
''', "<cell>", "exec"), ns)
a = np.random.default_rng(3).random(1000).astype(np.float32)
s = ns["total"](a)
expected = np.sin(a) * np.float32(2)
assert np.allclose(x.to_numpy(), expected, rtol=1e-6) and abs(s - expected.sum()) < 1e-3 * expected.sum()
full_after_load = cpu._threads_ready
if sys.argv[2] == "and-compile":        # a later compile in the same process sets Numba up in full
    ns["other"]()
    assert np.allclose(x.to_numpy(), expected + 1, rtol=1e-6)
print(offline_cache.stats.hits, full_after_load, cpu._threads_ready)
"""


def _warm_run(cache, mode):
    out = subprocess.run([sys.executable, "-c", WARM_SCRIPT, str(cache), mode], cwd=REPO, capture_output=True,
                         text=True, timeout=600, env={**os.environ, "PYTHONPATH": _pythonpath(),
                                                      "QD_CUDA_COMPILE_CHECK": "0", "QD_AMDGPU_COMPILE_CHECK": "0"})
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_a_warm_cpu_process_loads_without_numbas_full_set_up(tmp_path):
    """A hit needs the thread pool, NRT and the symbols its object code references, not Numba's
    registries (targets/cpu.ensure_runtime_for): a warm process does not pay them, a compile
    later in it still sets them up, and a symbol the loader cannot resolve sets them up first."""
    cache = tmp_path / "qdcache"
    assert _warm_run(cache, "plain") == ["0", "True", "True"]          # compiled: the full set-up
    assert _warm_run(cache, "plain") == ["1", "False", "False"]        # a hit: none of it
    assert _warm_run(cache, "and-compile") == ["1", "False", "True"]
    assert _warm_run(cache, "missing-symbol") == ["1", "True", "True"]


def test_undefined_symbols_of_a_kernel_object(cache_dir, rng):
    import pickle

    from qd_numba.targets.cpu import undefined_symbols

    ns = define()
    run_scale(ns, rng)
    (entry,) = entries(cache_dir)
    _versions, _key, (reduced, _tasks, _paths) = pickle.loads(entry.read_bytes())
    _name, kind, (obj, _bitcode) = reduced[0]        # Numba's serialized library
    assert kind == "object"
    names = undefined_symbols(obj)
    assert "numba_parallel_for" in names and not any(n.startswith("_ZN8qd_numba") for n in names)
    assert undefined_symbols(b"MZ" + obj[2:]) is None and undefined_symbols(obj[:64]) is None
    for _ in range(200):     # truncated or damaged objects: a list or None, never an error or a crash
        damaged = bytearray(obj[:int(rng.integers(0, len(obj)))])
        for k in rng.integers(6, max(7, len(damaged)), 4):
            if k < len(damaged):
                damaged[k] = int(rng.integers(0, 256))
        result = undefined_symbols(bytes(damaged))
        assert result is None or isinstance(result, list)
