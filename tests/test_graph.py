"""``@qd.kernel(graph=True)`` (qd_numba/graph.py, targets/cuda/graphs.py).

On the CPU: the API, every error path, graph kernels (and their gradients) giving the plain
kernel's results on random data, one task per loop (no fusion), the cache key; the CUDA graph's
build / patch / replay logic with a stand-in driver, and the generated runner's dirty bits with
a stand-in graph. The ``cuda`` tests need a GPU: replays after new ndarrays, new scalars and new
sizes equal the plain kernel; gradients launch plainly. References are numpy on random data.
"""

from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest

import qd_numba as qd
from qd_numba import offline_cache
from qd_numba.errors import QuadrantsRuntimeError, QuadrantsSyntaxError

F64 = qd.types.ndarray(dtype=qd.f64, ndim=1)


def _steps(x: F64, y: F64, z: F64, a: qd.f64):
    """Eight small tasks: seven loops and serial code, each reading what the earlier ones wrote."""
    for i in range(x.shape[0]):
        y[i] = a * x[i]
    for i in range(x.shape[0]):
        z[i] = y[i] + 1.0
    z[0] = z[0] + a                  # a serial task
    for i in range(z.shape[0]):
        y[i] = y[i] * z[i]
    for i in range(1, x.shape[0]):
        x[i] = x[i] - y[i - 1]
    for i in range(z.shape[0]):
        z[i] = z[i] * 0.5
    for i in range(y.shape[0]):
        y[i] += z[i]
    for i in range(x.shape[0]):
        x[i] += a


def _steps_ref(x, y, z, a):
    x, y, z = x.copy(), y.copy(), z.copy()
    y[:] = a * x
    z[:] = y + 1.0
    z[0] += a
    y *= z
    x[1:] -= y[:-1]
    z *= 0.5
    y += z
    x += a
    return x, y, z


steps_graph = qd.kernel(graph=True)(_steps)
steps_plain = qd.kernel(_steps)


def _random(rng, n):
    return rng.uniform(-1, 1, n), rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)


def test_graph_kernel_equals_plain_kernel_and_numpy(rng):
    for n, a in ((257, 0.75), (64, -1.5)):      # new sizes and scalars: same results
        x, y, z = _random(rng, n)
        ref = _steps_ref(x, y, z, a)
        plain = x.copy(), y.copy(), z.copy()
        steps_graph(x, y, z, a)
        steps_plain(*plain, a)
        for got, want, other in zip((x, y, z), ref, plain):
            np.testing.assert_allclose(got, want, rtol=1e-12)
            np.testing.assert_array_equal(got, other)


def test_graph_kernel_with_qd_ndarrays_repeated_calls(rng):
    n = 100
    arrays = [qd.ndarray(qd.f64, n) for _ in range(6)]
    hosts = [rng.uniform(-1, 1, n) for _ in range(6)]
    for arr, host in zip(arrays, hosts):
        arr.from_numpy(host)
    want = [h.copy() for h in hosts]
    for call, a in enumerate((0.5, 0.5, 2.0, -0.25)):
        first = 3 * (call % 2)     # alternate between two sets of ndarrays
        steps_graph(*arrays[first:first + 3], a)
        want[first:first + 3] = _steps_ref(*want[first:first + 3], a)
    for arr, w in zip(arrays, want):
        np.testing.assert_allclose(arr.to_numpy(), w, rtol=1e-12)


def test_graph_keyword_is_kept_and_loops_stay_separate_tasks(rng):
    assert steps_graph.graph is True and steps_plain.graph is False
    x, y, z = _random(rng, 16)
    names = [t.kind for t in steps_graph.tasks(x, y, z, 1.0)]
    assert names.count("range_for") == 7 and len(names) == 8


def test_graph_kernels_never_fuse_even_when_fusion_is_on(rng):
    def body(x: F64, y: F64):
        for i in range(x.shape[0]):
            y[i] = x[i] * 2.0
        for i in range(x.shape[0]):
            x[i] = x[i] + 1.0

    fused = qd.kernel(fuse=True)(body)
    graph = qd.kernel(graph=True, fuse=True)(body)
    x, y = rng.uniform(-1, 1, 40), np.zeros(40)
    assert len(fused.tasks(x, y)) == 1
    assert len(graph.tasks(x, y)) == 2
    x2, y2 = x.copy(), y.copy()
    graph(x, y)
    fused(x2, y2)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_allclose(y, 2.0 * (x - 1.0), rtol=1e-12)


def test_cache_key_includes_the_graph_flag():
    from qd_numba import config

    types_ = {"x": "array(float64, 1d, C)"}
    key_graph = offline_cache.fast_key(steps_graph, types_, config.current, "cpu")
    key_plain = offline_cache.fast_key(steps_plain, types_, config.current, "cpu")
    assert key_graph != key_plain        # same function, same types: only the flag differs
    assert [g for g, p in zip(key_graph, key_plain) if g != p] == [True]


def test_qd_graph_variable_and_init_option_turn_graphs_off(rng, monkeypatch, arch):
    from qd_numba import config

    target = getattr(qd, arch)
    try:
        monkeypatch.setenv("QD_GRAPH", "0")
        qd.init(arch=target)
        assert config.current.cuda_graph is False
        monkeypatch.delenv("QD_GRAPH")
        qd.init(arch=target)
        assert config.current.cuda_graph is True
        qd.init(arch=target, cuda_graph=False)
        assert config.current.cuda_graph is False
        x, y, z = _random(rng, 33)
        ref = _steps_ref(x, y, z, 0.5)
        steps_graph(x, y, z, 0.5)       # graphs off: the same results
        for got, want in zip((x, y, z), ref):
            np.testing.assert_allclose(got, want, rtol=1e-12)
    finally:
        qd.init(arch=target)


# -- errors ---------------------------------------------------------------------------------------------

def test_a_graph_kernel_cannot_return_a_value():
    def total(x: F64) -> qd.f64:
        s = 0.0
        for i in range(x.shape[0]):
            s += x[i]
        return s

    with pytest.raises(QuadrantsSyntaxError, match="kernel 'total': a graph=True kernel cannot return a value"):
        qd.kernel(graph=True)(total)
    assert qd.kernel(total) is not None     # without graph=True it is fine


def test_graph_kernel_gradients_run_as_plain_kernels(rng):
    """As in Quadrants: graph=True is for the primal; kernel.grad and a Tape work (the gradient
    kernels launch without a graph on CUDA) and give the plain kernel's gradients."""
    n = 16
    x0, w0 = rng.uniform(-1, 1, n), rng.uniform(0.5, 2.0, n)
    grads = []
    for graph in (True, False):
        loss = qd.field(qd.f64, shape=(), needs_grad=True)
        x = qd.field(qd.f64, shape=n, needs_grad=True)
        y = qd.field(qd.f64, shape=n, needs_grad=True)
        x.from_numpy(x0)

        def forward(w: F64):
            for i in range(n):
                y[i] = qd.sin(x[i]) * w[i]
            for i in range(n):
                loss[None] += y[i] * y[i]

        kernel = qd.kernel(graph=graph)(forward)
        with qd.ad.Tape(loss=loss):
            kernel(w0)
        np.testing.assert_allclose(loss[None], np.sum((np.sin(x0) * w0) ** 2), rtol=1e-12)
        grads.append(x.grad.to_numpy())
        x.grad.fill(0)
        y.grad.fill(0)
        loss.grad[None] = 1.0
        kernel.grad(w0)         # kernel.grad directly: the same adjoint
        np.testing.assert_allclose(x.grad.to_numpy(), grads[-1], rtol=1e-12)
    np.testing.assert_allclose(grads[0], 2 * np.sin(x0) * w0 ** 2 * np.cos(x0), rtol=1e-10)
    np.testing.assert_array_equal(grads[0], grads[1])


def test_graph_kernel_refuses_qd_stream(rng):
    x, y, z = _random(rng, 8)
    with pytest.raises(QuadrantsRuntimeError, match="kernel '_steps': qd_stream= is not compatible with graph"):
        steps_graph(x, y, z, 1.0, qd_stream=qd.create_stream())
    with pytest.raises(QuadrantsRuntimeError, match="qd_stream= is not compatible"):
        steps_graph(x, y, z, a=1.0, qd_stream=0)
    steps_graph(x, y, z, 1.0, qd_stream=None)    # None: the default stream, as without the keyword


# -- qd.graph.do_while / parallel_context / parallel -----------------------------------------------------

I32_0D = qd.types.ndarray(dtype=qd.i32, ndim=0)


@qd.kernel(graph=True)
def damped(x: F64, v: F64, steps: I32_0D, inner: I32_0D, k: qd.f64):
    for i in range(x.shape[0]):             # once
        v[i] = 0.0
    while qd.graph.do_while(steps):
        inner[()] = 3                       # a bare statement: every outer pass
        while qd.graph.do_while(inner):
            with qd.graph.parallel_context():
                with qd.graph.parallel():
                    for i in range(x.shape[0]):
                        v[i] = v[i] - k * x[i]
                with qd.graph.parallel():
                    inner[()] = inner[()] - 1
            for i in range(x.shape[0]):
                x[i] = x[i] + 0.1 * v[i]
        for i in range(x.shape[0]):
            v[i] = v[i] * 0.5
        steps[()] = steps[()] - 1
    for i in range(x.shape[0]):             # once, after
        x[i] = x[i] * 2.0


def _damped_ref(x, steps, k):
    x, v = x.copy(), np.zeros_like(x)
    for _ in range(max(steps, 1)):          # do-while: the body runs at least once
        for _ in range(3):
            v -= k * x
            x += 0.1 * v
        v *= 0.5
    return 2.0 * x, v


def test_do_while_loops_and_parallel_sections_equal_numpy(rng):
    for steps in (4, 1):
        x0 = rng.uniform(-1, 1, 50)
        x, v = qd.ndarray(qd.f64, 50), qd.ndarray(qd.f64, 50)
        counter, inner = qd.ndarray(qd.i32, ()), qd.ndarray(qd.i32, ())
        x.from_numpy(x0)
        counter.from_numpy(np.array(steps, np.int32))
        damped(x, v, counter, inner, 0.3)
        want_x, want_v = _damped_ref(x0, steps, 0.3)
        np.testing.assert_allclose(x.to_numpy(), want_x, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(v.to_numpy(), want_v, rtol=1e-12, atol=1e-14)
        assert counter.to_numpy() == 0 and inner.to_numpy() == 0
    assert damped.graph is True and "do_while" in repr(damped)


def test_do_while_with_numpy_flags_keywords_and_closure_fields(rng):
    total = qd.field(qd.f64, shape=())
    a = rng.uniform(0, 1, 20)

    @qd.kernel(graph=True)
    def accumulate(values: F64, n: I32_0D):
        while qd.graph.do_while(n):
            for i in range(values.shape[0]):
                total[None] += values[i]
            n[()] = n[()] - 1

    n = np.array(3, np.int32)
    accumulate(n=n, values=a)
    assert n[()] == 0
    np.testing.assert_allclose(total[None], 3 * a.sum(), rtol=1e-12)
    with pytest.raises(QuadrantsRuntimeError, match="kernel 'accumulate': qd_stream= is not compatible"):
        accumulate(a, n, qd_stream=qd.create_stream())
    with pytest.raises(qd.errors.QuadrantsTypeError, match="argument 'n': qd.graph.do_while.. needs a 0-d"):
        accumulate(a, np.array([1], np.int32))


def test_graph_constructs_outside_graph_kernels_are_located_errors():
    def loop_in_plain(x: F64, n: I32_0D):
        while qd.graph.do_while(n):
            for i in range(x.shape[0]):
                x[i] += 1.0

    with pytest.raises(QuadrantsSyntaxError, match=r"(?s)in kernel 'loop_in_plain': qd.graph.do_while\(\) requires "
                                                   r"@qd.kernel\(graph=True\).*test_graph.py\", line \d+"):
        qd.kernel(loop_in_plain)

    def region_in_plain(x: F64):
        with qd.graph.parallel_context():
            with qd.graph.parallel():
                for i in range(x.shape[0]):
                    x[i] += 1.0

    with pytest.raises(QuadrantsSyntaxError, match=r"qd.graph.parallel_context\(\) requires @qd.kernel\(graph"):
        qd.kernel(region_in_plain)


def test_misplaced_graph_constructs_are_located_errors():
    def in_a_for(x: F64, n: I32_0D):
        for j in range(2):
            while qd.graph.do_while(n):
                x[j] += 1.0

    def not_a_parameter(x: F64):
        while qd.graph.do_while(x_count):  # noqa: F821
            for i in range(x.shape[0]):
                x[i] += 1.0

    def section_alone(x: F64):
        with qd.graph.parallel():
            for i in range(x.shape[0]):
                x[i] += 1.0

    def mixed_region(x: F64):
        with qd.graph.parallel_context():
            x[0] = 1.0

    def nested_region(x: F64, n: I32_0D):
        with qd.graph.parallel_context():
            with qd.graph.parallel():
                while qd.graph.do_while(n):
                    x[0] += 1.0

    cases = [(in_a_for, "do_while.. must be at the kernel top level or directly inside a qd.graph.do_while"),
             (not_a_parameter, "'x_count' is not a parameter of the kernel"),
             (section_alone, "qd.graph.parallel.. must be directly inside 'with qd.graph.parallel_context"),
             (mixed_region, "may contain only 'with qd.graph.parallel\\(\\):' sections"),
             (nested_region, "do_while.. cannot be nested inside a qd.graph.parallel.. section")]
    for fn, message in cases:
        with pytest.raises(QuadrantsSyntaxError, match=f"(?s)in kernel '{fn.__name__}': .*{message}.*line \\d+"):
            qd.kernel(graph=True)(fn)


def test_graph_construct_functions_outside_kernels():
    assert qd.graph.do_while(np.array(2, np.int32)) is True and qd.graph.do_while(0) is False
    with qd.graph.parallel_context():
        with qd.graph.parallel():
            pass


# -- the CUDA graph logic, with a stand-in driver (no GPU) -----------------------------------------------

class _StandInDriver:
    """Records the graph calls of targets/cuda/graphs.py; the node parameters it sees are
    read from the structure and the parameter cells the call points at."""

    def __init__(self):
        self.calls, self.handle = [], 0x1000

    def _new(self, out):
        self.handle += 1
        out._obj.value = self.handle
        return self.handle

    def _params(self, p):
        p = p._obj
        argv = ctypes.cast(p.kernelParams, ctypes.POINTER(ctypes.c_void_p))
        first_cell = ctypes.c_int64.from_address(argv[2]).value     # after (ctx, tmp): the first argument
        return p.func, p.gridDimX, p.blockDimX, first_cell

    def cuGraphCreate(self, out, flags):
        self.calls.append(("create", self._new(out)))
        return 0

    def cuGraphAddKernelNode(self, out, graph, deps, ndeps, params):
        waits = tuple(deps[:ndeps]) if deps is not None else ()
        self.calls.append(("add", self._new(out), waits, ndeps, self._params(params)))
        return 0

    def cuGraphInstantiateWithFlags(self, out, graph, flags):
        self.calls.append(("instantiate", self._new(out)))
        return 0

    def cuGraphExecKernelNodeSetParams(self, exec_, node, params):
        self.calls.append(("set", node, self._params(params)))
        return 0

    def cuGraphNodeSetEnabled(self, exec_, node, on):
        self.calls.append(("enable", node, on))
        return 0

    def cuGraphLaunch(self, exec_, stream):
        self.calls.append(("launch", exec_, stream))
        return 0

    def cuGraphExecDestroy(self, exec_):
        return 0

    def cuGraphDestroy(self, graph):
        return 0


def _stand_in_plan(grids, first_args):
    """A plan-like object of len(grids) tasks whose first argument cell holds ``first_args[k]``."""
    from qd_numba.targets.cuda.runtime import PACK_HEAD, PACK_TASK

    packed = np.zeros(PACK_HEAD + PACK_TASK * len(grids), np.int64)
    launches, keep = [], []
    for k, (grid, arg) in enumerate(zip(grids, first_args)):
        cells = [ctypes.c_uint64(0), ctypes.c_uint64(0), ctypes.c_int64(arg)]
        argv = (ctypes.c_void_p * 3)(*[ctypes.addressof(c) for c in cells])
        keep.append((cells, argv))
        packed[PACK_HEAD + PACK_TASK * k:PACK_HEAD + PACK_TASK * (k + 1)] = (0x500 + k, grid, 128,
                                                                              ctypes.addressof(argv))
        launches.append(types.SimpleNamespace(argv=ctypes.addressof(argv), task=types.SimpleNamespace(loc=f"k.py:{k}")))
    plan = types.SimpleNamespace(kernel=types.SimpleNamespace(name="stand_in"), packed=packed, launches=launches)
    return plan, keep


def test_cuda_graph_builds_once_patches_only_dirty_nodes_and_replays(monkeypatch):
    from qd_numba.targets.cuda import graphs
    from qd_numba.targets.cuda.runtime import PACK_HEAD, PACK_TASK

    driver = _StandInDriver()
    monkeypatch.setattr(graphs, "_api", driver)
    plan, keep = _stand_in_plan([4, 0, 1], [11, 22, 33])
    g = graphs.CudaGraph(plan)
    assert g.node_mask(lambda k: k != 1) == 0b101
    g.launch(0b111)     # first launch: built from the cells as they are, empty loop disabled
    kinds = [c[0] for c in driver.calls]
    assert kinds == ["create", "add", "add", "add", "instantiate", "enable", "launch"]
    adds = [c for c in driver.calls if c[0] == "add"]
    assert [a[4] for a in adds] == [(0x500, 4, 128, 11), (0x501, 1, 128, 22), (0x502, 1, 128, 33)]
    assert [a[2:4] for a in adds] == [((), 0), ((adds[0][1],), 1), ((adds[1][1],), 1)]    # a chain
    assert driver.calls[5] == ("enable", adds[1][1], 0)
    exec_ = driver.calls[4][1]
    assert driver.calls[6] == ("launch", exec_, None)

    driver.calls.clear()
    g.launch(0)         # nothing changed: a bare replay
    assert driver.calls == [("launch", exec_, None)]

    driver.calls.clear()
    keep[2][0][2].value = 99                            # task 2's argument changed
    plan.packed[PACK_HEAD + PACK_TASK * 1 + 1] = 7      # task 1's loop is no longer empty
    g.launch(0b110)
    assert driver.calls == [("set", adds[1][1], (0x501, 7, 128, 22)), ("enable", adds[1][1], 1),
                            ("set", adds[2][1], (0x502, 1, 128, 99)), ("launch", exec_, None)]
    assert g.builds == 1 and g.patches == 2

    driver.calls.clear()
    plan.packed[PACK_HEAD + PACK_TASK * 1 + 1] = 0      # empty again: disabled, not patched
    g.launch(0b010)
    assert driver.calls == [("enable", adds[1][1], 0), ("launch", exec_, None)]


def test_cuda_graph_build_failure_frees_the_graph_and_the_next_call_builds_again(monkeypatch):
    from qd_numba.targets.cuda import graphs

    driver = _StandInDriver()
    fail = {"add": 2}
    add = driver.cuGraphAddKernelNode

    def flaky_add(*args):
        fail["add"] -= 1
        return 700 if fail["add"] == 0 else add(*args)      # the second node fails once

    destroyed = []
    monkeypatch.setattr(driver, "cuGraphAddKernelNode", flaky_add)
    monkeypatch.setattr(driver, "cuGraphDestroy", lambda graph: destroyed.append(graph) or 0)
    monkeypatch.setattr(graphs, "_api", driver)

    def check(result, what):
        raise QuadrantsRuntimeError(f"CUDA driver error in {what}: {int(result[0])}")

    monkeypatch.setattr(graphs, "_check", check)
    plan, keep = _stand_in_plan([2, 3], [5, 6])
    g = graphs.CudaGraph(plan)
    with pytest.raises(QuadrantsRuntimeError, match=r"cuGraphAddKernelNode \(kernel 'stand_in', task 1\): 700"):
        g.launch(0b11)
    assert destroyed == [driver.calls[0][1]] and g.exec == 0
    driver.calls.clear()
    g.launch(0)
    adds = [c[4] for c in driver.calls if c[0] == "add"]
    assert adds == [(0x500, 2, 128, 5), (0x501, 3, 128, 6)] and len(g.params) == 2 and g.builds == 1


def test_parallel_sections_become_concurrent_branches_between_a_fork_and_a_join(monkeypatch):
    from qd_numba import graph
    from qd_numba.targets.cuda import graphs

    # tasks: before, region 0 (sections 0, 0, 1), after, region 1 (sections 0, 1), a loop of another file
    labels = [None, (0, 0), (0, 0), (0, 1), None, (1, 0), (1, 1), None]
    assert graph.dependencies(labels) == [[], [0], [1], [0], [2, 3], [4], [4], [5, 6]]
    assert graph.dependencies([None, None]) == [[], [0]]
    assert graph.dependencies([(0, 0), (0, 1)]) == [[], []]
    sections = ("k.py", (((10, 12), (13, 15)),))
    assert graph.section_labels(sections, ["k.py:9", "k.py:11", "k.py:14", "other.py:11", "k.py:16"]) == \
        [None, (0, 0), (0, 1), None, None]
    assert graph.section_labels(None, ["k.py:11"]) == [None]

    driver = _StandInDriver()
    monkeypatch.setattr(graphs, "_api", driver)
    plan, keep = _stand_in_plan([1, 2, 3, 4], [1, 2, 3, 4])
    for launch, line in zip(plan.launches, (9, 11, 14, 16)):
        launch.task.loc = f"k.py:{line}"
    plan.kernel.graph_sections = sections
    graphs.CudaGraph(plan).launch(0)
    adds = [c for c in driver.calls if c[0] == "add"]
    nodes = [a[1] for a in adds]
    assert [a[2] for a in adds] == [(), (nodes[0],), (nodes[0],), (nodes[1], nodes[2])]


def test_kernels_record_the_parallel_regions_whose_sections_are_bounded_by_loops():
    def regions(x: F64, y: F64, n: I32_0D):
        with qd.graph.parallel_context():        # both sections start and end with loops
            with qd.graph.parallel():
                for i in range(x.shape[0]):
                    x[i] += 1.0
                qd.loop_config(block_dim=64)
                for i in range(x.shape[0]):
                    x[i] *= 2.0
            with qd.graph.parallel():
                for i in range(y.shape[0]):
                    y[i] -= 1.0
        with qd.graph.parallel_context():        # a section ending with serial code: in order
            with qd.graph.parallel():
                for i in range(x.shape[0]):
                    x[i] += 1.0
                n[()] = 1
            with qd.graph.parallel():
                y[0] = 0.0

    kernel = qd.kernel(graph=True)(regions)
    filename, recorded = kernel.graph_sections
    first = regions.__code__.co_firstlineno
    assert filename == regions.__code__.co_filename
    assert recorded == (((first + 2, first + 7), (first + 8, first + 10)),)
    x, y, n = np.zeros(4), np.zeros(4), np.zeros((), np.int32)
    from qd_numba.graph import section_labels
    labels = section_labels(kernel.graph_sections, [t.loc for t in kernel.tasks(x, y, n)])
    assert labels[:3] == [(0, 0), (0, 0), (0, 1)] and set(labels[3:]) == {None}


class _RecordingGraph:
    def __init__(self, count):
        self.count, self.dirty = count, []

    def node_mask(self, uses):
        return sum(1 << k for k in range(self.count) if uses(k))

    def launch(self, dirty):
        self.dirty.append(dirty)


def test_generated_runner_marks_only_the_nodes_whose_cells_changed():
    from qd_numba.targets.cuda import plan as cuda_plan

    cells = {"x": [ctypes.c_int64() for _ in range(7)], "a": [ctypes.c_double()], "b": [ctypes.c_int32()]}
    launches = [types.SimpleNamespace(binary=types.SimpleNamespace(runtime_args=args), total_index=None)
                for args in (("x",), ("x", "a"), ("b",))]
    graph = _RecordingGraph(3)
    plan = types.SimpleNamespace(params=[("x", "ndarray"), ("a", "scalar"), ("b", "scalar")], cells=cells,
                                 graph=graph, rt=None, launch_all=None, totals_fn=None, timer=None, written=(),
                                 written_args=(), error_words=[], launches=launches, ret=None,
                                 _patch_view=lambda name, view, key: key)
    src, ns = cuda_plan._runner_source(plan)
    exec(compile(src, "<runner>", "exec"), ns)
    run = ns["make"]()
    view1 = types.SimpleNamespace(host=None)
    view2 = types.SimpleNamespace(host=None)
    run(None, 1.5, 3, view1)
    run(None, 1.5, 3, view1)          # same view, same scalars
    run(None, 2.5, 3, view1)          # a changed: task 1 only
    run(None, 2.5, 4, view2)          # b and x changed
    assert graph.dirty == [0b111, 0, 0b010, 0b111]
    assert cells["a"][0].value == 2.5 and cells["b"][0].value == 4


# -- on a GPU --------------------------------------------------------------------------------------------

@pytest.fixture
def on_cuda():
    qd.init(arch=qd.cuda)
    yield
    qd.init(arch=qd.cpu)


@pytest.mark.cuda
def test_cuda_graph_replay_after_new_ndarrays_and_scalars_equals_plain(rng, on_cuda):
    n = 4096
    sets = []
    for _ in range(2):
        hosts = [rng.uniform(-1, 1, n) for _ in range(3)]
        graph_arrays, plain_arrays = [qd.ndarray(qd.f64, n) for _ in range(3)], [qd.ndarray(qd.f64, n)
                                                                                 for _ in range(3)]
        for g, p, h in zip(graph_arrays, plain_arrays, hosts):
            g.from_numpy(h)
            p.from_numpy(h)
        sets.append((graph_arrays, plain_arrays, hosts))
    for call, a in enumerate((0.5, 0.5, -1.25, 2.0, 2.0)):
        graph_arrays, plain_arrays, hosts = sets[call % 2]
        steps_graph(*graph_arrays, a)
        steps_plain(*plain_arrays, a)
        hosts[:] = _steps_ref(*hosts, a)
    for graph_arrays, plain_arrays, hosts in sets:
        for g, p, h in zip(graph_arrays, plain_arrays, hosts):
            np.testing.assert_allclose(g.to_numpy(), h, rtol=1e-10)
            np.testing.assert_allclose(g.to_numpy(), p.to_numpy(), rtol=1e-12)
    plan = steps_graph.backend().plan_for((*sets[0][0], 1.0))
    assert plan.graph is not None and plan.graph.builds == 1


@pytest.mark.cuda
def test_cuda_graph_with_numpy_arguments_new_sizes_and_an_empty_loop(rng, on_cuda):
    for n in (1000, 1, 300):       # n=1: the loop from 1 is empty (a disabled node)
        x, y, z = _random(rng, n)
        ref = _steps_ref(x, y, z, 0.3)
        steps_graph(x, y, z, 0.3)
        for got, want in zip((x, y, z), ref):
            np.testing.assert_allclose(got, want, rtol=1e-10)


@pytest.mark.cuda
def test_cuda_graph_kernel_gradient_launches_plainly(rng, on_cuda):
    n = 256
    x0 = rng.uniform(-1, 1, n)
    loss = qd.field(qd.f64, shape=(), needs_grad=True)
    x = qd.field(qd.f64, shape=n, needs_grad=True)
    x.from_numpy(x0)

    @qd.kernel(graph=True)
    def energy():
        for i in range(n):
            loss[None] += qd.sin(x[i]) * x[i]

    with qd.ad.Tape(loss=loss):
        energy()
    np.testing.assert_allclose(loss[None], np.sum(np.sin(x0) * x0), rtol=1e-10)
    np.testing.assert_allclose(x.grad.to_numpy(), np.cos(x0) * x0 + np.sin(x0), rtol=1e-10)
    assert energy.backend().plan_for(()).graph is not None
    assert energy.grad.backend().plan_for(()).graph is None


@pytest.mark.cuda
def test_cuda_graphs_off_launch_plainly_with_the_same_results(rng):
    x0, y0, z0 = _random(rng, 500)
    results = []
    for on in (True, False):
        qd.init(arch=qd.cuda, cuda_graph=on)
        try:
            arrays = [qd.ndarray(qd.f64, 500) for _ in range(3)]
            for arr, host in zip(arrays, (x0, y0, z0)):
                arr.from_numpy(host)
            steps_graph(*arrays, 0.125)
            steps_graph(*arrays, 0.25)
            assert (steps_graph.backend().plan_for((*arrays, 0.25)).graph is not None) is on
            results.append([arr.to_numpy() for arr in arrays])
        finally:
            qd.init(arch=qd.cpu)
    ref = _steps_ref(*_steps_ref(x0, y0, z0, 0.125), 0.25)
    for with_graph, plain, want in zip(*results, ref):
        np.testing.assert_allclose(with_graph, want, rtol=1e-10)
        np.testing.assert_array_equal(with_graph, plain)


@pytest.mark.cuda
def test_cuda_do_while_and_parallel_sections_equal_numpy(rng, on_cuda):
    for steps in (5, 1, 3):
        x0 = rng.uniform(-1, 1, 3000)
        x, v = qd.ndarray(qd.f64, 3000), qd.ndarray(qd.f64, 3000)
        counter, inner = qd.ndarray(qd.i32, ()), qd.ndarray(qd.i32, ())
        x.from_numpy(x0)
        counter.from_numpy(np.array(steps, np.int32))
        damped(x, v, counter, inner, 0.3)
        want_x, want_v = _damped_ref(x0, steps, 0.3)
        np.testing.assert_allclose(x.to_numpy(), want_x, rtol=1e-10)
        np.testing.assert_allclose(v.to_numpy(), want_v, rtol=1e-10)
        assert counter.to_numpy() == 0


@pytest.mark.cuda
def test_cuda_parallel_sections_are_concurrent_branches_with_plain_results(rng, on_cuda):
    steps = 400

    @qd.kernel(graph=True)
    def two_chains(a: F64, b: F64, out: F64):
        with qd.graph.parallel_context():
            with qd.graph.parallel():
                for i in range(a.shape[0]):
                    v = a[i]
                    for _ in range(steps):
                        v = qd.sin(v) * 0.9
                    a[i] = v
                for i in range(a.shape[0]):
                    a[i] = a[i] + 1.0
            with qd.graph.parallel():
                for i in range(b.shape[0]):
                    v = b[i]
                    for _ in range(steps):
                        v = qd.cos(v) * 0.9
                    b[i] = v
        for i in range(out.shape[0]):
            out[i] = a[i] - b[i]

    a0, b0 = rng.uniform(-1, 1, 4096), rng.uniform(-1, 1, 4096)
    ra, rb = a0.copy(), b0.copy()
    for _ in range(steps):
        ra, rb = np.sin(ra) * 0.9, np.cos(rb) * 0.9
    ra = ra + 1.0
    for _ in range(3):       # replays
        a, b, out = a0.copy(), b0.copy(), np.zeros(4096)
        two_chains(a, b, out)
        np.testing.assert_allclose(a, ra, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(b, rb, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(out, ra - rb, rtol=1e-9, atol=1e-12)
    graph = two_chains.backend().plan_for((a, b, out)).graph
    assert graph.deps == [[], [0], [], [1, 2]]
