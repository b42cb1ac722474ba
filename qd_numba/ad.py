"""``qd.ad``: autodiff in Python scope — the Tape, gradient clearing, custom gradients, FwdMode.

``kernel.grad`` (kernel.py) is the gradient kernel that passes/autodiff.py builds; this module
orders those calls. A :class:`Tape` records the kernels called inside its ``with`` block (by
wrapping every kernel's call path while it is open: calls outside a Tape pay nothing) and on exit
runs their gradients in reverse order. ``@grad_replaced`` functions are recorded as one entry whose
gradient is the function ``@grad_for`` registered. A :class:`FwdMode` block runs every kernel's
forward-mode twin (``kernel.forward_mode``, passes/forward_mode.py) instead of the kernel.
"""

from __future__ import annotations

import functools

import numpy as np

from . import config, streams
from . import kernel as kernel_module
from .errors import QuadrantsRuntimeError, QuadrantsSyntaxError
from .field import Ndarray, dual_holders, gradient_holders, host_sync_checks, run_host_sync_checks
from .passes.ad_validation import read_mask

_active_tape = None


def clear_all_gradients() -> None:
    """Zero the ``.grad`` of every field and ndarray created with ``needs_grad=True``."""
    for data in gradient_holders():
        data.grad.fill(0)


class Tape:
    """``with qd.ad.Tape(loss=l):`` — record kernel calls, then run their gradients in reverse.

    On entry: gradients are cleared (``clear_gradients``) and ``l.grad[None]`` is set to 1; on
    exit the recorded calls' gradient kernels run last to first. ``loss`` must be a 0-d field, or
    an ndarray of one element, with ``needs_grad=True``. ``validation=True`` (with ``qd.init(debug=True)``) checks
    that no kernel overwrites an element of a field with a gradient after a recorded kernel read
    that element — the gradient replays that kernel with the new values, so it would be wrong —
    and raises naming the field, the element, the kernel that read it and the one that
    overwrote it. Each recorded call runs ``kernel.validation``, which marks the elements it
    reads (passes/ad_validation.py), and the fields it reads are snapshotted (a debugging aid:
    it copies data on every call); elements nobody read may change (a time axis)."""

    def __init__(self, loss=None, clear_gradients: bool = True, validation: bool = False, grad_check=None):
        if validation and not config.current.debug:
            raise QuadrantsSyntaxError("qd.ad.Tape(validation=True) needs qd.init(debug=True)")
        self.validation = validation
        self.snapshots = []         # validation: [field, its values before a recorded call, kernel, elements read]
        if loss is not None:
            if getattr(loss, "grad", None) is None:
                raise QuadrantsSyntaxError(f"qd.ad.Tape: the loss {loss!r} needs a gradient: create it with "
                                           "needs_grad=True")
            if isinstance(loss, Ndarray):   # as Quadrants: an ndarray loss has one element, of any shape
                if int(np.prod(loss.shape)) != 1:
                    raise QuadrantsSyntaxError(f"qd.ad.Tape: an ndarray loss must have one element, got shape "
                                               f"{tuple(loss.shape)}")
            elif tuple(loss.shape) != ():
                raise QuadrantsSyntaxError(f"qd.ad.Tape: the loss must be a 0-d (scalar) field, got shape "
                                           f"{tuple(loss.shape)}")
        self.loss = loss
        self.clear_gradients = clear_gradients
        self.calls = []
        self.entered = False
        self.gradient_evaluated = False

    def __enter__(self):
        global _active_tape
        if _active_tape is not None:
            raise QuadrantsRuntimeError("qd.ad.Tape: tapes cannot be nested (a Tape is already recording)")
        if self.entered:
            raise QuadrantsRuntimeError("qd.ad.Tape: this tape was already used")
        self.entered = True
        if self.clear_gradients:
            clear_all_gradients()
        if self.loss is not None:
            self.loss.grad.fill(1)
        _active_tape = self
        kernel_module.wrap_calls(_recording_call)
        return self

    def __exit__(self, exc_type, exc, tb):
        global _active_tape
        _active_tape = None
        kernel_module.wrap_calls(None)
        if exc_type is None:
            self.grad()
            if host_sync_checks:    # adstack overflows of the gradient launches (CUDA reads them async)
                run_host_sync_checks()

    def insert(self, fn, args) -> None:
        self.calls.append((fn, args))

    def before_call(self, kernel, args) -> None:
        """validation: snapshot the fields with gradients this call reads (tasks in order: a field
        an earlier task of the call wrote, such as ``s[None] = 0`` before a loop reading it, is
        the call's own value and is not checked)."""
        tasks, fields = kernel.backend().tasks_and_fields(args)
        runtime_params = sum(p.kind != "template" for p in kernel.params)   # hidden fields follow them
        read, written = {}, set()
        for task in tasks:
            # ``f[i] += v`` reads the old value of f only to return it: accumulated fields are skipped
            accumulated = {a.resource for a in task.accesses if a.what == "atomic"}
            stored = {a.resource for a in task.accesses if a.kind == "write" and a.what == "store"}
            for access in task.accesses:
                if access.kind != "read" or access.resource in accumulated or access.resource in written:
                    continue
                k = access.resource - runtime_params if isinstance(access.resource, int) else -1
                field = fields[k] if 0 <= k < len(fields) else None
                if field is not None and getattr(field, "grad", None) is not None:
                    read[id(field)] = field
            written |= stored
        for field in read.values():
            read_mask(field).fill(0)
        self.snapshots += [[field, field.to_numpy(), kernel, None] for field in read.values()]

    def after_call(self, kernel) -> None:
        """validation: an element a recorded kernel read has changed: its gradient would be wrong."""
        for snapshot in self.snapshots:
            field, values, reader, read = snapshot
            if read is None:        # this call's snapshot: the elements it read
                read = snapshot[3] = read_mask(field).to_numpy() != 0
            now = field.to_numpy()
            changed = (now != values) & ~(np.isnan(now) & np.isnan(values))
            changed = changed.reshape(read.shape + (-1,)).any(axis=-1) & read
            if changed.any():
                name = field.name or repr(field)
                first = tuple(int(k) for k in np.argwhere(changed)[0])
                if field.offset is not None:
                    first = tuple(k + o for k, o in zip(first, field.offset))
                raise QuadrantsRuntimeError(
                    f"qd.ad.Tape(validation=True): kernel '{kernel.name}' overwrote the field {name}, which kernel "
                    f"'{reader.name}' read earlier in this tape (element {list(first)}, {int(changed.sum())} in "
                    f"all): the gradient of '{reader.name}' would use the new values. Write the result to another "
                    "field, or keep one value per step (e.g. a time axis)")

    def grad(self) -> None:
        """Run the recorded calls' gradients, last call first."""
        if self.gradient_evaluated:
            raise QuadrantsRuntimeError("qd.ad.Tape: the gradients were already evaluated")
        for fn, args in reversed(self.calls):
            fn.grad(*args)
        self.gradient_evaluated = True


def _recording_call(kernel, call):
    if kernel.autodiff_mode is not None:
        return call

    @functools.wraps(call)
    def recording(self, *args, **kwargs):
        tape = _active_tape
        if tape is not None:
            if kwargs:
                if kwargs.pop("qd_stream", None) is not None:
                    raise streams.tape_error(self)
                args = self._bind(args, kwargs)
                kwargs = {}
            tape.insert(self, args)
            if tape.validation:
                if kwargs:
                    args, kwargs = self._bind(args, kwargs), {}
                tape.before_call(self, args)
                out = self.validation(*args)
                tape.after_call(self)
                return out
        return call(self, *args, **kwargs)

    return recording


def grad_replaced(fn):
    """A Python function recorded by a Tape as one call whose gradient is the function registered
    with :func:`grad_for`; the kernels it calls are not recorded."""

    @functools.wraps(fn)
    def replaced(*args, **kwargs):
        global _active_tape
        tape = _active_tape
        if tape is None:
            return fn(*args, **kwargs)
        tape.insert(replaced, args)
        _active_tape = None
        kernel_module.wrap_calls(None)
        try:
            return fn(*args, **kwargs)
        finally:
            _active_tape = tape
            kernel_module.wrap_calls(_recording_call)

    replaced.grad = None
    return replaced


def grad_for(primal):
    """``@qd.ad.grad_for(f)``: the decorated function is the gradient of ``@grad_replaced`` ``f``."""
    if not hasattr(primal, "grad") or not callable(primal):
        raise QuadrantsSyntaxError("qd.ad.grad_for: the primal must be a @qd.ad.grad_replaced function")

    def register(grad_fn):
        primal.grad = grad_fn
        return grad_fn

    return register


def clear_all_duals() -> None:
    """Zero the ``.dual`` of every field created with ``needs_dual=True``."""
    for data in dual_holders():
        data.dual.fill(0)


class FwdMode:
    """``with qd.ad.FwdMode(loss=l, param=x, seed=[...]):`` — forward-mode autodiff.

    On entry the duals are cleared (``clear_gradients``) and ``x.dual`` is set to ``seed`` (one
    value per element of ``x``, row-major; default ``[1.0]`` for a 0-d ``x``); kernels called
    inside run their forward-mode twins, which also compute the ``.dual`` of what they write;
    afterwards ``l.dual`` holds the derivative of ``l`` along ``seed``. On exit ``x.dual`` is
    zeroed again. ``loss`` and ``param`` are fields created with ``needs_dual=True``."""

    def __init__(self, loss, param, seed=None, clear_gradients: bool = True):
        for what, data in (("loss", loss), ("param", param)):
            if getattr(data, "dual", None) is None:
                raise QuadrantsSyntaxError(f"qd.ad.FwdMode: the {what} {data!r} needs a dual: create it with "
                                           "needs_dual=True")
        size = int(np.prod(param.dual._arr.shape))
        if seed is None:
            if size != 1:
                raise QuadrantsSyntaxError(f"qd.ad.FwdMode: param has {size} elements: give a seed of that length")
            seed = [1.0]
        if len(seed) != size:
            raise QuadrantsSyntaxError(f"qd.ad.FwdMode: the seed has {len(seed)} values, param has {size} elements")
        self.loss, self.param, self.seed = loss, param, list(seed)
        self.clear_gradients = clear_gradients

    def __enter__(self):
        global _active_tape
        if _active_tape is not None:
            raise QuadrantsRuntimeError("qd.ad.FwdMode cannot be used inside a qd.ad.Tape")
        if self.clear_gradients:
            clear_all_duals()
        self.param.dual.from_numpy(np.asarray(self.seed, dtype=self.param.dual._arr.dtype)
                                   .reshape(self.param.dual._arr.shape))
        _active_tape = self
        kernel_module.wrap_calls(_forward_mode_call)
        return self

    def __exit__(self, exc_type, exc, tb):
        global _active_tape
        _active_tape = None
        kernel_module.wrap_calls(None)
        self.param.dual.fill(0)


def _forward_mode_call(kernel, call):
    if kernel.autodiff_mode is not None:
        return call

    def forward(self, *args, **kwargs):
        return self.forward_mode(*args, **kwargs)

    return forward
