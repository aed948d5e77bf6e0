"""Ray start-up and placement: which bundle each trainer rank and engine lives in.

On a CPU machine a "GPU" slot is one worker process; bundles hold logical CPUs. Actual
thread counts are set explicitly per process (`slime.utils.threads`), because Ray's CPU
resources are only bookkeeping, and oversubscribed cores were measured to make torch ~30x slower.
"""

from __future__ import annotations

import logging
import os
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

import ray
from ray.util.placement_group import PlacementGroup, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from slime.utils.threads import available_cores

logger = logging.getLogger(__name__)

WORKER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_WAIT_POLICY": "PASSIVE",
}
AUTH_DOC = "https://docs.ray.io/en/latest/ray-security/token-auth.html"


def init_ray(args: Namespace) -> None:
    """Join `RAY_ADDRESS` if set, else start a local cluster sized for this job.

    Ray's token authentication stays on (RAY_AUTH_MODE=token) unless the user sets
    RAY_AUTH_MODE=disabled, which is honoured with a warning. The local cluster listens on
    127.0.0.1 only (GCS, raylet, agents, workers). Workers inherit the mode from the raylet's
    environment and read the token from the same place as the driver (~/.ray/auth_token unless
    RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH say otherwise).
    """
    if ray.is_initialized():
        return
    os.environ.update({k: v for k, v in WORKER_ENV.items() if k not in os.environ})
    # Hooks are loaded by dotted path inside actors: give workers the driver's import path.
    pythonpath = os.pathsep.join(dict.fromkeys([os.getcwd(), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]))
    runtime_env = {"env_vars": {**WORKER_ENV, "PYTHONPATH": pythonpath}}
    address = os.environ.get("RAY_ADDRESS")
    auth = _configure_auth(joining=bool(address))
    if address:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=True)
        return
    if auth:
        _ensure_private_token()
    _bind_to_loopback()
    # Logical CPUs: one per bundle plus headroom; real threads are budgeted separately.
    needed = num_bundles(args) + 1
    ray.init(
        address="local",  # always a fresh cluster: never attach to one some `ray start` left running
        _node_ip_address="127.0.0.1",
        num_cpus=max(available_cores(), needed),
        include_dashboard=False,
        runtime_env=runtime_env,
        log_to_driver=True,
        logging_level="WARNING",
        configure_logging=True,
    )


def _configure_auth(joining: bool) -> bool:
    """Keep Ray's token authentication on unless the user explicitly turned it off.

    Setting RAY_AUTH_MODE=token ourselves (rather than leaving it unset) is what Ray's
    ray.init() would do for a local cluster anyway, minus its start-up notice; for an explicit
    RAY_ADDRESS, Ray would not enable it on its own, so without this a driver could not join a
    cluster started with token auth.
    """
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None and mode.strip().lower() != "token":
        logger.warning(
            "RAY_AUTH_MODE=%s: Ray's token authentication is OFF. Anyone who can reach this Ray "
            "cluster's ports can run code as this user. Unset RAY_AUTH_MODE to keep it on (%s).",
            mode, AUTH_DOC,
        )
        return False
    os.environ["RAY_AUTH_MODE"] = "token"  # inherited by the raylet, hence by every worker
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")  # Ray caches its config: make this process see the mode now
    if joining and not AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True):
        raise RuntimeError(
            "RAY_ADDRESS is set and Ray token authentication is on, but no token was found. Copy the "
            f"cluster's token (`ray get-auth-token` on the head node) to {_default_token_path()} (mode 600), "
            "or point RAY_AUTH_TOKEN_PATH at it. For a cluster started without token auth, set "
            f"RAY_AUTH_MODE=disabled explicitly. See {AUTH_DOC}."
        )
    return True


def _ensure_private_token() -> None:
    """Create Ray's default token file readable by its owner only (Ray would create it with
    the umask's mode, often world-readable); tighten an existing one."""
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return
    path = _default_token_path()
    if not path.exists():
        from ray._private.authentication.authentication_token_generator import generate_new_authentication_token
        from ray._raylet import AuthenticationTokenLoader

        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another run on this machine made it just now
            return
        with os.fdopen(fd, "w") as f:
            f.write(generate_new_authentication_token())
        AuthenticationTokenLoader.instance().reset_cache()
        logger.info("Generated a Ray auth token at %s (mode 600)", path)
    elif path.stat().st_mode & 0o077 and path.stat().st_uid == os.getuid():
        path.chmod(0o600)
        logger.info("Ray auth token %s was readable by others: now mode 600", path)


def _default_token_path() -> Path:
    """Ray's own default token file (what `ray get-auth-token` and the Ray CLI read)."""
    return Path.home() / ".ray" / "auth_token"


def _bind_to_loopback() -> None:
    """Make the local cluster's node address 127.0.0.1, which Ray's servers then bind to.

    ray.init() turns a loopback `_node_ip_address` into the host's routable address unless Ray
    believes multi-node clusters are off (its Windows/macOS default): switch that off for this
    process (the constant was read at import) and for Ray's child processes (the environment).
    """
    from ray._private import ray_constants

    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def _slots(args: Namespace) -> tuple[int, int]:
    """(trainer ranks, engine slots) this run starts: --debug-rollout-only has no trainer,
    --debug-train-only no engines (slime's placement of its debug modes)."""
    return (0 if args.debug_rollout_only else args.actor_world_size,
            0 if args.debug_train_only else args.rollout_num_gpus)


def num_bundles(args: Namespace) -> int:
    actors, engines = _slots(args)
    if args.colocate:
        return max(actors, engines)
    return actors + engines


@dataclass
class Placement:
    pg: PlacementGroup
    actor_bundles: list[int]  # bundle index of each trainer rank
    engine_bundles: list[int]  # bundle index of each engine (its first slot)
    # Fractions of a bundle's logical CPU: colocated actors must fit together in one bundle.
    actor_cpus: float
    engine_cpus: float

    def strategy(self, bundle: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=bundle)


def create_placement(args: Namespace) -> Placement:
    n = num_bundles(args)
    pg = placement_group([{"CPU": 1} for _ in range(n)], strategy="PACK")
    ray.get(pg.ready(), timeout=120)
    actors, engines = _slots(args)
    actor_bundles = list(range(actors))
    first_engine = 0 if args.colocate else actors
    engine_bundles = [first_engine + i * args.rollout_num_gpus_per_engine
                      for i in range(engines // args.rollout_num_gpus_per_engine)]
    share = 0.4 if args.colocate else 0.9
    return Placement(pg, actor_bundles, engine_bundles, actor_cpus=share, engine_cpus=share)


def thread_budget(args: Namespace) -> tuple[int, int]:
    """(torch threads per trainer rank, threads per engine).

    The synchronous loop alternates rollout and training, so trainers and engines take
    turns on the cores: each side may use all of them, divided among its own processes.
    """
    cores = available_cores()
    train = args.train_num_threads or max(1, cores // args.actor_world_size)
    engine = max(1, cores // args.num_engines)
    return train, engine
