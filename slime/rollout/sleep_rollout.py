"""slime's `--rollout-function-path slime.rollout.sleep_rollout.sleep`: a rollout that never returns.

slime uses it to keep the rollout side idle (for example while only the trainer is profiled or
debugged against `--load-debug-rollout-data`); it sleeps an hour at a time and logs each hour.
"""

from __future__ import annotations

import logging
import time
from argparse import Namespace
from typing import Any

logger = logging.getLogger(__name__)


def sleep(args: Namespace, rollout_id: int, data_source: Any, evaluation: bool = False) -> None:
    hours = 0
    while True:
        time.sleep(3600)
        hours += 1
        logger.info("rollout sleep for %d hours", hours)
