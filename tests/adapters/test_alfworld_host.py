"""ALFWorld's games in worker processes (adapters/alfworld/host.py): they play as in this
process, and a worker that dies or hangs costs the game that was asking, never the run nor the
other games it held (those replay their commands in its successor)."""

from __future__ import annotations

import importlib.util
import os
import signal
import threading

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("alfworld") is None,
                                reason="the alfworld extra is not installed")


@pytest.fixture()
def family(tmp_path, monkeypatch):
    from dreamgym_agents.adapters.alfworld.family import AlfworldFamily

    monkeypatch.setenv("DG_CACHE_DIR", str(tmp_path / "cache"))
    return AlfworldFamily()


def _play(game, commands):
    """The game's answers to its start and to each command."""
    answers = [game.reset()]
    answers += [game.step(c) for c in commands]
    return answers


def test_a_hosted_game_plays_as_the_game_in_this_process(family):
    from dreamgym_agents.adapters.alfworld.games import TEXTWORLD_LOCK, Game
    from dreamgym_agents.adapters.alfworld.host import GameHost

    path = family.game_path(family.load_tasks("test")[0])
    with TEXTWORLD_LOCK:
        local = Game(path)
        opening, info = local.reset()
        plan = list(info["expert_plan"])
        commands = ["look", "inventory", *plan]
        here = [(opening, info)] + [local.step(c) for c in commands]
        local.close()
    host = GameHost(1)
    try:
        game = host.game(path)
        assert _play(game, commands) == here
        assert here[-1][1] is True  # the expert's plan wins the game
        game.close()
    finally:
        host.close()


def test_a_worker_that_dies_between_requests_is_replaced_and_its_games_replay(family):
    from dreamgym_agents.adapters.alfworld.host import GameHost

    paths = [family.game_path(t) for t in family.load_tasks("test")[:2]]
    host = GameHost(1)
    try:
        games = [host.game(p) for p in paths]
        starts = [g.reset() for g in games]
        firsts = [g.step(s[1]["expert_plan"][0]) for g, s in zip(games, starts, strict=True)]
        (pid,) = host.pids()
        os.kill(pid, signal.SIGKILL)
        host._workers[0].process.join(10)  # dead before the next request
        seconds = [g.step(s[1]["expert_plan"][1]) for g, s in zip(games, starts, strict=True)]
        assert host.pids() != [pid]
        # the same games played straight through, in a fresh host, give the same answers
        again = GameHost(1)
        try:
            for path, start, first, second in zip(paths, starts, firsts, seconds, strict=True):
                plan = start[1]["expert_plan"]
                assert _play(again.game(path), plan[:2]) == [start, first, second]
        finally:
            again.close()
    finally:
        host.close()


def _two_envs(family):
    from dreamgym_agents.adapters.alfworld.env import AlfworldEnv
    from dreamgym_agents.adapters.alfworld.host import GameHost

    host = GameHost(1, timeout=120)
    envs = []
    for task in family.load_tasks("test")[:2]:
        env = AlfworldEnv(family.game_path, processes=1)
        env._host = host  # one worker holds both games
        envs.append((env, env.reset(task)))
    return host, envs


def test_a_hung_game_fails_its_episode_and_the_other_game_plays_on(family):
    from dreamgym_agents.errors import UnplayableTaskError

    host, ((stuck, _), (other, obs)) = _two_envs(family)
    host.timeout = 3  # the games started; a step replans in well under that
    try:
        (pid,) = host.pids()
        os.kill(pid, signal.SIGSTOP)  # a planner that never returns
        with pytest.raises(UnplayableTaskError, match="did not answer within 3 s"):
            stuck.step("look")
        host.timeout = 120  # the other game starts again in a new worker: no hurry
        result = other.step(obs.info["expert_plan"][0])
        assert result.valid and host.pids() and host.pids() != [pid]
    finally:
        host.close()


def test_a_game_whose_worker_crashes_under_it_fails_with_the_signal(family):
    from dreamgym_agents.errors import UnplayableTaskError

    host, ((crashed, _), (other, obs)) = _two_envs(family)
    try:
        (pid,) = host.pids()
        os.kill(pid, signal.SIGSTOP)  # the request waits in its pipe...
        threading.Timer(3.0, os.kill, (pid, signal.SIGKILL)).start()  # ...as the worker dies
        with pytest.raises(UnplayableTaskError, match="killed by signal 9"):
            crashed.step("look")
        assert other.step(obs.info["expert_plan"][0]).valid
    finally:
        host.close()


def test_the_hosts_settings_are_checked(family):
    from dreamgym_agents.episodes.env import EnvConfig
    from dreamgym_agents.errors import ConfigError

    with pytest.raises(ConfigError, match="env.processes must be 0"):
        family.make_env(EnvConfig(options={"processes": -1}))
    with pytest.raises(ConfigError, match="env.game_timeout_s must be above 0"):
        family.make_env(EnvConfig(options={"game_timeout_s": 0}))
    in_process = family.make_env(EnvConfig(options={"processes": 0}))
    assert in_process._host is None
    assert family.make_env(EnvConfig())._host is not None


def test_a_closed_family_stops_the_workers_that_hold_no_game(family):
    from dreamgym_agents.adapters.alfworld.host import shared_host

    host = shared_host(2, 120.0)
    paths = [family.game_path(t) for t in family.load_tasks("test")[:2]]
    playing, done = host.game(paths[0]), host.game(paths[1])
    playing.reset()
    done.reset()
    done.close()
    assert len(host.pids()) == 2
    family.close()  # one worker still holds a game: only the other stops
    assert len(host.pids()) == 1
    assert playing.step("look")[2]["admissible_commands"]  # the game plays on
    playing.close()
    family.close()
    assert host.pids() == []
    again = host.game(paths[1])  # a later game starts a worker again
    assert again.reset()[1]["admissible_commands"] and len(host.pids()) == 1
    again.close()
    host.close()
