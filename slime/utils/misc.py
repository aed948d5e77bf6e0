"""Small helpers shared across the package."""

from __future__ import annotations

import importlib
from typing import Any, Callable

from slime.errors import SlimeError


def load_function(path: str, *, arg_name: str | None = None) -> Callable[..., Any]:
    """Load `pkg.module.attr` (slime's `load_function`).

    `arg_name` names the command-line argument the path came from, so an import error
    points the user at what to fix.
    """
    where = f" (from {arg_name})" if arg_name else ""
    module_path, _, attr = path.rpartition(".")
    if not module_path:
        raise SlimeError(f"{path!r}{where} is not a dotted path of the form 'package.module.function'")
    try:
        module = importlib.import_module(module_path)
    except Exception as e:  # ImportError, or an error while the module runs
        raise SlimeError(f"cannot import module {module_path!r}{where}: {type(e).__name__}: {e}") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise SlimeError(f"module {module_path!r} has no attribute {attr!r}{where}") from None
