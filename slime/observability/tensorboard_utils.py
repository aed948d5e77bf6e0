"""slime's `slime.observability.tensorboard_utils`: `_TensorboardAdapter`, one TensorBoard writer
per process, in the directory the run's metrics use (`slime.observability.metrics.tensorboard_dir`:
$TENSORBOARD_DIR, else `tensorboard_log/<--tb-project-name>/<--tb-experiment-name>`, else
`<run-dir>/tensorboard`). A hook's scalars land next to the trainer's, in their own event file.
"""

from __future__ import annotations

import logging
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

from slime.errors import SlimeError
from slime.observability.metrics import tensorboard_dir
from slime.utils.misc import SingletonMeta

__all__ = ["_TensorboardAdapter"]

logger = logging.getLogger(__name__)


class _TensorboardAdapter(metaclass=SingletonMeta):
    """`_TensorboardAdapter(args)` opens the writer on first call; later calls return the same
    adapter (their arguments ignored), as slime's singleton."""

    _writer = None

    def __init__(self, args: Namespace) -> None:
        if not args.use_tensorboard:
            raise SlimeError("_TensorboardAdapter: TensorBoard logging needs --use-tensorboard")
        self._initialize(args)

    def _initialize(self, args: Namespace) -> None:
        from torch.utils.tensorboard import SummaryWriter  # imported lazily: slow import

        directory = tensorboard_dir(args)
        directory.mkdir(parents=True, exist_ok=True)
        logger.info("Saving tensorboard log to %s.", directory)
        self.log_dir = directory
        self._writer = SummaryWriter(str(directory))

    def log(self, data: Mapping[str, Any], step: int) -> None:
        """One scalar per key at `step`."""
        for key, value in data.items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def finish(self) -> None:
        """Close the writer."""
        self._writer.close()
