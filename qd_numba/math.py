"""``qd.math``: the math namespace, as Quadrants' (``import qd_numba as qd; qd.math.normalize(v)``).

It only gathers names: the elementwise functions come from ops/elementwise.py (built from the
tables of ops/math_ops.py and ops/bit_ops.py), the compositions (GLSL helpers, transforms) from
ops/math_funcs.py; the vector/matrix type aliases are defined here.
"""

from __future__ import annotations

from .dtypes import f32, i32, u32
from .matrix import matrix, vector
from .ops.elementwise import (  # noqa: F401  (re-exported)
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
    clz,
    cos,
    exp,
    ffs,
    floor,
    fract,
    frexp,
    isinf,
    isnan,
    log,
    log2,
    max,
    min,
    popcnt,
    pow,
    raw_div,
    raw_mod,
    round,
    rsqrt,
    select,
    sign,
    sin,
    sqrt,
    step,
    tan,
    tanh,
)
from .ops.math_funcs import (  # noqa: F401  (re-exported)
    cconj,
    cdiv,
    cexp,
    cinv,
    clog,
    cmul,
    cpow,
    cross,
    csqrt,
    degrees,
    determinant,
    distance,
    dot,
    e,
    eye,
    fns,
    inf,
    inverse,
    length,
    mix,
    mod,
    nan,
    normalize,
    pi,
    radians,
    reflect,
    refract,
    rot_by_axis,
    rot_yaw_pitch_roll,
    rotation2d,
    rotation3d,
    scale,
    smoothstep,
    translate,
    vdir,
)

vec2, vec3, vec4 = vector(2, f32), vector(3, f32), vector(4, f32)
ivec2, ivec3, ivec4 = vector(2, i32), vector(3, i32), vector(4, i32)
uvec2, uvec3, uvec4 = vector(2, u32), vector(3, u32), vector(4, u32)
mat2, mat3, mat4 = matrix(2, 2, f32), matrix(3, 3, f32), matrix(4, 4, f32)

__all__ = [
    "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "exp", "log", "sqrt", "rsqrt", "abs", "floor",
    "ceil", "round", "tanh", "pow", "min", "max", "clamp", "cast",
    "vec2", "vec3", "vec4", "ivec2", "ivec3", "ivec4", "uvec2", "uvec3", "uvec4", "mat2", "mat3", "mat4",
    "select", "log2", "fract", "sign", "step", "isnan", "isinf", "clz", "popcnt", "ffs", "raw_div", "raw_mod",
    "bit_shr", "bit_cast", "frexp",
    "cross", "degrees", "determinant", "distance", "dot", "e", "eye", "fns", "inf", "inverse", "length", "mix", "mod",
    "nan", "normalize", "pi", "radians", "reflect", "refract", "rot_by_axis", "rot_yaw_pitch_roll", "rotation2d",
    "rotation3d", "scale", "smoothstep", "translate", "vdir",
    "cconj", "cdiv", "cexp", "cinv", "clog", "cmul", "cpow", "csqrt",
]
