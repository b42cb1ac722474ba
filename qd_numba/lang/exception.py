"""``qd.lang.exception``: the error classes under Quadrants' ``quadrants.lang.exception`` names.

They are qd_numba's own classes (errors.py), so ``except`` clauses written either way catch
the same errors.
"""

from __future__ import annotations

from ..errors import (  # noqa: F401
    QuadrantsAssertionError,
    QuadrantsCompilationError,
    QuadrantsIndexError,
    QuadrantsNameError,
    QuadrantsRuntimeError,
    QuadrantsRuntimeTypeError,
    QuadrantsSyntaxError,
    QuadrantsTypeError,
)

__all__ = ["QuadrantsSyntaxError", "QuadrantsTypeError", "QuadrantsCompilationError", "QuadrantsNameError",
           "QuadrantsRuntimeError", "QuadrantsRuntimeTypeError", "QuadrantsAssertionError"]
