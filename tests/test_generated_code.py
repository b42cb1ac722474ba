"""Generated Python (call paths, launch runners) shows its source in tracebacks and dumps, and
its code objects are kept in the offline cache."""

from __future__ import annotations

import linecache
import marshal
import traceback
import warnings

import numpy as np
import pytest

import qd_numba as qd
from qd_numba import config, generated_code, offline_cache
from qd_numba.generated_code import exec_generated


def test_generated_source_is_in_linecache_and_tracebacks():
    ns = exec_generated("def boom(x):\n    return 1 // x\n", "test boom", {})
    try:
        ns["boom"](0)
    except ZeroDivisionError as e:
        frames = traceback.extract_tb(e.__traceback__)
    else:
        raise AssertionError("1 // 0 did not raise")
    last = frames[-1]
    assert last.filename.startswith("<qd_numba test boom #")
    assert last.line == "return 1 // x"
    assert linecache.getline(last.filename, 1).startswith("def boom(x):")


def test_kernel_call_path_is_readable(rng):
    @qd.kernel
    def add(a: qd.types.ndarray(dtype=qd.f32, ndim=1), s: qd.f32):
        for i in range(a.shape[0]):
            a[i] += s

    a = rng.random(16).astype(np.float32)
    expected = a + 2.0
    add(a, 2.0)
    np.testing.assert_allclose(a, expected, rtol=1e-6)
    code = type(add).__call__.__code__
    assert code.co_filename.startswith("<qd_numba call ")
    source = "".join(linecache.getlines(code.co_filename))
    assert "def __call__(__qd_self, a=MISSING, s=MISSING" in source


def test_dump_generated_prints_the_source(capsys):
    saved = config.current.dump_generated
    config.current.dump_generated = True
    try:
        exec_generated("def f():\n    return 42\n", "test dump", {})
    finally:
        config.current.dump_generated = saved
    err = capsys.readouterr().err
    assert "=== qd_numba generated source <qd_numba test dump #" in err and "return 42" in err


# -- code objects kept in the offline cache -------------------------------------------------------------

@pytest.fixture
def cache_dir(tmp_path):
    path = tmp_path / "qdcache"
    qd.init(arch=qd.cpu, offline_cache=True, offline_cache_file_path=str(path))
    generated_code._codes.clear()
    yield path
    generated_code._codes.clear()
    qd.init(arch=qd.cpu)


def _source(rng):
    k = int(rng.integers(2, 1000))
    return k, f"def scaled(x):\n    return x * {k} - 1 // (x - {k})\n"


def _blobs(path):
    """The code files under ``path``, once the queued ones are written."""
    offline_cache.flush_generated_code()
    return [p for p in path.rglob("*" + offline_cache.CODE_SUFFIX) if not p.name.startswith(".tmp-")]


def test_a_later_process_loads_the_code_instead_of_compiling(cache_dir, rng, monkeypatch):
    k, src = _source(rng)
    first = exec_generated(src, "test cached", {})["scaled"]
    assert first(3) == 3 * k - 1 // (3 - k) and len(_blobs(cache_dir)) == 1
    generated_code._codes.clear()           # what a new process knows

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled although the offline cache holds the code")

    monkeypatch.setattr(generated_code, "compile", no_compile, raising=False)
    again = exec_generated(src, "test cached", {})["scaled"]
    assert again(5) == 5 * k - 1 // (5 - k)
    assert again.__code__.co_filename == first.__code__.co_filename
    try:                                    # its traceback still shows the generated lines
        again(k)
    except ZeroDivisionError as e:
        last = traceback.extract_tb(e.__traceback__)[-1]
    else:
        raise AssertionError("1 // 0 did not raise")
    assert last.filename.startswith("<qd_numba test cached #") and last.line == f"return x * {k} - 1 // (x - {k})"


def test_other_source_or_name_is_other_code(cache_dir, rng):
    k, src = _source(rng)
    a = exec_generated(src, "test one", {})["scaled"]
    b = exec_generated(src.replace(f"* {k}", f"* {k + 1}"), "test one", {})["scaled"]
    c = exec_generated(src, "test two", {})["scaled"]
    assert (a(3), b(3), c(3)) == (3 * k - 1 // (3 - k), 3 * (k + 1) - 1 // (3 - k), 3 * k - 1 // (3 - k))
    assert len({a.__code__.co_filename, b.__code__.co_filename, c.__code__.co_filename}) == 3
    assert len(_blobs(cache_dir)) == 3


@pytest.mark.parametrize("damage", ["random bytes", "truncated", "other code"])
def test_a_damaged_entry_is_discarded_and_compiled_again(cache_dir, rng, damage):
    k, src = _source(rng)
    exec_generated(src, "test damaged", {})
    (blob,) = _blobs(cache_dir)
    data = blob.read_bytes()
    if damage == "random bytes":
        blob.write_bytes(rng.integers(0, 256, len(data), dtype=np.uint8).tobytes())
    elif damage == "truncated":
        blob.write_bytes(data[: len(data) // 2])
    else:   # a well-formed entry holding the code of another source under this key
        key = blob.name[: -len(offline_cache.CODE_SUFFIX)]
        offline_cache.store_blob(key, marshal.dumps(compile("def scaled(x):\n    return -7\n", "<other>", "exec")),
                                 offline_cache.CODE_SUFFIX)
    generated_code._codes.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", qd.QuadrantsWarning)
        got = exec_generated(src, "test damaged", {})["scaled"]
    assert got(3) == 3 * k - 1 // (3 - k)
    offline_cache.flush_generated_code()
    generated_code._codes.clear()           # rewritten: the next process loads good code
    assert exec_generated(src, "test damaged", {})["scaled"](4) == 4 * k - 1 // (4 - k)


def test_code_files_are_written_together_at_exit_or_in_batches(cache_dir, rng, monkeypatch):
    """A kernel's first call queues its code files (one directory lock for all of them, at exit
    or when 64 are queued) instead of writing each as it is generated."""
    sources = [_source(rng)[1].replace("scaled", f"scaled{i}") for i in range(3)]
    for i, src in enumerate(sources):
        exec_generated(src, f"test queued {i}", {})
    assert not list(cache_dir.rglob("*" + offline_cache.CODE_SUFFIX))
    assert len(_blobs(cache_dir)) == 3          # flushed (as at exit)
    monkeypatch.setattr(offline_cache, "_FLUSH_AT", 2)
    exec_generated(sources[0], "test batch a", {})
    assert len(offline_cache._pending_code) == 1
    exec_generated(sources[0], "test batch b", {})     # the second queued: both written now
    assert not offline_cache._pending_code
    assert len(list(cache_dir.rglob("*" + offline_cache.CODE_SUFFIX))) == 5


def test_a_process_writes_its_queued_code_files_when_it_exits(tmp_path, rng):
    import subprocess
    import sys

    k, src = _source(rng)
    code = ("import sys\nimport qd_numba as qd\nfrom qd_numba.generated_code import exec_generated\n"
            "qd.init(arch=qd.cpu, offline_cache=True, offline_cache_file_path=sys.argv[1])\n"
            f"assert exec_generated({src!r}, 'test exit', {{}})['scaled'](3) == {3 * k - 1 // (3 - k)}\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "c")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(list((tmp_path / "c").rglob("*" + offline_cache.CODE_SUFFIX))) == 1


def test_without_the_offline_cache_nothing_is_written(tmp_path, rng):
    path = tmp_path / "off"
    qd.init(arch=qd.cpu, offline_cache=False, offline_cache_file_path=str(path))
    try:
        k, src = _source(rng)
        assert exec_generated(src, "test off", {})["scaled"](3) == 3 * k - 1 // (3 - k)
        assert not path.exists()
    finally:
        qd.init(arch=qd.cpu)
