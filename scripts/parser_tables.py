"""Shared by the scripts that record another project's argument parser as data
(extract_megatron_args.py, extract_slime_args.py): empty stand-ins for the packages a parser
module imports but a CPU machine lacks, and the description of each option."""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Iterable
from unittest import mock


class StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import hook answering every module under `prefixes` with an empty MagicMock module (only a
    parser is built from the code that imports them; nothing of theirs runs)."""

    def __init__(self, prefixes: Iterable[str], version: str | None = None):
        self.prefixes, self.version = tuple(prefixes), version

    def find_spec(self, name, path, target=None):
        if any(name == s or name.startswith(s + ".") for s in self.prefixes):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = mock.MagicMock(name=spec.name)
        module.__path__, module.__spec__ = [], spec
        if self.version is not None:
            module.__version__ = self.version
        return module

    def exec_module(self, module):
        pass

    def install(self) -> None:
        sys.meta_path.insert(0, self)


def jsonable(value):
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(x, (str, int, float, bool)) for x in value):
        return list(value)
    return None


def describe(parser: argparse.ArgumentParser, extra=lambda action: {}) -> dict[str, dict]:
    """Option name -> {aliases, dest, action, nargs, type, default, const, choices} (+ `extra`)."""
    out = {}
    for action in parser._actions:
        names = [s for s in action.option_strings if s.startswith("--")]
        if not names or action.dest == "help":
            continue
        choices = action.choices
        out[names[0]] = {
            "aliases": names[1:],
            "dest": action.dest,
            **extra(action),
            "action": type(action).__name__,
            "nargs": action.nargs,
            "type": getattr(action.type, "__name__", None) if action.type is not None else None,
            "default": jsonable(action.default),
            "const": jsonable(action.const),
            "choices": list(choices) if choices is not None and jsonable(list(choices)) is not None else None,
        }
    return out
