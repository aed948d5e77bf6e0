"""Math grading (sympy, math-verify) in worker processes, with a time and a memory bound per grade.

A hung sympy call cannot be interrupted inside a thread, and signals only reach a main thread,
so the unbounded work runs in a small pool of worker processes: `run(fn, *args, timeout=...)`
sends the call to an idle worker and waits at most `timeout` seconds for the answer; a worker
that runs over is killed (SIGKILL) and `GradeRefused` says so; a fresh worker replaces it on the
next call. A worker that dies (a crash, its memory limit) is replaced the same way. Workers are
plain `python -c` subprocesses speaking pickles over their stdin/stdout, not multiprocessing:
nothing of the rollout process (torch, Ray, its `__main__`) is inherited or re-imported. Each
preloads sympy, pylatexenc and math-verify before it counts as started (about 1 s, measured),
so the time limit counts grading only; each has an address-space limit (`WORKER_MEMORY_MB`).

Async callers use `run_in_thread`: the whole grade (extraction and the string checks included)
runs on one of `WORKERS` grader threads, each holding at most one worker, so the event loop is
never blocked. A short response may first be tried inline under `no_workers()`: most answers are
settled by string checks alone (the thread hop would cost more than they do). `GradeRefused` is
how a grade ends without a result (the screen, the time or memory limit, a dead worker); the
callers turn it into a 0 with the reason recorded, counted in `stats()`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import logging
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from slime.rollout.rm_hub.answer_screen import screen_answer

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0  # --math-grader-timeout
WORKERS = max(1, min(4, os.cpu_count() or 1))
WORKER_MEMORY_MB = 2048  # address space of a worker (sympy and math-verify loaded: about 80 MB resident)
START_TIMEOUT_S = 60.0  # a worker's start-up (interpreter and imports), not counted in a grade
_HEADER = struct.Struct("<Q")
# what a worker imports before it counts as started (about 1 s): the graders' heavy dependencies
PRELOAD = ("sympy", "sympy.parsing.sympy_parser", "slime.rollout.rm_hub.math_grader", "math_verify")


class GradeRefused(Exception):
    """A grade that ended without a result; `reason` says why, `kind` is screened, timeout, memory
    (the worker's address-space limit) or crashed (the worker died)."""

    def __init__(self, reason: str, kind: str = "screened"):
        super().__init__(reason, kind)
        self.reason, self.kind = reason, kind

    def __str__(self) -> str:
        return self.reason


_stats = {"screened": 0, "timeout": 0, "memory": 0, "crashed": 0}
_stats_lock = threading.Lock()


def refused(error: GradeRefused) -> str:
    """Count a refused grade (logged at 1, 2, 4, 8, ... of a kind, so an adversary cannot flood the
    log) and return its reason, for the caller to record with the 0."""
    with _stats_lock:
        _stats[error.kind] = n = _stats.get(error.kind, 0) + 1
    if n & (n - 1) == 0:
        logger.warning("math grader: %d answer(s) %s so far, scored 0; latest: %s", n, error.kind, error.reason)
    return error.reason


def stats() -> dict[str, int]:
    """How many grades were refused, by kind, in this process."""
    with _stats_lock:
        return dict(_stats)


# ---------------------------------------------------------------------------------------------
# the wire: an 8-byte length, then a pickle


def _write(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _read(fd: int, deadline: float | None) -> Any:
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size, deadline))
    return pickle.loads(_read_exact(fd, size, deadline))


# ---------------------------------------------------------------------------------------------
# the worker side


def _serve() -> None:
    """A worker's main: quiet when the rollout process goes away (a closed pipe ends it)."""
    try:
        _serve_loop()
    except (BrokenPipeError, EOFError, KeyboardInterrupt):
        pass


def _lower_limit(which: int, soft: int) -> None:
    import resource

    hard = resource.getrlimit(which)[1]  # never above a hard limit set from outside
    resource.setrlimit(which, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


def _picklable(error: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - a user exception's pickling can fail in any way: sent as text
        return RuntimeError(f"{type(error).__name__}: {error}")


def _serve_loop() -> None:
    """(module, name, args, timeout) in, ("ok", result) or ("raise", exception) out."""
    import importlib
    import resource
    import traceback

    out = os.dup(1)
    os.dup2(2, 1)  # stray prints of a library go to stderr, not into the answers
    _lower_limit(resource.RLIMIT_AS, WORKER_MEMORY_MB << 20)
    for name in PRELOAD:  # before "ready": a grade's time limit counts grading only
        try:
            importlib.import_module(name)
        except ImportError:  # math-verify is optional
            pass
    _write(out, ("ready", os.getpid()))
    while True:
        try:
            module, name, args, timeout = _read(0, None)
        except EOFError:
            return  # the rollout process closed the pipe, or died
        # A CPU-time limit a little past the job's own: the parent kills the worker at its timeout;
        # this ends the job even if the parent died first (an orphan stops in seconds, not never).
        usage = resource.getrusage(resource.RUSAGE_SELF)
        _lower_limit(resource.RLIMIT_CPU, int(usage.ru_utime + usage.ru_stime + timeout) + 3)
        try:
            reply = ("ok", getattr(importlib.import_module(module), name)(*args))
        except MemoryError:
            reply = ("raise", GradeRefused(f"grading needed more than {WORKER_MEMORY_MB} MB of memory", "memory"))
        except GradeRefused as e:
            reply = ("raise", e)
        except BaseException as e:  # noqa: BLE001 (RecursionError included): the caller's to handle
            e.add_note("in the math grader worker:\n" + traceback.format_exc())
            reply = ("raise", _picklable(e))
        try:
            _write(out, reply)
        except Exception as e:  # noqa: BLE001 - an unpicklable result (pickling fails in any way): sent as an error
            _write(out, ("raise", RuntimeError(f"{type(e).__name__}: {e}; result {reply[1]!r:.200}")))


# ---------------------------------------------------------------------------------------------
# the pool side


def _worker_env() -> dict[str, str]:
    import slime

    root = os.path.dirname(os.path.dirname(os.path.abspath(slime.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


class _Worker:
    def __init__(self):
        cmd = [sys.executable, "-c", "from slime.rollout.rm_hub.grader_pool import _serve; _serve()"]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=_worker_env(),
            close_fds=True,
            start_new_session=True,
        )
        try:
            tag, _ = _read(self.proc.stdout.fileno(), time.monotonic() + START_TIMEOUT_S)
            if tag != "ready":
                raise RuntimeError(f"unexpected first message {tag!r}")
        except (EOFError, TimeoutError, RuntimeError) as e:
            self.kill()
            raise RuntimeError(
                f"math grader worker did not start ({type(e).__name__}: {e}; exit code {self.proc.returncode})"
            ) from None

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            f.close()

    def call(self, fn: Callable, args: tuple, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        try:
            _write(self.proc.stdin.fileno(), (fn.__module__, fn.__qualname__, args, timeout))
            tag, value = _read(self.proc.stdout.fileno(), deadline)
        except TimeoutError:
            self.kill()
            raise GradeRefused(
                f"grading timed out after {timeout:g}s (--math-grader-timeout); its worker was killed", "timeout"
            ) from None
        except (EOFError, OSError, ValueError):  # a closed pipe, or closed by shutdown() meanwhile
            self.kill()
            raise GradeRefused(f"the grader worker died (exit code {self.proc.returncode})", "crashed") from None
        if tag == "raise":
            raise value
        return value


class _Pool:
    def __init__(self, size: int):
        self.size, self.pid = size, os.getpid()
        self.idle: list[_Worker] = []
        self.all: set[_Worker] = set()
        self.starting, self.closed = 0, False
        self.cond = threading.Condition()
        self.threads = ThreadPoolExecutor(max_workers=size, thread_name_prefix="math-grader")

    def _acquire(self) -> _Worker:
        with self.cond:
            while not self.idle and len(self.all) + self.starting >= self.size:
                self.cond.wait()
            if self.idle:
                return self.idle.pop()
            self.starting += 1
        worker = None
        try:
            worker = _Worker()  # outside the lock: a start takes about a second
            return worker
        finally:
            with self.cond:
                self.starting -= 1
                if worker is not None:
                    self.all.add(worker)
                self.cond.notify()

    def _release(self, worker: _Worker) -> None:
        with self.cond:
            if self.closed:
                worker.kill()
            elif worker.alive:
                self.idle.append(worker)
            else:  # killed or dead: start its replacement now, so the next grade does not wait for it
                self.all.discard(worker)
                self.starting += 1
                threading.Thread(target=self._refill, name="math-grader-start", daemon=True).start()
            self.cond.notify()

    def _refill(self) -> None:
        try:
            worker = _Worker()
        except Exception as e:  # noqa: BLE001 - in a thread: the next _acquire tries again, and raises if it fails too
            logger.warning("math grader: a replacement worker did not start: %s", e)
            worker = None
        with self.cond:
            self.starting -= 1
            if worker is not None:
                if self.pid == os.getpid() and not self.closed:
                    self.all.add(worker)
                    self.idle.append(worker)
                else:
                    worker.kill()
            self.cond.notify_all()

    def run(self, fn: Callable, args: tuple, timeout: float) -> Any:
        worker = self._acquire()
        try:
            return worker.call(fn, args, timeout)
        finally:
            self._release(worker)

    def close(self) -> None:
        with self.cond:
            workers, self.idle, self.all, self.closed = list(self.all), [], set(), True
        for worker in workers:
            worker.kill()
        self.threads.shutdown(wait=False)


_pool: _Pool | None = None
_pool_lock = threading.Lock()


def _get_pool() -> _Pool:
    global _pool
    with _pool_lock:
        if _pool is None or _pool.pid != os.getpid():  # a forked child starts its own workers
            _pool = _Pool(WORKERS)
        return _pool


@atexit.register
def shutdown() -> None:
    """Kill every worker (at exit; also usable by tests). The next grade starts new ones."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None and pool.pid == os.getpid():
        pool.close()


class NeedsWorker(Exception):
    """Raised by `run` inside `no_workers()`: the grade cannot be settled without a worker."""


_local = threading.local()


@contextlib.contextmanager
def no_workers():
    """Within it, `run` raises `NeedsWorker` at once instead of waiting: for a first, inline try
    at a grade that string checks may settle (on the event loop, where nothing may wait)."""
    _local.no_workers = True
    try:
        yield
    finally:
        _local.no_workers = False


def run(fn: Callable, *args: Any, timeout: float | None = None) -> Any:
    """`fn(*args)` in a grader worker, waiting at most `timeout` seconds (DEFAULT_TIMEOUT_S when
    None) once a worker has it; raises `GradeRefused` on a time-out or a dead worker, and what
    `fn` raised otherwise. `fn` must be a module-level function (it is sent by name)."""
    if getattr(_local, "no_workers", False):
        raise NeedsWorker
    timeout = DEFAULT_TIMEOUT_S if timeout is None else float(timeout)
    if not timeout > 0:
        raise ValueError(f"the grading timeout must be > 0 seconds, got {timeout}")
    return _get_pool().run(fn, args, timeout)


async def run_in_thread(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` on a grader thread (fn calls `run` for its unbounded part), awaited:
    the event loop keeps running while a grade waits for its worker."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_get_pool().threads, functools.partial(fn, *args, **kwargs))


def run_screened(
    fn: Callable[..., Any], given: str, *args: Any, timeout: float, refused_value: Any
) -> tuple[Any, str | None]:
    """`(fn(given, *args), None)` in a worker, once `given` passed the answer screen; a refused grade
    (the screen, the time or memory limit, a dead worker) is `(refused_value, its reason)`."""
    try:
        reason = screen_answer(given)
        if reason is not None:
            raise GradeRefused(reason)
        return run(fn, given, *args, timeout=timeout), None
    except GradeRefused as e:
        return refused_value, refused(e)
