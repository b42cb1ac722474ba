"""Adstack sizing at launch (adstack.py, passes/bounds.py): per-thread loop bounds sized by a
max-reduction over the parallel loop's space (host numpy path and the generated max-reduction
kernel, which must agree), the size cache keyed on write generations (field.py), and where
overflows surface. Gradients are checked against a numpy reference on random data."""

from __future__ import annotations

import ctypes

import numba
import numpy as np
import pytest

import qd_numba as qd
from qd_numba import adstack, config
from qd_numba.field import host_sync_checks

N = 24


def _sin_chain_reference(xs, counts):
    """d/dx of sum(sin^counts[i](x[i])): the chained derivative per element."""
    v, dv = xs.copy(), np.ones_like(xs)
    for t in range(int(counts.max(initial=0))):
        live = t < counts
        dv = np.where(live, dv * np.cos(v), dv)
        v = np.where(live, np.sin(v), v)
    return v, dv


def _fields():
    x = qd.field(qd.f64, shape=(N,), needs_grad=True)
    n = qd.field(qd.i32, shape=(N,))
    loss = qd.field(qd.f64, shape=(), needs_grad=True)
    return x, n, loss


def _run(kernel, loss, *args):
    loss[None] = 0
    with qd.ad.Tape(loss=loss):
        kernel(*args)


def test_per_thread_bound_from_a_field_matches_the_reference(rng):
    x, n, loss = _fields()

    @qd.kernel
    def chain():
        for i in x:
            v = x[i]
            for _ in range(n[i]):
                v = qd.sin(v)
            loss[None] += v

    for high in (1, 9, 30):
        counts = rng.integers(0, high, N).astype(np.int32)
        xs = rng.uniform(-1.5, 1.5, N)
        n.from_numpy(counts)
        x.from_numpy(xs)
        _run(chain, loss)
        v, dv = _sin_chain_reference(xs, counts)
        np.testing.assert_allclose(loss[None], v.sum(), rtol=1e-12)
        np.testing.assert_allclose(x.grad.to_numpy(), dv, rtol=1e-12)
        # per iteration: v (what cos(v) of the adjoint reads; the loop header's executions are
        # counted, not recorded); the sizer counts the body trips + 1 times
        assert chain.grad.adstacks[0].depth == max(1, int(counts.max()) + 1)


def test_bound_from_the_loop_index_and_a_shifted_element(rng):
    x, n, loss = _fields()

    @qd.kernel
    def ramp():
        for i in range(1, N):
            v = x[i]
            for _ in range(i // 2 + n[i - 1]):
                v = qd.sin(v) * 1.01
            loss[None] += v

    counts = rng.integers(0, 5, N).astype(np.int32)
    xs = rng.uniform(-1, 1, N)
    n.from_numpy(counts)
    x.from_numpy(xs)
    _run(ramp, loss)
    steps = np.array([0] + [i // 2 + counts[i - 1] for i in range(1, N)])
    v, dv = xs.copy(), np.ones(N)
    for t in range(steps.max()):
        live = t < steps
        dv = np.where(live, dv * np.cos(v) * 1.01, dv)
        v = np.where(live, np.sin(v) * 1.01, v)
    expected = dv.copy()
    expected[0] = 0.0                      # outside the loop's range: no gradient
    np.testing.assert_allclose(x.grad.to_numpy(), expected, rtol=1e-12)
    assert ramp.grad.adstacks[0].depth == int(steps[1:].max()) + 1   # v (the header is counted)


def _depths(sizer, make):
    """(depths, gradient) of the kernels ``make()`` builds, under qd.init(ad_stack_sizer=sizer)."""
    qd.init(arch=config.current.arch, ad_stack_sizer=sizer)
    return make()


def test_host_and_device_sizers_give_the_same_depths(rng):
    """The differential test of the two sizing paths: numpy over host data vs the generated
    max-reduction kernel (run on the CPU here; compiled to a cubin by the CUDA compile check)."""
    counts2d = rng.integers(0, 7, (5, 6)).astype(np.int64)
    counts = rng.integers(0, 11, N).astype(np.int32)
    xs = rng.uniform(-1, 1, N)
    ys = rng.uniform(-1, 1, (5, 6))
    lo = rng.integers(0, 3, N).astype(np.int32)

    def make():
        x, n, loss = _fields()
        start = qd.field(qd.i32, shape=(N,))
        y = qd.field(qd.f64, shape=(5, 6), needs_grad=True)
        m = qd.field(qd.i64, shape=(5, 6))

        @qd.kernel
        def one_d(extra: qd.i32):
            for i in x:
                v = x[i]
                for _ in range(start[i], max(n[i], start[i]) + extra):
                    v = qd.sin(v) + 0.25
                loss[None] += v

        @qd.kernel
        def two_d():
            for i, j in y:
                v = y[i, j]
                for _ in range(m[i, j] * 2 - j):
                    v = qd.cos(v)
                loss[None] += v

        n.from_numpy(counts)
        start.from_numpy(lo)
        x.from_numpy(xs)
        y.from_numpy(ys)
        m.from_numpy(counts2d)
        out = []
        for kernel, args in ((one_d, (3,)), (two_d, ())):
            _run(kernel, loss, *args)
            stack = kernel.grad.adstacks[0]
            out.append((stack.depth, stack.device_reductions, x.grad.to_numpy(), y.grad.to_numpy()))
        return out

    try:
        host = _depths("host", make)
        device = _depths("device", make)
    finally:
        qd.init(arch=config.current.arch)
    for (hd, hr, hx, hy), (dd, dr, dx, dy) in zip(host, device):
        assert hd == dd and hd > 1
        assert hr == 0 and dr == 1
        np.testing.assert_array_equal(hx, dx)
        np.testing.assert_array_equal(hy, dy)
    trips = np.maximum(0, np.maximum(counts, lo) + 3 - lo)
    assert host[0][0] == trips.max() + 1       # v per iteration (the loop header is counted)
    assert host[1][0] == np.maximum(0, counts2d * 2 - np.arange(6)).max() + 1


def test_sizes_are_recomputed_exactly_when_a_leaf_changes(rng):
    x, n, loss = _fields()
    bumped = qd.ndarray(qd.i32, (N,))

    @qd.kernel
    def chain(k: qd.i32, extra: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        for i in x:
            v = x[i]
            for _ in range(n[i] + k + extra[i]):
                v = qd.sin(v)
            loss[None] += v

    @qd.kernel
    def grow(by: qd.i32):
        for i in n:
            n[i] += by

    @qd.kernel
    def touch_loss():
        loss[None] = 0.0

    @qd.kernel
    def set_extra(a: qd.types.ndarray(dtype=qd.i32, ndim=1), value: qd.i32):
        for i in a:
            a[i] = value

    counts = rng.integers(0, 6, N).astype(np.int32)
    xs = rng.uniform(-1, 1, N)
    n.from_numpy(counts)
    x.from_numpy(xs)
    bumped.from_numpy(np.zeros(N, np.int32))
    state = {"counts": counts.copy(), "k": 0, "extra": np.zeros(N, np.int32)}

    def launch(k=0):
        state["k"] = k
        _run(chain, loss, k, bumped)
        v, dv = _sin_chain_reference(xs, state["counts"] + k + state["extra"])
        np.testing.assert_allclose(x.grad.to_numpy(), dv, rtol=1e-12)     # never stale
        return chain.grad.adstacks[0].evaluations

    assert launch() == 1
    assert launch() == 1                    # nothing changed: no evaluation
    touch_loss()                            # a kernel writing something else
    x.from_numpy(xs)                        # a field that is not a leaf
    assert launch() == 1
    n[3] = 40                               # host __setitem__
    state["counts"][3] = 40
    assert launch() == 2
    assert launch() == 2
    grow(2)                                 # a kernel launch that writes the leaf
    state["counts"] += 2
    assert launch() == 3
    n.from_numpy(counts)                    # from_numpy
    state["counts"] = counts.copy()
    assert launch() == 4
    n.fill(1)                               # fill
    state["counts"][:] = 1
    assert launch() == 5
    assert launch(k=4) == 6                 # a scalar argument
    assert launch(k=4) == 6
    set_extra(bumped, 3)                    # a kernel writing an ndarray argument
    state["extra"][:] = 3
    assert launch(k=4) == 7
    bumped[0] = 9                           # the ndarray's __setitem__
    state["extra"][0] = 9
    assert launch(k=4) == 8
    assert launch(k=4) == 8


def test_a_numpy_argument_leaf_is_evaluated_on_every_launch(rng):
    x, _, loss = _fields()

    @qd.kernel
    def chain(counts: qd.types.ndarray(dtype=qd.i32, ndim=1)):
        for i in x:
            v = x[i]
            for _ in range(counts[i]):
                v = qd.sin(v)
            loss[None] += v

    counts = rng.integers(0, 6, N).astype(np.int32)
    xs = rng.uniform(-1, 1, N)
    x.from_numpy(xs)
    for launch in range(1, 4):
        counts[launch] = 10 * launch        # changed in place: no generation says so
        loss[None] = 0
        chain(counts)
        loss.grad[None] = 1
        x.grad.fill(0)
        chain.grad(counts)
        np.testing.assert_allclose(x.grad.to_numpy(), _sin_chain_reference(xs, counts)[1], rtol=1e-12)
        assert chain.grad.adstacks[0].evaluations == launch


def test_stamps_and_reducer_source():
    """The cache keys of each leaf kind, and the generated reduction kernel's text."""
    nd = qd.ndarray(qd.i32, (4,))
    first = adstack._stamp(nd)
    nd.fill(2)
    assert adstack._stamp(nd) != first
    assert adstack._stamp(nd._arr) == adstack._stamp(nd)      # the CPU launcher passes the buffer
    assert adstack._stamp(np.zeros(3)) is None and adstack._stamp(7) == 7
    dims = ((("const", 0), ("shape", ("arg", 1), 0), ("const", 1)),)
    body = ("*", ("load", ("arg", 1), (("index", 0),)), ("arg", 0))
    source, used, fields = adstack.reducer_source(dims, body, runtime=1)
    assert used == [0] and fields == [1]
    assert "qd.atomic_max(out[0], qd.cast((f0[i0] * a0), qd.i64))" in source


def test_ad_stack_sizer_option_is_checked():
    with pytest.raises(qd.QuadrantsConfigError, match="ad_stack_sizer"):
        qd.init(arch=config.current.arch, ad_stack_sizer="gpu")
    qd.init(arch=config.current.arch)


@pytest.mark.cuda
def test_cuda_device_reduction_and_deferred_overflow(rng):
    """On the GPU a per-thread bound in a field is reduced by the device kernel (one int64 comes
    back) and agrees with the host path; an overflow surfaces at the next synchronisation."""
    counts = rng.integers(0, 40, 4096).astype(np.int32)
    xs = rng.uniform(-1, 1, 4096)
    depths = {}
    try:
        for sizer in ("host", "auto"):
            qd.init(arch=qd.cuda, ad_stack_sizer=sizer)
            x = qd.field(qd.f64, shape=(4096,), needs_grad=True)
            n = qd.field(qd.i32, shape=(4096,))
            loss = qd.field(qd.f64, shape=(), needs_grad=True)

            @qd.kernel
            def chain():
                for i in x:
                    v = x[i]
                    for _ in range(n[i]):
                        v = qd.sin(v)
                    loss[None] += v

            n.from_numpy(counts)
            x.from_numpy(xs)
            _run(chain, loss)
            np.testing.assert_allclose(x.grad.to_numpy(), _sin_chain_reference(xs, counts)[1], rtol=1e-12)
            stack = chain.grad.adstacks[0]
            depths[sizer] = (stack.depth, stack.device_reductions)
        assert depths["host"][0] == depths["auto"][0] == int(counts.max()) + 1
        assert depths["host"][1] == 0 and depths["auto"][1] == 1

        qd.init(arch=qd.cuda, ad_stack_size=8)
        x = qd.field(qd.f64, shape=(256,), needs_grad=True)
        loss = qd.field(qd.f64, shape=(), needs_grad=True)

        @qd.kernel
        def deep(steps: qd.i32):
            for i in x:
                v = x[i]
                for _ in range(steps):
                    v = qd.sin(v)
                loss[None] += v

        deep(20)
        loss.grad[None] = 1
        deep.grad(20)                       # returns: the flag is read asynchronously
        with pytest.raises(qd.QuadrantsRuntimeError, match="adstack overflow") as info:
            qd.sync()
        assert "deep.grad" in str(info.value) and "test_ad_sizing.py:" in str(info.value)
        assert "next synchronisation" in str(info.value)
        deep.grad(2)                        # the flag was cleared
        qd.sync()
        deep.grad(20)
        with pytest.raises(qd.QuadrantsRuntimeError, match="adstack overflow"):
            x.grad.to_numpy()
    finally:
        qd.init()


class _StandInRuntime:
    """The CudaRuntime calls the CUDA launch wrapper makes, on host memory: the flag copy is
    immediate, and ``done`` says whether its event has completed."""

    def __init__(self):
        self.done, self.waits, self.uploads = False, 0, 0

    def pinned_words(self, count):
        words = (ctypes.c_int64 * count)()
        return words, ctypes.addressof(words)

    def event(self):
        return object()

    def write_async(self, device_address, host_address, nbytes, event):
        self.uploads += 1
        ctypes.memmove(device_address, host_address, nbytes)

    def read_async(self, host_address, device_address, nbytes, event):
        flag = ctypes.c_int64.from_address(device_address)
        ctypes.c_int64.from_address(host_address).value = flag.value
        flag.value = 0

    def event_done(self, event):
        return self.done

    def wait_event(self, event):
        self.waits += 1

    def device_words(self, count):
        return adstack.host_alloc(count)


class _HostAsDevice:
    """A field's ``_dev`` standing for device memory: the host buffer itself."""

    def __init__(self, array):
        self.array = array
        self.device_ctypes_pointer = ctypes.c_void_p(array.ctypes.data)

    def copy_to_device(self, values):
        self.array[...] = values


def test_cuda_launch_wrapper_reports_overflows_at_synchronisation_points(rng, monkeypatch, arch):
    if arch != "cpu":
        pytest.skip("drives the CUDA launch wrapper with the CPU instance and a stand-in runtime "
                    "(the GPU's own test is test_cuda_device_reduction_and_deferred_overflow)")
    """The CUDA gradient launch path (adstack.wrap_cuda_run) driven on the CPU with a stand-in
    runtime: the launch never waits; the flag is reported at qd.sync or the Tape's exit (device
    reads too, on a GPU), or at a later launch once its copy is done, naming the kernel and the
    task."""
    x, _, loss = _fields()

    @qd.kernel
    def chain(steps: qd.i32):
        for i in x:
            v = x[i]
            for _ in range(steps):
                v = qd.sin(v)
            loss[None] += v

    x.from_numpy(rng.uniform(-1, 1, N))
    chain(3)
    loss.grad[None] = 1
    chain.grad(3)
    inst = chain.grad.last_instance
    (stack,) = chain.grad.adstacks
    stack.desc._dev = _HostAsDevice(stack.desc._arr)
    rt = _StandInRuntime()
    rows = numba.config.NUMBA_NUM_THREADS
    sized = {"steps": 3}

    def run(steps):             # the launch, with a bound that may differ from the sized one
        return inst.cres.entry_point(sized.get("override", steps), *inst.hidden)

    launch = adstack.wrap_cuda_run(run, [stack], chain.grad, inst.fields, lambda uid: rows, rt)
    try:
        launch(3)
        assert rt.waits == 0 and stack.in_flight and adstack.check_pending in host_sync_checks
        qd.sync()                                           # nothing overflowed
        assert not stack.in_flight and adstack.check_pending not in host_sync_checks
        waits = rt.waits                                    # qd.sync waited for the flag's event
        launch(5)                                           # a new depth: the descriptor goes up async
        assert rt.uploads == 1 and rt.waits == waits and stack.desc._arr[1] == 5 + 1
        launch(6)                                           # the pinned words are reused after their event
        assert rt.uploads == 2 and rt.waits == waits + 1 and stack.desc._arr[1] == 6 + 1
        launch(6)
        assert rt.uploads == 2
        qd.sync()
        sized["override"] = 40                              # the kernel runs longer than sized for 3
        launch(3)
        assert stack.in_flight                              # the launch returned without reporting
        with pytest.raises(qd.QuadrantsRuntimeError, match="adstack overflow") as info:
            qd.sync()
        message = str(info.value)
        assert "chain.grad" in message and "test_ad_sizing.py:" in message and "next synchronisation" in message
        launch(3)                                           # the flag was cleared after its copy
        with pytest.raises(qd.QuadrantsRuntimeError, match="adstack overflow"):
            with qd.ad.Tape(loss=loss):                     # reported at the Tape's exit
                chain(3)
        del sized["override"]
        launch(3)
        rt.done = True
        launch(3)                                           # polls: the earlier launch was fine
        assert len(stack.in_flight) == 1
        sized["override"] = 40
        launch(3)
        del sized["override"]
        rt.done = False
        launch(3)                                           # not done yet: nothing reported, nothing waited
        assert len(stack.in_flight) == 2
        rt.done = True
        with pytest.raises(qd.QuadrantsRuntimeError, match="adstack overflow"):
            launch(3)                                       # a later launch reports it, before launching
        assert len(stack.in_flight) == 1
        qd.sync()                                           # the launch after it was fine
        assert not stack.in_flight and rt.waits > 0
        rt.done, waits = False, rt.waits                    # the host far ahead of the device:
        monkeypatch.setattr(adstack, "_MAX_IN_FLIGHT", 3)   # past the bound, a launch waits for the oldest
        for _ in range(5):
            launch(3)
        assert len(stack.in_flight) == 3 and rt.waits == waits + 2
        qd.sync()
    finally:
        stack.desc._dev = None
        adstack._pending.clear()
        if adstack.check_pending in host_sync_checks:
            host_sync_checks.remove(adstack.check_pending)


def test_two_loops_with_per_thread_bounds_get_their_own_depths(rng):
    x, n, loss = _fields()
    y = qd.field(qd.f64, shape=(N,), needs_grad=True)

    @qd.kernel
    def two():
        for i in x:
            v = x[i]
            for _ in range(n[i]):
                v = qd.sin(v)
            loss[None] += v
        for j in y:
            w = y[j]
            for _ in range(n[j] + 1):
                w = qd.cos(w)
            loss[None] += w

    counts = rng.integers(0, 6, N).astype(np.int32)
    xs, ys = rng.uniform(-1, 1, N), rng.uniform(-1, 1, N)
    n.from_numpy(counts)
    x.from_numpy(xs)
    y.from_numpy(ys)
    _run(two, loss)
    np.testing.assert_allclose(x.grad.to_numpy(), _sin_chain_reference(xs, counts)[1], rtol=1e-12)
    w, dw = ys.copy(), np.ones(N)
    for t in range(int(counts.max()) + 1):
        live = t < counts + 1
        dw = np.where(live, -dw * np.sin(w), dw)
        w = np.where(live, np.cos(w), w)
    np.testing.assert_allclose(y.grad.to_numpy(), dw, rtol=1e-12)
    assert sorted(s.depth for s in two.grad.adstacks) == [counts.max() + 1, counts.max() + 2]   # v, w per iteration


def test_size_expressions_are_simplified():
    from qd_numba.passes.bounds import simplify_size

    trip = ("+", ("max", ("const", 0), ("-", ("load", ("arg", 1), (("index", 0),)), ("const", 0))), ("const", 1))
    size = ("+", ("+", ("*", ("const", 1), trip), ("*", ("const", 2), trip)), ("*", ("const", 4), ("const", 5)))
    simple = simplify_size(size)
    assert simple == ("+", ("*", ("const", 3), ("+", ("max", ("const", 0), ("load", ("arg", 1), (("index", 0),))),
                                                   ("const", 1))), ("const", 20))
    leaf = {1: np.array([3, 9, 1])}.__getitem__
    dims = ((("const", 0), ("const", 3), ("const", 1)),)
    assert adstack.max_over(dims, simple, leaf) == adstack.max_over(dims, size, leaf) == 3 * 10 + 20
    assert simplify_size(("//", ("const", 4), ("const", 0))) == ("//", ("const", 4), ("const", 0))
