"""The ALFWorld curriculum: a seed game's variants are other real games of its type in its room,
never a train or held-out game, and the curriculum tells them apart by game, not by wording."""

from __future__ import annotations

import json
import shutil

import pytest

from dreamgym_agents.episodes.env import EnvConfig, make_family
from dreamgym_agents.rl.curriculum import Curriculum, CurriculumConfig
from dreamgym_agents.types import Task

pytest.importorskip("alfworld")


@pytest.fixture(scope="module")
def family():
    made = make_family("alfworld")
    yield made
    made.close()


def test_variants_are_new_games_of_the_seed_type_in_its_room(family):
    train = family.load_tasks("train")
    held = family.load_tasks("validation") + family.load_tasks("test")
    generator, feasible = family.task_generator(train, seed=0)
    assert feasible is None  # feasible by construction
    seed = train[0]
    candidates, choice = generator.generate(seed, 6)
    assert len(candidates) == 6 and choice is not None
    assert candidates[choice]["intent"] != seed.intent  # the selected goal is another one
    games = {family.task_keys(t).pop() for t in train + held}
    for c in candidates:
        game = c["config"]["game"]
        assert (game["layout"], game["task_type"]) == (seed.config["game"]["layout"],
                                                       seed.config["game"]["task_type"])
        assert c["params"]["object"].lower() in c["intent"]  # the goal names its object
        probe = type(seed)(task_id="p", family="alfworld", intent=c["intent"],
                           config={"game": game})
        assert not family.task_keys(probe) & games  # never a train, validation or test game
    again, _ = family.task_generator(train, seed=0)[0].generate(seed, 6)
    assert again == candidates  # deterministic in the seed


def test_the_curriculum_keeps_a_variant_whose_wording_recurs_in_another_game(family):
    train = family.load_tasks("train")
    seed, twin = next((a, b) for i, a in enumerate(train) for b in train[i + 1:]
                      if a.intent == b.intent)  # same wording, another game

    class Proposes:
        def __init__(self, raw):
            self.raw = raw

        def generate(self, task, n):
            return self.raw, 0

    same_wording = {"intent": seed.intent, "params": {},
                    "config": {"game": {**seed.config["game"], "seed": 123456789}}}
    cur = Curriculum(CurriculumConfig(seeds_per_round=1), Proposes([same_wording]), [seed, twin],
                     keys=family.task_keys)
    cur.observe([seed], [[1.0, 0.0]])
    (variant,) = cur.refresh()
    assert variant.intent == seed.intent and variant.config["game"]["seed"] == 123456789
    assert variant.config["synthetic_of"] == seed.task_id and variant.split == "synthetic"
    # the same game again is a duplicate; so would the wording be, judged by wording alone
    cur.observe([seed], [[1.0, 0.0]])
    assert cur.refresh() == [] and cur.stats.reasons == {
        "infeasible: duplicates a known task": 1}
    by_wording = Curriculum(CurriculumConfig(seeds_per_round=1), Proposes([same_wording]),
                            [seed, twin])
    by_wording.observe([seed], [[1.0, 0.0]])
    assert by_wording.refresh() == []


@pytest.mark.slow
def test_a_variant_is_a_real_game_with_its_goal(family, tmp_path, monkeypatch):
    monkeypatch.setenv("DG_CACHE_DIR", str(tmp_path))
    train = family.load_tasks("train")
    generator, _ = family.task_generator(train, seed=1)
    seed = train[0]
    candidates, choice = generator.generate(seed, 3)
    raw = candidates[choice]
    task = type(seed)(task_id="v", family="alfworld", intent=raw["intent"], split="synthetic",
                      config={**seed.config, **raw["config"], "intent": raw["intent"]})
    env = family.make_env(EnvConfig(max_steps=5))
    try:
        obs = env.reset(task)
    finally:
        env.close()
    assert obs.state.startswith(f"Task: {raw['intent']}")  # the game's own task sentence


def test_a_variant_dreams_from_its_seed_opening_with_its_own_goal(family, tmp_path):
    """The dream starts a variant where its seed started (the buffer's recorded opening of the
    seed's game), the Task line rewritten to the variant's goal; the seed itself starts as
    recorded."""
    from dreamgym_agents.buffer.replay import BufferConfig, ReplayBuffer
    from dreamgym_agents.experience.dream import DreamConfig, DreamEnv
    from dreamgym_agents.types import Trajectory, Transition

    seed = family.load_tasks("train")[0]
    opening = family.state_format().initial_state(seed).replace(
        "Room: unknown", "Room: countertop 1")
    first = Transition(episode_id="e", task_id=seed.task_id, step=0, state=opening,
                       action="go to countertop 1", next_state=opening, reward=0.0, done=False,
                       provenance="real")
    variant = type(seed)(task_id=f"{seed.task_id}~v1", family="alfworld",
                         intent="put a candle in toilet", split="synthetic",
                         config={**seed.config, "synthetic_of": seed.task_id})
    with ReplayBuffer(BufferConfig(path=str(tmp_path / "b"), family="alfworld")) as buffer:
        buffer.add_trajectories([Trajectory(episode_id="e", task=seed, transitions=[first])])
        env = DreamEnv(DreamConfig(), None, buffer, family)
        mine = env.reset(variant)
        assert mine.info["start_state"] == "recorded"
        assert mine.state.splitlines()[0] == "Task: put a candle in toilet."
        assert mine.state.splitlines()[1:] == opening.splitlines()[1:]
        assert env.reset(seed).state == opening


def test_the_dream_offers_a_game_state_commands_as_the_game_does(family, tmp_path):
    """ALFWorld's offline agents and LLM agents read the commands from the observation; in the
    dream they come from the state (the family's StateFormat.admissible)."""
    from dreamgym_agents.adapters.alfworld.belief import admissible_in
    from dreamgym_agents.experience.dream import DreamConfig, DreamEnv

    seed = family.load_tasks("train")[0]
    env = DreamEnv(DreamConfig(real_openings=False), None, None, family)
    obs = env.reset(seed)  # no buffer: the synthesised opening
    assert obs.info["start_state"] == "synthesised"
    assert obs.info["admissible"] == admissible_in(obs.state) and "look" in obs.info["admissible"]


@pytest.mark.slow
def test_a_task_without_a_recorded_start_dreams_from_its_real_opening(tmp_path, monkeypatch):
    """Not an empty room to invent: the game's first observation (a reset, no step), read
    once per game."""
    from dreamgym_agents.experience.dream import DreamConfig, DreamEnv

    monkeypatch.setenv("DG_CACHE_DIR", str(tmp_path))
    family = make_family("alfworld")
    task = family.load_tasks("test")[0]
    env = family.make_env(EnvConfig(max_steps=1))
    try:
        real = env.reset(task).state
    finally:
        env.close()
    dream = DreamEnv(DreamConfig(), None, None, family)
    obs = dream.reset(task)
    assert obs.info["start_state"] == "opening" and obs.state == real
    assert "Room: " in real and "Room: unknown" not in real and obs.info["admissible"]
    calls = []
    monkeypatch.setattr(family, "make_env", lambda cfg: calls.append(cfg))
    assert dream.reset(task).state == real and not calls  # cached: no second reset



def test_the_first_looks_of_a_dreams_games_are_read_ahead_in_processes(tmp_path, monkeypatch):
    """read_openings reads each new generated game's first look in a pool of processes and keeps it
    beside the game: the next process's dream reads it and loads no game; a game not made yet
    is made by the worker that reads it; a game textworld cannot load is a warning, nothing
    kept, and the others are read."""
    from dreamgym_agents.adapters.alfworld.games import GAME_FILE, GameSpec, games_root

    monkeypatch.setenv("DG_CACHE_DIR", str(tmp_path))
    family = make_family("alfworld")
    tasks = family.load_tasks("train")[:4]
    for task in tasks[:3]:
        family.game_path(task)
    broken = family.game_path(tasks[2])
    broken.write_text('{"solvable": true}')  # kept as whole, but no game textworld can load
    unmade = games_root() / GameSpec(**tasks[3].config["game"]).folder / GAME_FILE
    assert not unmade.exists()
    assert family.read_openings(tasks, workers=2) == 4
    assert unmade.is_file()  # made in a worker, with its first look
    assert family.read_openings(tasks, workers=2) == 1  # only the broken one is left
    kept = [list(family.game_path(t).parent.glob("start-*.txt")) for t in tasks]
    assert [len(k) for k in kept] == [1, 1, 0, 1]
    from dreamgym_agents.adapters.alfworld import games

    monkeypatch.setattr(games, "first_look", lambda path: pytest.fail("the game was loaded"))
    later = make_family("alfworld")
    for task, files in zip(tasks[:2], kept, strict=False):
        assert later.opening(task) == json.loads(files[0].read_text())["opening"]
        assert "Room: " in later.opening(task) and later.layout(task)
    monkeypatch.undo()
    env = later.make_env(EnvConfig(max_steps=1))
    try:
        assert env.reset(tasks[0]).state == later.opening(tasks[0])
    finally:
        env.close()


def test_a_truncated_kept_game_is_made_again(tmp_path, monkeypatch):
    monkeypatch.setenv("DG_CACHE_DIR", str(tmp_path))
    family = make_family("alfworld")
    task = family.load_tasks("train")[0]
    game = family.game_path(task)
    whole = game.read_text()
    game.write_text(whole[: len(whole) // 2])  # an interrupted write
    assert family.game_path(task) == game and game.read_text() == whole


def test_a_games_opening_is_kept_beside_it_for_the_next_process(tmp_path, monkeypatch):
    monkeypatch.setenv("DG_CACHE_DIR", str(tmp_path))
    first = make_family("alfworld")
    task = first.load_tasks("train")[0]
    try:
        opening = first.opening(task)
        env = first.make_env(EnvConfig(max_steps=1))
        try:
            assert opening == env.reset(task).state  # the game's first observation
        finally:
            env.close()
    finally:
        first.close()
    kept = list(first.game_path(task).parent.glob("start-*.txt"))
    assert len(kept) == 1
    assert json.loads(kept[0].read_text()) == {"opening": opening,
                                               "contents": first.layout(task)}
    from dreamgym_agents.adapters.alfworld import games

    second = make_family("alfworld")  # another process: reads it, loads no game
    monkeypatch.setattr(games, "first_look", lambda path: pytest.fail("the game was loaded"))
    try:
        assert second.opening(task) == opening and second.layout(task) == first.layout(task)
    finally:
        second.close()
    monkeypatch.undo()
    monkeypatch.setenv("DG_CACHE_DIR", str(tmp_path))
    # a game of the user's own (the official games' folder): read, and nothing written there
    game = first.game_path(task)
    official = tmp_path / "official" / game.parent.name
    shutil.copytree(game.parent, official)
    for kept_file in official.glob("start-*.txt"):
        kept_file.unlink()
    theirs = Task(task_id="mine", family="alfworld", intent=task.intent, split="train",
                  config={"game_file": str(official / game.name)})
    third = make_family("alfworld")
    try:
        assert third.opening(theirs) == opening
    finally:
        third.close()
    assert not list(official.glob("start-*.txt"))


def test_loading_a_game_leaves_the_process_arguments_alone(family, monkeypatch):
    """fast_downward's translator sets ``sys.argv`` for its own options and never restores it:
    a script that read its arguments after a game loaded wrote its run to ``./task``."""
    import sys

    from dreamgym_agents.adapters.alfworld import planner

    monkeypatch.setattr(planner, "_SAS_CACHE", {})  # the game is translated here, not cached
    argv = sys.argv
    env = family.make_env(EnvConfig(max_steps=3))
    try:
        env.reset(family.load_tasks("test")[0])
        env.step("look")
    finally:
        env.close()
    assert sys.argv is argv and sys.argv[0] != "translate.py"
