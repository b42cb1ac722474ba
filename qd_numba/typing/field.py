"""The Numba type of fields and of ndarrays with vector/matrix elements.

``FieldType`` wraps the Numba array type of the buffer (``shape + element_shape``) and
remembers how many leading dimensions index *elements* (``ndim``) and the element type
(``None`` for scalars, a vector/matrix type otherwise). Indexing a ``FieldType`` with
``ndim`` indices yields a scalar or a vector/matrix value; see lowering/field.py.

``f16`` data (Numba's CPU target has no half type): the buffer is typed as ``uint16`` (the
elements' bits) and compiled code computes on the elements as ``f32``, as Quadrants does:
loads widen, stores round to nearest-even (``value_dtype`` / ``value_elem_type``).

Values of this type reach compiled code only as kernel arguments (fields as hidden
arguments): the launcher passes the numpy buffer and :func:`_unbox_field` wraps it, at no
cost beyond unboxing the array. ``checked`` types bounds-check every access (``debug=True``).

Layout: the buffer may be a strided view (a field placed in an SNode tree, snode.py): its type
is then an ``"A"``-layout array, and accesses use the strides the array carries (on CUDA, the
constant strides of lowering/device.py). ``offset`` (a tuple, or None) is subtracted from every
index before the access (``qd.field(..., offset=...)``): part of the type, as in Quadrants.
``levels`` (None, or one ``(axis, size)`` per buffer dimension) describes a blocked layout, an
axis split over several nodes of an SNode path: the buffer has one dimension per level, and an
index ``i`` of an axis with levels of sizes ``s0, s1`` (outer first) is the pair
``(i // s1, i % s1)`` (lowering/field.py). Its index shape is ``logical_shape``.
``pool`` (None, or snode.PoolLayout's ``key()``) describes a field below a pointer node: the
buffer is the node's pool of blocks, and an index reaches its element through the node's slots
(lowering/field.py).
"""

from __future__ import annotations

from numba.core import cgutils, types
from numba.extending import NativeValue, models, register_model, unbox

from ..field import element_shape


class FieldType(types.Type):
    def __init__(self, dtype, ndim: int, elem_type=None, layout: str = "C", readonly: bool = False,
                 checked: bool = False, kind: str = "field", offset: tuple | None = None,
                 levels: tuple | None = None, pool=None):
        self.dtype = dtype
        self.ndim = ndim
        self.elem_type = elem_type
        self.elem_shape = element_shape(elem_type)
        self.layout = layout
        self.readonly = readonly
        self.checked = checked
        self.kind = kind
        self.offset = offset
        self.levels = levels
        self.pool = pool.key() if pool is not None and not isinstance(pool, tuple) else pool
        if self.pool is not None:
            levels = self.pool[0]
        self.logical_shape = logical_shape(levels, ndim) if levels else None
        half = dtype == types.float16
        self.value_dtype = types.float32 if half else dtype
        self.value_elem_type = elem_type.with_dtype(types.float32) if half and elem_type is not None else elem_type
        dims = 1 + len(levels) - self.pool[1] if self.pool is not None else len(levels) if levels else ndim
        self.array_type = types.Array(types.uint16 if half else dtype, dims + len(self.elem_shape), layout,
                                      readonly=readonly)
        elem = f", elem={elem_type}" if elem_type is not None else ""
        super().__init__(
            name=f"qd.{kind}({dtype}, ndim={ndim}{elem}, {layout}{', readonly' if readonly else ''}"
            f"{', checked' if checked else ''}{f', offset={offset}' if offset else ''}"
            f"{f', levels={self.levels}' if self.levels else ''}{f', pool={self.pool}' if self.pool else ''})"
        )

    @property
    def key(self):
        return (self.dtype, self.ndim, self.elem_type, self.layout, self.readonly, self.checked, self.kind,
                self.offset, self.levels, self.pool)


def logical_shape(levels, ndim: int) -> tuple[int, ...]:
    """The index shape of a blocked layout: per axis, the product of its levels' sizes."""
    shape = [1] * ndim
    for axis, size in levels:
        shape[axis] *= size
    return tuple(shape)


@register_model(FieldType)
class FieldModel(models.StructModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, [("arr", fe_type.array_type)])


@unbox(FieldType)
def _unbox_field(typ, obj, c):
    """The launcher passes the numpy buffer itself; wrap it without copying."""
    native = c.unbox(typ.array_type, obj)
    field = cgutils.create_struct_proxy(typ)(c.context, c.builder)
    field.arr = native.value
    return NativeValue(field._getvalue(), is_error=native.is_error, cleanup=native.cleanup)
