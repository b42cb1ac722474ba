"""qd.random: reproducible, counter-based (Philox-4x32-10), the same numbers on every backend.

References: the published Philox known answers, and the numpy implementation of the generator
in lowering/random.py (``host_random``), which the compiled numbers must equal bit for bit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import qd_numba as qd
from qd_numba.lowering.random import PYTHON_STREAM, host_launch_key, host_philox, host_random


@pytest.fixture
def seeded(arch):
    """``seeded(s)``: qd.init on the suite's arch with random_seed=s; the arch is re-initialised after."""
    yield lambda seed=None, **kw: qd.init(arch=arch, random_seed=seed, **kw)
    qd.init(arch=arch)


def _iterations(*shape):
    """Flat iteration indices of an ndrange over ``shape``, as an array of that shape."""
    return np.arange(int(np.prod(shape))).reshape(shape)


# -- the generator -------------------------------------------------------------------------------------

@pytest.mark.parametrize("counter, key, expected", [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_known_answers(counter, key, expected):
    """Random123's known-answer vectors for Philox-4x32-10."""
    assert tuple(int(w) for w in host_philox(counter, key)) == expected


@qd.kernel
def per_iteration(a: qd.types.ndarray(dtype=qd.f32, ndim=2), b: qd.types.ndarray(dtype=qd.f64, ndim=2),
                  c: qd.types.ndarray(dtype=qd.i32, ndim=3)):
    for i, j in qd.ndrange(a.shape[0], a.shape[1]):
        a[i, j] = qd.random()
        b[i, j] = qd.random(qd.f64)
        for k in range(c.shape[2]):
            c[i, j, k] = qd.random(dtype=qd.i32)


def test_kernel_equals_reference_generator(seeded, rng):
    seed = int(rng.integers(0, 2**62))
    seeded(seed)
    a, b, c = np.zeros((37, 5), np.float32), np.zeros((37, 5)), np.zeros((37, 5, 3), np.int32)
    per_iteration(a, b, c)
    key = host_launch_key(seed, 0)
    flat = _iterations(37, 5)
    np.testing.assert_array_equal(a, host_random(key, flat, 1, 0, qd.f32))
    np.testing.assert_array_equal(b, host_random(key, flat, 1, 1, qd.f64))
    np.testing.assert_array_equal(c, host_random(key, flat[..., None], 1, 2 + np.arange(3), qd.i32))
    assert 0 <= a.min() and a.max() < 1 and 0 <= b.min() and b.max() < 1
    assert c.min() < -(2**30) and c.max() > 2**30          # int32 range, as before


def test_launches_differ_and_follow_the_launch_counter(seeded):
    seeded(2024)
    a, b, c = np.zeros((16, 16), np.float32), np.zeros((16, 16)), np.zeros((16, 16, 1), np.int32)
    runs = []
    for _ in range(3):
        per_iteration(a, b, c)
        runs.append(a.copy())
    flat = _iterations(16, 16)
    for launch, got in enumerate(runs):
        np.testing.assert_array_equal(got, host_random(host_launch_key(2024, launch), flat, 1, 0, qd.f32))
    assert not np.array_equal(runs[0], runs[1]) and not np.array_equal(runs[1], runs[2])


def test_same_seed_same_numbers_and_other_seed_other_numbers(seeded):
    a, b, c = np.zeros((64, 8), np.float32), np.zeros((64, 8)), np.zeros((64, 8, 2), np.int32)
    results = []
    for seed in (5, 5, 6):
        seeded(seed)
        per_iteration(a, b, c)
        per_iteration(a, b, c)
        results.append((a.copy(), b.copy(), c.copy()))
    for x, y in zip(results[0], results[1]):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(results[0][0], results[2][0])
    assert not np.array_equal(results[0][2], results[2][2])


def test_default_seed_is_zero(seeded):
    seeded()
    a, b, c = np.zeros((8, 8), np.float32), np.zeros((8, 8)), np.zeros((8, 8, 1), np.int32)
    per_iteration(a, b, c)
    np.testing.assert_array_equal(a, host_random(host_launch_key(0, 0), _iterations(8, 8), 1, 0, qd.f32))


x_serial = qd.field(qd.f64, shape=(6,))


@qd.kernel
def serial_and_loops(out: qd.types.ndarray(dtype=qd.f64, ndim=1)):
    x_serial[0] = qd.random(qd.f64)
    for i in range(out.shape[0]):
        out[i] = qd.random(qd.f64)
    k = 1
    while k < 4:                                  # serial code: one counter for the whole launch
        x_serial[k] = qd.random(qd.f64)
        k += 1
    for i in range(out.shape[0]):
        out[i] += 2.0 * qd.random(qd.f64)
    x_serial[4] = qd.random(qd.f64)
    x_serial[5] = qd.random(qd.f64)


def test_serial_code_and_loops_have_their_own_streams(seeded):
    seeded(77)
    out = np.zeros(50)
    for launch in range(2):
        serial_and_loops(out)
        key = host_launch_key(77, launch)
        idx = np.arange(50)
        np.testing.assert_array_equal(x_serial.to_numpy(), host_random(key, 0, 0, np.arange(6), qd.f64))
        expected = host_random(key, idx, 1, 0, qd.f64) + 2.0 * host_random(key, idx, 2, 0, qd.f64)
        np.testing.assert_array_equal(out, expected)


def make_two_loops(fuse):
    @qd.kernel(fuse=fuse)
    def two_loops(a: qd.types.ndarray(dtype=qd.f32, ndim=1), b: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] = qd.random()
        for i in range(a.shape[0]):
            b[i] = qd.random() - qd.random()
    return two_loops


def test_fusion_does_not_change_the_numbers(seeded):
    results = []
    for fuse in (False, True):
        seeded(9)
        kernel = make_two_loops(fuse)
        a, b = np.zeros(300, np.float32), np.zeros(300, np.float32)
        kernel(a, b)
        # the serial task reads and advances the launch key (every target plans it: passes/plan_tasks.py)
        assert [t.kind for t in kernel.tasks(a, b)] == ["serial"] + ["range_for"] * (1 if fuse else 2)
        results.append((a, b))
    key, idx = host_launch_key(9, 0), np.arange(300)
    for a, b in results:
        np.testing.assert_array_equal(a, host_random(key, idx, 1, 0, qd.f32))
        np.testing.assert_array_equal(b, host_random(key, idx, 2, 0, qd.f32) - host_random(key, idx, 2, 1, qd.f32))


@qd.kernel
def through_func(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
    for i in range(a.shape[0]):
        a[i] = jitter(0.5)


@qd.func
def jitter(scale):
    return scale * qd.random()


def test_random_in_a_qd_func(seeded):
    seeded(3)
    a = np.zeros(100, np.float32)
    through_func(a)
    np.testing.assert_array_equal(a, np.float32(0.5) * host_random(host_launch_key(3, 0), np.arange(100), 1, 0, qd.f32))


def test_thread_count_does_not_change_the_numbers(seeded, arch):
    if arch != "cpu":
        pytest.skip("CPU thread counts")
    import numba

    results = []
    try:
        for threads in (1, 2):
            seeded(31, cpu_max_num_threads=threads)
            a, b, c = np.zeros((333, 7), np.float32), np.zeros((333, 7)), np.zeros((333, 7, 2), np.int32)
            per_iteration(a, b, c)
            results.append((a, b, c))
    finally:  # all cores again for the tests after this one
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    for x, y in zip(*results):
        np.testing.assert_array_equal(x, y)


_FRESH_PROCESS = textwrap.dedent("""
    import hashlib, numpy as np, qd_numba as qd
    qd.init(arch=qd.cpu, random_seed=1234)

    @qd.kernel
    def fill(a: qd.types.ndarray(dtype=qd.f32, ndim=2)):
        for i, j in qd.ndrange(a.shape[0], a.shape[1]):
            a[i, j] = qd.random() + qd.random()
        a[0, 0] = qd.random()

    a = np.zeros((1001, 13), np.float32)
    fill(a)
    fill(a)
    print(hashlib.sha256(a.tobytes()).hexdigest())
""")


def test_same_seed_in_fresh_processes_with_other_thread_counts():
    """Chunks depend on the thread count; the numbers must not (NUMBA_NUM_THREADS 1, 2, 3)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digests = set()
    for threads in ("1", "2", "3"):
        env = dict(os.environ, NUMBA_NUM_THREADS=threads,
                   PYTHONPATH=os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]))
        env.pop("QD_ARCH", None)
        out = subprocess.run([sys.executable, "-c", _FRESH_PROCESS], capture_output=True, text=True, env=env,
                             timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        digests.add(out.stdout.strip())
    a = (host_random(host_launch_key(1234, 1), _iterations(1001, 13), 1, 0, qd.f32)
         + host_random(host_launch_key(1234, 1), _iterations(1001, 13), 1, 1, qd.f32))
    a[0, 0] = host_random(host_launch_key(1234, 1), 0, 0, 0, qd.f32)
    import hashlib

    assert digests == {hashlib.sha256(a.tobytes()).hexdigest()}


def test_python_scope_random_is_reproducible(seeded):
    seeded(42)
    first = [qd.random() for _ in range(5)] + [qd.random(qd.i32), qd.random(qd.f64)]
    seeded(42)
    again = [qd.random() for _ in range(5)] + [qd.random(qd.i32), qd.random(qd.f64)]
    assert first == again
    key = host_launch_key(42, 0)
    assert first[:5] == [float(v) for v in host_random(key, np.arange(5), PYTHON_STREAM, 0, qd.f32)]
    assert isinstance(first[5], int) and isinstance(first[6], float)
    assert all(0 <= v < 1 for v in first[:5])
    assert qd.random(int) == host_random(key, 7, PYTHON_STREAM, 0, qd.i32)     # int: default_ip
    with pytest.raises(qd.QuadrantsTypeError, match="dtype must be an integer or float type"):
        qd.random(qd.u1)


def test_random_in_an_njit_callee_is_our_error():
    import numba

    @numba.njit
    def noisy(v):
        return v + qd.random()

    @qd.kernel
    def uses_njit(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] = noisy(a[i])

    with pytest.raises(qd.QuadrantsSyntaxError, match=r"qd.random\(\) can only be called in a kernel or a qd.func"):
        uses_njit(np.zeros(4, np.float32))


def test_dtype_argument(seeded):
    seeded(4, default_fp=qd.f64)

    @qd.kernel
    def python_types(a: qd.types.ndarray(dtype=qd.f64, ndim=1), b: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        for i in range(a.shape[0]):
            a[i] = qd.random(float)             # default_fp, as in annotations
            b[i] = qd.random(int)               # default_ip

    a, b = np.zeros(20), np.zeros(20, np.int32)
    python_types(a, b)
    key, idx = host_launch_key(4, 0), np.arange(20)
    np.testing.assert_array_equal(a, host_random(key, idx, 1, 0, qd.f64))
    np.testing.assert_array_equal(b, host_random(key, idx, 1, 1, qd.i32))


@pytest.mark.parametrize("call, error, message", [
    ("qd.random(qd.f32, 2)", qd.QuadrantsSyntaxError, r"qd.random\(\) takes one optional argument, dtype"),
    ("qd.random(seed=1)", qd.QuadrantsSyntaxError, r"qd.random\(\) takes one optional argument, dtype"),
    ("qd.random(qd.u1)", qd.QuadrantsTypeError, r"dtype must be an integer or float type .*got bool"),
    ("qd.random(a[0])", qd.QuadrantsTypeError, r"dtype must be an integer or float type .*known at run time"),
])
def test_bad_arguments_are_our_errors(call, error, message):
    ns = {"qd": qd}
    exec(textwrap.dedent(f"""
        @qd.kernel
        def bad(a: qd.types.ndarray(dtype=qd.f32, ndim=1)):
            for i in range(a.shape[0]):
                a[i] = {call}
    """), ns)
    with pytest.raises(error, match=message):
        ns["bad"](np.zeros(3, np.float32))


# -- statistical quality, 1e6 samples ---------------------------------------------------------------------

@qd.kernel
def samples(a: qd.types.ndarray(dtype=qd.f32, ndim=2), d: qd.types.ndarray(dtype=qd.f64, ndim=1),
            bits: qd.types.ndarray(dtype=qd.i32, ndim=1)):
    for i in range(a.shape[0]):
        a[i, 0] = qd.random()
        a[i, 1] = qd.random()
        d[i] = qd.random(qd.f64)
        bits[i] = qd.random(qd.i32)


N = 1_000_000
SIGMAS = 5


def _check_uniform(x):
    """Mean, variance and chi-square over 100 bins of U[0, 1) samples, each within 5 sigma."""
    n = len(x)
    assert x.min() >= 0 and x.max() < 1
    assert abs(x.mean() - 0.5) < SIGMAS * np.sqrt(1 / 12 / n)
    assert abs(x.var() - 1 / 12) < SIGMAS * np.sqrt((1 / 80 - 1 / 144) / n)
    counts = np.bincount((x * 100).astype(np.int64), minlength=100)
    chi2 = ((counts - n / 100) ** 2 / (n / 100)).sum()
    assert chi2 < 99 + SIGMAS * np.sqrt(2 * 99), chi2


def _check_uncorrelated(x, y):
    assert abs(np.corrcoef(x, y)[0, 1]) < SIGMAS / np.sqrt(len(x))


def test_uniform_floats_pass_simple_statistical_checks(seeded):
    seeded(20261122)
    a, d, bits = np.zeros((N, 2), np.float32), np.zeros(N), np.zeros(N, np.int32)
    samples(a, d, bits)
    first, second = a[:, 0].astype(np.float64), a[:, 1].astype(np.float64)
    for x in (first, second, d):
        _check_uniform(x)
        _check_uncorrelated(x[:-1], x[1:])                 # successive iterations
    _check_uncorrelated(first, second)                     # successive calls in one iteration
    a2 = a.copy()
    samples(a, d, bits)
    _check_uncorrelated(a2[:, 0].astype(np.float64), a[:, 0].astype(np.float64))   # successive launches
    seeded(20261123)
    samples(a, d, bits)
    _check_uncorrelated(a2[:, 0].astype(np.float64), a[:, 0].astype(np.float64))   # neighbouring seeds
    # every bit of the integers is a fair coin
    ones = ((bits.view(np.uint32)[:, None] >> np.arange(32, dtype=np.uint32)) & 1).mean(axis=0)
    assert np.all(np.abs(ones - 0.5) < SIGMAS * 0.5 / np.sqrt(N))


# -- the GPU gives the CPU's numbers ------------------------------------------------------------------------

@pytest.mark.cuda
def test_cuda_gives_the_cpu_numbers():
    """Every kernel above, on qd.cpu and then on qd.cuda with the same seed: identical numbers."""
    def run(arch):
        global x_serial
        qd.init(arch=arch, random_seed=555)
        x_serial = qd.field(qd.f64, shape=(6,))    # the kernel reads its global again after qd.init
        out = []
        for _ in range(2):
            a, b, c = np.zeros((123, 9), np.float32), np.zeros((123, 9)), np.zeros((123, 9, 3), np.int32)
            per_iteration(a, b, c)
            o = np.zeros(77)
            serial_and_loops(o)
            out += [a, b, c, o, x_serial.to_numpy()]
        for fuse in (False, True):
            a, b = np.zeros(1000, np.float32), np.zeros(1000, np.float32)
            make_two_loops(fuse)(a, b)
            out += [a, b]
        return out

    try:
        on_cpu, on_gpu = run(qd.cpu), run(qd.cuda)
    finally:
        qd.init(arch=qd.cpu)
    for x, y in zip(on_cpu, on_gpu):
        np.testing.assert_array_equal(x, y)


@pytest.mark.cuda
def test_cuda_f16_equals_reference():
    qd.init(arch=qd.cuda, random_seed=8)
    try:
        h = qd.field(qd.f16, shape=(4096,))

        @qd.kernel
        def halves():
            for i in h:
                h[i] = qd.random(qd.f16)

        halves()
        np.testing.assert_array_equal(h.to_numpy(), host_random(host_launch_key(8, 0), np.arange(4096), 1, 0, qd.f16))
    finally:
        qd.init(arch=qd.cpu)
