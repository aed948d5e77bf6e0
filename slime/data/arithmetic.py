"""The bundled verifiable task: integer addition, small enough for the tiny model.

`write_arithmetic_dataset(out_dir)` writes
- `train.jsonl`, `eval.jsonl`: prompt rows `{"prompt": "57+8=", "label": "65"}` (RL data; the
  `math` reward model grades the last `\\boxed{...}` of a response against `label`);
- `sft.jsonl`: the train problems in slime's SFT format
  `{"messages": [{"role": "user", "content": "57+8="}, {"role": "assistant", "content": "\\\\boxed{65}"}]}`.

Eval problems are held out from train (disjoint) whenever the problem space allows it.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path

from slime.errors import SlimeError

# difficulty -> (max a, max b); operands are drawn from 0..max
DIFFICULTIES: dict[int, tuple[int, int]] = {
    1: (9, 9),
    2: (99, 9),
    3: (99, 99),
    4: (999, 999),
}
DEFAULT_DIFFICULTY = 2
MAX_DEFAULT_TRAIN = 10_000
MAX_DEFAULT_EVAL = 200


def num_problems(difficulty: int) -> int:
    """Size of the problem space of a difficulty level."""
    a_max, b_max = _bounds(difficulty)
    return (a_max + 1) * (b_max + 1)


def make_prompt(a: int, b: int) -> str:
    return f"{a}+{b}="


def make_answer(total: int | str) -> str:
    """The assistant's answer text in the SFT data (and what the reward model looks for)."""
    return f"\\boxed{{{total}}}"


def _bounds(difficulty: int) -> tuple[int, int]:
    if difficulty not in DIFFICULTIES:
        raise SlimeError(
            f"--difficulty {difficulty!r} is not a known level; choose one of "
            + ", ".join(f"{d} (a<={a}, b<={b})" for d, (a, b) in DIFFICULTIES.items())
        )
    return DIFFICULTIES[difficulty]


def _problem(i: int, b_max: int) -> tuple[int, int]:
    return divmod(i, b_max + 1)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def write_arithmetic_dataset(
    out_dir: str | Path,
    *,
    difficulty: int = DEFAULT_DIFFICULTY,
    num_train: int | None = None,
    num_eval: int | None = None,
    seed: int = 0,
) -> dict[str, Path]:
    """Write train/eval/sft JSONL files for addition at `difficulty`; return their paths.

    Defaults: `num_eval = min(200, space // 5)` distinct problems held out, and
    `num_train = min(10000, space - num_eval)`. Train problems never include an eval problem;
    if more train rows are asked for than there are remaining problems, the remaining problems
    repeat (reshuffled each pass).
    """
    a_max, b_max = _bounds(difficulty)
    space = (a_max + 1) * (b_max + 1)
    if num_eval is None:
        num_eval = min(MAX_DEFAULT_EVAL, space // 5)
    if not isinstance(num_eval, int) or num_eval < 0 or num_eval >= space:
        raise SlimeError(
            f"--num-eval {num_eval!r} must be between 0 and {space - 1}: difficulty {difficulty} has only "
            f"{space} distinct problems and train needs at least one that eval does not hold"
        )
    if num_train is None:
        num_train = min(MAX_DEFAULT_TRAIN, space - num_eval)
    if not isinstance(num_train, int) or num_train <= 0:
        raise SlimeError(f"--num-train {num_train!r} must be a positive integer")

    rng = random.Random(seed)
    picked = rng.sample(range(space), min(space, num_eval + num_train))
    eval_ids, pool = picked[:num_eval], picked[num_eval:]
    if len(pool) < num_train:  # the whole space was drawn: pool is every non-eval problem
        train_ids = list(pool)
        while len(train_ids) < num_train:
            again = list(pool)
            rng.shuffle(again)
            train_ids.extend(again[: num_train - len(train_ids)])
    else:
        train_ids = pool

    def rows(ids: list[int]) -> list[dict]:
        out = []
        for i in ids:
            a, b = _problem(i, b_max)
            out.append({"prompt": make_prompt(a, b), "label": str(a + b)})
        return out

    train_rows, eval_rows = rows(train_ids), rows(eval_ids)
    sft_rows = [
        {
            "messages": [
                {"role": "user", "content": r["prompt"]},
                {"role": "assistant", "content": make_answer(r["label"])},
            ]
        }
        for r in train_rows
    ]

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise SlimeError(f"--out {str(out)!r} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    paths = {"train": out / "train.jsonl", "eval": out / "eval.jsonl", "sft": out / "sft.jsonl"}
    _write_jsonl(paths["train"], train_rows)
    _write_jsonl(paths["eval"], eval_rows)
    _write_jsonl(paths["sft"], sft_rows)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="slime make-data", description="Write the bundled addition task (train/eval/sft JSONL)."
    )
    p.add_argument("--out", required=True, help="Output directory.")
    p.add_argument(
        "--difficulty",
        type=int,
        default=DEFAULT_DIFFICULTY,
        choices=sorted(DIFFICULTIES),
        help="1: a,b<=9; 2: a<=99, b<=9; 3: a,b<=99; 4: a,b<=999.",
    )
    p.add_argument("--num-train", type=int, default=None, help="Default: min(10000, problems not held out).")
    p.add_argument("--num-eval", type=int, default=None, help="Default: min(200, problems // 5).")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    paths = write_arithmetic_dataset(
        a.out, difficulty=a.difficulty, num_train=a.num_train, num_eval=a.num_eval, seed=a.seed
    )
    for name, path in paths.items():
        with path.open() as f:
            n = sum(1 for _ in f)
        print(f"{name}: {n} rows -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
