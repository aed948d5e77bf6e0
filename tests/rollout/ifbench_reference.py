"""IFBench's own verifiers, run apart: `python -m tests.rollout.ifbench_reference DIR` reads JSON
cases on stdin ([instruction_id, kwargs, response, prompt], ...) and writes IFBench's verdict for
each (true / false, or "lookup" where the verifier needs NLTK data this machine lacks). DIR holds
IFBench's `ifbench` package (from a local mirror of allenai/IFBench). Its own process, because
importing IFBench sets NLTK's data path and makes `ifbench` importable, which would switch
`--rm-type ifbench` in the test process to IFBench's registry."""

from __future__ import annotations

import json
import sys
import types


def _stand_in(name: str) -> None:
    """IFBench imports these at the top of its modules; none of the checks compared uses them
    (langdetect: IFEval's language checks; unicodedata2: a newer unicodedata; immutabledict:
    read-only constant tables, here plain dicts)."""
    try:
        __import__(name)
    except ImportError:
        module = types.ModuleType(name)
        module.immutabledict = dict  # type: ignore[attr-defined]
        sys.modules[name] = module


def main() -> None:
    sys.path.insert(0, sys.argv[1])
    for name in ("immutabledict", "langdetect", "unicodedata2"):
        _stand_in(name)
    from ifbench.instructions_registry import INSTRUCTION_DICT

    from slime.rollout.rm_hub.ifbench import _official_follows

    verdicts: list[bool | str] = []
    for instruction_id, kwargs, response, prompt in json.load(sys.stdin):
        try:
            verdicts.append(
                _official_follows(INSTRUCTION_DICT[instruction_id], instruction_id, response, kwargs, prompt)
            )
        except LookupError:  # NLTK's data is not on this machine
            verdicts.append("lookup")
    json.dump(verdicts, sys.stdout)


if __name__ == "__main__":
    main()
