"""`njit` for the model's compiled loops: Numba's, or a no-op where Numba is missing (numba is
a dependency; this keeps the model importable without it, slowly)."""
try:
    from numba import njit
except ImportError:  # pragma: no cover - numba is a dependency; keep the model importable
    def njit(*a, **k):
        return (lambda f: f) if not a or not callable(a[0]) else a[0]

__all__ = ["njit"]
