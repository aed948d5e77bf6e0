"""Run one of slime's launch scripts here, at the size of a CPU test: the script itself runs under
bash (scripts/check_slime_scripts.py's stand-ins record its `train.py` / `train_async.py` command
line and any `python -m sglang.launch_server` it starts beside the run), then what it recorded is
started for real, with only what names the machine changed:

* the model: every model-config block the script sources (scripts/models/*.sh) is the bundled
  tiny model's, and the checkpoint options (`--hf-checkpoint`, `--ref-load`, `--opd-teacher-load`)
  point at local tiny models;
* the data and sizes: `--prompt-data`, rollout counts and lengths, batch sizes, the GPU counts
  (one trainer rank and one engine unless asked otherwise);
* servers the script starts: `slime serve` in place of `sglang.launch_server`, with the script's
  own arguments (SGLang's options it has no use for are named at its start-up) on a free loopback
  port, and the script's URLs of that server pointed at it.

Every other option is the script's, as slime's own parser would read it."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from slime.engine.args import passthrough_value, passthrough_without
from slime.ray.engine_process import EngineProcess
from tests.compat.slime_scripts import TINY_MODEL
from tests.examples.slime_mirror import extract

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import check_slime_scripts  # noqa: E402  (a script, not a package)

# A CPU test's size: two rollouts of 4 prompts x 2 samples, 8 new tokens each, one step a rollout
# (each replaces the script's value where it sets one), on one trainer rank and one engine.
SMALL = {
    "--num-rollout": "2",
    "--rollout-batch-size": "4",
    "--n-samples-per-prompt": "2",
    "--rollout-max-response-len": "8",
    "--global-batch-size": "8",
    "--max-tokens-per-gpu": "1024",
}
ONE_RANK_ONE_ENGINE = {
    "--actor-num-gpus-per-node": "1",
    "--rollout-num-gpus": "1",
    "--rollout-num-gpus-per-engine": "1",
}


@dataclass
class Replay:
    tree: Path  # slime's examples and scripts, extracted; the run's working directory
    entry: str  # train.py or train_async.py
    argv: list[str]  # the script's command line, as changed above
    servers: list[EngineProcess] = field(default_factory=list)

    @property
    def command(self) -> str:
        """The `slime` command for the script's entry point."""
        return "train-async" if self.entry.endswith("train_async.py") else "train"

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


def set_option(argv: list[str], option: str, value: str | None) -> list[str]:
    """`argv` with `option`'s value replaced (added when absent); None removes it."""
    out = passthrough_without(argv, {option})
    return out if value is None else [*out, option, value]


def replay(
    tmp_path: Path,
    script: str,
    *,
    model: Path,
    data: Path,
    server_model: Path | None = None,
    paths: dict[str, str] | None = None,
    size: dict[str, str] | None = None,
    flags: tuple[str, ...] = (),
) -> Replay:
    """Run `script` (a path in slime's tree) under bash with the stand-ins, start the servers it
    starts (`server_model` served), and return its training command line changed as above.
    `paths`: more options naming local paths (`--opd-teacher-load`); `size`: options set last
    (`--actor-num-gpus-per-node 2` for two trainer ranks); `flags`: flags added (`--colocate`,
    where two trainer ranks and an engine must share this machine's two cores)."""
    (tmp_path / "slime").mkdir()
    tree = extract(tmp_path / "slime", "examples", "scripts")
    block = "MODEL_ARGS=(" + " ".join(TINY_MODEL) + ")\n"
    for model_block in (tree / "scripts" / "models").glob("*.sh"):
        model_block.write_text(block)
    work = tmp_path / "capture"
    _, _, tail = check_slime_scripts.capture(tree, tree / script, work)
    launches = check_slime_scripts.recorded(work, "launch")
    assert len(launches) == 1, f"{script}: {len(launches)} launches recorded ({tail})"
    entry, *argv = launches[0]
    out = Replay(tree, entry, [])
    try:
        for _, *recorded in check_slime_scripts.recorded(work, "server"):
            assert server_model is not None, f"{script} starts a server: give server_model"
            server = EngineProcess.start(
                server_model,
                extra_args=passthrough_without(recorded, {"--model-path", "--host", "--port"}),
                log_path=tmp_path / "server.log",
            ).wait_until_healthy()
            out.servers.append(server)
            # the script's URLs of this server (`--rm-url http://$TEACHER_IP:$TEACHER_PORT/generate`)
            port = re.escape(passthrough_value(recorded, "--port") or "30000")
            argv = [re.sub(rf"^http://[^/]+:{port}(?=/|$)", server.url, a) for a in argv]
        argv = set_option(argv, "--load", None)  # a checkpoint on the script's machine
        for option, value in SMALL.items():
            if option in argv:
                argv = set_option(argv, option, value)
        changes = {"--hf-checkpoint": str(model), "--ref-load": str(model), "--prompt-data": str(data)}
        changes |= {"--save": str(tmp_path / "ckpt"), **(paths or {}), **ONE_RANK_ONE_ENGINE, **(size or {})}
        for option, value in changes.items():
            argv = set_option(argv, option, value)
        out.argv = [*argv, *(f for f in flags if f not in argv)]
        return out
    except BaseException:
        out.stop()
        raise
