"""Global data: ``qd.field`` and ``qd.ndarray`` objects (python scope).

Both own a C-contiguous numpy buffer of shape ``shape + element_shape`` (element shape is
``()`` for scalars, ``(n,)`` for vectors, ``(n, m)`` for matrices) — except a field placed in an
SNode tree, whose buffer is a strided view of its tree's bytes (snode.py). Kernels never see these
Python objects: the compiler turns a field reference into a hidden kernel argument and the
launcher passes the buffer itself, so compiled code always reads and writes the live data.
A field's buffer never moves after creation, which is what lets a compiled kernel keep its
hidden arguments without re-checking them on every call.

A field belongs to the runtime (the ``qd.init``) under which it is first used — read, written or
bound to a compiled kernel (:meth:`Field.claim`); a field declared before that ``qd.init``
(at module level, say) and not used yet moves to the new arch. After a later ``qd.init`` or
``qd.reset`` its data is gone, as in Quadrants: using it again is a ``QuadrantsRuntimeError``
naming the field. Kernels are recompiled after each ``qd.init``, so the check runs when they bind
their fields, never on the launch path.
"""

from __future__ import annotations

import itertools
import weakref

import numpy as np

from . import config, dtypes
from .errors import QuadrantsIndexError, QuadrantsRuntimeError, QuadrantsSyntaxError, QuadrantsTypeError

_field_ids = itertools.count()
_with_gradients: weakref.WeakSet = weakref.WeakSet()   # fields/ndarrays created with needs_grad=True
_with_duals: weakref.WeakSet = weakref.WeakSet()       # fields created with needs_dual=True
# write generations: every change of a field's/ndarray's data (a kernel launch that writes it,
# from_numpy, fill, __setitem__) gives it a new number, unique across all of them, so a cache
# keyed on generations (adstack sizes) sees any change. Writes through to_torch/to_cupy views or
# numpy views of the buffer are not seen.
next_generation = itertools.count(1).__next__
_owners: weakref.WeakValueDictionary = weakref.WeakValueDictionary()   # id(buffer) -> its field/ndarray
# checks run before a host read that synchronises with the device anyway (to_numpy, element reads,
# qd.sync): adstack.py reports overflow flags read asynchronously after gradient launches
host_sync_checks: list = []


def buffer_owner(buffer):
    """The field/ndarray whose host buffer ``buffer`` is (the CPU launcher passes buffers), or None."""
    owner = _owners.get(id(buffer))
    return owner if owner is not None and owner._arr is buffer else None


def bump_buffers(positions, buffers) -> None:
    """A kernel launch writes the host buffers at ``positions`` of ``buffers``: new generations
    for the ndarrays that own them (the CPU launcher passes buffers, not objects)."""
    for k in positions:
        owner = buffer_owner(buffers[k])
        if owner is not None:
            owner._gen = next_generation()


def written_by(tasks, runtime_count: int, fields, gradient: bool = False) -> tuple[tuple, tuple]:
    """(the fields, the runtime-parameter positions) a kernel instance's tasks may write: their
    launches give those new generations. Resources are kernel argument indices (runtime
    parameters, then the hidden ``fields``). A ``gradient`` kernel (``kernel.grad``) writes only
    gradients (its recomputed forward body stores nothing; its ndarrays are read-only)."""
    resources = {a.resource for t in tasks for a in t.accesses if a.kind == "write" and isinstance(a.resource, int)}
    written = tuple(fields[r - runtime_count] for r in sorted(resources) if 0 <= r - runtime_count < len(fields))
    if gradient:
        grads = {id(f.grad) for f in fields if getattr(f, "grad", None) is not None}
        return tuple(f for f in written if id(f) in grads), ()
    return written, tuple(r for r in sorted(resources) if r < runtime_count)


def run_host_sync_checks() -> None:
    for check in list(host_sync_checks):   # each one removes itself once it has nothing left to check
        check()


def _of_this_runtime(data) -> bool:
    """A field used under the ``qd.init`` in force (one of an earlier ``qd.init`` was released, and
    one not used yet has nothing to clear: touching it would tie it to this one), whose
    ``.grad``/``.dual`` belong to no other; ndarrays always."""
    if not isinstance(data, Field):
        return True
    current = config.current
    if data._runtime is not current:
        return False
    return all(getattr(part, "_runtime", None) in (None, current) for part in (data.grad, data.dual))


def gradient_holders() -> list:
    """The fields (of the runtime in force) and ndarrays that have a ``.grad``
    (``qd.ad.clear_all_gradients``)."""
    return [d for d in list(_with_gradients) if _of_this_runtime(d)]


def dual_holders() -> list:
    """The fields of the runtime in force that have a ``.dual`` (``qd.ad.clear_all_duals``)."""
    return [d for d in list(_with_duals) if _of_this_runtime(d)]


def _gradient_of(data, needs_grad: bool, name, what="grad"):
    """``data``'s ``.grad`` (or ``.dual``): the same kind, shape and element type,
    zero-initialised (or None)."""
    if not needs_grad:
        return None
    if not dtypes.is_real(data.dtype):
        raise QuadrantsTypeError(f"needs_{what}=True requires a floating-point dtype, got {data.dtype}")
    (_with_gradients if what == "grad" else _with_duals).add(data)
    return type(data)(data.elem_type or data.dtype, data.shape, name=f"{name}.{what}" if name else None)


def element_shape(elem_type) -> tuple[int, ...]:
    """``()`` for a scalar dtype, ``(n,)`` for a vector type, ``(n, m)`` for a matrix type."""
    if elem_type is None or not hasattr(elem_type, "ndim"):
        return ()
    return (elem_type.n,) if elem_type.ndim == 1 else (elem_type.n, elem_type.m)


def _normalize_shape(shape) -> tuple[int, ...]:
    if shape is None:
        return ()
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError as e:
        raise QuadrantsTypeError(f"shape must be an int or a tuple of ints, got {shape!r}") from e
    if any(s < 0 for s in shape):
        raise QuadrantsTypeError(f"shape must not be negative, got {shape}")
    return shape


def _split_dtype(dtype, elem_type):
    """(scalar Numba dtype, element type or None) from a dtype that may be a vector/matrix type."""
    if elem_type is None and hasattr(dtype, "ndim") and hasattr(dtype, "n"):
        elem_type, dtype = dtype, dtype.dtype
    return dtypes.to_numba(dtype), elem_type


class ArrayData:
    """What fields and ndarrays share: a typed buffer with python-scope access."""

    offset = None    # a field's index offset (``qd.field(..., offset=...)``), a tuple; None: zeros

    def __init__(self, dtype, shape, elem_type=None, name=None):
        self.dtype, self.elem_type = _split_dtype(dtype, elem_type)
        self.shape = None if shape is None else _normalize_shape(shape)   # None: a field to be placed
        self.element_shape = element_shape(self.elem_type)
        self.name = name
        self._gen = next_generation()
        # on a GPU arch the device buffer is the data (``_arr`` only gives shape and dtype)
        self._dev = None
        if self.shape is None:
            return
        self._arr = np.zeros(self.shape + self.element_shape, dtype=dtypes.to_numpy(self.dtype))
        _owners[id(self._arr)] = self
        from .targets.base import target_for

        target_for(config.current.arch).place(self)

    # where python-scope access goes: the device buffer, or (None) the host buffer, which a field
    # of an SNode tree keeps in step with the tree's device bytes (snode.py) by _pull/_push
    def _device(self):
        return self._dev

    def _pull(self) -> None:
        """Before host reads."""

    def _host_view(self) -> np.ndarray:
        """The host buffer as python scope indexes it (``_host_index``)."""
        return self._arr

    def _host_index(self, idx: tuple) -> tuple:
        return idx

    def _push(self) -> None:
        """After host writes."""

    # -- python-scope access -------------------------------------------------------
    def _index(self, key):
        if key is None:
            key = ()
        if not isinstance(key, tuple):
            key = (key,)
        if hasattr(key, "__len__") and len(key) == 1 and isinstance(key[0], tuple):
            key = key[0]
        if len(key) != len(self.shape):
            raise QuadrantsIndexError(
                f"{self._describe()} has {len(self.shape)} dimension(s) but was indexed with {len(key)} index(es)"
            )
        if self.offset is not None:
            key = tuple(int(i) - o for i, o in zip(key, self.offset))
            low = [0] * len(key)
        else:
            low = [-n for n in self.shape]
        for k, (i, n, lo) in enumerate(zip(key, self.shape, low)):
            if not lo <= int(i) < n:
                raise QuadrantsIndexError(f"index {int(i) + (self.offset[k] if self.offset else 0)} out of bounds "
                                          f"for dimension {k} of {self._describe()}")
        return tuple(int(i) for i in key)

    def _dev_element(self, idx):
        """A device view of one element, with a leading dimension of 1 (0-d: the whole array)."""
        if not idx:
            return self._dev
        last = idx[-1] % self.shape[len(idx) - 1]
        return self._dev[idx[:-1] + (slice(last, last + 1),)]

    def __getitem__(self, key):
        self.claim()
        idx = self._index(key)
        if self._device() is not None:
            if host_sync_checks:
                run_host_sync_checks()
            value = self._dev_element(idx).copy_to_host().reshape(self.element_shape)
            return value if self.element_shape else value.item()
        self._pull()
        value = self._host_view()[self._host_index(idx)]
        return value.copy() if self.element_shape else value.item()

    def __setitem__(self, key, value):
        self.claim()
        idx = self._index(key)
        self._gen = next_generation()
        if self._device() is not None:
            view = self._dev_element(idx)
            view.copy_to_device(np.broadcast_to(np.asarray(value, dtype=self._arr.dtype), view.shape).copy())
            return
        self._pull()
        self._host_view()[self._host_index(idx)] = value
        self._push()

    def to_numpy(self, dtype=None) -> np.ndarray:
        self.claim()
        if host_sync_checks and self._dev is not None:
            run_host_sync_checks()
        # numba-cuda stores 0-d arrays with shape (1,): give the field's own shape back
        if self._device() is None:
            self._pull()
        full = self.shape + self.element_shape
        out = self._dev.copy_to_host().reshape(full) if self._device() is not None else \
            self._host_view().reshape(full).copy()
        return out if dtype is None else out.astype(dtype)

    def from_numpy(self, array) -> None:
        self.claim()
        array = np.asarray(array)
        if np.iscomplexobj(array) and not np.iscomplexobj(self._arr):
            raise QuadrantsTypeError(f"from_numpy: {self._describe()} holds real numbers, got a complex array "
                                     f"({array.dtype}); pass array.real, array.imag or np.abs(array)")
        full = self.shape + self.element_shape
        if array.shape != full:
            raise QuadrantsTypeError(
                f"from_numpy: {self._describe()} has shape {full}, got an array of shape {array.shape}"
            )
        self._gen = next_generation()
        if self._device() is not None:
            self._dev.copy_to_device(np.ascontiguousarray(array, dtype=self._arr.dtype).reshape(self._dev.shape))
            return
        self._pull()
        view = self._host_view()
        np.copyto(view, array.reshape(view.shape), casting="unsafe")
        self._push()

    def copy_from(self, other: ArrayData) -> None:
        self.from_numpy(other.to_numpy())

    def fill(self, value) -> None:
        self.claim()
        self._gen = next_generation()
        if self._device() is not None:
            self._dev.copy_to_device(np.full(self._dev.shape, value, dtype=self._arr.dtype))
            return
        self._pull()
        self._host_view()[...] = value
        self._push()

    def to_torch(self, device=None):
        """A torch tensor sharing this field's/ndarray's memory (no copy): a CUDA tensor on the
        CUDA arch, a CPU tensor on the CPU. Writes through it are writes to the data."""
        import torch

        self.claim()
        if self._dev is not None:
            return torch.as_tensor(self._dev, device=device or "cuda")
        return torch.from_numpy(self._arr) if device in (None, "cpu") else torch.from_numpy(self._arr).to(device)

    def to_cupy(self):
        """A cupy array sharing this field's/ndarray's device memory (CUDA arch only; no copy)."""
        import cupy

        self.claim()
        if self._dev is None:
            raise QuadrantsTypeError(f"to_cupy: {self._describe()} is in host memory (use qd.init(arch=qd.cuda))")
        return cupy.asarray(self._dev)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule viewing this array's memory without a copy (``torch.from_dlpack(x)``):
        host memory on the CPU, device memory on CUDA and AMDGPU (dlpack.py; docs/multi_gpu.md)."""
        from . import dlpack

        self.claim()
        return dlpack.export(self, stream, max_version, dl_device, copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        from . import dlpack

        self.claim()
        return dlpack.device(self)

    def to_dlpack(self, versioned: bool = False):
        """Quadrants' export: the capsule of :meth:`__dlpack__` (``versioned``: DLPack 1.0's
        ``"dltensor_versioned"``, writable for numpy; else ``"dltensor"``)."""
        return self.__dlpack__(max_version=(1, 0) if versioned else None)

    def claim(self) -> None:
        """Before any use: fields check that they belong to the runtime in force (:class:`Field`);
        a qd.ndarray is an argument, valid under any runtime."""

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def _describe(self) -> str:
        kind = type(self).__name__.lower()
        return f"{kind} '{self.name}'" if self.name else f"{kind} of shape {self.shape}"

    def __repr__(self) -> str:
        elem = f", element={self.elem_type}" if self.elem_type is not None else ""
        return f"<qd.{type(self).__name__} {self.dtype}{elem} shape={self.shape}>"


class Field(ArrayData):
    """A global field; compiled kernels access it as a hidden argument.

    ``shape=None`` declares a field to be placed in an SNode tree (snode.py): its shape is set
    by ``place``, its buffer (``_arr``, a strided view of the tree's bytes) when the tree is
    materialised, which the first use of ``_arr`` does."""

    _buf = None          # the buffer behind ``_arr``
    _snode = None        # the place node (snode.py) once placed in a tree
    _placed_at = None    # ``file:line`` of the place call
    _tree = None         # the SNode tree whose bytes ``_arr`` views (None: a buffer of its own)
    _levels = None       # a blocked layout's (axis, size) per buffer dimension (typing/field.py)
    _pool = None         # below a pointer SNode: snode.PoolLayout (the buffer is the node's pool of blocks)
    is_scratch = False   # made by the compiler for one kernel instance, which writes it before reading it

    def __init__(self, dtype, shape=(), elem_type=None, needs_grad=False, name=None, needs_dual=False,
                 offset=None):
        super().__init__(dtype, shape, elem_type, name)
        self.uid = next(_field_ids)
        self._runtime = None    # the config of the qd.init it was first used under (each init makes a new one)
        if shape is not None:
            self.offset = _normalize_offset(offset, len(self.shape))
        self.grad = _gradient_of(self, needs_grad, name)
        self.dual = _gradient_of(self, needs_dual, name, "dual")    # forward mode (qd.ad.FwdMode)
        for partner in (self.grad, self.dual):
            if partner is not None:
                partner.offset = self.offset

    @property
    def _arr(self) -> np.ndarray:
        if self._buf is None:
            self._materialize()
        return self._buf

    @_arr.setter
    def _arr(self, value) -> None:
        self._buf = value
        if value is not None:
            _owners[id(value)] = self

    def _materialize(self) -> None:
        if self._snode is None:
            raise QuadrantsRuntimeError(
                f"{self._describe()} is not placed: give it a shape (qd.field(dtype, shape=...)) or place it in "
                "an SNode tree (qd.root.dense(qd.i, n).place(x)) before using it")
        self._snode._tree.materialize()

    def _place(self, node, shape: tuple, offset, site: str) -> None:
        """Placed at ``node`` (snode.py), whose cells give it ``shape``."""
        if self.shape is not None:
            raise QuadrantsRuntimeError(f"place at {site}: {self._describe()} has a shape of its own "
                                        f"{self.shape}; only a field declared without a shape can be placed")
        self.shape, self._snode, self._placed_at = shape, node, site
        self.offset = _normalize_offset(offset, len(shape))
        for partner in (self.grad, self.dual):
            if partner is not None and partner._snode is None:
                partner.offset = self.offset

    def _device(self):
        return None if self._tree is not None else self._dev

    @staticmethod
    def scratch(dtype, shape: tuple, name: str) -> Field:
        """A field of the compiler's own for one kernel instance (a reduction's cells): the
        offline cache makes a new one for a hit instead of finding it by name."""
        field = Field(dtype, shape, name=name)
        field.is_scratch = True
        return field

    @staticmethod
    def _hidden_i32(name: str, shape=None) -> Field:
        """A field for a sparse SNode's flags (snode.py), to be placed; with a shape, one of its own
        (a node's list of cells)."""
        return Field(dtypes.i32, shape, name=name)

    # below a pointer SNode python scope goes through the node's slots (snode.pool_*)
    def _pooled(self) -> bool:
        """Whether the field is below a pointer node (its tree materialised now, if placed)."""
        if self._snode is not None and self._buf is None:
            self._materialize()
        return self._pool is not None

    def __getitem__(self, key):
        if not self._pooled():
            return super().__getitem__(key)
        from .snode import pool_index

        self.claim()
        idx = self._index(key)
        self._pull()
        value = self._arr[pool_index(self, idx)]
        return value.copy() if self.element_shape else value.item()

    def to_numpy(self, dtype=None) -> np.ndarray:
        if not self._pooled():
            return super().to_numpy(dtype)
        from .snode import pool_gather

        self.claim()
        self._pull()
        out = pool_gather(self)
        return out if dtype is None else out.astype(dtype)

    def __setitem__(self, key, value):
        if self._pooled():
            from .snode import activate_host, pool_index

            self.claim()
            idx = self._index(key)
            self._gen = next_generation()
            activate_host(self, idx)     # first: the store needs the cell's block
            self._pull()
            self._arr[pool_index(self, idx)] = value
            self._push()
            return
        super().__setitem__(key, value)
        if self._tree is not None:
            from .snode import activate_host, sparse_ancestors

            if sparse_ancestors(self._snode):
                activate_host(self, self._index(key))

    # below sparse SNodes, as Quadrants' kernels for these do: from_numpy writes (and activates)
    # every element, fill writes the active elements only
    def from_numpy(self, array) -> None:
        if self._pooled():
            self.claim()
            array = np.asarray(array)
            full = self.shape + self.element_shape
            if array.shape != full:
                raise QuadrantsTypeError(
                    f"from_numpy: {self._describe()} has shape {full}, got an array of shape {array.shape}")
            self._activate_all()
            self._write_active(array)
            return
        super().from_numpy(array)
        self._activate_all()

    def _write_active(self, data) -> None:
        """Below a pointer node: write ``data`` into the blocks of the listed cells."""
        from .snode import pool_scatter

        self._gen = next_generation()
        self._pull()
        pool_scatter(self, data)
        self._push()

    def fill(self, value) -> None:
        mask = self._active_mask()
        if mask is None:
            super().fill(value)
            return
        data = self.to_numpy()
        data[mask] = value
        if self._pooled():
            self._write_active(data)
            return
        super().from_numpy(data)

    def _from_numpy_plain(self, array) -> None:
        """``from_numpy`` without activating (snode.py: a pointer node's slots)."""
        ArrayData.from_numpy(self, array)

    def _fill_plain(self, value) -> None:
        """``fill`` without activating (snode.py: deactivation, flags); below a pointer node, the
        block of cells without one stays zero."""
        ArrayData.fill(self, value)
        if value and self._pooled():
            self._pull()
            self._arr[self._pool.capacity] = 0
            self._push()

    def _activate_all(self) -> None:
        if self._tree is not None:
            from .snode import activate_all_host

            activate_all_host(self)

    def _active_mask(self):
        """Which elements are in active cells (a bool array of the shape), or None when the field
        is below no sparse node."""
        if self._tree is None:
            return None
        from .snode import active_mask_host

        return active_mask_host(self)

    def _host_view(self) -> np.ndarray:
        """A blocked layout's buffer with each axis's levels side by side (outer first), so that
        reshaping it to the field's shape gives the elements in index order."""
        if self._levels is None:
            return self._arr
        order = [k for axis in range(len(self.shape)) for k, (a, _) in enumerate(self._levels) if a == axis]
        return self._arr.transpose(order + list(range(len(self._levels), self._arr.ndim)))

    def _host_index(self, idx: tuple) -> tuple:
        if self._levels is None:
            return idx
        out = []
        for axis, i in enumerate(idx):
            i %= self.shape[axis]
            digits = []
            for a, size in reversed(self._levels):
                if a == axis:
                    i, digit = divmod(i, size)
                    digits.append(digit)
            out += reversed(digits)
        return tuple(out)

    def _pull(self) -> None:
        if self._tree is not None:
            self._tree.pull()

    def _push(self) -> None:
        if self._tree is not None:
            self._tree.push()

    def __deepcopy__(self, memo):
        # IR copies hold fields in ir.Global values; the data must never be cloned.
        return self

    def claim(self) -> None:
        """Check that this field belongs to the runtime in force: the first use adopts it (moving
        an unused field declared under an earlier ``qd.init`` to the current arch); a use after a
        later ``qd.init``/``qd.reset`` is a ``QuadrantsRuntimeError`` naming the field."""
        runtime = config.current
        if self._runtime is runtime:
            return
        if self._runtime is not None:
            raise QuadrantsRuntimeError(
                f"{f'field {self.name!r}' if self.name else 'a field'} ({self.dtype}, shape {self.shape}) belongs to "
                "an earlier qd.init(): a later "
                "qd.init() or qd.reset() released it; create the field again after qd.init()")
        self._arr  # noqa: B018  (a placed field's tree is materialised by its first use)
        self._runtime = runtime
        if self._tree is not None:
            self._tree.place_on(runtime.arch)
            return
        if self._dev is not None and runtime.arch != "cuda":
            self._dev = None    # declared on the GPU, never used: its (zero) data is the host buffer's
        from .targets.base import target_for

        target_for(runtime.arch).place(self)

    @property
    def snode(self):
        """The place SNode (``x.snode.shape``, ``x.snode.parent()``); a field with a shape of its
        own sits under one dense node of its own."""
        if self._snode is None:
            if self.shape is None:
                self._materialize()
            from .snode import standalone_tree

            self._snode = standalone_tree(self)
        return self._snode

    def parent(self, n: int = 1):
        """``x.parent()`` is ``x.snode.parent()``."""
        return self.snode.parent(n)


class Ndarray(ArrayData):
    """``qd.ndarray``: an array passed to kernels as an argument."""

    _cuda_view = None  # the CUDA launcher's view of the device buffer, made on first use

    def __init__(self, dtype, shape, elem_type=None, needs_grad=False, name=None):
        super().__init__(dtype, shape, elem_type, name)
        self.grad = _gradient_of(self, needs_grad, name)

    def __deepcopy__(self, memo):
        return self


def _normalize_offset(offset, ndim: int):
    if offset is None:
        return None
    offset = (int(offset),) if isinstance(offset, (int, np.integer)) else tuple(int(o) for o in offset)
    if len(offset) != ndim:
        raise QuadrantsSyntaxError(f"The dimensionality of shape and offset must be the same ({ndim} != {len(offset)})")
    return offset if any(offset) else None


def field(dtype, shape=None, needs_grad=False, name=None, offset=None, order=None, needs_dual=False,
          elem_type=None) -> Field:
    """``qd.field(dtype, shape=...)``: a global field (``shape=()`` is 0-d, accessed as ``x[None]``);
    without a shape, a field to place in an SNode tree (snode.py). ``order="ji"`` stores axis
    ``j`` outermost; ``offset`` shifts the indices (``x[offset]`` is the first element)."""
    if shape is None:
        if offset is not None:
            raise QuadrantsSyntaxError("shape cannot be None when offset is set")
        if order is not None:
            raise QuadrantsSyntaxError("shape cannot be None when order is set")
        return Field(dtype, None, elem_type, needs_grad=needs_grad, name=name, needs_dual=needs_dual)
    if order is None:
        return Field(dtype, shape, elem_type, needs_grad=needs_grad, name=name, needs_dual=needs_dual, offset=offset)
    from .snode import place_in_order

    shape = _normalize_shape(shape)
    x = Field(dtype, None, elem_type, needs_grad=needs_grad, name=name, needs_dual=needs_dual)
    place_in_order([x, x.grad, x.dual], shape, order, offset)
    return x


def ndarray(dtype, shape, needs_grad=False) -> Ndarray:
    """``qd.ndarray(dtype, shape)``; ``dtype`` may be a vector or matrix type; ``needs_grad``
    gives it a ``.grad`` ndarray of the same shape and type."""
    return Ndarray(dtype, shape, needs_grad=needs_grad)
