"""What a run leaves behind: its run directory, metrics, TensorBoard, and the weight-sync check."""

from __future__ import annotations

import argparse
import os
import time


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("logging")
    g.add_argument("--run-dir", type=str, default=None, help="Default: runs/<timestamp>.")
    g.add_argument("--use-tensorboard", action="store_true")
    g.add_argument("--check-weight-update-equal", action="store_true",
                   help="After each weight sync, compare engine and trainer log-probs on a fixed sequence.")
    g.add_argument("--stage", type=str, default=None, help="Stage name written with every metrics row.")


def finalize(args: argparse.Namespace) -> None:
    if args.run_dir is None:
        args.run_dir = os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
