"""A fault-tolerant pool that runs each environment in its own worker process.

One slot = one worker process (``multiprocessing`` spawn context by default) that builds its
environment with ``suite.make_env()`` (the suite is pickled to it) and serves ``reset``/``step``
requests over a pipe. ``reset`` and ``step`` send every request first and then collect the replies,
so the slots run in parallel; all replies of one call share one deadline.

Failures never stop the pool; the slot's result is ``StepResult(failed=True, observation="",
info={"error": ...})`` and ``failures`` counts them:

- a worker that does not answer in time (``"timeout after 60s"``) or that died
  (``"worker died (exit code -9)"``) is killed and a fresh worker (and environment) is started the
  next time its slot is used;
- an exception inside ``env.reset``/``env.step`` is reported with the traceback's last line
  (``"RuntimeError: ..."``); the worker survives and rebuilds its environment.

No process is left behind:

- each worker calls ``os.setsid()`` first, so it leads its own process group, and the environment's
  own children (ScienceWorld's JVM started by py4j) belong to it; workers are stopped by signalling
  the whole group (SIGTERM, then SIGKILL after a grace period), and a worker that receives a
  SIGTERM from anyone else forwards it to its group;
- workers (and their environments' children) ignore SIGINT: a terminal's Ctrl+C asks the trainer to
  finish its RL step (:mod:`lightning_epo.runtime.preemption`), which needs the environments until it closes
  the pool (SIGINT is blocked while a worker starts, until it ignores it). SIGTERM is how the pool
  stops a group; SLURM, which signals every process of a job, thus stops the workers too, and the
  step in progress finishes with those episodes truncated;
- a worker exits (killing its group) when the trainer's end of its pipe closes or when it notices,
  within a second, that its parent process is gone, even in the middle of a hanging step;
- ``close()`` asks each worker to close its environment, then stops the groups; it is idempotent and
  also runs when the pool is garbage collected or the interpreter exits (``weakref.finalize``, whose
  exit hook is registered with ``atexit``).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import signal
import threading
import time
import traceback
import weakref
from multiprocessing.connection import Connection, wait
from typing import Any, NoReturn

from lightning_epo.core.errors import ConfigError
from lightning_epo.envs.base import EnvPool, StepResult, Task, TaskSuite, TextEnv

logger = logging.getLogger(__name__)

PARENT_CHECK_INTERVAL_S = 1.0
# Not "fork": forked workers would inherit the trainer's ends of the other workers' pipes (and its
# threads' locks), so a dead worker's pipe would never report EOF.
START_METHODS = ("spawn", "forkserver")


def default_pool_size(requested: int | None) -> int:
    """``requested`` slots, or one per CPU core this process may use when ``requested`` is None."""
    if requested is None:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        raise ConfigError(
            f"env.pool_size must be a positive integer, or null for one slot per CPU core; got {requested!r}"
        )
    return requested


# ---------------------------------------------------------------------------------------------
# Worker side (runs in the child process)
# ---------------------------------------------------------------------------------------------


def _serve(conn: Connection, suite: TaskSuite) -> None:
    """Worker entry point: own process group, Ctrl+C ignored, parent watchdog, then answer requests until
    told to close."""
    os.setsid()
    signal.signal(signal.SIGTERM, _forward_to_group)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked by _Worker until now
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    env = _replace_env(None, suite)
    try:
        while True:
            command, argument = conn.recv()
            if command == "close":
                break
            try:
                if env is None:
                    env = suite.make_env()
                conn.send(("ok", env.reset(argument) if command == "reset" else env.step(argument)))
            except Exception as exc:
                traceback.print_exc()
                conn.send(("error", traceback.format_exception_only(exc)[-1].strip()))
                env = _replace_env(env, suite)
    except (EOFError, OSError):  # the trainer's end of the pipe is gone: take the env's processes along
        _close_quietly(env)
        _kill_own_group()
    _close_quietly(env)


def _replace_env(env: TextEnv | None, suite: TaskSuite) -> TextEnv | None:
    """Close ``env`` and build a new one; None when building fails (the next request retries and reports it)."""
    _close_quietly(env)
    try:
        return suite.make_env()
    except Exception:
        traceback.print_exc()
        return None


def _close_quietly(env: TextEnv | None) -> None:
    if env is None:
        return
    try:
        env.close()
    except Exception:
        traceback.print_exc()


def _forward_to_group(signum: int, frame: Any) -> None:
    """SIGTERM handler: pass the signal on to the whole group (the env's children), then die of it."""
    signal.signal(signum, signal.SIG_DFL)
    os.killpg(0, signum)


def _exit_when_orphaned(parent_pid: int) -> None:
    """Watchdog thread: once the parent is gone (we were re-parented), kill this worker's group.

    It also fires in the middle of a hanging step, when the main thread cannot notice the closed pipe.
    With ``forkserver`` the parent is the fork server, which exits when the trainer does.
    """
    while os.getppid() == parent_pid:
        time.sleep(PARENT_CHECK_INTERVAL_S)
    _kill_own_group()


def _kill_own_group() -> NoReturn:
    """SIGKILL this worker's process group: the worker itself and every process its env started."""
    os.killpg(0, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------
# Trainer side
# ---------------------------------------------------------------------------------------------


class _Worker:
    """One started worker process and the trainer's end of its pipe."""

    def __init__(self, context: multiprocessing.context.BaseContext, suite: TaskSuite) -> None:
        self.conn, child_conn = context.Pipe()
        self.process = context.Process(target=_serve, args=(child_conn, suite), daemon=True)
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # inherited by the worker
        try:
            self.process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        child_conn.close()

    def stop(self, grace_s: float) -> int | None:
        """SIGTERM the worker's group, SIGKILL what is left after ``grace_s``, reap; returns the exit code.

        The group is signalled before the worker is reaped, so its id cannot have been reused.
        """
        self._signal(signal.SIGTERM)
        wait([self.process.sentinel], grace_s)
        self._signal(signal.SIGKILL)
        self.process.join()
        self.conn.close()
        exit_code = self.process.exitcode
        self.process.close()
        return exit_code

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:  # the worker has not called setsid yet, or its whole group is gone
            pass
        # Also signal the worker itself in case it has not called setsid yet (no-op once it is reaped).
        if sig == signal.SIGTERM:
            self.process.terminate()
        else:
            self.process.kill()


def _close_workers(workers: list[_Worker | None], timeout_s: float, grace_s: float) -> None:
    """Ask every worker to close its environment (shared deadline ``timeout_s``), then stop all groups."""
    live = [worker for worker in workers if worker is not None]
    for worker in live:
        try:
            worker.conn.send(("close", None))
        except OSError:  # already dead
            pass
    deadline = time.monotonic() + timeout_s
    for worker in live:
        wait([worker.process.sentinel], max(0.0, deadline - time.monotonic()))
        worker.stop(grace_s)
    workers[:] = [None] * len(workers)


class ProcessEnvPool(EnvPool):
    """``size`` environment slots, each in its own worker process (see the module docstring).

    Args:
        suite: builds the environments; pickled to every worker, so it must be picklable.
        size: number of slots (worker processes); None for one per CPU core.
        step_timeout_s: deadline for the replies of one ``step`` call.
        reset_timeout_s: deadline for the replies of one ``reset`` call; it also covers starting a
            fresh worker and its simulator (e.g. a JVM).
        start_method: ``spawn`` (default) or ``forkserver`` (see :data:`START_METHODS`). With ``spawn``
            workers import the trainer's ``__main__`` module, so its work must sit under
            ``if __name__ == "__main__":``.
        close_timeout_s: how long ``close()`` waits for the environments to close themselves.
        kill_grace_s: time between SIGTERM and SIGKILL when a worker is stopped.
    """

    def __init__(
        self,
        suite: TaskSuite,
        size: int | None,
        step_timeout_s: float = 60.0,
        reset_timeout_s: float = 300.0,
        start_method: str = "spawn",
        close_timeout_s: float = 10.0,
        kill_grace_s: float = 2.0,
    ) -> None:
        for name, value in dict(
            step_timeout_s=step_timeout_s,
            reset_timeout_s=reset_timeout_s,
            close_timeout_s=close_timeout_s,
            kill_grace_s=kill_grace_s,
        ).items():
            if not value > 0:
                raise ConfigError(f"env.pool.{name} must be > 0 seconds, got {value!r}")
        if start_method not in START_METHODS:
            raise ConfigError(f"env.pool.start_method must be one of {list(START_METHODS)}, got {start_method!r}")
        try:
            pickle.dumps(suite)
        except Exception as exc:
            raise TypeError(
                f"{type(suite).__name__} must be picklable to run in worker processes "
                f"(define it at module level, keep no open handles in it): {exc}"
            ) from exc
        self.size = default_pool_size(size)
        self.step_timeout_s = step_timeout_s
        self.reset_timeout_s = reset_timeout_s
        self.kill_grace_s = kill_grace_s
        self.failures = 0
        self._suite = suite
        self._context = multiprocessing.get_context(start_method)
        self._workers: list[_Worker | None] = [None] * self.size
        self._finalizer = weakref.finalize(self, _close_workers, self._workers, close_timeout_s, kill_grace_s)
        for slot in range(self.size):  # start every simulator now, in parallel
            self._worker(slot)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the running workers (each leads the process group of its environment)."""
        return [w.process.pid for w in self._workers if w is not None]

    def reset(self, slots: list[int], tasks: list[Task]) -> list[StepResult]:
        """Reset ``slots[i]`` to ``tasks[i]``, all slots in parallel."""
        return self._request("reset", slots, tasks, self.reset_timeout_s)

    def step(self, slots: list[int], actions: list[str]) -> list[StepResult]:
        """Step ``slots[i]`` with ``actions[i]``, all slots in parallel."""
        return self._request("step", slots, actions, self.step_timeout_s)

    def close(self) -> None:
        """Close every environment and stop every worker and its children; safe to call twice."""
        self._finalizer()

    def _request(self, command: str, slots: list[int], arguments: list[Any], timeout_s: float) -> list[StepResult]:
        """Send ``command`` to every slot, then collect all replies under one shared deadline."""
        self.check_slots(slots, arguments, "tasks" if command == "reset" else "actions")
        # Pickle and start workers first: an error must not leave requests half sent (and replies unread).
        requests = [pickle.dumps((command, argument)) for argument in arguments]
        workers = [self._worker(slot) for slot in slots]
        results: dict[int, StepResult] = {}
        for slot, worker, request in zip(slots, workers, requests):
            try:
                worker.conn.send_bytes(request)
            except (BrokenPipeError, ConnectionResetError):  # died since its last reply
                results[slot] = self._worker_died(slot)
        deadline = time.monotonic() + timeout_s
        for slot in slots:
            if slot not in results:
                results[slot] = self._receive(slot, command, deadline, timeout_s)
        return [results[slot] for slot in slots]

    def _receive(self, slot: int, command: str, deadline: float, timeout_s: float) -> StepResult:
        conn = self._workers[slot].conn
        try:
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                self._discard(slot)
                return self._failure(slot, f"timeout after {timeout_s:g}s")
            status, payload = conn.recv()
        except (EOFError, OSError):
            return self._worker_died(slot)
        if status == "error":  # the worker has rebuilt its environment itself
            return self._failure(slot, payload)
        if command == "reset":
            observation, info = payload
            return StepResult(observation, info=info)
        observation, reward, done, info = payload
        return StepResult(observation, float(reward), bool(done), info)

    def _worker(self, slot: int) -> _Worker:
        """The slot's worker, started now if the slot has none (first use or after a failure)."""
        if not self._finalizer.alive:
            raise RuntimeError("this ProcessEnvPool is closed; build a new pool")
        if self._workers[slot] is None:
            self._workers[slot] = _Worker(self._context, self._suite)
        return self._workers[slot]

    def _worker_died(self, slot: int) -> StepResult:
        return self._failure(slot, f"worker died (exit code {self._discard(slot)})")

    def _discard(self, slot: int) -> int | None:
        """Stop the slot's worker and its children; a fresh one starts on the slot's next use."""
        worker, self._workers[slot] = self._workers[slot], None
        return worker.stop(self.kill_grace_s)

    def _failure(self, slot: int, error: str) -> StepResult:
        self.failures += 1
        logger.warning("environment slot %d failed: %s (its episode is truncated)", slot, error)
        return StepResult(observation="", info={"error": error}, failed=True)

