"""Content keys: what identifies a compiled kernel instance in any process.

The in-process caches key instances on identity where that is cheapest (a template field by
``id``: the instance holds that field's buffer). A compiled *artefact* (a cubin, an object
file) must instead be named by content, so that another process computing the same key may
reuse it (the disk cache): :func:`value_key` describes a template value by what the compiled
code depends on — a Python scalar by value, a field by its layout, a function by its code —
and :func:`artifact_key` hashes everything that changes the generated code.

A value with no stable description (an arbitrary object) gives ``None``: its instance is
valid in this process only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import types as pytypes

import numpy as np

from ..field import ArrayData, Ndarray
from ..snode import sparse_key

_SCALARS = (type(None), bool, int, float, complex, str, bytes)


def code_key(code: pytypes.CodeType) -> tuple:
    """The parts of a code object that decide what it computes (nested code objects too);
    line numbers and file names are left out."""
    consts = tuple(code_key(c) if isinstance(c, pytypes.CodeType) else value_key(c) for c in code.co_consts)
    return ("code", code.co_code, consts, code.co_names, code.co_varnames, code.co_freevars)


def value_key(value):
    """A process-independent description of a compile-time value, or None."""
    if isinstance(value, _SCALARS):
        return (type(value).__name__, value)
    if isinstance(value, np.generic):
        return ("np", value.dtype.str, value.item())
    if isinstance(value, (tuple, list)):
        items = tuple(value_key(v) for v in value)
        return None if any(k is None for k in items) else (type(value).__name__, items)
    if isinstance(value, ArrayData):
        return ("ndarray" if isinstance(value, Ndarray) else "field", str(value.dtype), value.shape,
                value.element_shape, repr(value.elem_type), value._arr.strides, value.offset,
                getattr(value, "_levels", None), sparse_key(value))
    from numba.core import types as nbtypes

    if isinstance(value, nbtypes.Type):
        return ("numba-type", str(value))
    if getattr(value, "holds_global_data", False):   # a struct field: its members' layouts
        return ("struct-field", str(value.dtype), tuple(value_key(f) for f in value.leaf_fields()))
    if getattr(type(value), "_qd_data_oriented", False):   # a data-oriented object: its attributes
        items = tuple((k, value_key(v)) for k, v in sorted(vars(value).items()))
        if any(k is None for _, k in items):
            return None
        return ("data-oriented", type(value).__module__, type(value).__qualname__, items)
    fn = getattr(value, "fn", None) or getattr(value, "py_func", None) or value
    code = getattr(fn, "__code__", None)
    if code is not None:   # a function, qd.func or njit dispatcher: by its qualified name and code
        return ("function", getattr(fn, "__module__", ""), getattr(fn, "__qualname__", ""), code_key(code))
    return None


def artifact_key(kernel, param_types: dict, templates: dict, fields: list, cfg, target: str) -> str | None:
    """The hex key of one compiled kernel instance: the kernel's code, its argument types,
    template values and the layouts of the fields it uses (kernel-local order), the code-
    changing configuration and the versions of the compiler stack. None if a template value
    has no stable description."""
    import numba

    from .. import __version__

    template_keys = tuple((name, value_key(v)) for name, v in sorted(templates.items()))
    if any(k is None for _, k in template_keys):
        return None
    config = tuple((f.name, repr(getattr(cfg, f.name))) for f in dataclasses.fields(cfg) if f.name in CODE_CONFIG)
    parts = (__version__, numba.__version__, target, kernel.qualname, code_key(kernel.fn.__code__),
             tuple((n, str(t)) for n, t in sorted(param_types.items())), template_keys,
             tuple(value_key(f) for f in fields), config)
    return hashlib.sha256(repr(parts).encode()).hexdigest()


CODE_CONFIG = frozenset({"debug", "default_fp", "default_ip", "aggressive_kernel_fusion",
                         "aggressive_kernel_fusion_raw", "kernel_fusion_budget", "warp_reduce", "cfg_optimization",
                         "cfg_optimization_per_task", "task_pipeline"})
"""The configuration fields that change generated code (the rest change messages or checks)."""
