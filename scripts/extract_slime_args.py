"""Write slime/arguments/slime_upstream.json: every option slime's own parser adds, as data.

    git -C <slime mirror> archive HEAD slime | tar -x -C /tmp/slime_up
    python scripts/extract_slime_args.py /tmp/slime_up [commit] [out.json]

slime-rl takes slime's arguments with slime's names, dests and defaults. This file is the
reference it is checked against (tests/arguments/test_slime_arguments.py) and the list of slime
options that are accepted here but have no effect on this backend (`slime/arguments/upstream.py`).
It builds slime's parser (`get_slime_extra_args_provider()` of `slime/utils/arguments.py`) from a
checkout of THUDM/slime, with the packages that module imports at the top replaced by empty
stand-ins (only the parser is built, nothing runs), and records, for each option, the slime group
function that added it (`add_rollout_arguments`, ...), its dest, action, nargs, type, default,
const and choices. This script must not import slime-rl's own `slime` package: the checkout's
`slime` comes first on sys.path.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import types
from pathlib import Path
from unittest import mock

from parser_tables import StandIns, describe  # a sibling of this script

# What slime/utils/arguments.py imports at module level that needs GPUs or is not installed here.
STAND_INS = ("sglang", "sglang_router", "slime.backends.sglang_utils", "slime.observability")
SGLANG_ARGUMENTS = "slime/backends/sglang_utils/arguments.py"  # slime's own --sglang-* / router options


class _RecordingParser(argparse.ArgumentParser):
    """Remembers which of slime's group functions added each option."""

    def __init__(self, *a, **kw):
        self.group_of: dict[str, str] = {}  # before argparse's own add_argument("-h")
        super().__init__(*a, **kw)

    def add_argument(self, *names, **kw):
        action = super().add_argument(*names, **kw)
        frame = sys._getframe(1)
        while frame is not None and not frame.f_code.co_name.startswith("add_"):
            frame = frame.f_back
        self.group_of[action.dest] = frame.f_code.co_name if frame is not None else "?"
        return action


def _describe(parser: _RecordingParser) -> dict[str, dict]:
    return describe(parser, extra=lambda action: {"group": parser.group_of.get(action.dest, "?")})


def _pre_parse_options(slime_arguments) -> dict[str, dict]:
    """The options slime's `_pre_parse_mode` reads with a parser of its own before the main one."""
    made: list[_RecordingParser] = []

    class Capture(_RecordingParser):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    argv, sys.argv = sys.argv, ["slime"]
    with mock.patch.object(slime_arguments, "argparse", types.SimpleNamespace(ArgumentParser=Capture)):
        slime_arguments._pre_parse_mode()
    sys.argv = argv
    options = _describe(made[0])
    for spec in options.values():
        spec["group"] = "_pre_parse_mode"
    return options


def main() -> None:
    root = Path(sys.argv[1]).resolve()
    commit = sys.argv[2] if len(sys.argv) > 2 else "unknown"
    out = Path(sys.argv[3]) if len(sys.argv) > 3 else Path(__file__).parents[1] / "slime/arguments/slime_upstream.json"
    sys.path.insert(0, str(root))
    StandIns(STAND_INS).install()
    import slime.utils.arguments as slime_arguments

    parser = _RecordingParser(allow_abbrev=False)
    slime_arguments.get_slime_extra_args_provider()(parser)
    # slime's own SGLang-side options (SGLang's and the router's parsers themselves are stand-ins here)
    spec = importlib.util.spec_from_file_location("slime_sglang_arguments", root / SGLANG_ARGUMENTS)
    sglang_arguments = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sglang_arguments)
    sglang_arguments.add_sglang_arguments(parser)
    options = _describe(parser)
    options.update(_pre_parse_options(slime_arguments))
    data = {"source": {"repo": "THUDM/slime", "path": "slime/utils/arguments.py", "commit": commit}, "options": options}
    out.write_text(json.dumps(data, indent=0, sort_keys=True) + "\n")
    print(f"{len(options)} slime options -> {out}")


if __name__ == "__main__":
    main()
