"""slime's `slime.utils.external_utils.typer_utils`: `dataclass_cli`, a typer command whose options
are a dataclass's fields, each also read from an environment variable (`SLIME_SCRIPT_<FIELD>`)."""

from __future__ import annotations

import dataclasses
import inspect
import sys
import typing
from collections.abc import Callable
from typing import Annotated, Any

from slime.errors import SlimeError

__all__ = ["dataclass_cli"]


def dataclass_cli(func: Callable[[Any], Any], env_var_prefix: str = "SLIME_SCRIPT_") -> Callable[..., Any]:
    """`func(config)` (its first parameter annotated with a dataclass) as a function of the
    dataclass's fields, for `typer.run` / `app.command()`: each field an option that falls back to
    the environment variable `<env_var_prefix><FIELD>`."""
    # typer is the caller's (a launch script runs it); this package does not depend on it
    typer = sys.modules.get("typer")
    if typer is None:
        raise SlimeError("dataclass_cli builds typer options: import typer in the script first")
    # annotations may be strings (`from __future__ import annotations`): typer needs the types
    config_cls = typing.get_type_hints(func).get(list(inspect.signature(func).parameters)[0])
    if not dataclasses.is_dataclass(config_cls):
        raise SlimeError(f"dataclass_cli: the first parameter of {func.__name__} must be a dataclass")
    hints = typing.get_type_hints(config_cls)
    params = [
        p.replace(annotation=Annotated[hints[p.name], typer.Option(envvar=f"{env_var_prefix}{p.name.upper()}")])
        for p in inspect.signature(config_cls).parameters.values()
    ]

    def wrapped(**kwargs: Any) -> Any:
        config = config_cls(**kwargs)
        print(f"Execute command with args: {config}")
        return func(config)

    wrapped.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    wrapped.__doc__ = func.__doc__
    wrapped.__name__ = func.__name__
    wrapped.__qualname__ = func.__qualname__
    return wrapped
