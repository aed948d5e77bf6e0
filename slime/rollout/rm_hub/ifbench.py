"""`--rm-type ifbench` (slime's `slime.rollout.rm_hub.ifbench`): IFBench's strict
instruction-following score, 1.0 when the response follows every instruction of its prompt, else
0.0, read from the sample's metadata as slime reads it:

    {"instruction_id_list": ["count:numbers", ...], "kwargs": [{"N": 3}, ...],
     "prompt_text": "...", "record_id": 7}

`kwargs` may be one dict for all instructions, or a list (padded with its last entry, cut to the
number of instructions); None values are dropped. Each instruction is decided as IFBench's
`test_instruction_following_strict` does: an empty or blank response follows nothing; a
verifier whose arguments include `prompt` is given `prompt_text`.

The verifiers: IFBench's own (`ifbench.instructions_registry`, the `ifbench` package) when it is
installed, which covers every IFBench and IFEval id; otherwise the ones written here
(`ifbench_checks.CHECKS`), one for each of the 58 ids of IFBench's test data (not IFEval's), of
which those that split sentences or words need `nltk` and its data installed. An instruction id
neither knows raises, naming it, rather than scoring a guess. slime instead clones IFBench from
GitHub and pip-installs its requirements at import time; nothing is fetched at run time here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from slime.errors import SlimeError
from slime.rollout.rm_hub.ifbench_checks import CHECKS

logger = logging.getLogger(__name__)

JsonDict = dict[str, Any]
KwargsDict = dict[str, str | int | float | None]


def _normalize_instruction_ids(raw_ids: Sequence[Any]) -> list[str]:
    """The ids as stripped strings, without None or blank entries."""
    return [str(e).strip() for e in raw_ids or [] if e is not None and str(e).strip()]


def _coerce_kwargs_list(raw_kwargs: Any, num_instructions: int) -> list[KwargsDict]:
    """One kwargs dict per instruction: a list is padded with copies of its last entry (or {}) and
    cut to length, one dict is repeated, anything else is {}; None values are dropped."""
    if isinstance(raw_kwargs, list):
        entries = [dict(e) if isinstance(e, dict) else {} for e in raw_kwargs]
    elif isinstance(raw_kwargs, dict):
        entries = [dict(raw_kwargs) for _ in range(num_instructions)]
    else:
        entries = [{} for _ in range(num_instructions)]
    tail = entries[-1] if entries else {}
    entries = (entries + [dict(tail) for _ in range(num_instructions - len(entries))])[:num_instructions]
    return [{k: v for k, v in e.items() if v is not None} for e in entries]


def _official_registry() -> dict[str, Any] | None:
    try:
        from ifbench.instructions_registry import INSTRUCTION_DICT  # IFBench's package, when installed
    except ImportError:
        return None
    return INSTRUCTION_DICT


def _official_follows(cls: Any, instruction_id: str, response: str, kwargs: KwargsDict, prompt: str) -> bool:
    instruction = cls(instruction_id)
    instruction.build_description(**kwargs)
    args = instruction.get_instruction_args()
    if args and "prompt" in args:
        instruction.build_description(prompt=prompt)
    return bool(instruction.check_following(response))


def _own_follows(instruction_id: str, response: str, kwargs: KwargsDict) -> bool:
    check, names = CHECKS[instruction_id]
    missing = [n for n in names if n not in kwargs]
    if missing:
        raise SlimeError(f"ifbench: instruction {instruction_id!r} needs kwargs {missing}, got {sorted(kwargs)}")
    return check(response, **{n: kwargs[n] for n in names})


def _follower(instruction_id: str) -> Callable[[str, KwargsDict, str], bool]:
    registry = _official_registry()
    if registry is not None and instruction_id in registry:
        cls = registry[instruction_id]
        return lambda response, kwargs, prompt: _official_follows(cls, instruction_id, response, kwargs, prompt)
    if instruction_id in CHECKS:
        return lambda response, kwargs, prompt: _own_follows(instruction_id, response, kwargs)
    hint = "" if registry is not None else " (install the `ifbench` package for IFBench's full set of verifiers)"
    raise SlimeError(
        f"--rm-type ifbench: no verifier for instruction {instruction_id!r}{hint}; "
        f"built in here: {', '.join(sorted(CHECKS))}"
    )


def follow_instruction_list(response: str, metadata: JsonDict) -> list[bool]:
    """Whether `response` follows each instruction of `metadata`, in order (IFBench's strict rule)."""
    ids = _normalize_instruction_ids(metadata.get("instruction_id_list") or [])
    kwargs_list = _coerce_kwargs_list(metadata.get("kwargs"), len(ids))
    prompt = "" if metadata.get("prompt_text") is None else str(metadata["prompt_text"])
    followers = [_follower(i) for i in ids]  # an unknown id fails the sample whatever the response
    if not response or not response.strip():
        return [False] * len(ids)
    return [f(response, kw, prompt) for f, kw in zip(followers, kwargs_list, strict=True)]


def compute_ifbench_reward(response: str, label: Any, metadata: JsonDict | None = None) -> float:
    """slime's scorer: 1.0 if the response follows all the instructions in `metadata`, else 0.0
    (also 0.0 without metadata, without instruction ids, or without a response). `label` is unused."""
    if metadata is None or response is None:
        return 0.0
    if not _normalize_instruction_ids(metadata.get("instruction_id_list") or []):
        logger.debug("ifbench: no instruction ids in the metadata: %s", metadata)
        return 0.0
    return 1.0 if all(follow_instruction_list(str(response), metadata)) else 0.0


__all__ = ["compute_ifbench_reward", "follow_instruction_list"]
