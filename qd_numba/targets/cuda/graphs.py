"""CUDA graphs of ``@qd.kernel(graph=True)`` plans: built once, patched, replayed.

A :class:`CudaGraph` belongs to one :class:`~qd_numba.targets.cuda.plan.LaunchPlan`. On the
plan's first launch it builds a graph of explicit kernel nodes, one per task, each depending on
the one before (the tasks' program order; a graph kernel never fuses) except the sections of a
``qd.graph.parallel_context()`` region, which are independent branches, from the plan's packed
launch array (function, grid, block, ``void*[]`` parameter array) and instantiates it. Every
later call is one ``cuGraphLaunch`` on the legacy default stream, where the plain launches and
qd_numba's copies run. The generated runner (plan.py ``_runner_source``) tells :meth:`launch`
which nodes read a cell that changed since the last call (a bit per node: a new ndarray view, a
new scalar value, a new iteration count); those nodes get ``cuGraphExecKernelNodeSetParams``
(the driver copies the parameter values from the cells, as ``cuLaunchKernel`` does) without a
new capture. A task whose grid is 0 (an empty loop) is a disabled node.

The driver is called through ctypes, with the ``_v2`` node-parameter structure (CUDA 12.0+), so
a replay costs one foreign call. This module never looks at kernel arguments.
"""

from __future__ import annotations

import ctypes
import weakref

from ...errors import QuadrantsRuntimeError
from ...graph import dependencies, section_labels
from .runtime import PACK_HEAD, PACK_TASK, _check, _driver


class _KernelNodeParams(ctypes.Structure):
    """``CUDA_KERNEL_NODE_PARAMS_v2`` (cuda.h)."""

    _fields_ = [("func", ctypes.c_void_p),
                ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint),
                ("kernelParams", ctypes.c_void_p), ("extra", ctypes.c_void_p),
                ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


class _Api:
    """The driver entry points graphs use (ctypes functions returning the CUresult)."""

    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        vp, uint, size_t, ull = ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t, ctypes.c_ulonglong
        out = ctypes.POINTER(ctypes.c_void_p)
        params = ctypes.POINTER(_KernelNodeParams)
        table = {"cuGraphCreate": (out, uint),
                 "cuGraphAddKernelNode_v2": (out, vp, out, size_t, params),
                 "cuGraphInstantiateWithFlags": (out, vp, ull),
                 "cuGraphExecKernelNodeSetParams_v2": (vp, vp, params),
                 "cuGraphNodeSetEnabled": (vp, vp, uint),
                 "cuGraphLaunch": (vp, vp),
                 "cuGraphExecDestroy": (vp,),
                 "cuGraphDestroy": (vp,)}
        for name, argtypes in table.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                raise QuadrantsRuntimeError(f"graph=True kernels need a CUDA 12.0+ driver (it has no {name}); "
                                            "update the driver, or drop graph=True") from None
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
            setattr(self, name.removesuffix("_v2"), fn)


_api = None


def api() -> _Api:
    global _api
    if _api is None:
        _api = _Api()
    return _api


def _ok(err: int, what: str) -> None:
    if err:
        _check((_driver().CUresult(err),), what)


def _destroy(drv: _Api, graph: int, exec_: int) -> None:
    """Free a graph and its instance (the plan is gone; errors at exit are ignored)."""
    if exec_:
        drv.cuGraphExecDestroy(exec_)
    if graph:
        drv.cuGraphDestroy(graph)


class CudaGraph:
    """The CUDA graph replaying one plan's tasks (built at the first :meth:`launch`)."""

    def __init__(self, plan):
        self.name = plan.kernel.name
        self.packed = plan.packed          # int64 launch words (plan.py keeps the grids there)
        self.argvs = [launch.argv for launch in plan.launches]
        # the nodes each node waits for: a chain, but for the sections of qd.graph.parallel
        # regions, which are concurrent branches (graph.py)
        self.deps = dependencies(section_labels(getattr(plan.kernel, "graph_sections", None),
                                                [launch.task.loc for launch in plan.launches]))
        self.count = len(plan.launches)
        self.nodes: list[int] = []
        self.params: list[_KernelNodeParams] = []
        self.enabled: list[bool] = []
        self.graph = self.exec = 0
        self.builds = 0                    # graphs built (introspection: 1 for a plan's life)
        self.patches = 0                   # node parameter updates made
        self._graph_launch = api().cuGraphLaunch

    def node_mask(self, uses) -> int:
        """The bits of the nodes whose tasks satisfy ``uses(k)``."""
        return sum(1 << k for k in range(self.count) if uses(k))

    def _words(self, k: int):
        base = PACK_HEAD + PACK_TASK * k
        fn, grid, block, _ = (int(w) for w in self.packed[base:base + PACK_TASK])
        return fn, grid, block

    def _fill(self, k: int) -> int:
        """Node k's parameters from the packed array; returns its grid (0: no launch)."""
        fn, grid, block = self._words(k)
        p = self.params[k]
        p.func, p.gridDimX, p.blockDimX = fn, max(grid, 1), block
        return grid

    def _build(self) -> None:
        drv = api()
        graph = ctypes.c_void_p()
        _ok(drv.cuGraphCreate(ctypes.byref(graph), 0), f"cuGraphCreate (kernel '{self.name}')")
        exec_ = ctypes.c_void_p()
        try:
            self.params, self.nodes, grids = [], [], []
            for k in range(self.count):
                self.params.append(_KernelNodeParams(gridDimY=1, gridDimZ=1, blockDimY=1, blockDimZ=1,
                                                     sharedMemBytes=0, kernelParams=self.argvs[k]))
                grids.append(self._fill(k))
                node = ctypes.c_void_p()
                deps = (ctypes.c_void_p * max(1, len(self.deps[k])))(*(self.nodes[j] for j in self.deps[k]))
                _ok(drv.cuGraphAddKernelNode(ctypes.byref(node), graph, deps if self.deps[k] else None,
                                             len(self.deps[k]), ctypes.byref(self.params[k])),
                    f"cuGraphAddKernelNode (kernel '{self.name}', task {k})")
                self.nodes.append(node.value)
            _ok(drv.cuGraphInstantiateWithFlags(ctypes.byref(exec_), graph, 0),
                f"cuGraphInstantiate (kernel '{self.name}')")
        except BaseException:
            _destroy(drv, graph.value, 0)
            raise
        self.graph, self.exec = graph.value, exec_.value
        # freed with the plan; not at interpreter exit, where the driver may be gone first
        weakref.finalize(self, _destroy, drv, self.graph, self.exec).atexit = False
        self.enabled = [True] * self.count
        for k, grid in enumerate(grids):
            if grid == 0:
                self._enable(k, False)
        self.builds += 1

    def _enable(self, k: int, on: bool) -> None:
        _ok(api().cuGraphNodeSetEnabled(self.exec, self.nodes[k], int(on)),
            f"cuGraphNodeSetEnabled (kernel '{self.name}', task {k})")
        self.enabled[k] = on

    def _patch(self, dirty: int) -> None:
        """New parameters (the cells' values now, the grid in the packed array) for the nodes
        whose bits are set in ``dirty``."""
        drv = api()
        k = 0
        while dirty:
            if dirty & 1:
                grid = self._fill(k)
                if grid:
                    _ok(drv.cuGraphExecKernelNodeSetParams(self.exec, self.nodes[k], ctypes.byref(self.params[k])),
                        f"cuGraphExecKernelNodeSetParams (kernel '{self.name}', task {k})")
                    self.patches += 1
                if bool(grid) != self.enabled[k]:
                    self._enable(k, bool(grid))
            dirty >>= 1
            k += 1

    def launch(self, dirty: int) -> None:
        """Replay the graph on the legacy default stream, the nodes in ``dirty`` patched first
        (built, from the cells as they are, on the first call)."""
        if not self.exec:
            self._build()
        elif dirty:
            self._patch(dirty)
        err = self._graph_launch(self.exec, None)
        if err:
            _ok(err, f"cuGraphLaunch (kernel '{self.name}')")
