"""qd_numba: Quadrants/Taichi-style kernels on Numba.

``import qd_numba as qd``; see README.md and docs/. This module only re-exports the public API.
"""

from .lowering import field as _lowering_field  # noqa: F401  (register Numba extensions)
from .lowering import spaces as _lowering_spaces  # noqa: F401
from .lowering import subscripts as _lowering_subscripts  # noqa: F401
from .lowering import struct as _lowering_struct  # noqa: F401
from .ops import matrix_methods as _matrix_methods  # noqa: F401
from .typing import intrinsics as _intrinsics
from . import (
    ad,  # noqa: E402  (qd.ad namespace)
    graph,  # noqa: E402  (qd.graph namespace: do_while, parallel_context, parallel)
    linalg,  # noqa: E402  (qd.linalg namespace)
    math,  # noqa: E402  (qd.math namespace)
    profiler,  # noqa: E402  (qd.profiler namespace)
    types,  # noqa: E402  (qd.types namespace)
)
from .dtypes import (
    f16,
    f32,
    f64,
    float16,
    float32,
    float64,
    i8,
    i16,
    i32,
    i64,
    int8,
    int16,
    int32,
    int64,
    u1,
    u8,
    u16,
    u32,
    u64,
    uint8,
    uint16,
    uint32,
    uint64,
)
from .errors import (
    QuadrantsAssertionError,
    QuadrantsCompilationError,
    QuadrantsConfigError,
    QuadrantsError,
    QuadrantsIndexError,
    QuadrantsNameError,
    QuadrantsRuntimeError,
    QuadrantsRuntimeTypeError,
    QuadrantsSyntaxError,
    QuadrantsTypeError,
    QuadrantsWarning,
)
from .field import Field, Ndarray, field, ndarray
from .frontend.args import Template, template
from .frontend.objects import QdFunc, func
from .frontend.real_func import QdRealFunc, real_func
from .kernel import Kernel, kernel
from .lowering.autodiff import stop_grad
from .lang import exception as _lang_exception  # noqa: F401  (qd.lang.* modules, Quadrants' layout)
from .lang import ops as _lang_ops  # noqa: F401
from .lang import util as _lang_util  # noqa: F401
from .lang.impl import cfg
from .lang.misc import dump_compile_config, extension, is_extension_enabled
from .lang import (
    atomic_add,
    atomic_and,
    atomic_max,
    atomic_min,
    atomic_or,
    atomic_sub,
    atomic_xor,
    grouped,
    loop_config,
    ndrange,
    random,
    static,
    static_assert,
    static_print,
    stream_parallel,
)
from .math import (
    abs,
    acos,
    asin,
    atan,
    atan2,
    bit_cast,
    bit_shr,
    cast,
    ceil,
    clamp,
    cos,
    exp,
    floor,
    frexp,
    log,
    max,
    min,
    pow,
    raw_div,
    raw_mod,
    round,
    rsqrt,
    select,
    sin,
    sqrt,
    tan,
    tanh,
)
from .matrix import Matrix, Vector
from .struct import Struct, StructField, data_oriented, dataclass
from .offline_cache import clear_offline_cache
from .ops.atomics import atomic_cas, atomic_exchange, atomic_mul
from .ops.volatile import volatile_load
from .ops.decompositions import eig, make_spd, polar_decompose, solve, svd, sym_eig
from .ops.math_funcs import one, zero
from .ops.random_normal import randn
from .profiler import CRITICAL, DEBUG, ERROR, INFO, TRACE, WARN, is_logging_effective, set_logging_level
from .snode import (
    Axis,
    FieldsBuilder,
    SNode,
    activate,
    append,
    axes,
    deactivate,
    i,
    ij,
    ijk,
    ijkl,
    ijl,
    ik,
    ikl,
    il,
    is_active,
    j,
    jk,
    jkl,
    jl,
    k,
    kl,
    l,
    length,
    root,
)
from .runtime import amdgpu, arm64, cpu, cuda, gpu, init, metal, reset, sync, vulkan, x64, x86_64
from .streams import Event, Stream, create_event, create_stream
from .task import Task

__version__ = "0.1.0"

_intrinsics.install_core()   # cached intrinsic signatures skip the registry refresh
