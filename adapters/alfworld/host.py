"""ALFWorld's games played in child processes: a crash or a hang in native code costs one game.

textworld's PDDL backend runs ALFWorld's planner (Fast Downward's translator in Python, its
search in C++ through ctypes) inside the process that plays the game. A game whose PDDL the
translator rejects ends it with ``SystemExit``; one that crashes the C++ side, or loops in it,
would end or stall the whole run. A :class:`GameHost` keeps the games in worker processes
(``spawn``: textworld and torch do not survive a fork) and talks to them over pipes:

- each request (start a game, play a command, close it) has a time limit; a worker that dies
  (a signal, an exit) or does not answer in time is killed, and the game that was asking is
  failed with :class:`GameCrashedError`, saying which;
- the other games that lived in that worker are rebuilt in its successor on their next request
  by replaying their commands since their start (the games are deterministic), so one bad game
  never takes another episode with it;
- the workers play at once (one per core by default), where in one process textworld's lock let
  one game step at a time.

:class:`HostedGame` has :class:`.games.Game`'s interface (``reset``, ``step``, ``close``,
``path``), so :class:`.env.AlfworldEnv` plays either.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import threading
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300.0
"""How long one request (a game's start, or one command) may take before its worker counts as
hung: far above a game's start, which translates its PDDL, and a step, which replans."""

STARTUP_TIMEOUT_S = 180.0
"""How long a new worker may take to import textworld and ALFWorld before its first request
(seconds here on an idle machine; not counted against the request's own limit)."""


class GameCrashedError(RuntimeError):
    """A game's worker process died or hung while playing it (the game is not playable here)."""


class GameFailedError(RuntimeError):
    """The game raised in its worker: ``kind`` is the exception's type name (``SystemExit``
    for Fast Downward's translator rejecting the PDDL), ``message`` its text."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def _serve(conn: Any) -> None:
    """A worker's loop: requests ``(op, game_id, *args)`` in, ``("ok", value)`` or
    ``("error", kind, message)`` out, one at a time, until ``("quit",)`` or the pipe closes."""
    from dreamgym_agents.adapters.alfworld.games import Game, _textworld

    _textworld()  # the imports a game needs, before saying ready
    conn.send(("ready",))
    games: dict[int, Any] = {}
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        op = request[0]
        if op == "quit":
            return
        try:
            if op == "open":
                _, gid, path, expert = request
                old = games.pop(gid, None)
                if old is not None:
                    old.close()
                game = Game(path, expert=expert)
                games[gid] = game
                value: Any = game.reset()
            elif op == "step":
                value = games[request[1]].step(request[2])
            elif op == "close":
                game = games.pop(request[1], None)
                if game is not None:
                    game.close()
                value = None
            else:
                raise ValueError(f"unknown request {op!r}")
        except (Exception, SystemExit) as exc:  # the translator ends with SystemExit
            conn.send(("error", type(exc).__name__, " ".join(str(exc).split())))
        else:
            conn.send(("ok", value))


class _Worker:
    """One worker process and its pipe; ``generation`` counts its restarts."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.lock = threading.Lock()
        self.process: Any = None
        self.conn: Any = None
        self.generation = 0
        self.games = 0
        self.ready = False

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        process = context.Process(target=_serve, args=(child,), daemon=True,
                                  name=f"alfworld-games-{self.index}")
        process.start()
        child.close()
        self.process, self.conn, self.ready = process, parent, False

    def stop(self) -> None:
        process, conn = self.process, self.conn
        self.process = self.conn = None
        if process is None:
            return
        try:
            conn.send(("quit",))
        except (OSError, ValueError):
            pass
        process.join(2)
        if process.is_alive():
            process.kill()
            process.join(2)
        conn.close()

    def kill(self) -> str:
        """Ends a worker that died or hung; returns how it ended, in words."""
        process, conn = self.process, self.conn
        self.process = self.conn = None
        self.generation += 1
        if process is None:
            return "it was not running"
        if process.is_alive():
            process.kill()
        process.join(5)
        conn.close()
        code = process.exitcode
        if code is not None and code < 0:
            return f"its process was killed by signal {-code}"
        return f"its process exited with status {code}"

    def ensure(self) -> None:
        """A running worker: started if there is none, replaced if it died between requests
        (its games are then rebuilt on their next request: :attr:`generation` moved)."""
        if self.process is not None and not self.process.is_alive():
            logger.warning("ALFWorld game worker %d ended between requests (%s); starting "
                           "another", self.index, self.kill())
        if self.process is None:
            self.start()

    def _await_ready(self) -> None:
        try:
            answered = self.conn.poll(STARTUP_TIMEOUT_S)
            reply = self.conn.recv() if answered else None
        except (EOFError, OSError):
            answered, reply = True, None
        if reply == ("ready",):
            self.ready = True
            return
        how = self.kill()
        if not answered:
            how = f"it did not start within {STARTUP_TIMEOUT_S:g} s"
        raise GameCrashedError(f"the game's worker process could not start ({how})")

    def call(self, request: tuple[Any, ...], timeout: float) -> Any:
        """One request and its answer (the caller holds :attr:`lock`).

        Raises:
            GameCrashedError: The worker died or did not answer within ``timeout`` seconds
                while on this request (it is killed, and replaced on the next request).
            GameFailedError: The game raised (the worker goes on).
        """
        self.ensure()
        if not self.ready:
            self._await_ready()
        try:
            self.conn.send(request)
            answered = self.conn.poll(timeout)
            reply = self.conn.recv() if answered else None
        except (EOFError, OSError, BrokenPipeError):
            reply, answered = None, True
        if reply is None:
            if answered:
                how = self.kill()
                raise GameCrashedError(f"the game's worker process died ({how})")
            self.kill()
            raise GameCrashedError(f"the game did not answer within {timeout:g} s (its "
                                   "worker process was stopped)")
        if reply[0] == "error":
            raise GameFailedError(reply[1], reply[2])
        return reply[1]


class GameHost:
    """Worker processes that play ALFWorld games (:mod:`this module <.host>`).

    Args:
        processes: Worker processes (None: one per core this process may use).
        timeout: Seconds one request may take before its worker counts as hung.
    """

    def __init__(self, processes: int | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        if processes is not None and processes < 1:
            raise ValueError(f"a game host needs at least one process, not {processes}")
        self.timeout = timeout
        self._workers = [_Worker(i) for i in range(processes or _cores())]
        self._lock = threading.Lock()
        self._next_id = 0

    @property
    def processes(self) -> int:
        return len(self._workers)

    def pids(self) -> list[int]:
        """The running workers' process ids."""
        return [w.process.pid for w in self._workers if w.process is not None]

    def game(self, path: str | Path, *, expert: bool = True) -> HostedGame:
        """A game on the least busy worker (not started: call ``reset``)."""
        with self._lock:
            worker = min(self._workers, key=lambda w: (w.games, w.index))
            worker.games += 1
            self._next_id += 1
            return HostedGame(self, worker, self._next_id, str(path), expert)

    def close(self) -> None:
        for worker in self._workers:
            with worker.lock:
                worker.stop()

    def release_idle(self) -> int:
        """Stop the workers that hold no game (each grows large once it has played a few
        dozen games: the planner's translations it keeps); they start again on their next
        game. Returns how many were stopped."""
        stopped = 0
        for worker in self._workers:
            with self._lock:
                idle = worker.games == 0
            if idle and worker.process is not None:
                with worker.lock:
                    worker.stop()
                    worker.generation += 1
                stopped += 1
        return stopped

    def _release(self, worker: _Worker) -> None:
        with self._lock:
            worker.games -= 1


class HostedGame:
    """A game in a :class:`GameHost` worker, with :class:`.games.Game`'s interface.

    It keeps its commands since its start: if its worker is replaced (another game crashed
    it), the next request starts it again in the new worker and replays them first.
    """

    def __init__(self, host: GameHost, worker: _Worker, game_id: int, path: str,
                 expert: bool) -> None:
        self._host, self._worker, self._id = host, worker, game_id
        self.path = path
        self._expert = expert
        self._commands: list[str] = []
        self._generation: int | None = None  # the worker generation that holds the game
        self._closed = False

    def reset(self) -> tuple[str, dict[str, Any]]:
        with self._worker.lock:
            self._commands = []
            return self._open()

    def step(self, command: str) -> tuple[str, bool, dict[str, Any]]:
        with self._worker.lock:
            self._worker.ensure()
            if self._generation != self._worker.generation:
                self._rebuild()
            result = self._worker.call(("step", self._id, command), self._host.timeout)
            self._commands.append(command)
            return result

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._worker.lock:
            if (self._generation == self._worker.generation
                    and self._worker.process is not None and self._worker.process.is_alive()):
                try:
                    self._worker.call(("close", self._id), self._host.timeout)
                except (GameCrashedError, GameFailedError) as exc:
                    logger.debug("closing game %s: %s", self.path, exc)
        self._host._release(self._worker)

    def _open(self) -> tuple[str, dict[str, Any]]:
        value = self._worker.call(("open", self._id, self.path, self._expert),
                                  self._host.timeout)
        self._generation = self._worker.generation
        return value

    def _rebuild(self) -> None:
        """Starts the game again in the current worker and replays its commands."""
        logger.info("game %s: its worker was replaced; replaying its %d command(s)", self.path,
                    len(self._commands))
        self._open()
        for command in self._commands:
            self._worker.call(("step", self._id, command), self._host.timeout)


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


_HOSTS: dict[tuple[int | None, float], GameHost] = {}
_HOSTS_LOCK = threading.Lock()


def shared_host(processes: int | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> GameHost:
    """The process's game host for these settings (made on first use, its workers started on
    their first game, stopped at exit)."""
    key = (processes, timeout)
    with _HOSTS_LOCK:
        host = _HOSTS.get(key)
        if host is None:
            host = _HOSTS[key] = GameHost(processes, timeout)
        return host


def release_idle_workers() -> int:
    """:meth:`GameHost.release_idle` of every host of this process: what a family does when it
    closes. The games of a collection or an evaluation are then over, and a pipeline's next
    stage, its SFT or its dream, needs no game worker. Returns how many workers were stopped."""
    with _HOSTS_LOCK:
        hosts = list(_HOSTS.values())
    return sum(host.release_idle() for host in hosts)


@atexit.register
def _close_hosts() -> None:
    with _HOSTS_LOCK:
        hosts = list(_HOSTS.values())
        _HOSTS.clear()
    for host in hosts:
        host.close()
