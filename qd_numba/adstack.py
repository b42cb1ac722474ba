"""Adstacks at run time: the per-launch heap of a gradient task, sized right before dispatch.

A gradient task whose body has loops (passes/autodiff.py) pushes the values its reverse pass
replays onto a per-thread stack (lowering/adstack.py). Each such task has one :class:`AdStack`:

* a *descriptor* field, int64 ``[heap address, depth in words, rows, overflow flag]``, a hidden
  argument of the kernel like any field (its storage never moves, so compiled code and the CUDA
  field table stay valid);
* a heap of ``rows x depth`` int64 words (a row per thread: Numba's thread pool on the CPU,
  the saturating grid on CUDA), made on the first launch, grown on demand, reused after;
* a *size expression*, built at compile time from the loop bounds of the task (see
  :func:`evaluate`), evaluated before a launch from the kernel's arguments and fields.
  ``qd.init(ad_stack_size=N)`` replaces the expression by N.

Sizing (:meth:`AdStack.depth_for`). A bound read at the parallel loop's index (a per-thread
bound) makes the size a maximum over the loop's iteration space (``maxover``). The host
evaluates it (numpy over the host data, in chunks; no device kernel, no device→host copy of
arrays: seed 002) unless a per-thread leaf lives in device memory: then a small max-reduction
kernel (a qd kernel generated from the expression, :func:`reducer_source`) runs on the device and
one int64 comes back (seed 001); if that kernel cannot be compiled, the host reduces over a
copy (the serial fallback). ``qd.init(ad_stack_sizer=...)`` forces either path. The result is
cached per task, keyed on the write generations of the fields/ndarrays the expression reads
(field.py: every kernel launch that writes one, ``from_numpy``, ``fill`` and ``__setitem__`` give
it a new generation) and the values of its scalar arguments: a launch whose leaves did not
change evaluates nothing. A leaf without a generation (a numpy array argument) is evaluated
on every launch.

On CUDA a launch whose size is cached neither waits nor copies anything to the host: the
descriptor, when it changes, goes up from pinned memory on the kernels' stream (an event guards
the pinned words' reuse), and the overflow flag comes back the same way (:meth:`AdStack.watch`).
The flag is checked at once on the CPU; on CUDA where the host synchronises anyway
(:func:`check_pending`) or at a later launch of the kernel. A set flag raises
:class:`QuadrantsRuntimeError` naming the kernel, the task (file:line of its loop) and the likely
cause.

Size expressions are nested tuples: ``("const", n)``, ``("arg", k)`` (kernel argument k: a
runtime parameter, or a hidden field after them), ``("item", e, index)`` (an element of the
array/field ``e`` at a constant index), ``("shape", e, axis)``, ``("+"|"-"|"*"|"//", a, b)``,
``("max"|"min", a, b)``; inside ``("maxover", dims, e)`` (the maximum of ``e`` over the space
``dims``, a ``(start, stop, step)`` per dimension) also ``("index", k)`` (component k of the
parallel loop's index) and ``("load", e, (i0, ...))`` (an element at per-thread indices).
"""

from __future__ import annotations

import collections
import math

import numpy as np

from . import config, dtypes, runtime
from .errors import QuadrantsRuntimeError
from .field import ArrayData, Field, buffer_owner, host_sync_checks

_BINARY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
           "//": lambda a, b: a // b, "max": np.maximum, "min": np.minimum}
_CHUNK = 1 << 20        # index points per numpy pass of a host max-reduction
_SLOTS_PER_BLOCK = 32   # CUDA: pinned flag words allocated at a time
_MAX_IN_FLIGHT = 256    # CUDA: launches whose flags may be outstanding before one waits


def evaluate(expr, leaf, index=None):
    """The value of size expression ``expr``; ``leaf(k)`` is kernel argument k (host data);
    ``index``: the parallel loop's index components (numpy arrays) inside a ``maxover``."""
    tag = expr[0]
    if tag == "const":
        return expr[1]
    if tag == "arg":
        return leaf(expr[1])
    if tag == "index":
        return index[expr[1]]
    if tag == "shape":
        return int(evaluate(expr[1], leaf).shape[expr[2]])
    if tag == "item":
        at = expr[2]
        value = evaluate(expr[1], leaf)[() if at is None else at]
        return int(value.item() if hasattr(value, "item") else value)
    if tag == "load":
        array = _host_array(evaluate(expr[1], leaf))
        at = tuple(evaluate(e, leaf, index) for e in expr[2])
        return array[at].astype(np.int64)
    if tag == "maxover":
        return max_over(expr[1], expr[2], leaf)
    value = _BINARY[tag](evaluate(expr[1], leaf, index), evaluate(expr[2], leaf, index))
    return value if isinstance(value, np.ndarray) else int(value)


def _host_array(value) -> np.ndarray:
    """The data of a per-thread leaf on the host: a host buffer as it is, device data copied
    (the serial fallback of the device max-reduction)."""
    if isinstance(value, ArrayData):
        return value._arr if value._dev is None else value.to_numpy()
    if hasattr(value, "__cuda_array_interface__"):
        from numba import cuda

        return cuda.as_cuda_array(value).copy_to_host()
    return np.asarray(value)


def space_counts(dims, leaf):
    """``[(start, step, count)]`` per dimension of a ``maxover`` space."""
    out = []
    for start, stop, step in dims:
        start, stop, step = (int(evaluate(e, leaf)) for e in (start, stop, step))
        out.append((start, step, len(range(start, stop, step))))
    return out


def max_over(dims, body, leaf) -> int:
    """The maximum of ``body`` over the space ``dims`` (0 for an empty space), in numpy chunks."""
    space = space_counts(dims, leaf)
    counts = [c for _, _, c in space]
    total, best = math.prod(counts), 0
    for lo in range(0, total, _CHUNK):
        flat = np.arange(lo, min(total, lo + _CHUNK), dtype=np.int64)
        parts = np.unravel_index(flat, counts) if len(counts) > 1 else (flat,)
        index = [start + k * step for (start, step, _), k in zip(space, parts)]
        best = max(best, int(np.max(evaluate(body, leaf, index))))
    return best


def _nodes(x):
    """Every node of a size expression (and of the spaces and index tuples inside it)."""
    if isinstance(x, tuple):
        if x and isinstance(x[0], str):
            yield x
        for y in x:
            yield from _nodes(y)


def leaves(expr) -> set:
    """The kernel arguments (indices) a size expression reads."""
    return {node[1] for node in _nodes(expr) if node[0] == "arg"}


def loaded(expr) -> set:
    """The kernel arguments a size expression reads per thread (``load`` bases)."""
    return set().union(*(leaves(node[1]) for node in _nodes(expr) if node[0] == "load"))


def render(expr, names) -> str:
    """``expr`` as a person would write it; ``names(k)`` is the name of kernel argument k."""
    tag = expr[0]
    if tag == "const":
        return str(expr[1])
    if tag == "arg":
        return names(expr[1])
    if tag == "index":
        return f"i{expr[1]}"
    if tag == "shape":
        return f"{render(expr[1], names)}.shape[{expr[2]}]"
    if tag == "item":
        return f"{render(expr[1], names)}[{expr[2]}]"
    if tag == "load":
        return f"{render(expr[1], names)}[{', '.join(render(e, names) for e in expr[2])}]"
    if tag == "maxover":
        space = ", ".join(f"i{k} in range({render(a, names)}, {render(b, names)}"
                          + (f", {render(c, names)})" if c != ("const", 1) else ")")
                          for k, (a, b, c) in enumerate(expr[1]))
        return f"max of {render(expr[2], names)} over {space}"
    if tag in ("max", "min"):
        return f"{tag}({render(expr[1], names)}, {render(expr[2], names)})"
    return f"({render(expr[1], names)} {tag} {render(expr[2], names)})"


def reducer_source(dims, body, runtime: int):
    """Source of the max-reduction kernel of ``maxover(dims, body)``: ``adstack_depth(out, s0,
    n0, d0, ..., a<k>...)`` atomically maxes ``body`` at every point ``s + t * d`` (t < n) into
    ``out[0]``. ``runtime``: how many of the kernel arguments are runtime parameters (``a<k>``);
    hidden fields are the globals ``f<j>``. Returns (source, runtime leaves, field leaves)."""
    used_args, used_fields = set(), set()

    def src(e):
        tag = e[0]
        if tag == "const":
            return str(int(e[1]))
        if tag == "arg":
            k = e[1]
            (used_args if k < runtime else used_fields).add(k)
            return f"a{k}" if k < runtime else f"f{k - runtime}"
        if tag == "index":
            return f"i{e[1]}"
        if tag == "shape":
            return f"{src(e[1])}.shape[{e[2]}]"
        if tag == "item":
            at = e[2]
            return f"{src(e[1])}[{'None' if at is None else ', '.join(map(str, at)) if isinstance(at, tuple) else at}]"
        if tag == "load":
            return f"{src(e[1])}[{', '.join(src(x) for x in e[2])}]"
        if tag in ("max", "min"):
            return f"{tag}({src(e[1])}, {src(e[2])})"
        return f"({src(e[1])} {e[0]} {src(e[2])})"

    value = src(body)
    ndim = len(dims)
    space = ", ".join(f"s{k}: qd.i64, n{k}: qd.i64, d{k}: qd.i64" for k in range(ndim))
    params = "".join(f", a{k}: ann{k}" for k in sorted(used_args))
    ts = ", ".join(f"t{k}" for k in range(ndim))
    loop = "range(n0)" if ndim == 1 else f"qd.ndrange({', '.join(f'n{k}' for k in range(ndim))})"
    lines = ["@qd.kernel",
             f"def adstack_depth(out: qd.types.ndarray(dtype=qd.i64, ndim=1), {space}{params}):",
             f"    for {ts} in {loop}:",
             *(f"        i{k} = s{k} + t{k} * d{k}" for k in range(ndim)),
             f"        qd.atomic_max(out[0], qd.cast({value}, qd.i64))"]
    return "\n".join(lines) + "\n", sorted(used_args), sorted(used_fields)


def _stamp(value):
    """What a leaf's value is keyed on in the size cache: a field's/ndarray's write generation,
    a scalar's value; None where nothing says it did not change (a numpy array argument)."""
    if isinstance(value, ArrayData):
        return value._gen
    if type(value) is np.ndarray:
        owner = buffer_owner(value)
        return None if owner is None else owner._gen
    if isinstance(value, (int, float, bool, np.number, np.bool_)):
        return value
    return None


class AdStack:
    """The adstack of one gradient task (see the module docstring)."""

    def __init__(self, kernel_name: str, loc: str, size, size_text: str):
        self.kernel_name, self.loc = kernel_name, loc
        self.size, self.size_text = size, size_text      # size None: only qd.init(ad_stack_size=N) sizes it
        self.desc = Field(dtypes.i64, shape=(4,), name=f"adstack of {kernel_name} at {loc}")
        self.task_uid = None        # set once the task list is final
        self.heap = None
        self.capacity, self.address = 0, 0   # words in the heap, its address
        self.written = None         # (address, depth, rows) last written to the descriptor
        self.depth = 0
        self.leaf_ids = sorted(leaves(size)) if size is not None else []
        self.per_thread = loaded(size) if size is not None else set()
        self.key = None             # the leaves' stamps the cached depth was evaluated for
        self.evaluations = 0        # evaluations of the size expression (the cache's misses)
        self.device_reductions = 0  # ... of which by the device max-reduction kernel
        self.params = ()            # (annotation, kind) per runtime parameter of the kernel
        self.fields = ()            # the kernel's fields (the hidden arguments), for the reducer
        self.reducer = None         # (kernel, runtime leaves, out) once made; False: cannot compile
        self.slots = []             # CUDA: free (pinned words, index, address, event) for the flags' async reads
        self.in_flight = collections.deque()   # CUDA: (slot, depth, source) per launch not reported yet
        self.upload = None          # CUDA: (pinned words, address, event) of the descriptor's uploads
        self.desc_address = None    # CUDA: the descriptor's device address

    # -- sizing ------------------------------------------------------------------------------------
    def depth_for(self, leaf) -> int:
        """The depth for a launch whose kernel argument k is ``leaf(k)`` (cached, see the module
        docstring)."""
        override = config.current.ad_stack_size
        if override:
            return int(override)
        key = tuple(_stamp(leaf(k)) for k in self.leaf_ids)
        if key == self.key:
            return self.depth
        depth = max(1, int(self._evaluate(leaf)))
        self.evaluations += 1
        self.key = None if None in key else key
        return depth

    def _evaluate(self, leaf):
        sizer = config.current.ad_stack_sizer
        if self.size[0] == "maxover" and (sizer == "device" or sizer == "auto" and any(
                _on_device(leaf(k)) for k in self.per_thread)):
            depth = self._reduce_on_device(leaf)
            if depth is not None:
                return depth
        try:
            return evaluate(self.size, leaf)
        except IndexError as e:
            raise QuadrantsRuntimeError(
                f"kernel '{self.kernel_name}': sizing the adstack of the task at {self.loc} reads out of bounds "
                f"({e}): {self.size_text}") from None

    def _reduce_on_device(self, leaf):
        """The max-reduction kernel's result, or None where it cannot be compiled (the caller
        reduces on the host, over a copy)."""
        from .errors import QuadrantsError

        if self.reducer is None:
            self.reducer = self._make_reducer()
        if self.reducer is False:
            return None
        kernel, used, out = self.reducer
        space = space_counts(self.size[1], leaf)
        if math.prod(n for _, _, n in space) == 0:
            return 0
        out.fill(0)
        try:
            kernel.backend().call(out, *(x for s, d, n in space for x in (s, n, d)), *(leaf(k) for k in used))
        except QuadrantsError:
            self.reducer = False
            return None
        self.device_reductions += 1
        # the one int64 (not out.to_numpy(): that would also report other launches' overflows here)
        return int(out._arr[0] if out._dev is None else out._dev.copy_to_host()[0])

    def _make_reducer(self):
        import qd_numba as qd

        from .generated_code import exec_generated

        source, used, fields = reducer_source(self.size[1], self.size[2], len(self.params))
        ns = {"qd": qd}
        for k in used:
            annotation, kind = self.params[k]
            ns[f"ann{k}"] = qd.types.ndarray() if kind == "ndarray" else annotation
        for k in fields:
            ns[f"f{k - len(self.params)}"] = self.fields[k - len(self.params)]
        exec_generated(source, f"adstack sizer of {self.kernel_name} at {self.loc}", ns)
        return ns["adstack_depth"], used, qd.ndarray(qd.i64, (1,))

    def prepare(self, leaf, rows: int, alloc, rt=None) -> None:
        """Size the heap for this launch: ``rows`` threads; ``alloc(words)`` makes an int64 buffer
        (numpy on the CPU, device memory on CUDA) and gives (buffer, address). The descriptor is
        written when it changes: on CUDA (``rt``) asynchronously from pinned memory, ordered
        before the kernel on its stream, the pinned words reused once their event has passed."""
        depth = self.depth = self.depth_for(leaf)
        words = depth * rows
        if words > self.capacity:
            self.capacity = max(words, 2 * self.capacity)
            self.heap, self.address = alloc(self.capacity)
        state = (self.address, depth, rows)
        if state == self.written:
            return
        if rt is None:
            self.desc.from_numpy(np.array([*state, 0], dtype=np.int64))
        else:
            if self.upload is None:
                self.upload = (*rt.pinned_words(4), rt.event())
            else:
                rt.wait_event(self.upload[2])      # the previous upload has left the pinned words
            words_, address, event = self.upload
            words_[:] = [*state, 0]
            rt.write_async(self.device_address(), address, 32, event)
        self.written = state

    def device_address(self) -> int:
        """The descriptor's device address (CUDA; a field's storage never moves)."""
        if self.desc_address is None:
            self.desc_address = self.desc._dev.device_ctypes_pointer.value
        return self.desc_address

    # -- overflow ----------------------------------------------------------------------------------
    def _source(self) -> str:
        return (f"qd.init(ad_stack_size={config.current.ad_stack_size})" if config.current.ad_stack_size
                else f"the loop bounds, read before the launch: {self.size_text} = {self.depth}")

    def _overflow(self, depth, source, later=False):
        if not later:                       # CUDA clears the flag after each launch's copy
            self.desc._arr[3] = 0
        when = (" (found after that launch, at the next synchronisation — qd.sync, to_numpy, a device "
                "element read, the Tape's exit — or at a later launch of this gradient kernel)") if later else ""
        return QuadrantsRuntimeError(
            f"kernel '{self.kernel_name}': adstack overflow in the task of the loop at {self.loc}{when}: a thread "
            f"pushed more than the {depth} words sized from {source}. Likely cause: a loop bound "
            "(a field, an ndarray or an argument) changed between the forward kernel and its gradient, "
            "or a while loop ran longer than the depth allows (raise qd.init(ad_stack_size=...))")

    def check(self) -> None:
        """CPU: raise if the launch overflowed the stack (and clear the flag)."""
        if self.desc._arr[3] != 0:
            raise self._overflow(self.depth, self._source())

    def watch(self, rt) -> None:
        """CUDA: after a launch, copy its flag into pinned memory and clear it on the device,
        both ordered after the kernel on its stream, then record an event; nothing waits. The
        launch is reported by :meth:`poll` (the next launch, if its copy is done) or
        :meth:`settle` (where the host synchronises)."""
        if not self.slots:                  # pinned words and events, a block at a time
            words, address = rt.pinned_words(_SLOTS_PER_BLOCK)
            self.slots = [(words, k, address + 8 * k, rt.event()) for k in reversed(range(_SLOTS_PER_BLOCK))]
        slot = self.slots.pop()
        rt.read_async(slot[2], self.device_address() + 3 * 8, 8, slot[3])
        self.in_flight.append((slot, self.depth, self._source()))
        _pending[id(self)] = (self, rt)
        _register_sync_check()

    def poll(self, rt) -> None:
        """CUDA: report the launches whose flag copies are done (in launch order); waits only for
        the oldest when more than ``_MAX_IN_FLIGHT`` are outstanding (the host far ahead)."""
        in_flight = self.in_flight
        while in_flight:
            event = in_flight[0][0][3]
            if len(in_flight) >= _MAX_IN_FLIGHT:
                rt.wait_event(event)
            elif not rt.event_done(event):
                break
            self._report(in_flight.popleft())
        if not in_flight:
            _pending.pop(id(self), None)

    def settle(self, rt) -> None:
        """CUDA: wait for every flag copy in flight and report them (in launch order)."""
        try:
            while self.in_flight:
                entry = self.in_flight.popleft()
                rt.wait_event(entry[0][3])
                self._report(entry)
        finally:
            if not self.in_flight:
                _pending.pop(id(self), None)

    def _report(self, entry) -> None:
        slot, depth, source = entry
        self.slots.append(slot)
        if slot[0][slot[1]] != 0:
            raise self._overflow(depth, source, later=True)


_pending = {}       # id -> (AdStack, CudaRuntime) with flag copies in flight


def check_pending() -> None:
    """Report the overflow flags read in flight (CUDA): called where the host synchronises anyway
    (qd.sync, to_numpy, field reads, the Tape's exit); the first set flag raises."""
    try:
        for stack, rt in list(_pending.values()):
            stack.settle(rt)
    finally:
        if not _pending and check_pending in host_sync_checks:
            host_sync_checks.remove(check_pending)


def discard_pending() -> None:
    """``qd.init``: the flag copies in flight belong to the runtime being replaced; they are
    dropped, not reported against the kernels of the new one."""
    _pending.clear()
    if check_pending in host_sync_checks:
        host_sync_checks.remove(check_pending)


runtime.on_init(discard_pending)


def _register_sync_check() -> None:
    if check_pending not in host_sync_checks:
        host_sync_checks.append(check_pending)


def _on_device(value) -> bool:
    if isinstance(value, ArrayData):
        return value._dev is not None
    return hasattr(value, "__cuda_array_interface__")


def host_alloc(words: int):
    heap = np.empty(words, dtype=np.int64)
    return heap, heap.ctypes.data


def wrap_cpu_entry(entry, adstacks, kernel, fields):
    """The CPU entry point of a gradient kernel with adstacks: size, run, check. The entry
    takes the runtime arguments then the address of the field table of ``fields``."""
    import numba

    rows = numba.config.NUMBA_NUM_THREADS
    nruntime = sum(p.kind != "template" for p in kernel.params)
    buffers = tuple(f._arr for f in fields)
    _bind(adstacks, kernel, fields)

    def run(*args):
        def leaf(k):
            return args[k] if k < nruntime else buffers[k - nruntime]

        for stack in adstacks:
            stack.prepare(leaf, rows, host_alloc)
        out = entry(*args)
        for stack in adstacks:
            stack.check()
        return out

    return run


def wrap_cuda_run(run, adstacks, kernel, hidden, rows_of, rt):
    """The CUDA runner of a gradient kernel with adstacks. ``hidden``: the kernel's fields after
    its runtime parameters; ``rows_of(uid)``: the saturating thread count of a task's launch;
    ``rt`` the CudaRuntime (heaps, pinned memory, events)."""
    runtime = [k for k, p in enumerate(kernel.params) if p.kind != "template"]
    _bind(adstacks, kernel, hidden)

    def launch(*args):
        def leaf(k):
            return args[runtime[k]] if k < len(runtime) else hidden[k - len(runtime)]

        for stack in adstacks:
            if stack.in_flight:                 # earlier launches whose flags have come back
                stack.poll(rt)
            stack.prepare(leaf, rows_of(stack.task_uid), rt.device_words, rt)
        out = run(*args)
        for stack in adstacks:
            stack.watch(rt)
        return out

    return launch


def wrap_sync_run(run, adstacks, kernel, hidden, rows_of, alloc):
    """The runner ``run(args, *rest)`` of a gradient kernel with adstacks on a target whose copies
    wait for the device (AMDGPU, targets/amdgpu/kernel.py): before the launch the descriptor goes
    up with the field's own copy when it changed, after it the flag comes back and a set one
    raises at once. ``alloc(words)``: (device buffer, address) of a heap; ``hidden``, ``rows_of``
    as :func:`wrap_cuda_run`'s."""
    runtime = [k for k, p in enumerate(kernel.params) if p.kind != "template"]
    _bind(adstacks, kernel, hidden)

    def launch(args, *rest):
        def leaf(k):
            return args[runtime[k]] if k < len(runtime) else hidden[k - len(runtime)]

        for stack in adstacks:
            stack.prepare(leaf, rows_of(stack.task_uid), alloc)
        out = run(args, *rest)
        for stack in adstacks:
            if stack.desc.to_numpy()[3] != 0:
                stack.written = None    # the next launch writes the descriptor again, its flag cleared
                raise stack._overflow(stack.depth, stack._source())
        return out

    return launch


def _bind(adstacks, kernel, fields) -> None:
    kernel.adstacks = list(adstacks)
    params = tuple((p.annotation, p.kind) for p in kernel.params if p.kind != "template")
    for stack in adstacks:
        stack.params, stack.fields = params, tuple(fields)
