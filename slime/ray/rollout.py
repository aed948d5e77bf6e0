"""The rollout side as Ray actors: engine servers, and the manager that drives them.

* `EngineActor` (`slime.ray.model_fleet`) is placed by Ray in its bundle and owns one engine
  server process (the built-in engine on CPU); the process exits if its owner dies (no orphans).
* `RolloutManager` owns the data source, the engines and the rollout function, and turns a
  rollout into train data: `generate(rollout_id) -> (train_data, metrics)`. Its `engines` /
  `engine_urls` are the policy's: what rollouts, weight syncs, offload and recovery act on; the
  other models of `--sglang-config` (`frozen`) have their own routers and are never synced.
"""

from __future__ import annotations

import inspect
import logging
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

import ray

from slime.data.data_source import RolloutDataSource
from slime.data.data_source import resume as resume_data
from slime.engine.client import client_for
from slime.engine.client import set_default_timeout as set_engine_timeout
from slime.errors import SlimeError
from slime.observability.debug_data import load_rollout_data as load_debug_rollout_data
from slime.observability.debug_data import save_rollout_data as save_debug_rollout_data
from slime.observability.sample_log import write_eval_samples, write_rollout_samples
from slime.observability.trace_timeline import save_rollout_trace
from slime.ray.engine_watcher import EngineWatcher, start_watcher
from slime.ray.model_fleet import FrozenModel, launch_models
from slime.ray.placement import Placement, thread_budget
from slime.ray.router import start_router
from slime.rollout.base_types import unwrap_eval_output, unwrap_train_output
from slime.rollout.failure_report import report_failures
from slime.rollout.generation import set_engine_urls
from slime.rollout.sample_hooks import set_current_rollout_id
from slime.rollout.train_data import (
    eval_metrics,
    rollout_metrics,
    samples_to_train_data,
)
from slime.utils.api_keys import register as register_keys
from slime.utils.async_utils import run
from slime.utils.checkpoint_layout import ROLLOUT_STATE_FILE, halt_point, weight_snapshot_dir, weight_snapshot_version
from slime.utils.http_utils import configure as configure_requests
from slime.utils.http_utils import server_lost
from slime.utils.misc import load_function
from slime.utils.types import Sample

logger = logging.getLogger(__name__)


class RolloutFailed(SlimeError):
    """Too many of a rollout's samples FAILED. `server_lost`: some of them failed because the engine
    or router their request went to was unreachable, hung or answered 5xx."""

    def __init__(self, message: str, server_lost: bool = False):
        super().__init__(message)
        self.server_lost = server_lost


def rollout_lost_server(e: BaseException) -> bool:
    """Whether a rollout's error comes from an engine or router that is gone or broken (what
    --use-fault-tolerance would have restarted), told by the error's type, never by its text."""
    return e.server_lost if isinstance(e, RolloutFailed) else server_lost(e)


def check_failed_samples(groups: list[list[Any]], rollout_id: int, max_ratio: float) -> None:
    """Stop the run when too many of a rollout's samples FAILED (a broken hook or reward service).

    Up to `--max-failed-sample-ratio` of the samples may fail (they are kept, never trained on, and
    counted in `rollout/status/failed`; `report_failures` has said them, a line per distinct error);
    above it, or when every sample failed, the run stops and names the first error.
    """
    samples = [s for g in groups for s in g]
    failed = [s for s in samples if s.status == Sample.Status.FAILED]
    if not samples or not failed:
        return
    ratio = len(failed) / len(samples)
    if ratio > max_ratio or len(failed) == len(samples):
        first = failed[0].metadata.get("error", "no error recorded")
        raise RolloutFailed(
            f"rollout {rollout_id}: {len(failed)} of {len(samples)} samples FAILED ({ratio:.0%}), more than "
            f"--max-failed-sample-ratio {max_ratio:g} allows; first error: {first}",
            server_lost=any(s.metadata.get("server_lost") for s in failed),
        )


def sample_weight_version(sample: Sample) -> int | None:
    """The oldest weight version that generated tokens of `sample` (the loop names versions by
    rollout id: version k is pushed before rollout k); None when the engine reported none."""
    versions = []
    for v in sample.weight_versions or []:
        try:
            versions.append(int(str(v)))
        except ValueError:
            pass
    return min(versions) if versions else None


def staleness_metrics(rollout_id: int, samples: list[Sample]) -> dict[str, float]:
    """`rollout/staleness/mean|max`: how many weight updates behind rollout `rollout_id` the
    weights that generated its samples were (0: on policy; train_async: 1; in policy versions)."""
    lags = [rollout_id - v for v in map(sample_weight_version, samples) if v is not None]
    if not lags:
        return {}
    return {"rollout/staleness/mean": sum(lags) / len(lags), "rollout/staleness/max": float(max(lags))}


def optional_hook(args: Namespace, name: str) -> Any:
    """The function at `args.<name>` (a dotted path), or None when it is not set."""
    path = getattr(args, name)
    return load_function(path, arg_name="--" + name.replace("_", "-")) if path else None


def skips_default_log(args: Namespace, name: str, fn: Any, rollout_id: int, *call: Any) -> bool:
    """Call a --custom-(eval-)rollout-log-function-path hook; its truthy answer means "skip the
    default metrics" (slime's contract). An error in it stops the run, naming the hook."""
    if fn is None:
        return False
    try:
        answer = fn(*call)
        if inspect.isawaitable(answer):  # an async hook, on the process's event loop
            answer = run(answer)
    except Exception as e:
        raise SlimeError(
            f"rollout {rollout_id}: --{name.replace('_', '-')} {getattr(args, name)} raised {type(e).__name__}: {e}"
        ) from e
    return bool(answer)


@ray.remote
class RolloutManager:
    def __init__(self, args: Namespace, placement: Placement) -> None:
        # Set-up happens in init(): an error there reaches the driver as the error it is
        # (a failing actor constructor only surfaces as "actor died").
        self.args, self.placement = args, placement
        self.engines: list[Any] = []
        self.frozen: list[FrozenModel] = []  # the --sglang-config models never synced
        self.router = None
        self.watcher = None
        self._offloaded = False
        self._restarts_reported = 0  # engine restarts recover_engines has reported

    def init(self) -> None:
        args, placement = self.args, self.placement
        if args.debug_train_only:  # no engines: rollouts are loaded (--load-debug-rollout-data) or need none
            self.engine_urls = []
            set_engine_urls(self.engine_urls)
            self.load_hooks()
            resume_data(self.data_source, args)
            return
        _, engine_threads = thread_budget(args)
        if args.rollout_external_engine_addrs is not None:  # engines this run did not launch (slime's option)
            from slime.sync.external import discover

            self.engines, self.engine_urls = [], list(args.rollout_external_engine_addrs)
            discover(self.engine_urls, api_key=args.engine_api_key, admin_api_key=args.engine_admin_api_key)
            self.router = self._start_router() if len(self.engine_urls) > 1 else None
            if self.router is not None:
                host, port = self.router.host, self.router.port
                self.watcher = EngineWatcher(self.router, self.engine_urls, on_removed=self._engine_removed).start()
            else:
                host, port = self.engine_urls[0].removeprefix("http://").rsplit(":", 1)
            # where slime's hooks send /generate: slime writes these too (slime/ray/rollout.py, the router it starts)
            args.sglang_router_ip, args.sglang_router_port = host, int(port)
        elif args.sglang_router_ip is None:
            # every model's engines (--sglang-config; else the one model), started at once
            policy, self.engines, self.engine_urls, self.frozen = launch_models(args, placement, engine_threads)
            self._engine_of = dict(zip(self.engine_urls, self.engines, strict=True))
            self.router = None
            if len(self.engine_urls) == 1:
                host, port = self.engine_urls[0].removeprefix("http://").rsplit(":", 1)
            else:
                self.router = self._start_router()
                host, port = self.router.host, self.router.port
            # restarted engines get the current weights; the monitor runs during generate/eval only
            self.watcher = start_watcher(
                args,
                self.router,
                self.engine_urls,
                restart=self._restart_engine,
                restart_router=self._restart_router,
                on_removed=self._engine_removed,
            )
            # where slime's hooks send /generate: slime writes these too (slime/ray/rollout.py, the router it starts)
            args.sglang_router_ip, args.sglang_router_port = host, int(port)
            # get_model_url(args, name): each model's router, as slime fills it after start-up
            args.sglang_model_routers = {policy.name: (host, int(port)), **{m.name: m.address for m in self.frozen}}
        else:  # an external router/engine the user runs
            self.engines, self.router = [], None
            self.engine_urls = [f"http://{args.sglang_router_ip}:{args.sglang_router_port}"]
        set_engine_urls(self.engine_urls)  # where this process's rollouts send their aborts
        # every request from this process (hooks' post(url, payload) included) to these servers
        # carries the run's key, and to no other address
        frozen_urls = [u for m in self.frozen for u in [*m.urls, m.url]]
        register_keys(
            [*self.engine_urls, f"http://{args.sglang_router_ip}:{args.sglang_router_port}", *frozen_urls],
            args.engine_api_key,
            args.engine_admin_api_key,
        )
        configure_requests(
            timeout=args.sglang_router_request_timeout_secs,
            max_retries=args.rollout_request_max_retries,
            retry_interval=args.rollout_request_retry_interval,
        )
        set_engine_timeout(args.engine_control_timeout_secs)
        self.load_hooks()
        # the data position (and Data Buffer) of rollout --start-rollout-id - 1, or of the --load checkpoint
        resume_data(self.data_source, args)

    def load_hooks(self) -> None:
        """The data source and every hook the manager calls itself (no engine needed)."""
        args = self.args
        self.data_source = load_function(args.data_source_path, arg_name="--data-source-path")(args)
        self.generate_rollout = load_function(args.rollout_function_path, arg_name="--rollout-function-path")
        self.eval_rollout = load_function(
            args.eval_function_path or args.rollout_function_path, arg_name="--eval-function-path"
        )
        self.sample_filter = optional_hook(args, "rollout_sample_filter_path")
        self.rollout_log = optional_hook(args, "custom_rollout_log_function_path")
        self.eval_log = optional_hook(args, "custom_eval_rollout_log_function_path")

    def weight_versions(self) -> dict[str, str | None]:
        """Each live engine's weight_version (what --ci-test compares with the trainer's)."""
        return {url: client_for(url).get_weight_version() for url in list(self.engine_urls)}

    def before_weight_update(self) -> dict[str, float]:
        """Around every weight sync: a rollout function that generates across rollouts (the fully
        async one) may carry `before_weight_update(args)` / `after_weight_update(args)` hooks."""
        hook = getattr(self.generate_rollout, "before_weight_update", None)
        return (hook(self.args) or {}) if hook is not None else {}

    def prepare_weight_update(self) -> tuple[int, list[str], dict[str, float]]:
        """`recover_engines`, `get_engine_urls` and `before_weight_update` in one call: a sync's three
        questions to this actor cost one round trip instead of three."""
        restarted = self.recover_engines()
        return restarted, self.get_engine_urls(), self.before_weight_update()

    def after_weight_update(self) -> None:
        hook = getattr(self.generate_rollout, "after_weight_update", None)
        if hook is not None:
            hook(self.args)

    def get_engine_urls(self) -> list[str]:
        """The live engines (one removed by the engine watcher is gone from here too)."""
        return list(self.engine_urls)

    def _engine_removed(self, url: str) -> None:
        logger.warning(
            "engine %s died and was removed from the router; %d engines remain (it is not restarted: "
            "run with --use-fault-tolerance to restart dead or hung engines)",
            url,
            len(self.engine_urls) - 1,
        )
        self.engine_urls = [u for u in self.engine_urls if u != url]
        set_engine_urls(self.engine_urls)

    # ------------------------------------------------------------------ fault tolerance
    def _start_router(self, port: int | None = None):
        args = self.args
        return start_router(
            self.engine_urls,
            policy=args.router_policy,
            model_path=args.hf_checkpoint,
            log_dir=Path(args.run_dir) / "logs",
            extra_args=args.router_args,
            api_key=args.engine_api_key,
            admin_api_key=args.engine_admin_api_key,
            port=port,
            request_timeout_secs=args.sglang_router_request_timeout_secs,
        )

    def _restart_engine(self, url: str) -> str:
        """The watcher's restart: a new server at `url` (same port), serving the current weights: the
        snapshot the trainer wrote at its last weight sync (none yet: the checkpoint's, which is what
        the trainer pushes first anyway)."""
        new_url = ray.get(self._engine_of[url].restart.remote())
        if new_url != url:  # the address is the engine's identity for the router, clients and weight sync
            raise SlimeError(f"engine {url} came back at {new_url}")
        version = weight_snapshot_version(self.args.run_dir)
        if version is not None:
            client_for(url).update_weights_from_disk(
                str(weight_snapshot_dir(self.args.run_dir)), weight_version=version
            )
        if self._offloaded:  # --offload-rollout: released like the others until onload
            client_for(url).release_memory_occupation()
        return url

    def _restart_router(self):
        old = self.router
        old.stop(grace=0)  # a hung router ignores SIGTERM
        self.router = self._start_router(port=old.port)
        return self.router

    def _watch(self, on: bool) -> None:
        if self.watcher is not None and self.args.use_fault_tolerance:
            self.watcher.resume() if on else self.watcher.pause()
        for model in self.frozen:
            model.watch(on)

    def recover_engines(self) -> int:
        """Before a weight sync (slime's recover_updatable_engines): check every engine and the router
        now and restart what is dead or hung, so the sync reaches every engine. Returns how many engines
        were restarted since the previous call (0 without --use-fault-tolerance): the trainer then
        rebuilds its weight-update group, which a restarted engine is not in."""
        if self.watcher is None or not self.args.use_fault_tolerance:
            return 0
        self.watcher.check_now()
        engines = [e for e in self.watcher.events if e["what"] == "engine" and e["ok"]]
        new, self._restarts_reported = len(engines) - self._restarts_reported, len(engines)
        return new

    def fault_events(self) -> list[dict]:
        """Every recovery so far: {"what": engine|router, "url", "reason", "detected_at", "recovered_s", "ok"}
        (a frozen model's carry its "model")."""
        own = list(self.watcher.events) if self.watcher is not None and self.args.use_fault_tolerance else []
        return own + [e for m in self.frozen for e in m.fault_events()]

    def model_urls(self) -> dict[str, list[str]]:
        """Each frozen model's live engines (the policy's: `get_engine_urls`)."""
        return {m.name: list(m.urls) for m in self.frozen}

    def model_engine_pids(self) -> dict[str, list[int | None]]:
        return {m.name: m.pids() for m in self.frozen}

    def engine_pids(self) -> list[int | None]:
        return ray.get([e.pid.remote() for e in self.engines])

    def router_pid(self) -> int | None:
        return self.router.proc.pid if self.router is not None else None

    def generate(self, rollout_id: int) -> tuple[dict[str, Any], dict[str, float]]:
        self._watch(True)  # --use-fault-tolerance: engines are checked (and restarted) while they generate
        before = len(self.fault_events())
        try:
            data, metrics = self._generate(rollout_id)
        except SlimeError as e:
            if self.args.use_fault_tolerance or not rollout_lost_server(e):
                raise
            raise SlimeError(
                f"{e} (an engine or the router that dies is not restarted: run with "
                "--use-fault-tolerance to restart them and retry their requests)"
            ) from e
        finally:
            self._watch(False)
        if self.args.use_fault_tolerance:
            metrics["rollout/fault/restarts"] = float(len(self.fault_events()) - before)
        return data, metrics

    def _generate(self, rollout_id: int) -> tuple[dict[str, Any], dict[str, float]]:
        t0 = time.perf_counter()
        set_current_rollout_id(rollout_id)  # what --rollout-sample-hook-path hooks are told
        if hasattr(self.data_source, "rollout_id"):
            self.data_source.rollout_id = rollout_id  # what the --buffer-filter-path hook is told
        if self.args.load_debug_rollout_data:  # a saved rollout replayed, checked against this run's batch
            groups, extra_metrics = load_debug_rollout_data(self.args, rollout_id), {}
        else:
            groups, extra_metrics = unwrap_train_output(
                self.generate_rollout(self.args, rollout_id, self.data_source, evaluation=False)
            )
        # as generated, before any filter or conversion (slime's point of saving)
        save_debug_rollout_data(self.args, [s for g in groups for s in g], rollout_id)
        write_rollout_samples(self.args, groups, rollout_id)  # the report's sample log (first groups)
        if self.args.run_dir and self.args.report_groups_per_rollout:  # the same groups' timelines (spans
            # of generation and reward on each sample); every sample's trace is in the debug dump
            shown = groups[: self.args.report_groups_per_rollout]
            save_rollout_trace(self.args.run_dir, rollout_id, [s for g in shown for s in g])
        report_failures(self.args, [s for g in groups for s in g], f"rollout {rollout_id}")  # a line per error
        check_failed_samples(groups, rollout_id, self.args.max_failed_sample_ratio)
        if self.sample_filter is not None:  # marks sample.remove_sample; groups keep their shape
            try:
                self.sample_filter(self.args, [s for g in groups for s in g])
            except Exception as e:
                raise SlimeError(
                    f"rollout {rollout_id}: --rollout-sample-filter-path "
                    f"{self.args.rollout_sample_filter_path} raised {type(e).__name__}: {e}"
                ) from e
        samples = [s for g in groups for s in g]
        # slime's call, before the conversion; a hook may add to extra_metrics and return False
        skip = skips_default_log(
            self.args,
            "custom_rollout_log_function_path",
            self.rollout_log,
            rollout_id,
            rollout_id,
            self.args,
            samples,
            extra_metrics,
            time.perf_counter() - t0,
        )
        data = samples_to_train_data(self.args, groups)
        if skip:  # the hook logs instead; failures are still counted (never dropped silently)
            return data, {"rollout/status/failed": float(sum(s.status == Sample.Status.FAILED for s in samples))}
        metrics = rollout_metrics(self.args, groups, data)
        metrics.update(staleness_metrics(rollout_id, samples))
        metrics.update(extra_metrics)
        if getattr(self.data_source, "num_dropped", 0):
            metrics["rollout/data/dropped_long_prompts"] = float(self.data_source.num_dropped)
        elapsed = time.perf_counter() - t0
        metrics["perf/rollout_time"] = elapsed
        metrics["perf/tokens_per_s"] = sum(data["response_lengths"]) / max(elapsed, 1e-9)
        return data, metrics

    def eval(self, rollout_id: int) -> dict[str, float]:
        self._watch(True)
        try:
            return self._eval(rollout_id)
        finally:
            self._watch(False)

    def _eval(self, rollout_id: int) -> dict[str, float]:
        t0 = time.perf_counter()
        set_current_rollout_id(rollout_id)
        results, extra_metrics = unwrap_eval_output(
            self.eval_rollout(self.args, rollout_id, self.data_source, evaluation=True)
        )
        save_debug_rollout_data(
            self.args, [s for res in results.values() for s in res.get("samples") or []], rollout_id, evaluation=True
        )
        write_eval_samples(self.args, results, rollout_id)  # the report's sample log (first groups)
        for name, res in results.items():
            report_failures(self.args, res.get("samples") or [], f"eval {name!r} at rollout {rollout_id}")
        if skips_default_log(
            self.args,
            "custom_eval_rollout_log_function_path",
            self.eval_log,
            rollout_id,
            rollout_id,
            self.args,
            results,
            extra_metrics,
        ):
            # the hook logs instead; failed samples are still counted
            return {
                f"eval/{name}/failed": float(sum(s.status == Sample.Status.FAILED for s in res["samples"]))
                for name, res in results.items()
                if res.get("samples")
            }
        metrics = eval_metrics(self.args, results)
        metrics.update(extra_metrics)
        metrics["perf/eval_time"] = time.perf_counter() - t0
        return metrics

    def _each_engine(self, method: str) -> None:
        for url in list(self.engine_urls):
            try:
                getattr(client_for(url), method)()
            except SlimeError as e:
                if not self.args.use_fault_tolerance:
                    raise
                # restarted (in the state this call asked for) by recover_engines before the weight sync
                logger.warning("%s on engine %s failed (%s); it is recovered before the weight sync", method, url, e)

    def offload(self) -> None:
        """--offload-rollout (on with --colocate): free the engines' KV cache (prefix cache included)
        while the trainer trains; generation waits until `onload`."""
        self._offloaded = True  # an engine restarted meanwhile is offloaded too
        self._each_engine("release_memory_occupation")

    def onload(self) -> None:
        self._offloaded = False
        self._each_engine("resume_memory_occupation")

    def save(self, rollout_id: int, directory: str) -> None:
        """The data position and Data Buffer go into the trainer's checkpoint of this rollout (its
        staging `directory`, which the driver then commits); a --data-source-path class of slime's
        contract saves itself with `save(rollout_id)`."""
        Path(directory).mkdir(parents=True, exist_ok=True)
        if isinstance(self.data_source, RolloutDataSource) and type(self.data_source).save is RolloutDataSource.save:
            self.data_source.save(Path(directory) / ROLLOUT_STATE_FILE)
        else:
            self.data_source.save(rollout_id)
        halt_point("rollout_state", rollout_id)

    def dispose(self) -> None:
        for model in self.frozen:
            model.dispose()
        if self.watcher is not None:
            self.watcher.stop()
        if self.router is not None:
            self.router.stop()
        ray.get([e.stop.remote() for e in self.engines])
