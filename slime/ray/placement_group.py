"""Ray start-up and placement: which bundle each trainer rank and engine lives in; and the builders
slime's train.py calls, with slime's names and signatures:

    pgs = create_placement_groups(args)
    rollout_manager, num_rollout_per_epoch = create_rollout_manager(args, pgs["rollout"])
    actor_model, critic_model = create_training_models(args, pgs, rollout_manager)

They build what `slime.train` builds: one `Placement` (a Ray placement group holding every trainer
rank and engine, as slime's one group holds every GPU), the `RolloutManager` actor with its engines
started, and the `RayTrainGroup` of trainer ranks, initialized (checkpoint loaded) and told the
engines' addresses. The objects are this repo's: their methods are `slime.train`'s
(`rollout_manager.generate.remote(id)`, `actor_model.train(id, ref)`), not Megatron's actor API.
The critic, with --use-critic, trains inside the trainer ranks here, so `critic_model` is None.

On a CPU machine a "GPU" slot is one worker process; bundles hold logical CPUs. Actual
thread counts are set explicitly per process (`slime.runtime.threads`), because Ray's CPU
resources are only bookkeeping, and oversubscribed cores were measured to make torch ~30x slower.
"""

from __future__ import annotations

import logging
import os
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from slime.arguments import set_num_rollout
from slime.engine.args import passthrough_value
from slime.errors import SlimeError
from slime.ray.placement import Placement as Placement  # the data lives there; slime's path keeps the names
from slime.ray.placement import ProcessPlace as ProcessPlace
from slime.ray.placement import thread_budget as thread_budget
from slime.ray.rollout import RolloutManager
from slime.ray.train_group import RayTrainGroup
from slime.runtime.core_lending import Lender, lending_file
from slime.runtime.cores import node_cores, split_cores
from slime.runtime.mkl_vendor import cpu_info, preload_env
from slime.runtime.threads import available_cores
from slime.utils.misc import HUB_ENV, load_function

logger = logging.getLogger(__name__)
PLACEMENT_TIMEOUT_S = 120

WORKER_ENV = {
    **HUB_ENV,
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_WAIT_POLICY": "PASSIVE",
}
AUTH_DOC = "https://docs.ray.io/en/latest/ray-security/token-auth.html"


def plain_logs_when_redirected() -> None:
    """Ray colours the `(Actor pid=...)` prefix of the worker lines it prints here; into a file or a
    pipe those are escape codes, not colours (RAY_COLOR_PREFIX=0, unless the user set it)."""
    if not sys.stdout.isatty():
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")


def init_ray(args: Namespace) -> bool:
    """Join `RAY_ADDRESS` if set, else start a local cluster sized for this job; returns whether
    this call did either. When Ray is already initialized in this process (an earlier stage of the
    job, or a caller that runs several jobs in one cluster) it is used as it is, and False says
    the caller does not own it: it releases only what it created.

    Ray's token authentication stays on (RAY_AUTH_MODE=token) unless the user sets
    RAY_AUTH_MODE=disabled, which is honoured with a warning. The local cluster listens on
    127.0.0.1 only (GCS, raylet, agents, workers). Workers inherit the mode from the raylet's
    environment and read the token from the same place as the driver (~/.ray/auth_token unless
    RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH say otherwise).
    """
    if ray.is_initialized():
        return False
    os.environ.update({k: v for k, v in WORKER_ENV.items() if k not in os.environ})
    plain_logs_when_redirected()
    # Hooks are loaded by dotted path inside actors: give workers the driver's import path.
    pythonpath = os.pathsep.join(
        dict.fromkeys([os.getcwd(), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
    )
    runtime_env = {"env_vars": {**WORKER_ENV, "PYTHONPATH": pythonpath}}
    address = os.environ.get("RAY_ADDRESS")
    auth = _configure_auth(joining=bool(address))
    if address:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=True)
        total, per_node = _cluster_cpus()
        check_fits(args, total, f"the Ray cluster at RAY_ADDRESS={address} has {total:g} CPU ({per_node})")
        return True
    # before Ray starts: a local cluster has this machine's cores
    cores = available_cores()
    check_fits(args, cores, f"this machine has {cores} core(s) (os.sched_getaffinity; a remote cluster: RAY_ADDRESS)")
    shim = preload_env(args.mkl_vendor_shim)  # built here: the workers of a local cluster run here
    if shim:
        runtime_env["env_vars"].update(shim)
        print(
            "[slime] MKL vendor shim preloaded into this run's Ray workers and engines: MKL picks its matrix "
            f"kernels by this {cpu_info().get('vendor_id')} CPU's instruction sets (--no-mkl-vendor-shim: off)",
            flush=True,
        )
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
    return True


def _configure_auth(joining: bool) -> bool:
    """Keep Ray's token authentication on unless the user explicitly turned it off.

    Setting RAY_AUTH_MODE=token ourselves (rather than leaving it unset) is what Ray's
    ray.init() would do for a local cluster anyway, minus its start-up notice; for an explicit
    RAY_ADDRESS, Ray would not enable it on its own, so without this a driver could not join a
    cluster started with token auth.
    """
    from ray._raylet import AuthenticationTokenLoader, Config

    mode = os.environ.get("RAY_AUTH_MODE")
    enabled = mode is None or mode.strip().lower() == "token"
    if enabled:
        os.environ["RAY_AUTH_MODE"] = "token"  # inherited by the raylet, hence by every worker
    else:
        logger.warning(
            "RAY_AUTH_MODE=%s: Ray's token authentication is OFF. Anyone who can reach this Ray "
            "cluster's ports can run code as this user. Unset RAY_AUTH_MODE to keep it on (%s).",
            mode,
            AUTH_DOC,
        )
    # Ray caches its config and token per process: make this process see the mode of the cluster it
    # starts or joins now, in both directions. A process that ran a cluster before (an earlier stage,
    # a test) would otherwise keep that cluster's mode, and a driver that still expects a token from
    # a cluster started without one has every actor it creates destroyed at once (the cluster's
    # "is this actor still referenced?" call is refused), and would present a stale token to the
    # cluster RAY_ADDRESS / RAY_AUTH_TOKEN_PATH name now.
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
    if not enabled:
        return False
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
    return (
        0 if args.debug_rollout_only else args.actor_world_size,
        0 if args.debug_train_only else args.rollout_num_gpus,
    )


def num_bundles(args: Namespace) -> int:
    actors, engines = _slots(args)
    if args.colocate:
        return max(actors, engines)
    return actors + engines


def describe_request(args: Namespace) -> str:
    """What the command line asks for, in slime's option names."""
    actors, engines = _slots(args)
    trainer = (
        f"{actors} trainer rank(s) (--actor-num-nodes {args.actor_num_nodes} x --actor-num-gpus-per-node "
        f"{args.actor_num_gpus_per_node})"
        if actors
        else "no trainer"
    )
    rollout = (
        f"{engines} engine slot(s) (--rollout-num-gpus {args.rollout_num_gpus}, "
        f"--rollout-num-gpus-per-engine {args.rollout_num_gpus_per_engine})"
        if engines
        else "no engines"
    )
    how = (
        "--colocate: trainer and engines take turns on the same cores, so the larger side counts"
        if args.colocate
        else "disaggregated: one core at least per trainer rank and per engine slot"
    )
    return f"{trainer} and {rollout}; {how}: {num_bundles(args)} core(s) needed"


def check_fits(args: Namespace, cores: float, where: str) -> None:
    """Stop before anything starts when the run needs more cores (a CPU "GPU" is one) than there are."""
    if num_bundles(args) > cores:
        raise SlimeError(
            f"cannot place this run: {describe_request(args)}, but {where}. Use fewer trainer ranks or engine "
            f"slots, --colocate (both sides take turns on the same cores), or a larger cluster (RAY_ADDRESS)"
        )


def _cluster_cpus() -> tuple[float, str]:
    """(total CPUs, "node ip (id): n CPU, ...") of the Ray cluster this process joined."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    per_node = ", ".join(
        f"{n['NodeManagerAddress']} ({n['NodeID'][:8]}): {n['Resources'].get('CPU', 0):g} CPU" for n in nodes
    )
    return ray.cluster_resources().get("CPU", 0.0), per_node


@ray.remote(num_cpus=0)
def _probe_node() -> tuple[str, list[int]]:
    return ray.get_runtime_context().get_node_id(), node_cores()


def _node_cores(node_ids: list[str], local: bool) -> dict[str, tuple[int, ...]]:
    """The cores each node's processes may run on: this process's own on a local cluster (its
    workers inherit them), else asked on each node."""
    if local:
        return {n: tuple(node_cores()) for n in node_ids}
    refs = [
        _probe_node.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
        for n in node_ids
    ]
    return {n: tuple(cores) for n, cores in ray.get(refs, timeout=PLACEMENT_TIMEOUT_S)}


def create_placement(args: Namespace) -> Placement:
    """One placement group of a CPU bundle per slot (slime: one GPU bundle per slot, PACK), its
    bundles ordered by node as slime orders them; trainer ranks take the first, engines the rest
    (colocated: the same ones). Each process gets a share of its node's cores (`ProcessPlace`):
    disaggregated, all processes of a node split its cores; colocated, each side splits them (the
    two sides take turns). The plan is printed; the rollout manager hands each engine its place
    (`ProcessPlace`: cores, threads, lending file), read where it starts (`slime.ray.engine_launch.start_engine`)."""
    n = num_bundles(args)
    pg = placement_group([{"CPU": 1} for _ in range(n)], strategy="PACK")
    if not ray.wait([pg.ready()], timeout=PLACEMENT_TIMEOUT_S)[0]:
        total, per_node = _cluster_cpus()
        remove_placement_group(pg)
        raise SlimeError(
            f"cannot place this run within {PLACEMENT_TIMEOUT_S} s: {describe_request(args)}; the Ray "
            f"cluster has {total:g} CPU in all ({per_node}), some of them possibly in use"
        )
    bundle_node = ray.util.placement_group_table(pg)["bundles_to_node_id"]
    ips = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
    # slime's order: by node address, then (here) node id; bundle indices within a node kept
    order = sorted(range(n), key=lambda b: (_ip_key(ips.get(bundle_node[b], "")), bundle_node[b], b))
    actors, engines = _slots(args)
    per = args.rollout_num_gpus_per_engine
    first_engine = 0 if args.colocate else actors
    engine_slots = [order[first_engine + i * per : first_engine + (i + 1) * per] for i in range(engines // per)]
    for rank, slots in enumerate(engine_slots):
        if len({bundle_node[b] for b in slots}) > 1:
            remove_placement_group(pg)
            raise SlimeError(
                f"engine {rank}'s --rollout-num-gpus-per-engine {per} slots landed on different nodes "
                f"({sorted({ips.get(bundle_node[b], '?') for b in slots})}); an engine is one process on one node: "
                f"make --rollout-num-gpus-per-engine fit in one node's CPUs"
            )
    share = 0.4 if args.colocate else 0.9
    placement = Placement(
        pg, [order[i] for i in range(actors)], [s[0] for s in engine_slots], actor_cpus=share, engine_cpus=share
    )
    units = [("trainer", f"trainer rank {r}", [order[r]]) for r in range(actors)]
    units += [("engine", f"engine {e}", slots) for e, slots in enumerate(engine_slots)]
    cores = _node_cores(sorted({bundle_node[b] for b in range(n)}), local=not os.environ.get("RAY_ADDRESS"))
    places = _assign_cores(args, units, bundle_node, ips, cores)
    placement.actors, placement.engines = places[:actors], places[actors:]
    plan_core_lending(args, placement.actors, placement.engines)
    print("[slime] placement (on CPU a 'GPU' slot is a share of a node's cores):", flush=True)
    for line in placement.summary():
        print(f"[slime]   {line}", flush=True)
    return placement


def _ip_key(ip: str) -> tuple:
    try:
        return tuple(int(x) for x in ip.split("."))
    except ValueError:
        return tuple(ord(c) for c in ip)


def _assign_cores(
    args: Namespace,
    units: list[tuple[str, str, list[int]]],
    bundle_node: dict,
    ips: dict[str, str],
    cores: dict[str, tuple[int, ...]],
) -> list[ProcessPlace]:
    """Split each node's cores among the processes sharing them, in proportion to their slots."""
    groups = [["trainer"], ["engine"]] if args.colocate else [["trainer", "engine"]]
    user_engine_threads = passthrough_value(list(args.sglang_args), "--num-threads")
    places: dict[int, ProcessPlace] = {}
    for kinds in groups:
        mine = [i for i, u in enumerate(units) if u[0] in kinds]
        for node in dict.fromkeys(bundle_node[units[i][2][0]] for i in mine):
            here = [i for i in mine if bundle_node[units[i][2][0]] == node]
            weights = [len(units[i][2]) for i in here]
            shares = split_cores(cores[node], weights)
            for j, i in enumerate(here):
                kind, role, _ = units[i]
                if shares is not None:
                    share, threads = shares[j], len(shares[j])
                else:  # fewer cores than processes (e.g. two Ray nodes on one machine): shared, unpinned
                    share, threads = None, max(1, len(cores[node]) * weights[j] // sum(weights))
                if kind == "trainer" and args.train_num_threads:
                    threads = args.train_num_threads
                if kind == "engine" and user_engine_threads:
                    threads = int(user_engine_threads)
                places[i] = ProcessPlace(role, node, ips.get(node, "?"), share, cores[node], threads)
    return [places[i] for i in range(len(units))]


def plan_core_lending(args: Namespace, actors: list[ProcessPlace], engines: list[ProcessPlace]) -> list[str | None]:
    """Disaggregated on the CPU (`slime.runtime.core_lending`): each built-in engine lends its pinned
    cores, while it is idle, to one trainer rank on its node (the node's ranks in turn). Sets each
    rank's `lenders` and each lending engine's `lend_file`; returns each engine's file (None: it
    lends nothing). Colocated, each side already has every core while the other waits; an SGLang
    engine's slots are GPUs."""
    files: list[str | None] = [None] * len(engines)
    if args.colocate or args.rollout_backend == "sglang" or not args.lend_idle_cores:
        return files
    for node in dict.fromkeys(a.node_id for a in actors):
        ranks = [a for a in actors if a.node_id == node and a.cores]
        mine = [e for e, p in enumerate(engines) if p.node_id == node and p.cores]
        for i, e in enumerate(mine if ranks else []):
            files[e] = engines[e].lend_file = lending_file(args.run_dir, e)
            ranks[i % len(ranks)].lenders.append(Lender(files[e], tuple(engines[e].cores)))
    return files


# ---------------------------------------------------------------------- slime's train.py builders
def create_placement_groups(args: Namespace) -> dict[str, Placement | None]:
    """slime's role -> placement map. One placement serves every role (slime also shares one
    placement group among them); "critic" is the actor's with --use-critic, else None. Starts
    (or joins) Ray first when the caller has not."""
    if not ray.is_initialized():
        init_ray(args)
    placement = create_placement(args)
    return {"actor": placement, "rollout": placement, "critic": placement if args.use_critic else None}


def _count_rollouts_per_epoch(args: Namespace) -> int:
    """--num-epoch without --num-rollout: the data source's prompts // --rollout-batch-size, and
    --num-rollout set from it (slime asks its rollout manager for the same count)."""
    source = load_function(args.data_source_path, arg_name="--data-source-path")(args)
    num_prompts = len(source)
    set_num_rollout(args, num_prompts)
    return num_prompts // args.rollout_batch_size


def create_rollout_manager(args: Namespace, pg: Placement) -> tuple[Any, int | None]:
    """(the RolloutManager actor, its engines started; rollouts per epoch, or None when --num-rollout
    was given), as slime returns them. The engines stay loaded: slime offloads them here to give
    the GPUs to the trainer's start-up and onloads them with its own calls before the first weight
    update; on CPU there is nothing to give, and this manager offloads around each train step
    itself (slime.train), so a rollout can be asked for right after the builders."""
    num_rollout_per_epoch = _count_rollouts_per_epoch(args) if args.num_rollout is None else None
    rollout_manager = RolloutManager.options(num_cpus=0).remote(args, pg)
    ray.get(rollout_manager.init.remote())  # engines (and router) started, data position resumed
    return rollout_manager, num_rollout_per_epoch


def create_actor_model(
    args: Namespace, pgs: dict[str, Placement | None], rollout_manager: Any, actor_cls: Any = None
) -> tuple[RayTrainGroup, list[int]]:
    """(the trainer ranks, initialized; each rank's start rollout id), as slime's."""
    if actor_cls is not None:
        raise SlimeError(
            "create_actor_model(actor_cls=...): a custom Megatron actor class has no counterpart here; "
            "the trainer ranks are slime.backends.torch's"
        )
    actor_model = RayTrainGroup(args, pgs["actor"])
    start = actor_model.init()  # the --load checkpoint's rollout + 1, else 0
    actor_model.connect_rollout(ray.get(rollout_manager.get_engine_urls.remote()))
    return actor_model, [start] * len(actor_model.actors)


def create_training_models(
    args: Namespace, pgs: dict[str, Placement | None], rollout_manager: Any, actor_cls: Any = None
) -> tuple[RayTrainGroup, None]:
    """(actor_model, critic_model) as slime's; sets --start-rollout-id from the checkpoint when
    unset (slime's rule). critic_model is None: a --use-critic critic lives in the trainer ranks."""
    actor_model, start_ids = create_actor_model(args, pgs, rollout_manager, actor_cls=actor_cls)
    if args.start_rollout_id is None:
        args.start_rollout_id = start_ids[0]
    return actor_model, None
