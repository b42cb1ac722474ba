"""Matrix-free Krylov solvers: ``qd.linalg.LinearOperator``, ``MatrixFreeCG``, ``MatrixFreeBICGSTAB``.

``A`` is a user kernel ``matvec(x, Ax)`` over fields shaped like the unknown ``x``; every vector
operation of the solvers (dot products, axpy updates) is a ``@qd.kernel`` over fields of the
shape and dtype of ``x``, so a solve runs on the backend in force with no host copies of the
vectors. Only the scalars of the recurrences (dot products, step lengths) come back to Python.

Semantics follow Quadrants' ``quadrants.linalg``: 1-D, 2-D and 3-D ``f32``/``f64`` fields; the
iteration stops when ``sqrt(r . r) < tol`` (an absolute tolerance) and the call returns whether
the solve succeeded. Quadrants decides that last flag with ``r . r < tol`` (the squared residual
against ``tol``) after the loop; we keep that rule, so a result is reported as a success exactly
when Quadrants would report it.

The solvers' work vectors are fields, one set per (shape, dtype), created at the first solve of
that kind and reused by later ones (Quadrants creates and destroys them on every call); the
kernels are compiled once per set of fields. ``qd.init`` drops them.
"""

from __future__ import annotations

import math

from .. import runtime
from ..dtypes import f32, f64
from ..errors import QuadrantsRuntimeError, QuadrantsTypeError
from ..field import field
from ..frontend.args import template
from ..kernel import kernel
from ..lang import grouped


class LinearOperator:
    """A linear map given by ``matvec_kernel(x, Ax)``, a kernel writing ``A @ x`` into ``Ax``
    (both fields of the shape of the unknown, usually taken as ``qd.template()``)."""

    def __init__(self, matvec_kernel):
        self._matvec = matvec_kernel

    def matvec(self, x, Ax) -> None:
        if x.shape != Ax.shape:
            raise QuadrantsRuntimeError(f"Dimension mismatch x.shape{x.shape} != Ax.shape{Ax.shape}.")
        self._matvec(x, Ax)


# -- the vector kernels (one compiled instance per set of fields) -------------------------------------

@kernel
def _dot(p: template(), q: template()) -> f64:
    result = 0.0
    for idx in grouped(p):
        result += p[idx] * q[idx]
    return result


@kernel
def _copy(src: template(), dst: template()):
    for idx in grouped(src):
        dst[idx] = src[idx]


@kernel
def _residual(b: template(), Ax: template(), r: template()):
    for idx in grouped(r):
        r[idx] = b[idx] - Ax[idx]


@kernel
def _axpy(y: template(), a: f64, x: template()):
    """``y += a * x``."""
    for idx in grouped(y):
        y[idx] += a * x[idx]


@kernel
def _xpay(y: template(), x: template(), a: f64):
    """``y = x + a * y``."""
    for idx in grouped(y):
        y[idx] = x[idx] + a * y[idx]


@kernel
def _bicgstab_direction(p: template(), r: template(), v: template(), beta: f64, omega: f64):
    """``p = r + beta * (p - omega * v)``."""
    for idx in grouped(p):
        p[idx] = r[idx] + beta * (p[idx] - omega * v[idx])


@kernel
def _combine(out: template(), x: template(), a: f64, y: template()):
    """``out = x + a * y``."""
    for idx in grouped(out):
        out[idx] = x[idx] + a * y[idx]


@kernel
def _bicgstab_update_x(x: template(), alpha: f64, p: template(), omega: f64, s: template()):
    for idx in grouped(x):
        x[idx] += alpha * p[idx] + omega * s[idx]


# -- work vectors ---------------------------------------------------------------------------------------

_work_vectors: dict = {}
runtime.on_init(_work_vectors.clear)   # fields of the old runtime are gone


def _work(kind: str, count: int, shape: tuple, dtype) -> list:
    key = (kind, shape, dtype)
    if key not in _work_vectors:
        _work_vectors[key] = [field(dtype, shape=shape) for _ in range(count)]
    return _work_vectors[key]


def _check(name: str, b, x):
    if b.dtype != x.dtype:
        raise QuadrantsTypeError(f"Dtype mismatch b.dtype({b.dtype}) != x.dtype({x.dtype}).")
    if b.dtype not in (f32, f64):
        raise QuadrantsTypeError(f"Not supported dtype: {b.dtype}")
    if b.shape != x.shape:
        raise QuadrantsRuntimeError(f"Dimension mismatch b.shape{b.shape} != x.shape{x.shape}.")
    if not 1 <= len(b.shape) <= 3:
        raise QuadrantsRuntimeError(f"{name} only support 1D, 2D, 3D inputs; your inputs is {len(b.shape)}-D.")


def MatrixFreeCG(A: LinearOperator, b, x, tol: float = 1e-6, maxiter: int = 5000, quiet: bool = True) -> bool:
    """Solve ``A x = b`` by conjugate gradients (``A`` symmetric positive definite), starting from
    the values in ``x`` and leaving the solution there. Stops when ``sqrt(r . r) < tol`` or after
    ``maxiter`` iterations; returns True on success (see the module docstring)."""
    _check("MatrixFreeCG", b, x)
    p, r, Ap, Ax = _work("cg", 4, b.shape, b.dtype)
    A._matvec(x, Ax)
    _residual(b, Ax, r)
    _copy(r, p)
    old_rTr = new_rTr = _dot(r, r)
    if not quiet:
        print(f">>> Initial residual = {old_rTr:e}")
    if math.sqrt(old_rTr) >= tol:
        for i in range(maxiter):
            A._matvec(p, Ap)
            alpha = old_rTr / _dot(p, Ap)
            _axpy(x, alpha, p)
            _axpy(r, -alpha, Ap)
            new_rTr = _dot(r, r)
            if math.sqrt(new_rTr) < tol:
                if not quiet:
                    print(f">>> Conjugate Gradient method converged.\n>>> #iterations {i}")
                break
            _xpay(p, r, new_rTr / old_rTr)
            old_rTr = new_rTr
            if not quiet:
                print(f">>> Iter = {i + 1:4}, Residual = {math.sqrt(new_rTr):e}")
    if new_rTr >= tol:
        if not quiet:
            print(f">>> Conjugate Gradient method failed to converge in {maxiter} iterations: "
                  f"Residual = {math.sqrt(new_rTr):e}")
        return False
    return True


def MatrixFreeBICGSTAB(A: LinearOperator, b, x, tol: float = 1e-6, maxiter: int = 5000, quiet: bool = True) -> bool:
    """Solve ``A x = b`` by BiCGSTAB (any nonsingular ``A``), starting from the values in ``x``.
    Stops when ``sqrt(r . r) < tol``, after ``maxiter`` iterations, or on a breakdown
    (``r . r_tld == 0``); returns True on success (see the module docstring)."""
    _check("MatrixFreeBICGSTAB", b, x)
    p, r, r_tld, s, t, Ap, Ax = _work("bicgstab", 7, b.shape, b.dtype)
    A._matvec(x, Ax)
    _residual(b, Ax, r)
    _copy(b, r_tld)
    rTr = _dot(r, r)
    if not quiet:
        print(f">>> Initial residual = {rTr:e}")
    rho_1 = alpha = omega = 1.0
    if math.sqrt(rTr) >= tol:
        for i in range(maxiter):
            rho = _dot(r, r_tld)
            if rho == 0.0:
                if not quiet:
                    print(">>> BICGSTAB failed because r@r_tld = 0.")
                return False
            if i == 0:
                _copy(r, p)
            else:
                _bicgstab_direction(p, r, Ap, (rho / rho_1) * (alpha / omega), omega)
            A._matvec(p, Ap)
            alpha = rho / _dot(r_tld, Ap)
            _combine(s, r, -alpha, Ap)
            A._matvec(s, t)
            omega_lower = _dot(t, t)
            omega = _dot(t, s) / (omega_lower if omega_lower != 0.0 else 1e-16)
            _bicgstab_update_x(x, alpha, p, omega, s)
            _combine(r, s, -omega, t)
            rTr = _dot(r, r)
            if not quiet:
                print(f">>> Iter = {i + 1:4}, Residual = {math.sqrt(rTr):e}")
            if math.sqrt(rTr) < tol:
                if not quiet:
                    print(f">>> BICGSTAB method converged at #iterations {i}")
                break
            rho_1 = rho
    if rTr >= tol:
        if not quiet:
            print(f">>> BICGSTAB failed to converge in {maxiter} iterations: Residual = {math.sqrt(rTr):e}")
        return False
    return True
