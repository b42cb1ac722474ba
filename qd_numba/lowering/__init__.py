"""Lowering of qd types and intrinsics. Each module registers its extensions with Numba when
imported; the package itself imports none of them (qd_numba/__init__.py imports those that no
other module does), so that importing one module does not pull in the others."""
