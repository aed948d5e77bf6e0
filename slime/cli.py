"""`slime <command>`: train (the RL loop; no arguments = the default job), train-async, serve, tiny-model,
make-data."""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Sequence

from slime.utils.misc import set_hub_env

USAGE = """usage: slime <command> [args]

commands:
  train        run RL training (slime's arguments; `slime train --help`).
               With neither --hf-checkpoint nor --prompt-data: the default job
               (tiny model + addition task, SFT warm start then GRPO, on CPU).
  train-async  the same loop one step off policy (slime's train_async.py): rollout
               k+1 is generated while step k trains; same arguments, no --colocate
  serve        start the built-in inference engine (SGLang's HTTP API)
  tiny-model   write a tiny random-init Hugging Face model with a local tokenizer
  make-data    write the bundled arithmetic task (train/eval/sft JSONL)
  report       write RUN_DIR/report.html: curves, rollout browser, run facts
               (one self-contained HTML file; `slime report RUN_DIR`)
"""


def main(argv: Sequence[str] | None = None) -> int:
    argv_given = argv
    argv = list(sys.argv[1:] if argv is None else argv)
    set_hub_env()  # before any command imports transformers
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    # Hooks are loaded by dotted path: modules in the working directory must import, as under
    # `python -m slime` (a console script does not put the working directory on sys.path).
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    # Each command imports only its own side: `slime serve` is the standalone engine and must not
    # load Ray or the trainer, and `slime tiny-model` / `make-data` start in a second.
    if cmd in ("train", "train-async") and {"-h", "--help", "--help-all"} & set(rest):
        # help needs the parser only, not Ray, transformers and the trainer (seconds of imports)
        from slime.arguments import parse_args

        parse_args(rest, prog=f"slime {cmd}")  # argparse prints the help and exits
        return 0
    if cmd == "train":
        from slime.default_job import is_default_job, run_default_job
        from slime.train import main as train_main

        return run_default_job(rest) if is_default_job(rest) else train_main(rest)
    if cmd == "train-async":
        from slime.train_async import main as train_async_main

        return train_async_main(rest)
    if cmd == "serve":
        from slime.engine.server import main as serve_main

        return serve_main(rest, from_command_line=argv_given is None) or 0
    if cmd == "tiny-model":
        from slime.data.tiny_model import main as tiny_main

        return tiny_main(rest) or 0
    if cmd == "make-data":
        from slime.data.arithmetic import main as data_main

        return data_main(rest) or 0
    if cmd == "report":
        from slime.arguments.parser import build_parser
        from slime.observability.report import main as report_main
        from slime.observability.report_args import defaults_of

        # the defaults tell a run's own settings from the rest, for runs that did not record them
        return report_main(rest, arg_defaults=defaults_of(build_parser()))
    close = difflib.get_close_matches(cmd, ["train", "train-async", "serve", "tiny-model", "make-data", "report"], n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    print(f"slime: unknown command {cmd!r}{hint}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
