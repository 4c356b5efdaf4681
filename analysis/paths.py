"""Output paths of the `flashsim` commands, checked before any work is done.

A bad path is a ValueError with one line naming it (the CLI prints it and exits 2):
a directory where a file is wanted, a file where a directory is wanted, a place whose
parent is not a directory, or one that is not writable.
"""
from __future__ import annotations

import os


class OutPathError(ValueError):
    """An output path that cannot be used (one line, naming the path)."""


def _existing_ancestor(path: str) -> str:
    a = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(a):
        a = os.path.dirname(a)
    return a


def check_out_file(path, option: str = "--out") -> str:
    """`path` as a str if a file can be written there (its parents may still be missing);
    OutPathError otherwise. Creates nothing."""
    p = os.fspath(path)
    if p == "":
        raise OutPathError(f"{option} is empty; give a file path")
    if os.path.isdir(p):
        raise OutPathError(f"{option} {p!r} is a directory; give a file path")
    a = _existing_ancestor(p)
    if not os.path.isdir(a):
        raise OutPathError(f"{option} {p!r} cannot be created: {a!r} is not a directory")
    if os.path.exists(p):
        if not os.access(p, os.R_OK | os.W_OK):
            raise OutPathError(f"{option} {p!r} is not readable and writable")
    elif not os.access(a, os.W_OK | os.X_OK):
        raise OutPathError(f"{option} {p!r} cannot be created: {a!r} is not writable")
    return p


def check_out_dir(path, option: str = "--out") -> str:
    """`path` as a str, created if missing, if files can be written into it; OutPathError
    otherwise."""
    p = os.fspath(path)
    if p == "":
        raise OutPathError(f"{option} is empty; give a directory")
    if os.path.exists(p) and not os.path.isdir(p):
        raise OutPathError(f"{option} {p!r} is not a directory")
    a = _existing_ancestor(os.path.join(p, "x"))
    if not os.path.isdir(a):
        raise OutPathError(f"{option} {p!r} cannot be created: {a!r} is not a directory")
    try:
        os.makedirs(p, exist_ok=True)
    except OSError as e:
        raise OutPathError(f"{option} {p!r} cannot be created: {e.strerror}") from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise OutPathError(f"{option} {p!r} is not writable")
    return p


__all__ = ["OutPathError", "check_out_dir", "check_out_file"]
