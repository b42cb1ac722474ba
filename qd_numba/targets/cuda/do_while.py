"""Device-side ``qd.graph.do_while``: one CUDA graph with conditional WHILE nodes per call shape.

graph.py splits a do_while kernel into plain graph kernels (the part before a loop, its body, the
part after; nested loops nest the split). :class:`DeviceLoop` runs all of them as one CUDA graph:
the nodes of each part's tasks (their dependencies as in graphs.py: a chain, parallel sections as
branches), and for each loop a conditional node of type WHILE whose body graph holds the body's
nodes followed by one small kernel, ``qd_set_conditional``, that reads the 0-d ``qd.i32`` flag
and calls the device runtime's ``cudaGraphSetConditional(handle, flag != 0)``. The handle is
created with default 1 and ``CU_GRAPH_COND_ASSIGN_DEFAULT`` (the body runs at least once); a
nested loop's handle is set to 1 by a ``qd_set_conditional`` node (flag pointer 0) before its
conditional node, so the inner body runs at least once on every outer pass. A call is one
``cuGraphLaunch``: the flag is never read on the host.

``qd_set_conditional`` is hand-written PTX linked with libcudadevrt.a (which defines
``cudaGraphSetConditional``) by nvJitLink (:func:`set_conditional_cubin`: needs no GPU).

Per call, each part's generated call path writes its cells and returns the bits of its graph
nodes whose cells changed (plan.py ``LaunchPlan.prepare``); those nodes get
``cuGraphExecKernelNodeSetParams``. Where the driver refuses that for a node inside a
conditional body, the graph is rebuilt from the cells instead, on every call that changes a
node (:attr:`DeviceLoop.rebuild_on_change`). A new flag array patches its ``qd_set_conditional``
node the same way.

The host-side loop (graph.py ``DoWhileKernel``) runs instead when :func:`unavailable` gives a
reason (a driver without ``cuGraphConditionalHandleCreate`` or ``cuGraphAddNode_v2``, CUDA <
12.4; no nvJitLink or no libcudadevrt.a; a first graph build the driver refused), when graphs
are off (``qd.init(cuda_graph=False)``, debug mode, the kernel profiler: the parts have no
graph), or for a call with a numpy array argument (each part would copy it to the device and
back) or a flag that is not a ``qd.ndarray``.
"""

from __future__ import annotations

import ctypes
import functools
import weakref

import numpy as np

from ...errors import QuadrantsRuntimeError
from ...field import Ndarray
from ...graph import DoWhileKernel
from .graphs import _KernelNodeParams, _ok, api
from .runtime import PACK_HEAD, PACK_TASK, CudaRuntime

CU_GRAPH_NODE_TYPE_CONDITIONAL = 13
CU_GRAPH_COND_TYPE_WHILE = 1
CU_GRAPH_COND_ASSIGN_DEFAULT = 1
SET_CONDITIONAL = "qd_set_conditional"


class _ConditionalParams(ctypes.Structure):
    """``CUDA_CONDITIONAL_NODE_PARAMS`` (cuda.h; 32 bytes)."""

    _fields_ = [("handle", ctypes.c_uint64), ("type", ctypes.c_int), ("size", ctypes.c_uint),
                ("phGraph_out", ctypes.POINTER(ctypes.c_void_p)), ("ctx", ctypes.c_void_p)]


class _NodeParamsUnion(ctypes.Union):
    _fields_ = [("reserved1", ctypes.c_longlong * 29), ("kernel", _KernelNodeParams),
                ("conditional", _ConditionalParams), ("asBytes", ctypes.c_char * 232)]


class _NodeParams(ctypes.Structure):
    """``CUgraphNodeParams`` (cuda.h, ``struct CUgraphNodeParams_st``; 256 bytes)."""

    _anonymous_ = ("u",)
    _fields_ = [("type", ctypes.c_int), ("reserved0", ctypes.c_int * 3), ("u", _NodeParamsUnion),
                ("reserved2", ctypes.c_longlong)]


# the sizes cuda.h gives (CUDA 12.4 to 13): the driver reads these structures by them
assert ctypes.sizeof(_ConditionalParams) == 32 and ctypes.sizeof(_NodeParams) == 256


_PTX = """.version 8.0
.target sm_{cc}
.address_size 64
.extern .func cudaGraphSetConditional(.param .b64 handle, .param .b32 value);
.visible .entry {name}(.param .u64 qd_handle, .param .u64 qd_flag)
{{
    .reg .b64 %rd<4>;
    .reg .b32 %r<3>;
    .reg .pred %p<3>;
    ld.param.u64 %rd1, [qd_handle];
    ld.param.u64 %rd2, [qd_flag];
    mov.u32 %r2, 1;
    setp.eq.u64 %p1, %rd2, 0;
    @%p1 bra SET;
    cvta.to.global.u64 %rd3, %rd2;
    ld.global.u32 %r1, [%rd3];
    setp.ne.s32 %p2, %r1, 0;
    selp.u32 %r2, 1, 0, %p2;
SET:
    {{
        .param .b64 p0;
        .param .b32 p1;
        st.param.b64 [p0], %rd1;
        st.param.b32 [p1], %r2;
        call.uni cudaGraphSetConditional, (p0, p1);
    }}
    ret;
}}
"""


@functools.cache
def set_conditional_cubin(cc: tuple = (9, 0)) -> bytes:
    """The cubin of ``qd_set_conditional(handle, flag)`` for compute capability ``cc``: set the
    conditional ``handle`` to ``*flag != 0`` (the int32 at device address ``flag``), or to 1
    when ``flag`` is 0. PTX linked with libcudadevrt.a by nvJitLink; raises
    QuadrantsRuntimeError when either is missing or the link fails."""
    try:
        from cuda.bindings import nvjitlink
        from numba.cuda.cudadrv.libs import get_cudalib
    except ImportError as e:
        raise QuadrantsRuntimeError(f"device-side do_while needs nvJitLink (cuda.bindings): {e}") from None
    devrt = get_cudalib("cudadevrt", static=True)
    ptx = _PTX.format(cc="".join(map(str, cc)), name=SET_CONDITIONAL).encode()
    handle = nvjitlink.create(1, [f"-arch=sm_{''.join(map(str, cc))}"])
    try:
        nvjitlink.add_data(handle, nvjitlink.InputType.PTX, ptx, len(ptx), "qd_set_conditional.ptx")
        nvjitlink.add_file(handle, nvjitlink.InputType.LIBRARY, devrt)
        nvjitlink.complete(handle)
        cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, cubin)
    except Exception as e:
        log = ""
        try:
            log = bytearray(nvjitlink.get_error_log_size(handle))
            nvjitlink.get_error_log(handle, log)
            log = log.decode(errors="replace").strip()
        except Exception:   # noqa: BLE001 - the log is a courtesy
            pass
        raise QuadrantsRuntimeError(f"linking {SET_CONDITIONAL} with {devrt} failed: {e} {log}") from None
    finally:
        nvjitlink.destroy(handle)
    return bytes(cubin)


class _CondApi:
    """The driver entry points conditional nodes add to graphs.py's (CUDA 12.4+)."""

    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        vp, size_t, uint = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint
        out = ctypes.POINTER(ctypes.c_void_p)
        table = {"cuGraphConditionalHandleCreate": (ctypes.POINTER(ctypes.c_uint64), vp, vp, uint, uint),
                 "cuGraphAddNode_v2": (out, vp, out, vp, size_t, ctypes.POINTER(_NodeParams)),
                 "cuCtxGetCurrent": (out,)}
        for name, argtypes in table.items():
            fn = getattr(lib, name)     # AttributeError: an older driver (unavailable() says so)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
            setattr(self, name.removesuffix("_v2"), fn)


_state: dict = {}   # "reason": why device loops are off (None: on); "api"; "set": (runtime, module, function)


def unavailable() -> str | None:
    """Why device-side do_while loops cannot run here (None: they can). Checked once."""
    if "reason" not in _state:
        try:
            _state["api"] = _CondApi()
            _state["set"] = _load_set_conditional()
            _state["reason"] = None
        except AttributeError as e:
            _state["reason"] = f"the driver has no conditional graph nodes (CUDA 12.4+): {e}"
        except (OSError, QuadrantsRuntimeError) as e:
            _state["reason"] = str(e)
    return _state["reason"]


def _load_set_conditional():
    """(runtime, module, CUfunction address) of ``qd_set_conditional`` in the current runtime."""
    rt = CudaRuntime.get()
    module, fn = rt.load_function(set_conditional_cubin(rt.cc), SET_CONDITIONAL)
    return rt, module, int(fn)


def _set_function() -> int:
    """``qd_set_conditional`` loaded in the current runtime (loaded again after a new one)."""
    if _state["set"][0] is not CudaRuntime.get():
        _state["set"] = _load_set_conditional()
    return _state["set"][2]


def _leaves(kernel) -> list:
    """The plain kernels of a do_while kernel's parts, in program order."""
    if not isinstance(kernel, DoWhileKernel):
        return [kernel]
    return [leaf for part in kernel.parts for leaf in _leaves(part)]


def _loops(kernel) -> list:
    """The DoWhileKernels of a kernel's tree, outermost first, in program order."""
    if not isinstance(kernel, DoWhileKernel):
        return []
    return [kernel] + [loop for part in kernel.parts for loop in _loops(part)]


class DeviceLoop:
    """The device-side runner of one do_while kernel: ``loop(args) -> bool`` (False: nothing
    ran, the caller runs the host-side loop). Holds the graph of the last call's plans."""

    # tests and bench/do_while_bench.py turn it off to time and check the host-side loop
    enabled = True

    def __init__(self, kernel):
        self.kernel = kernel
        self.leaves = _leaves(kernel)
        self.loops = _loops(kernel)
        self.graph = None
        self.launches = 0           # cuGraphLaunch calls (one per kernel call)
        self.builds = 0             # graphs built
        self.patches = 0            # nodes patched in the executable graph
        self.rebuild_on_change = False

    def __call__(self, args) -> bool:
        if not self.enabled or unavailable() is not None:
            return False
        flags = [args[loop.flag_index] for loop in self.loops]
        if any(type(f) is not Ndarray for f in flags) or any(isinstance(a, np.ndarray) for a in args):
            return False
        prepared = [leaf.backend().prepare(args) for leaf in self.leaves]
        if any(dirty is None and plan.launches for plan, dirty in prepared):
            return False        # graphs are off for these plans
        plans = tuple(plan for plan, _ in prepared)
        pointers = [f._cuda_view.ptr for f in flags]
        graph = self.graph
        if graph is None or graph.plans != plans:
            self.graph = None
            try:
                graph = _Graph(self, plans, pointers)
            except QuadrantsRuntimeError as e:
                if self.builds:
                    raise
                _state["reason"] = f"the driver refused a conditional graph: {e}"
                return False
            self.graph = graph
            self.builds += 1
        else:
            changed = [(k, d) for k, (_, d) in enumerate(prepared) if d] + \
                [(-1 - j, p) for j, p in enumerate(pointers) if p != graph.pointers[j]]
            if changed:
                self._patch(graph, changed, pointers)
        graph.launch()
        self.launches += 1
        return True

    def _patch(self, graph, changed, pointers) -> None:
        """New parameters for the nodes of ``changed``: (leaf index, dirty bits) or (-1 - loop
        index, new flag pointer); the executable graph patched, or rebuilt where the driver
        refuses."""
        if not self.rebuild_on_change:
            try:
                for what, value in changed:
                    self.patches += graph.patch(what, value)
                return
            except QuadrantsRuntimeError:
                self.rebuild_on_change = True     # a node inside a conditional body: rebuild
        self.graph = None
        self.graph = _Graph(self, graph.plans, pointers)
        self.builds += 1


class _Graph:
    """One do_while kernel's CUDA graph for one set of part plans, instantiated."""

    def __init__(self, loop: DeviceLoop, plans, pointers):
        self.name, self.plans, self.pointers = loop.kernel.name, plans, list(pointers)
        self.api, self.cond = api(), _state["api"]
        self.leaf_of = {id(leaf): k for k, leaf in enumerate(loop.leaves)}
        self.loop_of = {id(dw): j for j, dw in enumerate(loop.loops)}
        self.nodes = [[] for _ in plans]        # per part plan: its task nodes
        self.params = [[] for _ in plans]       # their _KernelNodeParams
        self.set_nodes = [None] * len(loop.loops)    # per loop: (node, params, cells) of its flag reader
        self.keep: list = []                    # ctypes objects the driver may read later
        self.owned: dict = {}                   # "graph", "exec": freed with this object
        ctx = ctypes.c_void_p()
        _ok(self.cond.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        self.ctx = ctx.value
        graph = ctypes.c_void_p()
        _ok(self.api.cuGraphCreate(ctypes.byref(graph), 0), f"cuGraphCreate (kernel '{self.name}')")
        self.graph = self.owned["graph"] = graph.value
        # not at interpreter exit, where the driver may be gone first
        weakref.finalize(self, _destroy, self.api, self.owned).atexit = False
        self._add(self.graph, loop.kernel, [], top=True)
        self._instantiate()

    def _instantiate(self) -> None:
        exec_ = ctypes.c_void_p()
        _ok(self.api.cuGraphInstantiateWithFlags(ctypes.byref(exec_), self.graph, 0),
            f"cuGraphInstantiate (kernel '{self.name}', do_while)")
        self.exec = self.owned["exec"] = exec_.value

    def _kernel_node(self, graph, params, deps) -> int:
        node = ctypes.c_void_p()
        array = (ctypes.c_void_p * max(1, len(deps)))(*deps)
        _ok(self.api.cuGraphAddKernelNode(ctypes.byref(node), graph, array if deps else None, len(deps),
                                          ctypes.byref(params)),
            f"cuGraphAddKernelNode (kernel '{self.name}', do_while)")
        return node.value

    def _fill(self, plan, k: int, params) -> None:
        base = PACK_HEAD + PACK_TASK * k
        fn, grid, block, _ = (int(w) for w in plan.packed[base:base + PACK_TASK])
        # an empty loop (grid 0) runs one block that finds no iteration: nodes inside a
        # conditional body cannot be disabled
        params.func, params.gridDimX, params.blockDimX = fn, max(grid, 1), block

    def _add(self, graph, part, deps, top=False) -> list:
        """Add ``part`` (a plain kernel or a DoWhileKernel) after the nodes ``deps``; returns the
        nodes that end it."""
        if not isinstance(part, DoWhileKernel):
            return self._add_plan(graph, self.leaf_of[id(part)], deps)
        j = self.loop_of[id(part)]
        if part.before is not None:
            deps = self._add(graph, part.before, deps)
        handle = ctypes.c_uint64()
        _ok(self.cond.cuGraphConditionalHandleCreate(ctypes.byref(handle), graph, self.ctx, 1,
                                                     CU_GRAPH_COND_ASSIGN_DEFAULT),
            f"cuGraphConditionalHandleCreate (kernel '{self.name}')")
        if not top:     # a nested loop: its handle is 1 again on every pass of the outer loop
            deps = [self._set_node(graph, handle.value, 0, deps)[0]]
        params = _NodeParams(type=CU_GRAPH_NODE_TYPE_CONDITIONAL)
        params.conditional.handle, params.conditional.type = handle.value, CU_GRAPH_COND_TYPE_WHILE
        params.conditional.size, params.conditional.ctx = 1, self.ctx
        node = ctypes.c_void_p()
        array = (ctypes.c_void_p * max(1, len(deps)))(*deps)
        _ok(self.cond.cuGraphAddNode(ctypes.byref(node), graph, array if deps else None, None, len(deps),
                                     ctypes.byref(params)),
            f"cuGraphAddNode (conditional WHILE, kernel '{self.name}')")
        body = params.conditional.phGraph_out[0]
        tails = self._add(body, part.body, [])
        self.set_nodes[j] = self._set_node(body, handle.value, self.pointers[j], tails)
        deps = [node.value]
        if part.after is not None:
            deps = self._add(graph, part.after, deps)
        return deps

    def _set_node(self, graph, handle: int, flag: int, deps):
        cells = (ctypes.c_uint64(handle), ctypes.c_uint64(flag))
        argv = (ctypes.c_void_p * 2)(*(ctypes.addressof(c) for c in cells))
        params = _KernelNodeParams(func=_set_function(), gridDimX=1, gridDimY=1, gridDimZ=1, blockDimX=1,
                                   blockDimY=1, blockDimZ=1, sharedMemBytes=0,
                                   kernelParams=ctypes.addressof(argv))
        self.keep += [cells, argv, params]
        return self._kernel_node(graph, params, deps), params, cells

    def _add_plan(self, graph, k: int, deps) -> list:
        plan = self.plans[k]
        if not plan.launches:
            return deps
        own = plan.graph.deps       # a chain, or parallel sections as branches (graphs.py)
        nodes, params = self.nodes[k], self.params[k]
        for t, launch in enumerate(plan.launches):
            p = _KernelNodeParams(gridDimY=1, gridDimZ=1, blockDimY=1, blockDimZ=1, sharedMemBytes=0,
                                  kernelParams=launch.argv)
            self._fill(plan, t, p)
            params.append(p)
            nodes.append(self._kernel_node(graph, p, [nodes[i] for i in own[t]] if own[t] else deps))
        waited = {i for t in range(len(nodes)) for i in own[t]}
        return [node for t, node in enumerate(nodes) if t not in waited]

    def patch(self, what: int, value: int) -> int:
        """New parameters in the executable graph: the nodes of part ``what`` whose bits are set
        in ``value``, or (``what`` = -1 - loop index) the flag pointer ``value`` of a loop.
        Returns the nodes patched; raises QuadrantsRuntimeError where the driver refuses."""
        setp = self.api.cuGraphExecKernelNodeSetParams
        if what < 0:
            j = -1 - what
            node, params, cells = self.set_nodes[j]
            cells[1].value = value
            _ok(setp(self.exec, node, ctypes.byref(params)), f"cuGraphExecKernelNodeSetParams (kernel '{self.name}')")
            self.pointers[j] = value
            return 1
        plan, count, t = self.plans[what], 0, 0
        while value:
            if value & 1:
                params = self.params[what][t]
                self._fill(plan, t, params)
                _ok(setp(self.exec, self.nodes[what][t], ctypes.byref(params)),
                    f"cuGraphExecKernelNodeSetParams (kernel '{self.name}', do_while)")
                count += 1
            value >>= 1
            t += 1
        return count

    def launch(self) -> None:
        """One replay on the legacy default stream (where plain launches and copies run)."""
        _ok(self.api.cuGraphLaunch(self.exec, None), f"cuGraphLaunch (kernel '{self.name}', do_while)")


def _destroy(drv, owned: dict) -> None:
    """Free a graph and its instance (errors are ignored: the context may be gone)."""
    if owned.get("exec"):
        drv.cuGraphExecDestroy(owned["exec"])
    if owned.get("graph"):
        drv.cuGraphDestroy(owned["graph"])
