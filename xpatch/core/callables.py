"""Tokens of callables that change when their code does.

dask tokenizes a function defined in a module by its name (pickle stores a
reference), so a model whose body was edited keeps its token. :func:`code_token`
hashes the code itself; the results of ``apply`` are named with it, which is what
lets a resumed write tell an edited model from the one that started the run.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import types
from typing import Any

from dask.base import tokenize


def _code_parts(code: types.CodeType) -> list:
    parts: list = [code.co_code, code.co_names, code.co_varnames]
    for const in code.co_consts:
        parts.append(_code_parts(const) if isinstance(const, types.CodeType) else repr(const))
    return parts


@functools.lru_cache(maxsize=64)
def _source_digest(filename: str, mtime_ns: int) -> str:
    with open(filename, "rb") as source:
        return hashlib.sha256(source.read()).hexdigest()


def _module_digest(fn: Any) -> str:
    """Hash the source file that defines ``fn`` ('' if there is none)."""
    try:
        filename = inspect.getsourcefile(fn) or ""
        return _source_digest(filename, os.stat(filename).st_mtime_ns) if filename else ""
    except (TypeError, OSError):
        return ""


def code_token(fn: Any) -> str:
    """Return a token of a callable that changes when its code changes.

    Covers a Python function's bytecode, constants, defaults and closure, and the
    source file of its module (so a changed helper in the same module counts);
    ``functools.partial`` objects by their function and arguments; wrapped
    functions (``jax.jit``) by what they wrap; other callables by dask's token of
    the object and the source of their class. Weights a function loads from files
    at run time are not covered.

    Examples
    --------
    >>> def double(b):
    ...     return b * 2
    >>> def triple(b):
    ...     return b * 3
    >>> code_token(double) == code_token(double), code_token(double) == code_token(triple)
    (True, False)
    """
    if isinstance(fn, functools.partial):
        return tokenize("partial", code_token(fn.func), fn.args, fn.keywords)
    wrapped = getattr(fn, "__wrapped__", None)
    if wrapped is not None and wrapped is not fn:
        return tokenize("wrapped", type(fn).__qualname__, code_token(wrapped))
    if isinstance(fn, types.MethodType):
        return tokenize("method", code_token(fn.__func__), tokenize(fn.__self__))
    if isinstance(fn, types.FunctionType):
        closure = [cell.cell_contents for cell in fn.__closure__ or ()]
        return tokenize(
            fn.__module__,
            fn.__qualname__,
            _code_parts(fn.__code__),
            fn.__defaults__,
            fn.__kwdefaults__,
            closure,
            _module_digest(fn),
        )
    return tokenize("callable", tokenize(fn), type(fn).__qualname__, _module_digest(type(fn)))


def describe_callable(fn: Any) -> str:
    """Name a callable for messages: ``module:qualname`` and a short code token.

    Examples
    --------
    >>> import numpy as np
    >>> describe_callable(np.negative).startswith("numpy:negative@")
    True
    """
    target = fn.func if isinstance(fn, functools.partial) else fn
    module = getattr(target, "__module__", None) or type(target).__module__
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}:{name}@{code_token(fn)[:8]}"
