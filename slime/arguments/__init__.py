"""slime's command-line arguments, one file per concern, composed into one parser.

| file           | options                                                                    |
|----------------|----------------------------------------------------------------------------|
| `cluster.py`   | trainer ranks, engine slots, colocation, train backend                     |
| `rollout.py`   | samples per rollout, sampling, generate/filter/reward hooks, rewards       |
| `data.py`      | prompt data, chat template, data source and Data Buffer filter             |
| `evaluation.py`| evaluation data sets and sampling                                          |
| `engine.py`    | rollout backend, weight sync, router, `--sglang-*` pass-through            |
| `logs.py`      | run directory, TensorBoard, weight-sync check                              |
| `training.py`  | checkpoints, batching, optimizer and LR schedule                           |
| `algorithm.py` | advantage estimators, losses, KL, TIS/OPSM, critic, distillation           |
| `debug.py`     | debug modes and dumps (rollout-only, train-only, replay), CI checks        |
| `upstream.py`  | slime's other options (data: `slime_upstream.json`): not used / not built  |
| `megatron.py`  | Megatron-LM's options (data: `megatron_lm.json`), model-shape checks       |
| `from_data.py` | adding options from those tables                                           |

A new option goes into the file of its concern, with its default there and nowhere else.
"""

from slime.arguments.data import DEFAULT_DATA_SOURCE
from slime.arguments.parser import (
    build_parser,
    finalize_args,
    parse_args,
    save_args,
    set_num_rollout,
    startup_notes,
    to_argv,
)
from slime.arguments.rollout import DEFAULT_ROLLOUT_FUNCTION

__all__ = [
    "DEFAULT_DATA_SOURCE",
    "DEFAULT_ROLLOUT_FUNCTION",
    "build_parser",
    "finalize_args",
    "parse_args",
    "save_args",
    "set_num_rollout",
    "startup_notes",
    "to_argv",
]
