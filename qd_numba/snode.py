"""The SNode tree (python scope): ``qd.root``, ``qd.FieldsBuilder``, ``.dense``, ``.place``, axes.

A tree describes where placed fields live, as in Quadrants: the root has one cell; a
``dense(axes, sizes)`` node is an array of cells (row-major over its axes); a cell holds its
children one after the other, each aligned to its own scalar size — a placed field is one
element (a scalar, or a vector/matrix's components, row-major), a child node is its whole array.
So fields placed together (``place(a, b)``) are interleaved (AoS), fields under separate nodes
are separate arrays (SoA), and ``dense(qd.j, n).dense(qd.i, m)`` stores ``j`` outermost.

Storage: each tree is one byte buffer. A placed field is a *strided view* of it: a byte offset
(the sum of its cells' offsets along its path) and, per index axis, the byte stride of that
axis's node (cell size times the sizes of the node's later axes). Its index axes are the axes
on its path, in axis order (``qd.j`` alone makes a 1-d field). The view is a numpy array
(``Field._arr``) — compiled code reads its shape and strides like any Numba array (CPU), or as
compile-time constants next to the data pointer in the field table (CUDA, lowering/device.py) —
so compiled code holds no address, and a field of its own shape (``qd.field(dtype, shape=...)``)
is just the contiguous case. An axis on several nodes of a path (a blocked layout,
``dense(qd.ij, 4).dense(qd.ij, 8)``: shape 32 x 32) gives the view one dimension per level; the
field's ``_levels`` tell compiled code (typing/field.py) and python scope how an index splits
into digits. A field's ``offset=`` shifts its indices.

Materialisation: a tree's layout is fixed, and its buffer allocated, when one of its fields is
first used — read, written or compiled into a kernel; using any field of the default root
(``qd.root``) also closes that root: later ``qd.root.dense(...)`` calls start a new tree, as
Quadrants starts a new ``FieldsBuilder`` at each kernel launch. Placing under a node of a
materialised tree and placing a field twice are ``QuadrantsRuntimeError``s naming the field and
the line. Only dense nodes exist (``pointer``/``bitmasked``/``dynamic`` are not supported).
"""

from __future__ import annotations

import numbers
import os
import sys

import numpy as np

from . import dtypes
from .errors import QuadrantsRuntimeError, QuadrantsSyntaxError, QuadrantsTypeError


class Axis:
    """An index axis (``qd.i`` is ``[Axis(0)]``)."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = int(index)

    def __eq__(self, other):
        return isinstance(other, Axis) and other.index == self.index

    def __hash__(self):
        return hash(self.index)

    def __repr__(self):
        return f"Axis({self.index})"


def axes(*indices: int) -> list[Axis]:
    """``qd.axes(0, 1)`` is ``qd.ij``: the axes a node indexes."""
    return [Axis(i) for i in indices]


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _user_site() -> str:
    """``file:line`` of the innermost caller outside qd_numba (where a place/dense was written)."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"


def _field_label(f) -> str:
    return f"field {f.name!r}" if f.name else f"a field ({f.dtype}{', ' + str(f.elem_type) if f.elem_type else ''})"


class SNode:
    """A node of a tree: ``kind`` is ``"root"``, ``"dense"`` or ``"place"`` (a placed field)."""

    def __init__(self, tree: Tree, kind: str, parent: SNode | None, axes_=(), sizes=(), field=None):
        self._tree, self._kind, self._parent = tree, kind, parent
        self._axes, self._sizes = tuple(axes_), tuple(sizes)
        self._field = field
        self._children: list[SNode] = []

    # -- building -------------------------------------------------------------------
    def dense(self, axes_, dimensions) -> SNode:
        """A child array of cells over ``axes_`` (``qd.ij``), ``dimensions`` per axis (an int: the
        same for each)."""
        axes_ = [axes_] if isinstance(axes_, Axis) else list(axes_)
        if isinstance(dimensions, numbers.Integral):
            dimensions = [int(dimensions)] * len(axes_)
        dimensions = [int(d) for d in dimensions]
        if not axes_ or len(dimensions) != len(axes_) or not all(isinstance(a, Axis) for a in axes_):
            raise QuadrantsTypeError(f"dense(axes, dimensions): give one dimension per axis, got axes {axes_} and "
                                     f"dimensions {dimensions} ({_user_site()})")
        if any(d <= 0 for d in dimensions):
            raise QuadrantsTypeError(f"dense: dimensions must be positive, got {dimensions} ({_user_site()})")
        self._check_open("dense")
        if len({a.index for a in axes_}) != len(axes_):
            raise QuadrantsTypeError(f"dense at {_user_site()}: an axis appears twice in {axes_}")
        node = SNode(self._tree, "dense", self, [a.index for a in axes_], dimensions)
        self._children.append(node)
        return node

    def place(self, *fields, offset=None) -> SNode:
        """Place fields (or lists of fields) in this node's cells; ``offset`` shifts their indices."""
        site = _user_site()
        for f in fields:
            if isinstance(f, (list, tuple)):
                self.place(*f, offset=offset)
                continue
            if not hasattr(f, "_place"):    # a qd.field (field.py imports this module, not the reverse)
                raise QuadrantsTypeError(f"place at {site}: {f!r} cannot be placed (a qd.field is expected)")
            if f._snode is not None:
                raise QuadrantsRuntimeError(f"place at {site}: {_field_label(f)} is placed already "
                                            f"({f._placed_at}); a field is placed once")
            self._check_open("place", f, site)
            shape = self.shape
            node = SNode(self._tree, "place", self, field=f)
            f._place(node, shape, offset, site)
            self._children.append(node)
        return self

    def lazy_grad(self) -> None:
        """Place the ``.grad`` of every field placed under this node that was declared with
        ``needs_grad=True`` and whose ``.grad`` is not placed, next to its primal."""
        self._place_gradients("grad")

    def lazy_dual(self) -> None:
        """Place the ``.dual`` of every field under this node declared with ``needs_dual=True``."""
        self._place_gradients("dual")

    def _place_gradients(self, what: str) -> None:
        for node in list(self._walk()):
            if node._kind == "place":
                partner = getattr(node._field, what)
                if partner is not None and partner._snode is None:
                    node._parent.place(partner, offset=node._field.offset)

    def deactivate_all(self) -> None:
        """Deactivate every cell below: dense cells are always active, so nothing changes."""

    # -- queries ----------------------------------------------------------------------
    def parent(self, n: int = 1):
        """The ``n``-th ancestor (``qd.root`` for the default root), or None above the root."""
        node = self
        for _ in range(n):
            node = node._parent
            if node is None:
                return None
        return _root if node is _root._builder.root else node

    @property
    def shape(self) -> tuple[int, ...]:
        """Cells per index axis from the root (axes in axis order; a place node: its field's shape):
        the product of the sizes of the nodes on the path along that axis."""
        sizes: dict[int, int] = {}
        for a, n in self._levels():
            sizes[a] = sizes.get(a, 1) * n
        return tuple(sizes[a] for a in sorted(sizes))

    def _levels(self) -> list[tuple[int, int]]:
        """(axis, size) of every node axis on the path from the root, outermost first."""
        path, node = [], self
        while node is not None:
            path.append(node)
            node = node._parent
        return [(a, n) for node in reversed(path) for a, n in zip(node._axes, node._sizes)]

    def _walk(self):
        yield self
        for c in self._children:
            yield from c._walk()

    def _check_open(self, what: str, field=None, site: str | None = None) -> None:
        if self._tree.materialized:
            who = f" of {_field_label(field)}" if field is not None else ""
            raise QuadrantsRuntimeError(
                f"{what}{who} at {site or _user_site()}: this SNode's tree was materialised when its fields were "
                "first used (a kernel launch or a python-scope access); place new fields under qd.root (a new "
                "tree) or give them a shape")

    def __repr__(self):
        return f"<qd.SNode {self._kind} shape={list(self.shape)}>"


class Tree:
    """One SNode tree and, once materialised, its byte buffer."""

    def __init__(self):
        self.root = SNode(self, "root", None)
        self.materialized = False
        self.base = None          # the host byte buffer
        self._dev = None          # the device byte buffer (CUDA), made on first use there
        self._fields: list = []

    def materialize(self) -> None:
        """Fix the layout, allocate the buffer and give every placed field its view."""
        if self.materialized:
            return
        self.materialized = True
        if _root._builder.tree is self:
            _root._builder = FieldsBuilder()
        size, _ = _cell_size(self.root)
        self.base = np.zeros(max(size, 1), np.uint8)
        for node, (offset, strides) in _placements(self.root, 0, {}).items():
            f = node._field
            itemsize = np.dtype(_numpy_dtype(f)).itemsize
            elem_strides = tuple(int(np.prod(f.element_shape[k + 1:], dtype=np.int64)) * itemsize
                                 for k in range(len(f.element_shape)))
            levels = node._levels()
            shape = f.shape
            if len(levels) != len(f.shape):    # an axis split over several nodes: one dimension per level
                axis_rank = {a: k for k, a in enumerate(sorted({a for a, _ in levels}))}
                levels = tuple((axis_rank[a], n) for a, n in levels)
                f._levels, shape = levels, tuple(n for _, n in levels)
            f._arr = np.ndarray(shape + f.element_shape, _numpy_dtype(f), buffer=self.base, offset=offset,
                                strides=strides + elem_strides)
            f._tree = self
            self._fields.append(f)

    def place_on(self, arch: str) -> None:
        """Give the tree (and each field's view) device storage on ``arch`` (CUDA), or host only."""
        if arch != "cuda":
            self._dev = None
            for f in self._fields:
                f._dev = None
            return
        if self._dev is not None:
            return
        from .targets.base import target_for

        target_for(arch).place(self)
        from numba.cuda.cudadrv.devicearray import DeviceNDArray

        start = self.base.ctypes.data
        for f in self._fields:
            f._dev = DeviceNDArray(f._arr.shape, f._arr.strides, f._arr.dtype,
                                   gpu_data=self._dev.gpu_data.view(f._arr.ctypes.data - start))

    # the target's place() treats the tree like an array: its host data is the byte buffer
    @property
    def _arr(self):
        return self.base

    def pull(self) -> None:
        """Before host-side reads: bring the device bytes back (CUDA)."""
        if self._dev is not None:
            self._dev.copy_to_host(self.base)

    def push(self) -> None:
        """After host-side writes: send the bytes to the device (CUDA)."""
        if self._dev is not None:
            self._dev.copy_to_device(self.base)


def _numpy_dtype(f):
    return dtypes.to_numpy(f.dtype)


def _member(child: SNode) -> tuple[int, int]:
    """(size, alignment) in bytes of one member of a cell: a placed field's element, or a child
    node's whole array."""
    if child._kind == "place":
        f = child._field
        item = np.dtype(_numpy_dtype(f)).itemsize
        return item * int(np.prod(f.element_shape, dtype=np.int64)), item
    cell, align = _cell_size(child)
    return cell * int(np.prod(child._sizes, dtype=np.int64)), align


def _cell(node: SNode) -> tuple[list[int], int, int]:
    """(byte offset of each child in a cell of ``node``, cell size, cell alignment): children in
    order, each aligned to its own alignment, the cell padded to the largest."""
    offsets, offset, cell_align = [], 0, 1
    for child in node._children:
        size, align = _member(child)
        offset = -(-offset // align) * align
        offsets.append(offset)
        offset += size
        cell_align = max(cell_align, align)
    return offsets, -(-offset // cell_align) * cell_align, cell_align


def _member_offsets(node: SNode) -> list[int]:
    return _cell(node)[0]


def _cell_size(node: SNode) -> tuple[int, int]:
    """(size, alignment) in bytes of one cell of ``node``."""
    _, size, align = _cell(node)
    return size, align


def _placements(node: SNode, base_offset: int, out: dict) -> dict:
    """Each place node under ``node`` -> (byte offset in the buffer, byte strides of its axes)."""
    for child, offset in zip(node._children, _member_offsets(node)):
        if child._kind == "place":
            out[child] = (base_offset + offset, _axis_strides(child))
        else:
            _placements(child, base_offset + offset, out)
    return out


def _axis_strides(place: SNode) -> tuple[int, ...]:
    """Byte strides of a place node's index axes: per node on its path, the node's cell size times
    the sizes of the node's later axes. In axis order; for a blocked layout (an axis on several
    nodes) one per level instead, outermost first."""
    strides: dict[int, int] = {}
    levels: list[int] = []
    path, node = [], place._parent
    while node is not None and node._kind == "dense":
        path.append(node)
        node = node._parent
    for node in reversed(path):
        cell, _ = _cell_size(node)
        for k, a in enumerate(node._axes):
            stride = cell * int(np.prod(node._sizes[k + 1:], dtype=np.int64))
            strides[a] = stride
            levels.append(stride)
    return tuple(strides[a] for a in sorted(strides)) if len(levels) == len(strides) else tuple(levels)


class FieldsBuilder:
    """``qd.FieldsBuilder()``: a tree built by hand; ``finalize()`` materialises it."""

    def __init__(self):
        self.tree = Tree()
        self.root = self.tree.root

    @property
    def finalized(self) -> bool:
        return self.tree.materialized

    def dense(self, axes_, dimensions) -> SNode:
        return self.root.dense(axes_, dimensions)

    def place(self, *fields, offset=None) -> SNode:
        return self.root.place(*fields, offset=offset)

    def lazy_grad(self) -> None:
        self.root.lazy_grad()

    def lazy_dual(self) -> None:
        self.root.lazy_dual()

    def deactivate_all(self) -> None:
        self.root.deactivate_all()

    def finalize(self, raise_warning: bool = True):
        if self.tree.materialized:
            raise QuadrantsRuntimeError("FieldsBuilder finalized")
        self.tree.materialize()
        return self.tree


class _Root:
    """``qd.root``: the default tree being built; materialising it starts a new one."""

    def __init__(self):
        self._builder = FieldsBuilder()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._builder.root, name)

    @property
    def shape(self) -> tuple[int, ...]:
        return ()

    def parent(self, n: int = 1):
        return None

    def deactivate_all(self) -> None:
        """Dense cells are always active: nothing to do."""

    def __repr__(self):
        return "qd.root"


_root = _Root()
root = _root


def place_in_order(fields, shape: tuple, order: str, offset) -> None:
    """``qd.field(..., order="ji")``: each of ``fields`` (None skipped) under its own chain of dense
    nodes, the axes in ``order`` outermost first, in one tree materialised now."""
    if len(order) != len(shape):
        raise QuadrantsSyntaxError(f"The dimensionality of shape and order must be the same ({len(shape)} != "
                                   f"{len(order)})")
    if len(set(order)) != len(order):
        raise QuadrantsSyntaxError("The axes in order must be different")
    for ch in order:
        if not 0 <= ord(ch) - ord("i") < len(shape):
            raise QuadrantsSyntaxError(f"Invalid axis {ch}")
    tree = Tree()
    for f in fields:
        if f is None:
            continue
        node = tree.root
        for ch in order:
            axis = ord(ch) - ord("i")
            node = node.dense(axes(axis), shape[axis])
        node.place(f, offset=offset)
    tree.materialize()


def standalone_tree(field) -> SNode:
    """The place node of a field with its own buffer (``qd.field(dtype, shape=...)``): a
    materialised tree of one dense node over ``qd.ij...``, for ``x.snode`` queries."""
    tree = Tree()
    tree.materialized = True
    parent = tree.root
    if field.shape:
        parent = SNode(tree, "dense", tree.root, range(len(field.shape)), field.shape)
        tree.root._children.append(parent)
    node = SNode(tree, "place", parent, field=field)
    parent._children.append(node)
    return node


# Quadrants' axis names: qd.i is axes(0), qd.ij is axes(0, 1), ...
i, j, k, l = axes(0), axes(1), axes(2), axes(3)  # noqa: E741  (Quadrants' names)
ij, ik, il, jk, jl, kl = axes(0, 1), axes(0, 2), axes(0, 3), axes(1, 2), axes(1, 3), axes(2, 3)
ijk, ijl, ikl, jkl = axes(0, 1, 2), axes(0, 1, 3), axes(0, 2, 3), axes(1, 2, 3)
ijkl = axes(0, 1, 2, 3)
