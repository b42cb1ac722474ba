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
the line.

Sparse nodes (docs/data_layout.md, "Sparse storage"): a ``bitmasked`` node is stored densely
with a hidden i32 state per cell (0 inactive, 1 active, 2 inactive but listed; a dense sibling
node of the same shape), and a list of the cells activated since its last ``deactivate_all``
(hidden fields of their own: ``_cells``, ``_count``) that struct-fors walk. A ``pointer`` node
has the same, plus an i32 slot per cell (1 + its block, 0: none); its cells are not stored in
its parent but as blocks of a pool after the tree's dense part (``capacity + 2`` blocks: the
always-zero block for cells without one, and a spare for overflow); its fields are views of the
pool (``PoolLayout``). Free blocks are kept in a ring (``_ring``, ``_heads``): activation takes
one, deactivation of the cell gives it back. A bitmasked node below a pointer node keeps its
states in the pointer's blocks and has no list (struct-fors walk the pointer's list). A
``dynamic`` node is stored at its capacity, with a hidden i32 length per
cell of its parent. The first field placed below a sparse node places these. Kernels keep them
up to date (passes/sparse.py: stores activate, struct-fors walk the list); a python-scope store
activates too (``activate_host``). Deactivation zero-fills the cells' data, so an inactive cell
reads 0.
"""

from __future__ import annotations

import numbers
import os
import sys

import numpy as np

from . import config, dtypes
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
    """A node of a tree: ``kind`` is ``"root"``, ``"dense"``, ``"bitmasked"``, ``"pointer"``,
    ``"dynamic"`` or ``"place"`` (a placed field)."""

    _flags = None    # a sparse node's hidden i32 field: cell states (bitmasked, pointer) or lengths (dynamic)
    _cells = None    # bitmasked, pointer: the flat indices of the cells listed (states 1 and 2), an i32 field
    _count = None    # bitmasked, pointer: how many are listed, a 0-d i32 field
    _slots = None    # pointer: per cell, 1 + the index of its block in the pool (0: none), an i32 field
    _ring = None     # pointer: the ring of free blocks of its pool, an i32 field (made when the tree is)
    _make = None     # pointer: how its hidden fields are made (the ring is made with the tree)
    _heads = None    # pointer: the ring's positions (taken, given back) and the count of failed takes
    _capacity = 0    # pointer: blocks in its pool (set when the tree is materialised)

    def __init__(self, tree: Tree, kind: str, parent: SNode | None, axes_=(), sizes=(), field=None):
        self._tree, self._kind, self._parent = tree, kind, parent
        self._axes, self._sizes = tuple(axes_), tuple(sizes)
        self._field = field
        self._children: list[SNode] = []

    # -- building -------------------------------------------------------------------
    def dense(self, axes_, dimensions) -> SNode:
        """A child array of cells over ``axes_`` (``qd.ij``), ``dimensions`` per axis (an int: the
        same for each)."""
        return self._child("dense", axes_, dimensions)

    def bitmasked(self, axes_, dimensions) -> SNode:
        """A child array of cells, each active or not (one activity flag per cell, in the tree's
        buffer): a store activates a cell, a struct-for visits only active cells."""
        return self._child("bitmasked", axes_, dimensions)

    def pointer(self, axes_, dimensions) -> SNode:
        """As ``bitmasked`` for programs, but a cell's contents (the nodes and fields below it) are a
        block taken from the node's pool when the cell is first activated: inactive cells take no
        memory beyond a 4-byte slot."""
        if any(n._kind == "pointer" for n in sparse_ancestors(self)):
            raise QuadrantsSyntaxError(f"pointer at {_user_site()}: a pointer SNode below another pointer SNode "
                                       "is not supported (use dense or bitmasked nodes below a pointer)")
        return self._child("pointer", axes_, dimensions)

    def dynamic(self, axis, dimension, chunk_size=None) -> SNode:
        """A list of up to ``dimension`` cells along one axis per cell of this node, with a length
        (``qd.append``, ``qd.length``); stored densely at its capacity (``chunk_size`` is accepted
        and has no effect)."""
        axes_ = [axis] if isinstance(axis, Axis) else list(axis)
        if len(axes_) != 1:
            raise QuadrantsTypeError(f"dynamic at {_user_site()}: a dynamic node has one axis, got {axes_}")
        return self._child("dynamic", axes_, dimension)

    def _child(self, kind: str, axes_, dimensions) -> SNode:
        axes_ = [axes_] if isinstance(axes_, Axis) else list(axes_)
        if isinstance(dimensions, numbers.Integral):
            dimensions = [int(dimensions)] * len(axes_)
        dimensions = [int(d) for d in dimensions]
        if not axes_ or len(dimensions) != len(axes_) or not all(isinstance(a, Axis) for a in axes_):
            raise QuadrantsTypeError(f"{kind}(axes, dimensions): give one dimension per axis, got axes {axes_} and "
                                     f"dimensions {dimensions} ({_user_site()})")
        if any(d <= 0 for d in dimensions):
            raise QuadrantsTypeError(f"{kind}: dimensions must be positive, got {dimensions} ({_user_site()})")
        self._check_open(kind)
        if len({a.index for a in axes_}) != len(axes_):
            raise QuadrantsTypeError(f"{kind} at {_user_site()}: an axis appears twice in {axes_}")
        node = SNode(self._tree, kind, self, [a.index for a in axes_], dimensions)
        self._children.append(node)
        return node

    def _give_flags(self, make) -> None:
        """Place the hidden flags of this sparse node (``make(name)`` makes an i32 field): for
        ``bitmasked``/``pointer`` one activity flag per cell, in a dense sibling of the same shape;
        for ``dynamic`` one length per cell of its parent, placed in the parent."""
        if self._kind == "dynamic":
            self._flags = make("length of a dynamic SNode")
            self._parent.place(self._flags)
            return
        holder = SNode(self._tree, "dense", self._parent, self._axes, self._sizes)
        self._parent._children.append(holder)
        self._flags = make(f"activity of a {self._kind} SNode")
        holder.place(self._flags)
        if self._kind == "pointer":
            self._slots = make("blocks of a pointer SNode")
            holder.place(self._slots)
            self._heads = make("ring positions of a pointer SNode", (3,))
            self._make = make
        if any(n._kind == "pointer" for n in sparse_ancestors(self._parent)):
            return    # its states live in the pointer's blocks: struct-fors walk the pointer's list
        self._cells = make(f"active cells of a {self._kind} SNode", (int(np.prod(self.shape, dtype=np.int64)),))
        self._count = make(f"active cell count of a {self._kind} SNode", ())

    def place(self, *fields, offset=None) -> SNode:
        """Place fields (or lists of fields) in this node's cells; ``offset`` shifts their indices."""
        site = _user_site()
        for f in fields:
            if isinstance(f, (list, tuple)):
                self.place(*f, offset=offset)
                continue
            if hasattr(f, "leaf_fields"):   # a struct field: its members, side by side (AoS)
                self.place(*f.leaf_fields(), offset=offset)
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
            for sparse in sparse_ancestors(self):   # the first field below a sparse node gives it flags
                if sparse._flags is None:
                    sparse._give_flags(f._hidden_i32)
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
        """Deactivate every cell of the sparse nodes at and below this one (dense cells are always
        active): their fields read 0 again, dynamic lengths are 0."""
        deactivate_all(self)

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
        self._dev = None          # the device byte buffer (CUDA, AMDGPU), made on first use there
        self._fields: list = []

    def materialize(self) -> None:
        """Fix the layout, allocate the buffer and give every placed field its view."""
        if self.materialized:
            return
        self.materialized = True
        if _root._builder.tree is self:
            _root._builder = FieldsBuilder()
            _root_trees.append(self)
        size, _ = _cell_size(self.root)
        pools = {}     # pointer node -> byte offset of its pool (after the tree's dense part)
        for node in self.root._walk():
            if node._kind == "pointer" and node._slots is not None:
                node._capacity = pool_capacity(node)
                node._ring = node._make("free blocks of a pointer SNode", (node._capacity,))
                size = -(-size // 16) * 16
                pools[node] = size
                size += (node._capacity + 2) * _cell_size(node)[0]
        self.base = np.zeros(max(size, 1), np.uint8)
        placements = _placements(self.root, 0, {})
        for p, at in pools.items():
            placements.update(_placements(p, at, {}))
        for node, (offset, strides) in placements.items():
            f = node._field
            pointer = next((n for n in sparse_ancestors(node) if n._kind == "pointer"), None)
            if pointer is not None:
                continue
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
        for node, (offset, _) in placements.items():   # below a pointer: views of its pool, once slots are there
            pointer = next((n for n in sparse_ancestors(node) if n._kind == "pointer"), None)
            if pointer is not None:
                self._place_pooled(node, pointer, offset)
        for node in pools:
            reset_pool(node)

    def _place_pooled(self, node: SNode, pointer: SNode, offset: int) -> None:
        """The view of a field below a pointer node: (blocks, levels below the node..., element),
        the block's stride the node's cell size; its ``_pool`` tells compiled code (typing/field.py)
        where the node's slots are."""
        f = node._field
        itemsize = np.dtype(_numpy_dtype(f)).itemsize
        elem_strides = tuple(int(np.prod(f.element_shape[k + 1:], dtype=np.int64)) * itemsize
                             for k in range(len(f.element_shape)))
        levels = node._levels()
        outer = len(pointer._levels())
        inner_sizes, inner_strides = [], []
        path, n = [], node._parent
        while n is not pointer:
            path.append(n)
            n = n._parent
        for n in reversed(path):
            cell, _ = _cell_size(n)
            for k, size in enumerate(n._sizes):
                inner_sizes.append(size)
                inner_strides.append(cell * int(np.prod(n._sizes[k + 1:], dtype=np.int64)))
        block = _cell_size(pointer)[0]
        f._arr = np.ndarray((pointer._capacity + 2, *inner_sizes) + f.element_shape, _numpy_dtype(f),
                            buffer=self.base, offset=offset,
                            strides=(block, *inner_strides) + elem_strides)
        f._tree = self
        self._fields.append(f)
        slots = pointer._slots._arr
        ranks = {a: k for k, a in enumerate(sorted({a for a, _ in levels}))}
        slot_ranks = {a: k for k, a in enumerate(sorted({a for a, _ in levels[:outer]}))}
        if pointer._slots._levels is not None:
            slot_strides = slots.strides[:outer]
        else:
            slot_strides = tuple(slots.strides[slot_ranks[a]] for a, _ in levels[:outer])
        f._pool = PoolLayout(tuple((ranks[a], n) for a, n in levels), outer,
                             slots.ctypes.data - f._arr.ctypes.data, tuple(int(x) for x in slot_strides),
                             pointer._capacity, pointer)

    def place_on(self, arch: str) -> None:
        """Give the tree (and each field's view) device storage on ``arch`` (CUDA, AMDGPU), or host only."""
        if arch not in ("cuda", "amdgpu"):
            self._dev = None
            for f in self._fields:
                f._dev = None
            return
        if self._dev is not None:
            return
        from .targets.base import target_for

        target_for(arch).place(self)
        if arch == "amdgpu":    # its place() gave each field its view too (targets/amdgpu/runtime.py)
            return
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
        """Before host-side reads: bring the device bytes back (CUDA, AMDGPU); a pointer node's pool
        that ran out of blocks is an error here."""
        if self._dev is not None:
            self._dev.copy_to_host(self.base)
        for node in self.root._walk():
            if node._slots is not None:
                check_pool(node)

    def push(self) -> None:
        """After host-side writes: send the bytes to the device (CUDA, AMDGPU)."""
        if self._dev is not None:
            self._dev.copy_to_device(self.base)


class PoolLayout:
    """How compiled code reaches an element of a field below a pointer node: the element's digit
    on each level of its path (``levels``: (index rank, size), outermost first); the first
    ``outer`` digits pick the node's cell, whose slot (an i32 at byte ``slot_offset`` from the
    field's data plus the digits times ``slot_strides``) holds 1 + its block; the block is the
    first index of the field's buffer (block ``capacity``, always zero, for a cell without one),
    the remaining digits the next ones."""

    def __init__(self, levels, outer, slot_offset, slot_strides, capacity, node):
        self.levels, self.outer, self.slot_offset = levels, outer, slot_offset
        self.slot_strides, self.capacity, self.node = slot_strides, capacity, node

    def key(self) -> tuple:
        return (self.levels, self.outer, self.slot_offset, self.slot_strides, self.capacity)


def pool_capacity(node: SNode) -> int:
    """The blocks of a pointer node's pool: its cells times ``qd.init(pointer_pool_fraction=...)``."""
    cells = int(np.prod(node.shape, dtype=np.int64))
    return max(1, min(cells, int(np.ceil(cells * config.current.pointer_pool_fraction))))


SPARSE_KINDS = ("bitmasked", "pointer", "dynamic")
_root_trees: list[Tree] = []    # the materialised trees built from qd.root (qd.root.deactivate_all())


def sparse_ancestors(node: SNode) -> list[SNode]:
    """The sparse nodes on the path from the root to ``node``, outermost first."""
    out = []
    while node is not None:
        if node._kind in SPARSE_KINDS:
            out.append(node)
        node = node._parent
    return out[::-1]


def sparse_key(field) -> tuple | None:
    """What compiled code of a field below sparse nodes depends on beyond its view (frontend/keys.py:
    a kernel over a bitmasked field is not one over a dense field of the same layout): the kind,
    shape and pool capacity of each sparse node above it; None below none."""
    node = getattr(field, "_snode", None)
    if node is None or node._kind != "place":
        return None
    return tuple((n._kind, n.shape, n._capacity) for n in sparse_ancestors(node)) or None


def cell_digits(node: SNode, field) -> list[tuple[int, int, int]]:
    """How an index of ``field`` (placed below ``node``) gives the index of ``node``'s cell: per
    axis of ``node.shape``, (position of the axis in the field's index, the field's offset on it,
    the divisor: the cells of the levels below ``node`` on that axis)."""
    field_levels, node_levels = field._snode._levels(), node._levels()
    ranks = {a: k for k, a in enumerate(sorted({a for a, _ in field_levels}))}
    divisors = {a: 1 for a, _ in node_levels}
    for a, n in field_levels[len(node_levels):]:
        if a in divisors:
            divisors[a] *= n
    offset = field.offset or (0,) * len(ranks)
    return [(ranks[a], offset[ranks[a]], divisors[a]) for a in sorted(divisors)]


def dynamic_position(node: SNode, field) -> tuple[int, int, int, int]:
    """(position in the field's index, offset, divisor, capacity): a field index's place in the
    list of the dynamic ``node`` above it is ``(i - offset) // divisor % capacity``."""
    axis = node._axes[0]
    for rank, off, div in cell_digits(node, field):
        if rank == sorted({a for a, _ in field._snode._levels()}).index(axis):
            return rank, off, div, node._sizes[0]
    raise AssertionError("a dynamic node's axis is on the path of the fields below it")


def activate_host(field, idx: tuple) -> None:
    """After a python-scope store of ``field[idx]`` (``idx`` without the offset): activate the
    cells of the sparse nodes above it (a dynamic list grows to hold the index)."""
    for node in sparse_ancestors(field._snode):
        if node._kind == "dynamic":
            rank, _, div, cap = dynamic_position(node, field)
            where = tuple((idx[r] % field.shape[r]) // d for r, _, d in cell_digits(node._parent, field))
            length = node._flags[where or None]
            node._flags[where or None] = max(length, (idx[rank] % field.shape[rank]) // div % cap + 1)
        else:
            activate_cell_host(node, tuple((idx[r] % field.shape[r]) // d for r, _, d in cell_digits(node, field)))


def activate_cell_host(node: SNode, where: tuple) -> None:
    """Python scope: make the cell ``where`` of a bitmasked/pointer node active (state 1), listing
    it if it was not, and giving it a block of the pool (pointer; lowering/sparse.py)."""
    state = node._flags[where]
    if state == 0 and node._cells is not None:
        n = node._count[None]
        node._cells[n] = int(np.ravel_multi_index(where, node.shape))
        node._count[None] = n + 1
    if state != 1 and node._slots is not None and node._slots[where] == 0:
        node._slots[where] = int(take_blocks_host(node, 1)[0]) + 1
        check_pool(node)
    if state != 1:
        node._flags[where] = 1


def take_blocks_host(node: SNode, n: int) -> np.ndarray:
    """Python scope: ``n`` blocks of a pointer node's pool from its ring of free blocks (as
    lowering/sparse.take_block; past the free ones: the spare block, counted as failed)."""
    heads, ring = node._heads.to_numpy(), node._ring.to_numpy()
    free = max(0, min(n, int(heads[1] - heads[0])))
    at = (heads[0] + np.arange(free)) % node._capacity
    blocks = np.concatenate([ring[at], np.full(n - free, node._capacity + 1, np.int32)]).astype(np.int32)
    ring[at] = -1
    heads[0] += n
    heads[2] += n - free
    node._ring.from_numpy(ring)
    node._heads.from_numpy(heads)
    return blocks


def reset_pool(node: SNode) -> None:
    """Every block of a pointer node's pool free: the ring holds them all, none taken."""
    node._ring.from_numpy(np.arange(node._capacity, dtype=np.int32))
    node._heads.from_numpy(np.array([0, node._capacity, 0], np.int32))


def blocks_in_use(node: SNode) -> int:
    """The blocks of a pointer node's pool held by its cells (the allocator's counter: taken less
    given back, less the takes that found none)."""
    heads = node._heads.to_numpy()
    return int(node._capacity - (heads[1] - heads[0]) - heads[2])


def _activate_all_cells(node: SNode) -> None:
    """Python scope: every cell of a bitmasked/pointer node active; those not listed are listed
    (and given blocks) after the others, whose blocks keep their data."""
    flags = node._flags.to_numpy().reshape(-1)
    new = np.flatnonzero(flags == 0).astype(np.int32)
    if len(new) and node._cells is not None:
        n = node._count[None]
        cells = node._cells.to_numpy()
        cells[n:n + len(new)] = new
        node._cells.from_numpy(cells)
        node._count[None] = n + len(new)
    if node._slots is not None:
        slots = node._slots.to_numpy().reshape(-1)
        need = np.flatnonzero(slots == 0)
        if len(need):
            slots[need] = take_blocks_host(node, len(need)) + 1
            node._slots._from_numpy_plain(slots.reshape(node.shape))
            check_pool(node)
    node._flags._fill_plain(1)


def check_pool(node: SNode) -> None:
    """A ``QuadrantsRuntimeError`` when cells of a pointer node were activated while its pool had no
    free block (since its last ``deactivate_all``)."""
    failed = int(node._heads[2])
    if failed:
        hidden = ("activity of", "blocks of", "length of")
        names = ", ".join(_field_label(p._field) for p in node._walk()
                          if p._kind == "place" and not (p._field.name or "").startswith(hidden))
        raise QuadrantsRuntimeError(
            f"the pool of {node!r} ({names}) is full: {failed} activation(s) found none of its "
            f"{node._capacity} blocks free (since its last deactivate_all(), which empties it); raise "
            f"qd.init(pointer_pool_fraction=...) (now {config.current.pointer_pool_fraction}), deactivate cells "
            "sooner or deactivate_all() it")


def activate_all_host(field) -> None:
    """After python scope wrote every element of ``field``: every cell above it is active, every
    dynamic list above it full."""
    for node in sparse_ancestors(field._snode):
        if node._kind != "dynamic":
            _activate_all_cells(node)
        else:
            node._flags._fill_plain(node._sizes[0])


def active_mask_host(field):
    """A bool array of ``field.shape``: whether each element lies in active cells of every sparse
    node above it (within the length of a dynamic one); None below no sparse node."""
    nodes = sparse_ancestors(field._snode)
    if not nodes:
        return None
    idx = np.indices(field.shape)
    mask = np.ones(field.shape, bool)
    for node in nodes:
        flags = node._flags.to_numpy()
        if node._kind == "dynamic":
            rank, _, div, cap = dynamic_position(node, field)
            cell = tuple(idx[r] // d for r, _, d in cell_digits(node._parent, field))
            mask &= idx[rank] // div % cap < (flags[cell] if cell else flags)
        else:
            mask &= flags[tuple(idx[r] // d for r, _, d in cell_digits(node, field))] == 1
    return mask


def _level_digits(levels, idx) -> list[int]:
    """An index's digit on each level (``(rank, size)``, outermost first) of a path."""
    out = []
    for k, (rank, size) in enumerate(levels):
        inner = int(np.prod([n for r, n in levels[k + 1:] if r == rank], dtype=np.int64))
        digit = idx[rank] // inner
        out.append(digit % size if any(r == rank for r, _ in levels[:k]) else digit)
    return out


def pool_index(field, idx: tuple) -> tuple:
    """Where the element ``idx`` (without the offset) of a field below a pointer node is in its
    buffer (the always-zero block for a cell without a block)."""
    pool = field._pool
    idx = tuple(int(i) % n for i, n in zip(idx, field.shape))
    slot = pool.node._slots[tuple(idx[r] // d for r, _, d in cell_digits(pool.node, field))]
    block = slot - 1 if slot else pool.capacity
    return (block, *_level_digits(pool.levels, idx)[pool.outer:])


def _pool_dims(field):
    """(the dimensions of the field's blocks, P.shape + inner levels, and the transposition that puts
    each index rank's dimensions together, outermost first)."""
    pool = field._pool
    digits = cell_digits(pool.node, field)
    inner = pool.levels[pool.outer:]
    sizes = list(pool.node.shape) + [n for _, n in inner]
    order = []
    for r in range(len(field.shape)):
        order += [k for k, (rank, _, _) in enumerate(digits) if rank == r]
        order += [len(digits) + j for j, (rank, _) in enumerate(inner) if rank == r]
    return sizes, order


def pool_gather(field) -> np.ndarray:
    """The elements of a field below a pointer node, in index order (0 in cells without a block)."""
    pool = field._pool
    slots = pool.node._slots.to_numpy()
    blocks = np.where(slots > 0, slots - 1, pool.capacity)
    image = field._arr[blocks]
    sizes, order = _pool_dims(field)
    elem = list(range(len(sizes), image.ndim))
    return image.transpose(order + elem).reshape(field.shape + field.element_shape)


def pool_scatter(field, data: np.ndarray) -> None:
    """Write ``data`` (index order) into the blocks of the listed cells of a field below a pointer node."""
    pool = field._pool
    slots = pool.node._slots.to_numpy()
    sizes, order = _pool_dims(field)
    split = np.asarray(data).reshape([sizes[k] for k in order] + list(field.element_shape))
    image = split.transpose(list(np.argsort(order)) + list(range(len(sizes), split.ndim)))
    has = (slots > 0) & (slots <= pool.capacity)
    field._arr[slots[has] - 1] = image[has]


def deactivate_all(node: SNode) -> None:
    """Zero the data and the flags of every sparse node at or below ``node``."""
    if not node._tree.materialized:
        return   # nothing was stored yet
    for sparse in node._walk():
        if sparse._kind in SPARSE_KINDS and sparse._flags is not None:
            for below in sparse._walk():
                if below._kind == "place":
                    below._field._fill_plain(0)    # Field.fill would activate
            sparse._flags._fill_plain(0)
            if sparse._count is not None:
                sparse._count[None] = 0
            if sparse._slots is not None:
                sparse._slots._fill_plain(0)
                reset_pool(sparse)


def _numpy_dtype(f):
    return dtypes.to_numpy(f.dtype)


def _member(child: SNode) -> tuple[int, int]:
    """(size, alignment) in bytes of one member of a cell: a placed field's element, or a child
    node's whole array (a pointer node's cells are blocks of its pool: nothing here)."""
    if child._kind == "pointer":
        return 0, 1
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
        elif child._kind != "pointer":    # its pool is laid out by Tree.materialize
            _placements(child, base_offset + offset, out)
    return out


def _axis_strides(place: SNode) -> tuple[int, ...]:
    """Byte strides of a place node's index axes: per node on its path, the node's cell size times
    the sizes of the node's later axes. In axis order; for a blocked layout (an axis on several
    nodes) one per level instead, outermost first."""
    strides: dict[int, int] = {}
    levels: list[int] = []
    path, node = [], place._parent
    while node is not None and node._kind != "root":
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
        """Deactivate every sparse cell of the trees built from ``qd.root`` so far."""
        for tree in list(_root_trees):
            if any(f._runtime is not None and f._runtime is not config.current for f in tree._fields):
                _root_trees.remove(tree)    # released by a later qd.init()/qd.reset()
                continue
            deactivate_all(tree.root)

    def __repr__(self):
        return "qd.root"


_root = _Root()
root = _root


def start_new_root() -> None:
    """``qd.init``: nodes placed under ``qd.root`` and not materialised yet belong to the old
    runtime, as its fields do; the next ``qd.root`` use starts a new tree."""
    _root._builder = FieldsBuilder()


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


def _kernel_only(name: str):
    raise QuadrantsSyntaxError(f"qd.{name}() is called inside kernels (or qd.func functions), not in python scope")


def is_active(node, indices):
    """``qd.is_active(node, I)`` (in kernels): whether the cell ``I`` of a bitmasked or pointer node
    is active, as 1 or 0."""
    _kernel_only("is_active")


def activate(node, indices):
    """``qd.activate(node, I)`` (in kernels): activate the cell ``I`` of a bitmasked or pointer node."""
    _kernel_only("activate")


def deactivate(node, indices):
    """``qd.deactivate(node, I)`` (in kernels): deactivate the cell ``I``; the fields placed directly
    under ``node`` read 0 there again."""
    _kernel_only("deactivate")


def rescale_index(a, b, I):  # noqa: E741  (Quadrants' name)
    """``qd.rescale_index(a, b, I)`` (in kernels): the index ``I`` of field or SNode ``a`` as an index
    of ``b`` (a vector): per axis, divided by ``a.shape[k] // b.shape[k]`` when ``a`` is finer,
    multiplied by ``b.shape[k] // a.shape[k]`` when it is coarser."""
    _kernel_only("rescale_index")


def append(node, indices, val):
    """``qd.append(node, I, v)`` (in kernels): add ``v`` at the end of the list ``I`` of a dynamic
    node (atomically); returns its position."""
    _kernel_only("append")


def length(node, indices):
    """``qd.length(node, I)`` (in kernels): the length of the list ``I`` of a dynamic node."""
    _kernel_only("length")
