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
                                 _patch_view=lambda name, view, key: key, cells_owner=None, _launch_all_users=[],
                                 stream_blocks=None, auto_graph=False)
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


# -- the generated call path of a plan (targets/cuda/plan.py), with stand-ins (no GPU) ---------------

class _LoggingGraph:
    def __init__(self, count, log):
        self.count, self.log = count, log

    def node_mask(self, uses):
        return sum(1 << k for k in range(self.count) if uses(k))

    def launch(self, dirty):
        self.log.append(("graph", dirty))


def _runner_plan(log, auto_graph):
    """A plan-like object of two tasks: task 0 reads ndarray 'x', task 1 reads scalar 's'."""
    from qd_numba.targets.cuda.plan import LaunchPlan

    cells = {"x": [ctypes.c_int64() for _ in range(7)], "s": [ctypes.c_double()]}
    launches = [types.SimpleNamespace(binary=types.SimpleNamespace(runtime_args=names)) for names in (("x",), ("s",))]
    def launch_all():
        log.append(("plain", cells["x"][4].value, cells["s"][0].value))
        return -1

    plan = types.SimpleNamespace(params=[("x", "ndarray"), ("s", "scalar")], cells=cells, rt=None,
                                 packed=np.zeros(4, np.int64), launch_all=launch_all,
                                 totals_fn=None, totals_args=[], error_words=[], timer=None, ret=None,
                                 written=[], written_args=[], stream_blocks=None, launches=launches,
                                 auto_graph=auto_graph, cells_owner=None, _launch_all_users=[])
    plan.graph = _LoggingGraph(2, log) if auto_graph is not None else None
    plan._patch_view = lambda name, view, key: LaunchPlan._patch_view(plan, name, view, key)
    return plan


def _view(ptr):
    from qd_numba.targets.cuda.arrays import ArrayView

    return ArrayView(np.dtype(np.float32), (4,), (4,), ptr, False)


def test_automatic_graph_replays_only_calls_whose_arguments_did_not_change():
    from qd_numba.targets.cuda.plan import _runner_source

    log = []
    plan = _runner_plan(log, auto_graph=True)
    src, ns = _runner_source(plan)
    exec(src, ns)
    run = ns["make"]()
    a, b = _view(0xA00), _view(0xB00)
    run(a, 1.5, a)             # first call: cells written, launched plainly
    run(a, 1.5, a)             # nothing changed: replay, patching the nodes the first call changed
    run(a, 1.5, a)             # a bare replay
    run(b, 1.5, b)             # a new array: plain launch with b's cells
    run(b, 2.5, b)             # a new scalar: plain
    run(b, 2.5, b)             # replay, patching both nodes
    assert log == [("plain", 0xA00, 1.5), ("graph", 0b11), ("graph", 0), ("plain", 0xB00, 1.5),
                   ("plain", 0xB00, 2.5), ("graph", 0b11)]


def test_plain_and_stream_runners_of_one_plan_never_launch_with_the_others_cells():
    """The two call paths of a plan (plain and qd_stream=) share its cells: a call after a call
    of the other path rewrites every cell, as the first call does."""
    from qd_numba.targets.cuda.plan import _runner_source

    for auto_graph in (None, True):
        log = []
        plan = _runner_plan(log, auto_graph)
        runners = []
        for on_stream in (False, True):
            src, ns = _runner_source(plan, on_stream=on_stream)
            exec(src, ns)
            runners.append(ns["make"]())
        plain, streamed = runners
        a, b = _view(0xA00), _view(0xB00)
        plain(a, 1.5, a)
        streamed(0, False, b, 2.5, b)
        plain(a, 1.5, a)           # x and s must be a's and 1.5 again
        plain(a, 1.5, a)
        launched = [entry for entry in log if entry[0] == "plain"]
        assert launched == [("plain", 0xA00, 1.5), ("plain", 0xB00, 2.5), ("plain", 0xA00, 1.5)] + \
            ([("plain", 0xA00, 1.5)] if auto_graph is None else [])
        if auto_graph:
            assert log[-1] == ("graph", 0b11)     # the replay after the switch patches every node


@pytest.mark.cuda
def test_cuda_automatic_graph_replay_equals_plain_launches(rng):
    """Plain kernels of several tasks replay a graph on calls whose arguments did not change
    (qd.init(auto_graph=True), the default), launch plainly on the others, and mix with
    qd_stream= calls of the same kernel: the results equal auto_graph=False and numpy."""
    n = 3000
    hosts = [[rng.uniform(-1, 1, n) for _ in range(3)] for _ in range(2)]
    calls = [(0, 0.5, None), (0, 0.5, None), (0, 0.5, None), (1, 0.5, None), (1, -1.25, None), (1, -1.25, None),
             (0, -1.25, "stream"), (0, -1.25, None), (1, 2.0, "stream"), (0, 2.0, None), (0, 2.0, None)]
    results = {}
    for auto in (True, False):
        qd.init(arch=qd.cuda, auto_graph=auto)
        try:
            stream = qd.create_stream()
            sets = [[qd.ndarray(qd.f64, n) for _ in range(3)] for _ in range(2)]
            for arrays, h in zip(sets, hosts):
                for arr, values in zip(arrays, h):
                    arr.from_numpy(values)
            for which, a, on in calls:
                steps_plain(*sets[which], a, **({"qd_stream": stream} if on else {}))
                if on:
                    stream.synchronize()
            results[auto] = [[arr.to_numpy() for arr in arrays] for arrays in sets]
            plan = steps_plain.backend().plan_for((*sets[0], 2.0))
            assert plan.auto_graph is auto and (plan.graph is not None) is auto
            if auto:
                assert plan.graph.builds == 1
            stream.destroy()
        finally:
            qd.init(arch=qd.cpu)
    want = [list(h) for h in hosts]
    for which, a, _ in calls:
        want[which] = list(_steps_ref(*want[which], a))
    for auto in (True, False):
        for got_set, want_set in zip(results[auto], want):
            for got, ref in zip(got_set, want_set):
                np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)
    for a_set, b_set in zip(results[True], results[False]):
        for a, b in zip(a_set, b_set):
            np.testing.assert_array_equal(a, b)


# -- device-side qd.graph.do_while (targets/cuda/do_while.py) --------------------------------------------

def test_set_conditional_kernel_links_with_the_device_runtime_without_a_gpu():
    """The PTX of qd_set_conditional links with libcudadevrt.a (cudaGraphSetConditional) to a
    cubin holding the entry, here, without a GPU."""
    pytest.importorskip("cuda.bindings.nvjitlink", reason="nvJitLink (cuda.bindings) is not installed")
    from qd_numba.targets.cuda.compile import _elf_symbol_names
    from qd_numba.targets.cuda.do_while import SET_CONDITIONAL, set_conditional_cubin

    cubin = set_conditional_cubin((9, 0))
    assert cubin[:4] == b"\x7fELF"
    assert SET_CONDITIONAL in _elf_symbol_names(cubin)
    assert "cudaGraphSetConditional" in _elf_symbol_names(cubin)


def test_node_parameter_structures_match_cuda_h(tmp_path):
    """The ctypes CUgraphNodeParams and CUDA_CONDITIONAL_NODE_PARAMS have the sizes and offsets
    of the cu13 cuda.h (compiled with the C compiler, where there is one)."""
    import os
    import shutil
    import subprocess

    from qd_numba.targets.cuda import do_while

    cc = shutil.which("cc") or shutil.which("gcc")
    try:
        import nvidia.cu13
        include = os.path.join(list(nvidia.cu13.__path__)[0], "include")
    except ImportError:
        include = None
    if cc is None or include is None or not os.path.exists(os.path.join(include, "cuda.h")):
        pytest.skip("needs a C compiler and the cu13 cuda.h")
    src = tmp_path / "sizes.c"
    src.write_text("#include <stdio.h>\n#include <stddef.h>\n#include <cuda.h>\nint main(void) {\n"
                   "printf(\"%zu %zu %zu %zu %zu %zu %zu %zu\\n\", sizeof(CUgraphNodeParams),\n"
                   "  offsetof(CUgraphNodeParams, conditional), offsetof(CUgraphNodeParams, reserved2),\n"
                   "  sizeof(CUDA_CONDITIONAL_NODE_PARAMS), offsetof(CUDA_CONDITIONAL_NODE_PARAMS, type),\n"
                   "  offsetof(CUDA_CONDITIONAL_NODE_PARAMS, size),\n"
                   "  offsetof(CUDA_CONDITIONAL_NODE_PARAMS, phGraph_out),\n"
                   "  offsetof(CUDA_CONDITIONAL_NODE_PARAMS, ctx));\n return 0;\n}\n")
    exe = tmp_path / "sizes"
    subprocess.run([cc, f"-I{include}", str(src), "-o", str(exe)], check=True, capture_output=True)
    got = [int(v) for v in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()]
    P, C = do_while._NodeParams, do_while._ConditionalParams
    assert got == [ctypes.sizeof(P), P.u.offset, P.reserved2.offset, ctypes.sizeof(C), C.type.offset,
                   C.size.offset, C.phGraph_out.offset, C.ctx.offset]


class _StandInCondDriver(_StandInDriver):
    """The stand-in driver with conditional nodes: each conditional node's body is a new graph."""

    def __init__(self):
        super().__init__()
        self.bodies, self.refuse_set = [], False

    def cuCtxGetCurrent(self, out):
        out._obj.value = 0xC7
        return 0

    def cuGraphConditionalHandleCreate(self, out, graph, ctx, default, flags):
        self.handle += 1
        out._obj.value = self.handle
        self.calls.append(("handle", self.handle, graph, default, flags))
        return 0

    def cuGraphAddNode(self, out, graph, deps, edges, ndeps, params):
        p = params._obj
        body = (ctypes.c_void_p * 1)(self.handle + 1000)
        self.bodies.append(body)
        p.conditional.phGraph_out = ctypes.cast(body, ctypes.POINTER(ctypes.c_void_p))
        waits = tuple(deps[:ndeps]) if deps is not None else ()
        self.calls.append(("cond", self._new(out), graph, waits, p.type, p.conditional.handle, p.conditional.type,
                           p.conditional.size, body[0]))
        return 0

    def cuGraphAddKernelNode(self, out, graph, deps, ndeps, params):
        waits = tuple(deps[:ndeps]) if deps is not None else ()
        p = params._obj
        argv = ctypes.cast(p.kernelParams, ctypes.POINTER(ctypes.c_void_p))
        if p.func == 0x777:     # qd_set_conditional(handle, flag pointer)
            args = (ctypes.c_uint64.from_address(argv[0]).value, ctypes.c_uint64.from_address(argv[1]).value)
            self.calls.append(("setcond", self._new(out), graph, waits, args))
        else:
            self.calls.append(("add", self._new(out), graph, waits, self._params(params)))
        return 0

    def cuGraphExecKernelNodeSetParams(self, exec_, node, params):
        if self.refuse_set:
            return 1    # CUDA_ERROR_INVALID_VALUE
        p = params._obj
        if p.func == 0x777:
            argv = ctypes.cast(p.kernelParams, ctypes.POINTER(ctypes.c_void_p))
            self.calls.append(("set", node, ctypes.c_uint64.from_address(argv[1]).value))
            return 0
        return super().cuGraphExecKernelNodeSetParams(exec_, node, params)


def _stand_in_do_while():
    """damped's structure (graph.py's split) with stand-in parts: before; loop(steps){ set_inner;
    loop(inner){ A }; B }; after. The plans' tasks are chained but for A's two parallel sections."""
    from qd_numba.graph import DoWhileKernel

    names = ["before", "set_inner", "inner_body", "outer_rest", "after"]
    leaves = {n: types.SimpleNamespace(name=n) for n in names}
    outer_body = DoWhileKernel("damped", leaves["set_inner"], leaves["inner_body"], leaves["outer_rest"], 3, "inner")
    top = DoWhileKernel("damped", leaves["before"], outer_body, leaves["after"], 2, "steps")
    plans, keep = [], []
    for k, (count, deps) in enumerate([(1, [[]]), (1, [[]]), (3, [[], [], [0, 1]]), (2, [[], [0]]), (1, [[]])]):
        plan, cells = _stand_in_plan([4] * count, [100 * k + t for t in range(count)])
        plan.graph = types.SimpleNamespace(deps=deps)
        plans.append(plan)
        keep.append(cells)
    return top, tuple(plans), keep


def test_device_do_while_graph_nests_conditional_while_nodes(monkeypatch):
    from qd_numba.targets.cuda import do_while, graphs

    driver = _StandInCondDriver()
    monkeypatch.setattr(graphs, "_api", driver)
    monkeypatch.setitem(do_while._state, "api", driver)
    monkeypatch.setattr(do_while, "_set_function", lambda: 0x777)

    def ok(err, what):
        if err:
            raise QuadrantsRuntimeError(f"CUDA driver error in {what}")

    monkeypatch.setattr(do_while, "_ok", ok)
    top, plans, keep = _stand_in_do_while()
    loop = do_while.DeviceLoop(top)
    assert [leaf.name for leaf in loop.leaves] == ["before", "set_inner", "inner_body", "outer_rest", "after"]
    assert [dw.flag_name for dw in loop.loops] == ["steps", "inner"]
    g = do_while._Graph(loop, plans, [0xF1, 0xF2])
    calls = driver.calls
    root = calls[0][1]
    by_kind = {}
    for c in calls:
        by_kind.setdefault(c[0], []).append(c)
    before, = [c for c in by_kind["add"] if c[4][3] == 0]
    h_top = by_kind["handle"][0]
    assert h_top[2:] == (root, 1, 1)                       # default 1, CU_GRAPH_COND_ASSIGN_DEFAULT
    cond_top = by_kind["cond"][0]
    assert cond_top[2:8] == (root, (before[1],), 13, h_top[1], 1, 1)   # WHILE after the before part
    outer_body = cond_top[8]
    set_inner, = [c for c in by_kind["add"] if c[4][3] == 100]
    assert set_inner[2:4] == (outer_body, ())
    # the nested loop: its handle lives in the outer body, set to 1 before its node on every pass
    h_inner = by_kind["handle"][1]
    assert h_inner[2] == outer_body
    reset = by_kind["setcond"][0]
    assert reset[2:] == (outer_body, (set_inner[1],), (h_inner[1], 0))
    cond_inner = by_kind["cond"][1]
    assert cond_inner[2:6] == (outer_body, (reset[1],), 13, h_inner[1])
    inner_body = cond_inner[8]
    a0, a1, a2 = [c for c in by_kind["add"] if 200 <= c[4][3] < 300]
    assert [c[2:4] for c in (a0, a1, a2)] == [(inner_body, ()), (inner_body, ()), (inner_body, (a0[1], a1[1]))]
    flag_inner = by_kind["setcond"][1]
    assert flag_inner[2:] == (inner_body, (a2[1],), (h_inner[1], 0xF2))
    b0, b1 = [c for c in by_kind["add"] if 300 <= c[4][3] < 400]
    assert [c[2:4] for c in (b0, b1)] == [(outer_body, (cond_inner[1],)), (outer_body, (b0[1],))]
    flag_top = by_kind["setcond"][2]
    assert flag_top[2:] == (outer_body, (b1[1],), (h_top[1], 0xF1))
    after, = [c for c in by_kind["add"] if c[4][3] == 400]
    assert after[2:4] == (root, (cond_top[1],))
    assert calls[-1][0] == "instantiate" and len(by_kind["instantiate"]) == 1

    # a call that changed part 2's third task and the outer flag: two exec patches, no rebuild
    calls.clear()
    keep[2][2][0][2].value = 777
    loop.graph = g
    loop._patch(g, [(2, 0b100), (-1, 0xF9)], [0xF9, 0xF2])
    assert [(c[0], c[1]) for c in calls] == [("set", a2[1]), ("set", flag_top[1])]
    assert calls[0][2][3] == 777 and calls[1][2] == 0xF9 and loop.patches == 2 and g.pointers[0] == 0xF9

    # a driver that refuses to patch nodes inside a conditional body: the graph is rebuilt
    calls.clear()
    driver.refuse_set = True
    loop._patch(g, [(3, 0b1)], [0xF9, 0xF2])
    assert loop.rebuild_on_change and loop.graph is not g and loop.builds == 1
    kinds = [c[0] for c in calls]
    assert kinds[0] == "create" and kinds.count("instantiate") == 1 and kinds[-1] == "instantiate"
    assert [c[4][1] for c in calls if c[0] == "setcond"] == [0, 0xF2, 0xF9]    # from the new pointers
    assert 777 in [c[4][3] for c in calls if c[0] == "add"]                 # and the cells as they are now
    calls.clear()
    loop._patch(loop.graph, [(0, 0b1)], [0xF9, 0xF2])                # from now on: rebuilt at once
    assert [c[0] for c in calls].count("set") == 0 and loop.builds == 2


def test_prepare_runner_writes_the_cells_and_returns_the_dirty_nodes_without_launching():
    from qd_numba.targets.cuda.plan import _runner_source

    log = []
    plan = _runner_plan(log, auto_graph=False)
    src, ns = _runner_source(plan, prepare=True)
    exec(src, ns)
    prepare = ns["make"]()
    a, b = _view(0xA00), _view(0xB00)
    assert prepare(a, 1.5, a) == 0b11
    assert prepare(a, 1.5, a) == 0
    assert prepare(b, 1.5, b) == 0b01
    assert prepare(b, 2.5, b) == 0b10
    assert log == [] and plan.cells["x"][4].value == 0xB00 and plan.cells["s"][0].value == 2.5


@qd.kernel(graph=True)
def two_loops(x: F64, a: I32_0D, b: I32_0D, s: qd.f64):
    while qd.graph.do_while(a):
        for i in range(x.shape[0]):
            x[i] = x[i] + s
        a[()] = a[()] - 1
    while qd.graph.do_while(b):
        for i in range(x.shape[0]):
            x[i] = x[i] * 0.5
        for i in range(1, x.shape[0]):      # empty for a 1-element x
            x[i] = x[i] + 1.0
        b[()] = b[()] - 1


def _two_loops_ref(x, na, nb, s):
    x = x + max(na, 1) * s
    for _ in range(max(nb, 1)):
        x *= 0.5
        x[1:] += 1.0
    return x


def _do_while_calls(rng, device: bool):
    """damped and two_loops called with new arrays, sizes (an empty loop), scalars and flags
    between calls, and damped with numpy arrays (the host-side loop on every arch); returns
    (results, the numpy references, flag reads on the host before the numpy call, the DeviceLoops
    on CUDA)."""
    from qd_numba import graph as graph_mod
    from qd_numba.targets.cuda.do_while import DeviceLoop

    reads = []
    real = graph_mod._flag_value
    graph_mod._flag_value = lambda flag: reads.append(1) or real(flag)
    DeviceLoop.enabled = device
    try:
        got, want = [], []
        counter, inner = qd.ndarray(qd.i32, ()), qd.ndarray(qd.i32, ())
        for n, steps, k, new_flag in ((3000, 5, 0.3, False), (3000, 1, 0.3, False), (3000, 3, -0.2, False),
                                      (700, 4, 0.3, True), (700, 2, 0.3, False)):
            if new_flag:
                counter = qd.ndarray(qd.i32, ())
            x0 = rng.uniform(-1, 1, n)
            x, v = qd.ndarray(qd.f64, n), qd.ndarray(qd.f64, n)
            x.from_numpy(x0)
            counter.from_numpy(np.array(steps, np.int32))
            damped(x, v, counter, inner, k)
            got.append((x.to_numpy(), v.to_numpy(), int(counter.to_numpy()), int(inner.to_numpy())))
            want.append((*_damped_ref(x0, steps, k), 0, 0))
        a, b = qd.ndarray(qd.i32, ()), qd.ndarray(qd.i32, ())
        for n, na, nb, s in ((500, 3, 2, 0.5), (500, 1, 4, 0.25), (1, 2, 3, 0.25), (500, 2, 1, 0.25)):
            x = qd.ndarray(qd.f64, n)
            x0 = rng.uniform(-1, 1, n)
            x.from_numpy(x0)
            a.from_numpy(np.array(na, np.int32))
            b.from_numpy(np.array(nb, np.int32))
            two_loops(x, a, b, s)
            got.append((x.to_numpy(), int(a.to_numpy()), int(b.to_numpy())))
            want.append((_two_loops_ref(x0, na, nb, s), 0, 0))
        loops = [getattr(kernel._first().backend(), "_device_loop", None) for kernel in (damped, two_loops)]
        launches = [loop.launches for loop in loops if loop is not None]
        flag_reads = len(reads)
        x0 = rng.uniform(-1, 1, 64)
        x_np, v_np, steps = x0.copy(), np.zeros(64), qd.ndarray(qd.i32, ())
        steps.from_numpy(np.array(2, np.int32))
        damped(x_np, v_np, steps, inner, 0.3)          # numpy arguments: the host-side loop
        assert [loop.launches for loop in loops if loop is not None] == launches
        got.append((x_np, v_np))
        want.append(_damped_ref(x0, 2, 0.3))
        assert len(reads) > flag_reads
        return got, want, flag_reads, loops
    finally:
        graph_mod._flag_value = real
        DeviceLoop.enabled = True


def test_do_while_with_new_arguments_between_calls_equals_numpy(rng):
    got, want, reads, _ = _do_while_calls(rng, device=False)
    assert reads > 0
    for g_set, r_set in zip(got, want):
        for g, r in zip(g_set, r_set):
            np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12)


@pytest.mark.cuda
def test_cuda_device_do_while_equals_numpy_and_the_host_loop_with_no_host_reads(rng, on_cuda):
    """Device-side loops (conditional WHILE nodes): nested loops, parallel sections, a statement
    between loops, two loops in a row, new arrays / sizes / scalars / flags between calls: the
    results equal numpy and the host-side loop, one cuGraphLaunch per call, no flag read."""
    from qd_numba.targets.cuda.do_while import unavailable

    assert unavailable() is None, unavailable()
    seed = int(rng.integers(1 << 30))
    dev, want, reads, loops = _do_while_calls(np.random.default_rng(seed), device=True)
    host, _, host_reads, _ = _do_while_calls(np.random.default_rng(seed), device=False)
    assert reads == 0 and host_reads > 0
    assert loops[0].launches == 5 and loops[1].launches == 4
    print("device do_while: rebuild_on_change", loops[0].rebuild_on_change, "patches", loops[0].patches,
          "builds", loops[0].builds)
    for got, ref, other in zip(dev, want, host):
        for g, r, h in zip(got, ref, other):
            np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(g, h, rtol=1e-13, atol=1e-15)
