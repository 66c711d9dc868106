"""ALFWorld's official games (the 2020 release's words) beside the generated ones (the wheel's):
one vocabulary for the family, translated at the game's edge; the official folders as task
sets; and no run that dies on a game it cannot play."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dreamgym_agents.adapters.alfworld.dialect import Dialect, canonical

OFFICIAL = Path(__file__).resolve().parents[3] / "shared" / "data" / "alfworld" / "json_2.1.1"
SIX_TYPES = ("look_at_obj_in_light", "pick_and_place_simple", "pick_clean_then_place_in_recep",
             "pick_cool_then_place_in_recep", "pick_heat_then_place_in_recep",
             "pick_two_obj_and_place")
needs_alfworld = pytest.mark.skipif(importlib.util.find_spec("alfworld") is None,
                                    reason="the alfworld extra is not installed")
needs_official = pytest.mark.skipif(not (OFFICIAL / "valid_seen").is_dir(),
                                    reason=f"ALFWorld's official games are not at {OFFICIAL}")
OLD = Dialect(put_in_on=True)


def test_the_2020_release_is_read_in_the_familys_words_and_written_in_its_own():
    assert canonical("put mug 1 in/on desk 2") == "move mug 1 to desk 2"
    assert canonical("take mug 1 from desk 2") == "take mug 1 from desk 2"
    assert OLD.to_game("move mug 1 to desk 2") == "put mug 1 in/on desk 2"
    assert Dialect().to_game("move mug 1 to desk 2") == "move mug 1 to desk 2"
    assert OLD.from_game("put mug 1 in/on desk 2") == "move mug 1 to desk 2"
    assert OLD.to_game("put book 1 into box 2") == "put book 1 into box 2"  # another verb
    assert OLD.feedback("move mug 1 to desk 2", "You put the mug 1 in/on the desk 2.") == \
        "You move the mug 1 to the desk 2."
    assert OLD.feedback("go to desk 2", "You arrive at loc 23. On the desk 2, you see a mug "
                        "1.") == "You arrive at desk 2. On the desk 2, you see a mug 1."
    assert OLD.feedback("go to drawer 1", "You arrive at loc 5. The drawer 1 is closed.") == \
        "You arrive at drawer 1. The drawer 1 is closed."
    assert OLD.feedback("look", "You arrive at loc 5. The drawer 1 is closed.") == \
        "You arrive at drawer 1. The drawer 1 is closed."  # the receptacle it goes on to name
    same = "You arrive at desk 2. On the desk 2, you see nothing."
    assert Dialect().feedback("go to desk 2", same) == same
    assert Dialect.of_grammar('"put {o} in/on {r}";') == OLD
    assert Dialect.of_grammar('"move {o} to {r}";') == Dialect()


def test_the_action_set_reads_either_releases_put():
    from dreamgym_agents.adapters.alfworld.env import AlfworldActionSet

    assert AlfworldActionSet().parse("Put mug 1 in/on desk 2")[0].text == "move mug 1 to desk 2"


def _first_games(split: str = "valid_seen") -> list[Path]:
    """The first solvable game of each of the six task types."""
    found = []
    for task_type in SIX_TYPES:
        for game in sorted((OFFICIAL / split).glob(f"{task_type}-*/*/game.tw-pddl")):
            if json.loads(game.read_text())["solvable"]:
                found.append(game)
                break
    return found


def _play_first_games(check) -> None:
    """The expert's episode of each of :func:`_first_games`, ``check(game, observation)``
    before each step; asserts that each is won."""
    from dreamgym_agents.adapters.alfworld.env import AlfworldEnv
    from dreamgym_agents.adapters.alfworld.family import AlfworldFamily
    from dreamgym_agents.types import Task

    codec = AlfworldFamily().experience_codec(3)
    env = AlfworldEnv(lambda task: task.config["game_file"])
    try:
        for game in _first_games():
            task = Task(task_id=game.parent.name, family="alfworld", intent="",
                        config={"game_file": str(game)})
            obs = env.reset(task)
            assert Dialect.of_game(game) == OLD
            won = False
            for _ in range(50):
                plan = obs.info["expert_plan"]
                assert plan, game
                admissible = obs.info["admissible"]
                assert not any("in/on" in c for c in admissible + plan)
                check(game, obs)
                assert plan[0] in admissible
                result = env.step(plan[0])
                assert result.valid, (game, plan[0], result.error)
                at = next(line for line in result.observation.state.splitlines()
                          if line.startswith("At: "))
                assert "loc " not in at
                if plan[0].startswith("go to "):
                    assert at == "At: " + plan[0][len("go to "):]
                written = codec.encode_state(result.observation.state, obs.state, [], None,
                                             plan[0])
                assert codec.expand_state(written, obs.state, [], None, plan[0]) == \
                    result.observation.state
                obs = result.observation
                if result.done:
                    won = result.success
                    break
            assert won, game
    finally:
        env.close()


@needs_alfworld
@needs_official
@pytest.mark.slow
def test_an_official_game_of_each_type_plays_in_the_familys_words():
    """The expert wins each; every command offered, planned and played is the family's (no
    ``put … in/on``); an arrival names where the player is; the codec writes each step and
    reads it back exactly."""
    _play_first_games(lambda game, obs: None)


@needs_alfworld
@needs_official
@pytest.mark.slow
def test_the_policys_choices_on_an_official_game_are_the_games():
    """The policy's choices (from the state alone: the dream's and the policy view's) are the
    game's own (but ``help``, which the 2020 games lack), a receptacle beside the one gone to
    included (a 2020 game can place two at one location: the countertop by the sinkbasin)."""
    from dreamgym_agents.adapters.alfworld.belief import admissible_in

    def same(game, obs):
        assert set(obs.info["admissible"]) == set(admissible_in(obs.state)) - {"help"}, game

    _play_first_games(same)


def test_a_receptacle_beside_the_one_gone_to_is_here_too():
    from dreamgym_agents.adapters.alfworld.belief import Belief, admissible_in

    belief = Belief.start("You are in the middle of a room. Looking quickly around you, you "
                          "see a countertop 2, a sinkbasin 1, and a cabinet 1.\n\nYour task is "
                          "to: put a clean mug in countertop.")
    belief.update("go to sinkbasin 1", "You arrive at sinkbasin 1. On the sinkbasin 1, you "
                  "see a mug 1.")
    belief.notice_here(["examine sinkbasin 1", "examine countertop 2", "take mug 1 from "
                        "sinkbasin 1", "examine mug 1"])
    state = belief.render()
    assert "Also here: countertop 2" in state.splitlines()
    assert Belief.parse(state).render() == state
    choices = admissible_in(state)
    assert "examine countertop 2" in choices and "go to countertop 2" not in choices
    belief.update("take mug 1 from sinkbasin 1", "You pick up the mug 1 from the sinkbasin 1.")
    assert "move mug 1 to countertop 2" in admissible_in(belief.render())
    belief.update("go to cabinet 1", "You arrive at cabinet 1. The cabinet 1 is closed.")
    assert "Also here" not in belief.render()  # somewhere else: until the game says again


@needs_official
def test_an_official_folder_is_its_solvable_games_of_the_six_types_links_followed(tmp_path):
    from dreamgym_agents.adapters.alfworld.family import AlfworldFamily

    linked = tmp_path / "linked"
    linked.mkdir()
    picked = sorted((OFFICIAL / "valid_seen").glob("look_at_obj_in_light-*"))[:6]
    for folder in picked:
        (linked / folder.name).symlink_to(folder)
    family = AlfworldFamily()
    tasks = family.load_task_file(str(linked))
    games = [g for f in picked for g in f.glob("*/game.tw-pddl")]
    solvable = [g for g in games if json.loads(g.read_text())["solvable"]]
    assert 0 < len(tasks) == len(solvable) < len(games)  # the data marks some unsolvable
    assert {Path(t.config["game_file"]).parent.name for t in tasks} == \
        {g.parent.name for g in solvable}
    first = tasks[0]
    assert first.task_id.startswith("linked/look_at_obj_in_light-")
    assert family.instance_key(first)[0] == "official"
    # the same game reached by another path is the same task
    direct = family.load_task_file(str(OFFICIAL / "valid_seen"))
    same = [t for t in direct if family.instance_key(t) == family.instance_key(first)]
    assert len(same) == 1
    assert family.instance_key(family.load_tasks("test")[0])[0] == "game"


def _broken_games(root: Path, good: Path) -> None:
    """A folder of four games: ``good`` (a copy), a truncated one, one whose goal names a
    predicate its domain does not declare (the planner's translator ends the process with
    SystemExit on it) and one whose goal cannot be reached (textworld cannot start it)."""
    text = good.read_text()
    game = json.loads(text)
    for name in ("a-good", "b-truncated", "c-undeclared", "d-unreachable"):
        (root / name / "trial_x").mkdir(parents=True)
    shutil.copy(good, root / "a-good" / "trial_x" / "game.tw-pddl")
    (root / "b-truncated" / "trial_x" / "game.tw-pddl").write_text(text[:4000])
    problem = game["pddl_problem"]
    at = problem.index("(and", problem.index("(:goal")) + len("(and")
    undeclared = {**game, "pddl_problem": problem[:at] +
                  " (exists (?x - object) (receptacleObjectType ?x MugType))" + problem[at:]}
    (root / "c-undeclared" / "trial_x" / "game.tw-pddl").write_text(json.dumps(undeclared))
    unreachable = {**game, "pddl_problem": problem[:at] + " (holds agent1 agent1)" +
                   problem[at:]}
    (root / "d-unreachable" / "trial_x" / "game.tw-pddl").write_text(json.dumps(unreachable))


@needs_alfworld
@pytest.mark.slow
def test_a_run_over_broken_games_finishes_with_its_summary_and_says_why(tmp_path, monkeypatch):
    """Generated games (always here): a good one is played, each broken one is a failed
    episode with its reason, and the command exits 0 with its summary."""
    from dreamgym_agents.adapters.alfworld.family import AlfworldFamily

    monkeypatch.setenv("DG_CACHE_DIR", str(tmp_path / "cache"))
    family = AlfworldFamily()
    good = family.game_path(family.load_tasks("test")[0])
    _broken_games(tmp_path / "games", good)
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "dreamgym_agents.cli.main", "eval", "--task", "alfworld",
         "--tasks", str(tmp_path / "games"), "--agent", "oracle", "--max-steps", "20",
         "--concurrency", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
        env={**__import__("os").environ, "DG_CACHE_DIR": str(tmp_path / "cache")})
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 1 and summary["success_rate"] == 1.0
    assert summary["unplayable_episodes"] == 3
    errors = {json.loads(line)["episode_id"].split("-file-")[1]: json.loads(line)
              for line in (out / "errors.jsonl").read_text().splitlines()}
    assert set(errors) == {"games/b-truncated/trial_x", "games/c-undeclared/trial_x",
                           "games/d-unreachable/trial_x"}
    assert all(e["unplayable"] for e in errors.values())
    assert "Undeclared predicate" in errors["games/c-undeclared/trial_x"]["error"]
    assert "3 task(s) could not be played" in run.stderr


@needs_official
def test_the_official_splits_are_task_sets_and_held_out(tmp_path, monkeypatch):
    """``--split valid_seen`` with ALFWORLD_DATA; its games are held out wherever they are
    read from (a linked copy of one is still held out), and no generated game is."""
    from dreamgym_agents.adapters.alfworld.family import AlfworldFamily
    from dreamgym_agents.errors import ConfigError
    from dreamgym_agents.heldout import HeldOut

    family = AlfworldFamily()
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(ConfigError, match="ALFWORLD_DATA"):
        family.load_tasks("valid_seen")
    assert "valid_seen" not in HeldOut.for_family(family).splits  # not there: skipped
    monkeypatch.setenv("ALFWORLD_DATA", str(OFFICIAL.parent))
    seen = family.load_tasks("valid_seen")
    assert len(seen) == 140 and all(t.split == "valid_seen" for t in seen)  # 47 unsolvable
    held = HeldOut.for_family(family)
    assert "valid_seen" in held.splits and all(held.matches(t) for t in seen)
    linked = tmp_path / "copy"
    linked.mkdir()
    folder = Path(seen[0].config["game_file"]).parents[1]
    (linked / folder.name).symlink_to(folder)
    assert all(held.matches(t) for t in family.load_task_file(str(linked)))
    assert not any(held.matches(t) for t in family.load_tasks("train"))
    if (OFFICIAL / "valid_train").is_dir():  # official training games are not held out
        assert not any(held.matches(t) for t in family.load_task_file(
            str(OFFICIAL / "valid_train")))


@needs_official
def test_official_games_play_alfworlds_50_steps_unless_told(monkeypatch, tmp_path):
    """ALFWorld's own evaluation setting is the default for its games (the family's
    ``standard_max_steps``); generated games keep the command's (an explicit ``--max-steps``
    wins over both, as over any family default)."""
    from dreamgym_agents.adapters.alfworld.family import AlfworldFamily

    family = AlfworldFamily()
    monkeypatch.setenv("ALFWORLD_DATA", str(OFFICIAL.parent))
    assert family.standard_max_steps(family.load_tasks("valid_seen")) == 50
    assert family.standard_max_steps(family.load_tasks("test")) is None
    assert family.standard_max_steps([]) is None


@needs_official
@needs_alfworld
def test_a_run_can_train_on_the_official_training_games(tmp_path, monkeypatch):
    """``--set train_split=valid_train``: the run's training tasks, demonstrations and buffer
    steps come from ALFWorld's official training games; an evaluation split never can."""
    from dreamgym_agents.adapters.alfworld.family import AlfworldFamily
    from dreamgym_agents.errors import ConfigError
    from dreamgym_agents.heldout import HeldOut
    from dreamgym_agents.pipeline.coevolve import for_buffer
    from dreamgym_agents.pipeline.embedded import demos_name, ensure_demos
    from dreamgym_agents.pipeline.run import Pipeline, PipelineConfig
    from dreamgym_agents.types import read_trajectories

    monkeypatch.setenv("ALFWORLD_DATA", str(OFFICIAL.parent))
    monkeypatch.setenv("DG_CACHE_DIR", str(tmp_path / "cache"))
    family = AlfworldFamily()
    train = family.load_tasks("valid_train")
    assert len(train) >= 150 and all(t.split == "valid_train" for t in train)
    assert not any(HeldOut.for_family(family).matches(t) for t in train)
    if not (OFFICIAL / "train").is_dir():
        with pytest.raises(ConfigError, match="json_2.1.1/train"):
            family.load_tasks("official_train")
    with pytest.raises(ConfigError, match="held out"):
        PipelineConfig(task="alfworld", train_split="test")
    run = Pipeline(PipelineConfig(task="alfworld", train_split="valid_train"), tmp_path / "run")
    assert [t.task_id for t in run.train_tasks(family)] == [t.task_id for t in train]
    held = Pipeline(PipelineConfig(task="alfworld", train_split="valid_seen"), tmp_path / "r2")
    with pytest.raises(ConfigError, match="held out by the alfworld family"):
        held.train_tasks(family)
    # the generated train split keeps its demonstrations' name; another split has its own
    assert demos_name(None, 0) == demos_name(None, 0, "train") != demos_name(None, 0,
                                                                             "valid_train")
    folder = ensure_demos("alfworld", 3, split="valid_train", concurrency=1, max_steps=50,
                          folder=tmp_path / "demos")
    episodes = read_trajectories(folder / "oracle" / "trajectories.jsonl")
    assert len(episodes) == 3 and all(e.success for e in episodes)
    assert {e.task.split for e in episodes} == {"valid_train"}
    assert len(for_buffer(episodes, HeldOut.for_family(family), "b",
                          train_split="valid_train")) == 3
    assert for_buffer(episodes, HeldOut.for_family(family), "b") == []  # not its train split
