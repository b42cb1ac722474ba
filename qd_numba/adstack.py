"""Adstacks at run time: the per-launch heap of a gradient task, sized right before dispatch.

A gradient task whose body has loops (passes/autodiff.py) pushes the values its reverse pass
replays onto a per-thread stack (lowering/adstack.py). Each such task has one :class:`AdStack`:

* a *descriptor* field, int64 ``[heap address, depth in words, rows, overflow flag]``, a hidden
  argument of the kernel like any field (its storage never moves, so compiled code and the CUDA
  field table stay valid);
* a heap of ``rows x depth`` int64 words (a row per thread: Numba's thread pool on the CPU,
  the saturating grid on CUDA), made on the first launch, grown on demand, reused after;
* a *size expression*, built at compile time from the loop bounds of the task (see
  :func:`evaluate`), evaluated on the host before each launch from the kernel's arguments and
  fields: nothing runs on the device to size it (seed 002). ``qd.init(ad_stack_size=N)``
  replaces the expression by N.

After the launch the overflow flag is read; a set flag raises :class:`QuadrantsRuntimeError`
naming the kernel, the task (file:line of its loop) and the likely cause.

Size expressions are nested tuples: ``("const", n)``, ``("arg", k)`` (kernel argument k: a
runtime parameter, or a hidden field after them), ``("item", e, index)`` (an element of the
array/field ``e`` at a constant index), ``("shape", e, axis)``, ``("+"|"-"|"*"|"//", a, b)``,
``("max"|"min", a, b)``.
"""

from __future__ import annotations

import numpy as np

from . import config, dtypes
from .errors import QuadrantsRuntimeError
from .field import Field

_BINARY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
           "//": lambda a, b: a // b, "max": max, "min": min}


def evaluate(expr, leaf):
    """The value of size expression ``expr``; ``leaf(k)`` is kernel argument k."""
    tag = expr[0]
    if tag == "const":
        return expr[1]
    if tag == "arg":
        return leaf(expr[1])
    if tag == "shape":
        return int(evaluate(expr[1], leaf).shape[expr[2]])
    if tag == "item":
        index = expr[2]
        value = evaluate(expr[1], leaf)[() if index is None else index]
        return int(value.item() if hasattr(value, "item") else value)
    return _BINARY[tag](evaluate(expr[1], leaf), evaluate(expr[2], leaf))


def render(expr, names) -> str:
    """``expr`` as a person would write it; ``names(k)`` is the name of kernel argument k."""
    tag = expr[0]
    if tag == "const":
        return str(expr[1])
    if tag == "arg":
        return names(expr[1])
    if tag == "shape":
        return f"{render(expr[1], names)}.shape[{expr[2]}]"
    if tag == "item":
        return f"{render(expr[1], names)}[{expr[2]}]"
    if tag in ("max", "min"):
        return f"{tag}({render(expr[1], names)}, {render(expr[2], names)})"
    return f"({render(expr[1], names)} {tag} {render(expr[2], names)})"


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

    def depth_for(self, leaf) -> int:
        override = config.current.ad_stack_size
        if override:
            return int(override)
        return max(1, int(evaluate(self.size, leaf)))

    def prepare(self, leaf, rows: int, alloc) -> None:
        """Size the heap for this launch: ``rows`` threads; ``alloc(words)`` makes an int64 buffer
        (numpy on the CPU, device memory on CUDA) and gives (buffer, address)."""
        depth = self.depth = self.depth_for(leaf)
        words = depth * rows
        if words > self.capacity:
            self.capacity = max(words, 2 * self.capacity)
            self.heap, self.address = alloc(self.capacity)
        state = (self.address, depth, rows)
        if state != self.written:
            self.desc.from_numpy(np.array([*state, 0], dtype=np.int64))
            self.written = state

    def check(self) -> None:
        """Raise if the launch overflowed the stack (and clear the flag)."""
        if self.desc[3] == 0:
            return
        self.desc[3] = 0
        source = (f"qd.init(ad_stack_size={config.current.ad_stack_size})" if config.current.ad_stack_size
                  else f"the loop bounds, read before the launch: {self.size_text} = {self.depth}")
        raise QuadrantsRuntimeError(
            f"kernel '{self.kernel_name}': adstack overflow in the task of the loop at {self.loc}: a thread "
            f"pushed more than the {self.depth} words sized from {source}. Likely cause: a loop bound "
            "(a field, an ndarray or an argument) changed between the forward kernel and its gradient, "
            "or a while loop ran longer than the depth allows (raise qd.init(ad_stack_size=...))")


def host_alloc(words: int):
    heap = np.empty(words, dtype=np.int64)
    return heap, heap.ctypes.data


def wrap_cpu_entry(entry, adstacks):
    """The CPU entry point of a gradient kernel with adstacks: size, run, check.
    The entry takes the runtime arguments then the ``hidden`` field buffers."""
    import numba

    rows = numba.config.NUMBA_NUM_THREADS

    def run(*args):
        for stack in adstacks:
            stack.prepare(args.__getitem__, rows, host_alloc)
        out = entry(*args)
        for stack in adstacks:
            stack.check()
        return out

    return run


def wrap_cuda_run(run, adstacks, params, hidden, rows_of, alloc):
    """The CUDA runner of a gradient kernel with adstacks. ``params``: (name, kind) per kernel
    parameter; ``hidden``: the kernel's fields after its runtime parameters; ``rows_of(uid)``:
    the saturating thread count of a task's launch; ``alloc(words)`` a device buffer."""
    runtime = [k for k, (_, kind) in enumerate(params) if kind != "template"]

    def launch(*args):
        def leaf(k):
            return args[runtime[k]] if k < len(runtime) else hidden[k - len(runtime)]

        for stack in adstacks:
            stack.prepare(leaf, rows_of(stack.task_uid), alloc)
        out = run(*args)
        for stack in adstacks:
            stack.check()
        return out

    return launch
