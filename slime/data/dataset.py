"""Loading prompt files (JSONL or Parquet) into `Sample`s.

Every malformed input raises `SlimeError` naming the file and the line (JSONL, 1-based) or row
(Parquet, 0-based index) and, for a missing column, the key and the keys the row does have.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from slime.errors import SlimeError
from slime.utils.types import Sample


class PromptSamples(list):
    """`list[Sample]` as loaded from one file, plus what was left out.

    `num_dropped` counts prompts dropped for being longer than `max_prompt_len` tokens.
    """

    def __init__(self, samples: list[Sample] = (), *, path: str | None = None, num_dropped: int = 0):
        super().__init__(samples)
        self.path = path
        self.num_dropped = num_dropped

    def __repr__(self) -> str:
        return f"PromptSamples({len(self)} samples from {self.path!r}, {self.num_dropped} dropped as too long)"


def _check_file(path: str | Path) -> Path:
    p = Path(path)
    if not p.exists():
        raise SlimeError(f"data file {str(p)!r} does not exist")
    if not p.is_file():
        raise SlimeError(f"data file {str(p)!r} is not a regular file")
    return p


# Bounds on one JSONL row, checked before anything else touches it: a line of gigabytes would be
# read whole, JSON nested 100k deep raises RecursionError inside the parser (and a few hundred
# levels inside copy.deepcopy later). Real prompt rows (chat messages, tools, metadata, inline
# images) stay far inside both.
MAX_LINE_BYTES = 64 * 1024**2
MAX_JSON_DEPTH = 64


def _iter_jsonl(path: str | Path) -> Iterator[tuple[str, dict]]:
    """Yield (`"line N"`, row) for each non-empty line of a JSONL file."""
    p = _check_file(path)
    try:
        f = p.open("rb")
    except OSError as e:
        raise SlimeError(f"cannot read data file {str(p)!r}: {e.strerror or e}") from e
    with f:
        lineno = 0
        while raw := f.readline(MAX_LINE_BYTES + 1):
            lineno += 1
            where = f"{p}: line {lineno}"
            if len(raw) > MAX_LINE_BYTES:
                raise SlimeError(f"{where}: longer than {MAX_LINE_BYTES // 1024**2} MiB; split the row or the file")
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")  # tolerate a BOM
            except UnicodeDecodeError as e:
                raise SlimeError(f"{where}: not valid UTF-8 ({e.reason} at byte {e.start})") from e
            if not line.strip():
                continue
            row = _loads_row(line, where)
            if not isinstance(row, dict):
                raise SlimeError(f"{where}: expected a JSON object, got {type(row).__name__}")
            yield f"line {lineno}", row


def _loads_row(text: str, where: str) -> Any:
    """`json.loads(text)` for a line a user (or their data pipeline) wrote: malformed JSON, nesting
    deeper than MAX_JSON_DEPTH and strings that are not valid Unicode (a lone surrogate such as
    "\\ud800", which JSON allows and every tokenizer refuses) raise SlimeError naming `where` and
    the key that holds the bad value."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise SlimeError(f"{where}: malformed JSON ({e.msg} at column {e.colno})") from e
    except RecursionError:
        raise SlimeError(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    _check_value(value, where)
    return value


def _check_value(value: Any, where: str, key: str | None = None) -> None:
    """Walk `value` (without recursion) and refuse nesting deeper than MAX_JSON_DEPTH and strings
    (keys included) that UTF-8 cannot encode; the message names the key path of the bad value."""
    stack: list[tuple[Any, str, int]] = [(value, repr(key) if key else "", 0)]
    while stack:
        v, at, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth >= MAX_JSON_DEPTH:
                raise SlimeError(f"{where}: {at or 'the row'} is nested deeper than {MAX_JSON_DEPTH} levels")
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for k, item in items:
                if isinstance(k, str):
                    _check_text(k, where, f"{at}[{k!r}]" if at else f"the key {k!r}")
                stack.append((item, f"{at}[{k!r}]" if at else repr(k), depth + 1))
        elif isinstance(v, str):
            _check_text(v, where, at or "the row")


def _check_text(s: str, where: str, at: str) -> None:
    if s.isascii():
        return
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise SlimeError(
            f"{where}: {at} is not valid Unicode ({e.reason}: {s[e.start]!r} at character {e.start}); "
            "fix the data: a tokenizer cannot encode it"
        ) from None


def _iter_parquet(path: str | Path) -> Iterator[tuple[str, dict]]:
    p = _check_file(path)
    try:
        import pyarrow.parquet as pq  # lazily: Parquet input only

        rows = pq.read_table(str(p)).to_pylist()
    except Exception as e:  # ArrowInvalid, OSError, ...
        raise SlimeError(f"cannot read Parquet file {str(p)!r}: {type(e).__name__}: {e}") from e
    for i, row in enumerate(rows):
        _check_value(row, f"{p}: row {i}")
        yield f"row {i}", row


def iter_rows(path: str | Path) -> Iterator[tuple[str, dict]]:
    """Yield (location, row) from a `.parquet` file or a JSONL file (any other extension)."""
    if str(path).endswith(".parquet"):
        return _iter_parquet(path)
    return _iter_jsonl(path)


def load_jsonl(path: str | Path) -> list[dict]:
    """All rows of a JSONL file (empty lines skipped); a malformed line names file and line."""
    return [row for _, row in _iter_jsonl(path)]


def _check_messages(messages: list, where: str, input_key: str) -> None:
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise SlimeError(
                f"{where}: {input_key!r} is a list, so it must hold chat messages "
                f"{{'role': ..., 'content': ...}}; item {i} is {m!r}"
            )


def _tools_of(row: dict, tool_key: str | None, where: str) -> list | None:
    if tool_key is None or row.get(tool_key) is None:
        return None
    tools = row[tool_key]
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as e:
            raise SlimeError(f"{where}: {tool_key!r} (--tool-key) is a string but not JSON: {e.msg}") from e
        except RecursionError:
            raise SlimeError(
                f"{where}: {tool_key!r} (--tool-key) is nested deeper than {MAX_JSON_DEPTH} levels"
            ) from None
        _check_value(tools, where, tool_key)
    if isinstance(tools, dict):
        tools = [tools]
    if not isinstance(tools, list):
        raise SlimeError(f"{where}: {tool_key!r} (--tool-key) must be a list of tools, got {type(tools).__name__}")
    return tools


def load_prompt_samples(
    path: str | Path,
    *,
    input_key: str,
    label_key: str | None = None,
    metadata_key: str | None = None,
    tool_key: str | None = None,
    tokenizer: Any = None,
    apply_chat_template: bool = False,
    apply_chat_template_kwargs: dict | None = None,
    max_prompt_len: int | None = None,
    check: Callable[[Sample], None] | None = None,
) -> PromptSamples:
    """Read a prompt file into `Sample`s (`prompt`, `label` as the file holds it, `metadata`).

    - `input_key` column: a string, or a list of chat messages. With `apply_chat_template`, a
      string becomes `[{"role": "user", "content": s}]` and the prompt is the rendered template
      (with the generation prompt); without it the value is kept as-is (a messages list stays a
      list). A conversation that already ends with an assistant turn is SFT data: there is no
      generation prompt to add, so it stays a messages list either way (the SFT rollout
      tokenizes it with its loss mask).
    - `label_key` column (if given) is required in every row; `metadata_key` (if given) is
      optional per row and must hold an object (or a JSON string of one).
    - `tool_key` column (if given; optional per row): a list of tool specs, or a JSON string of
      one; passed to the chat template as `tools=` and kept in `metadata["tools"]`.
    - With `max_prompt_len` and a `tokenizer`, prompts longer than that many tokens are dropped
      and counted in the result's `num_dropped`.
    - `check(sample)` (e.g. the reward's own check of its labels) raising ValueError stops the load
      with a `SlimeError` naming the file and row.
    """
    path = str(path)
    if apply_chat_template and tokenizer is None:
        raise SlimeError(f"loading {path!r}: --apply-chat-template needs a tokenizer (set --hf-checkpoint)")
    template_kwargs = dict(apply_chat_template_kwargs or {})
    out = PromptSamples(path=path)
    for loc, row in iter_rows(path):
        where = f"{path}: {loc}"
        for key, arg in ((input_key, "--input-key"), (label_key, "--label-key")):
            if key is not None and key not in row:
                raise SlimeError(f"{where}: no key {key!r} ({arg}); the row has keys {sorted(row)}")
        tools = _tools_of(row, tool_key, where)
        row_kwargs = dict(template_kwargs, tools=tools) if tools is not None else template_kwargs
        prompt = _prompt_of(row[input_key], where, input_key, tokenizer if apply_chat_template else None, row_kwargs)
        if max_prompt_len is not None and tokenizer is not None:
            text = (
                prompt
                if isinstance(prompt, str)
                else tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True, **row_kwargs)
            )
            if len(tokenizer.encode(text, add_special_tokens=False)) > max_prompt_len:
                out.num_dropped += 1
                continue
        metadata = _metadata_of(row, metadata_key, where)
        if tools is not None:
            metadata["tools"] = tools
        # the label column as the file holds it (a string, number, object, list ...), as slime keeps it:
        # a custom reward may read `sample.label["ground_truth"]`; the built-in ones convert what they grade
        label = copy.deepcopy(row[label_key]) if label_key is not None else None
        sample = Sample(prompt=prompt, label=label, metadata=metadata)
        if check is not None:
            try:
                check(sample)
            except ValueError as e:
                raise SlimeError(f"{where}: {e}") from None
        out.append(sample)
    return out


def _prompt_of(value: Any, where: str, input_key: str, template_tokenizer: Any, template_kwargs: dict) -> str | list:
    """The row's prompt: rendered with the chat template when a tokenizer is given for it, else as
    written. A conversation that already ends with an assistant turn is SFT data: there is no
    generation prompt to add, so it stays a messages list either way."""
    if isinstance(value, list):
        _check_messages(value, where, input_key)
    elif not isinstance(value, str):
        raise SlimeError(
            f"{where}: {input_key!r} must be a string or a list of chat messages, got {type(value).__name__}"
        )
    complete_conversation = isinstance(value, list) and bool(value) and value[-1].get("role") == "assistant"
    if template_tokenizer is None or complete_conversation:
        return copy.deepcopy(value)
    messages = [{"role": "user", "content": value}] if isinstance(value, str) else value
    try:
        return template_tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **template_kwargs
        )
    except Exception as e:
        raise SlimeError(f"{where}: applying the chat template failed: {type(e).__name__}: {e}") from e


def _metadata_of(row: dict, metadata_key: str | None, where: str) -> dict:
    """The row's metadata column: an object, or a JSON string of one; {} when absent."""
    if metadata_key is None or row.get(metadata_key) is None:
        return {}
    raw = row[metadata_key]
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except (json.JSONDecodeError, RecursionError):
            pass  # not an object in a string: refused below
        _check_value(raw, where, metadata_key)
    if not isinstance(raw, dict):
        raise SlimeError(f"{where}: {metadata_key!r} (--metadata-key) must be an object, got {type(raw).__name__}")
    return copy.deepcopy(raw)
