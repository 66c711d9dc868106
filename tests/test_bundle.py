"""The embedded bundle: the shipped one matches this code; a tiny one is built end to end by
``dg-agents build-embedded`` and a run loads it instead of collecting and training; a build
stopped by a time budget is partial and never used as the recipe's model."""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
from dataclasses import replace

import pytest

from dreamgym_agents.cli.main import main
from dreamgym_agents.errors import ConfigError, PartialBuildError
from dreamgym_agents.pipeline.bundle import (
    COLLECT_FILE,
    DEMOS_FILE,
    Bundle,
    read_episodes,
    shipped_bundle,
)
from dreamgym_agents.pipeline.embedded import (
    RECIPE_VERSION,
    demos_name,
    family_recipe,
)
from dreamgym_agents.pipeline.run import WARM_START_VERSION, preset_config, warm_start_key
from dreamgym_agents.types import read_trajectories

TINY_RECIPE = dict(oracle_tasks=3, noisy_tasks=1, quitter_tasks=2, random_tasks=1, max_steps=4,
                   explorer_tasks=1, explorer_pages=1, explorer_steps=5, order_explorer_tasks=1,
                   hidden_size=32, num_layers=1, vocab_size=500, sft_steps=10, batch_size=4,
                   counterfactual_answers=1)
TINY_BUILD = {"experience_recipe": TINY_RECIPE, "demo_tasks": 3,
              "warm_start": {"max_steps": 4, "max_length": 4096},
              "eval_limit": 1, "fidelity_limit": 1}


SHIPPED = [pytest.param("webarena"),
           pytest.param("alfworld", marks=pytest.mark.skipif(
               importlib.util.find_spec("alfworld") is None, reason="needs the alfworld extra")),
           pytest.param("tau2", marks=pytest.mark.skipif(
               importlib.util.find_spec("tau2") is None, reason="needs the tau2 extra"))]
"""The families that ship a bundle."""


@pytest.mark.parametrize("family", SHIPPED)
def test_the_shipped_bundle_is_this_codes(monkeypatch, family):
    """Fails when the recipe's code changed and the bundle was not rebuilt (it is stale): run
    dg-agents build-embedded --task FAMILY --out DIR and copy DIR/bundle to bundles/FAMILY/."""
    from dreamgym_agents.episodes.env import make_family, spread_tasks
    from dreamgym_agents.pipeline.bundle import read_episodes
    from dreamgym_agents.policy.model import view_record

    monkeypatch.delenv("DG_BUNDLE", raising=False)
    bundle = shipped_bundle(family)
    assert bundle is not None, f"the package ships no embedded bundle (bundles/{family}/)"
    m = bundle.manifest
    recipe = family_recipe(family)
    assert m["family"] == family
    assert m["experience"]["recipe_version"] == RECIPE_VERSION
    assert bundle.experience_key == recipe.key
    assert m["warm_start"]["version"] == WARM_START_VERSION
    preset = preset_config("quick", 0, family)
    key = warm_start_key(preset.sft, preset.policy_view, init=recipe.key,
                         collect=recipe.collect_key, demos=demos_name(None, 0))
    assert bundle.warm_start_key == key, "the warm start's recipe changed: rebuild the bundle"
    assert m["split"]["trained_on"] == "train"
    assert m["built"]["commit"] and m["figures"]["fidelity"] and m["figures"]["warm_start"]
    assert bundle.verify() == []
    assert m["bytes"] < 60e6  # tens of MB
    # the warm start's test episodes cover the quick preset's evaluation (make run reuses them)
    played = m["figures"]["warm_start"]["episodes"]
    assert played["max_steps"] == preset.eval_max_steps
    assert view_record(played["view"]) == view_record(preset.policy_view)
    tasks = {str(t.task.task_id) for t in read_episodes(bundle.root / played["file"])}
    made = make_family(family)
    quick = spread_tasks(made.load_tasks("test"), preset.eval_limit)
    made.close()
    assert {str(t.task_id) for t in quick} <= tasks


@pytest.mark.parametrize("family", SHIPPED)
def test_no_shipped_episode_is_a_held_out_task(monkeypatch, family):
    """The shipped models trained on train-split episodes only: none of the bundle's seed
    episodes or demonstrations is a validation or test task."""
    from dreamgym_agents.episodes.env import make_family
    from dreamgym_agents.heldout import HeldOut
    from dreamgym_agents.pipeline.bundle import read_episodes

    monkeypatch.delenv("DG_BUNDLE", raising=False)
    bundle = shipped_bundle(family)
    held = HeldOut.for_family(make_family(family))
    assert read_episodes(bundle.collect_file)  # demonstrations: none where the warm start
    for path in (bundle.collect_file, bundle.demos_file):  # learns from the collection (τ²)
        episodes = read_episodes(path)
        assert {t.task.split for t in episodes} <= {"train"}
        assert not [t.task.intent for t in episodes if held.matches(t.task)]


@pytest.mark.browser
def test_dream_loads_the_shipped_bundle_in_seconds(tmp_path, monkeypatch, capsys):
    """No --experience-model: the shipped bundle's model, its buffer made from the seed
    episodes on first use (no collection, no training)."""
    monkeypatch.delenv("DG_BUNDLE", raising=False)
    monkeypatch.setenv("DG_CACHE_DIR", str(tmp_path / "cache"))
    bundle = shipped_bundle("webarena")
    out = tmp_path / "dream"
    code = main(["dream", "--agent", "oracle", "--split", "test", "--limit", "1",
                 "--max-steps", "2", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["experience_model"] == f"hf/{bundle.experience_dir}"
    assert f"bundle-{bundle.id}" in json.dumps(summary)  # the buffer made from its episodes
    assert summary["episodes"] == 1 and summary["synthetic_transitions"] >= 1


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory):
    """A tiny bundle made by the CLI from nothing (its own cache: nothing shared)."""
    root = tmp_path_factory.mktemp("bundle")
    config = root / "build.yaml"
    config.write_text(json.dumps(TINY_BUILD))  # JSON is YAML
    mp = pytest.MonkeyPatch()
    mp.setenv("DG_CACHE_DIR", str(root / "cache"))
    try:
        code = main(["build-embedded", "--out", str(root / "build"), "--config", str(config)])
    finally:
        mp.undo()
    assert code == 0
    return root


@pytest.mark.browser
@pytest.mark.slow
def test_a_tiny_bundle_is_built_end_to_end(tiny_build):
    bundle = Bundle.open(tiny_build / "build" / "bundle")
    m = bundle.manifest
    assert bundle.verify() == []
    assert m["experience"]["recipe"]["oracle_tasks"] == 3 and m["split"]["trained_on"] == "train"
    assert m["experience"]["training"]["steps"] == 10  # the recipe's fixed steps
    assert m["warm_start"]["result"]["steps"] == 4 and not m["warm_start"]["result"]["partial"]
    assert m["demos"]["episodes"] == 3 and m["experience"]["collection"]["episodes"] == 9
    figures = m["figures"]
    assert figures["fidelity"]["tasks"] == 1 and figures["fidelity"]["oracle_real_success"] == 1
    assert 0 <= figures["fidelity"]["state_exact"] <= figures["fidelity"]["state_f1"] <= 1
    assert figures["warm_start"]["tasks"] == 1 and 0 <= figures["warm_start"]["success"] <= 1
    assert m["built"]["commit"] and set(m["built"]["phase_seconds"]) >= {"collect", "measure"}
    # weights stored in bfloat16, computed in float32
    from safetensors import safe_open

    with safe_open(str(bundle.policy_dir / "model.safetensors"), "pt") as fh:
        assert {str(fh.get_tensor(k).dtype) for k in fh.keys()} == {"torch.bfloat16"}
    from dreamgym_agents.gateway.local import load_causal_lm

    _, model = load_causal_lm(bundle.experience_dir)
    assert {str(p.dtype) for p in model.parameters()} == {"torch.float32"}
    # compact episodes: abstract states and outcomes, none of the browser's action code
    with gzip.open(bundle.collect_file, "rt") as fh:
        first = json.loads(fh.readline())
    assert first["info"]["collector"] == "oracle" and first["transitions"][0]["state"]
    assert "code" not in first["transitions"][0]["info"]
    # rerunning the finished build changes nothing
    before = (bundle.root / "manifest.json").read_text()
    config = tiny_build / "build.yaml"
    assert main(["build-embedded", "--out", str(tiny_build / "build"), "--config",
                 str(config)]) == 0
    assert (bundle.root / "manifest.json").read_text() == before


@pytest.mark.browser
@pytest.mark.slow
def test_a_run_loads_the_bundle_instead_of_building(tiny_build, tmp_path, monkeypatch):
    from dreamgym_agents.config import load_config
    from dreamgym_agents.pipeline.run import Pipeline

    monkeypatch.setenv("DG_CACHE_DIR", str(tmp_path / "cache"))  # nothing cached
    monkeypatch.setenv("DG_BUNDLE", str(tiny_build / "build" / "bundle"))
    cfg = preset_config("quick", task="webarena")
    cfg = load_config(cfg, overrides=[f"experience_recipe={json.dumps(TINY_RECIPE)}",
                                      "demo_tasks=3", "sft.max_steps=4", "sft.max_length=4096",
                                      "eval_limit=1"])
    said: list[str] = []

    class Recorder:
        def stage(self, *args):
            pass

        def bar(self, *args):
            return lambda *a, **k: None

        def say(self, message):
            said.append(message)

    pipe = Pipeline(cfg, tmp_path / "run", Recorder())
    pipe._open_folder()
    experience = pipe.stage_experience()
    pipe.state["done"]["experience"] = experience
    sft = pipe.stage_sft()
    pipe.state["done"]["sft"] = sft
    bundle = Bundle.open(tiny_build / "build" / "bundle")
    # the warm start's evaluation: the episodes the build played with it on the same task
    evaluated = pipe.stage_eval_sft()
    measured = bundle.manifest["figures"]["warm_start"]
    assert evaluated["from_bundle"] == bundle.id and evaluated["episodes"] == 1
    assert evaluated["successes"] == measured["successes"]
    assert evaluated["eval_real_transitions"] == 0 < evaluated["build_real_transitions"]
    played = read_trajectories(tmp_path / "run" / "eval" / "eval_sft" / "trajectories.jsonl")
    assert [t.task.task_id for t in played] == [t.task_id for t in pipe.test_tasks()]
    assert all(t.provenance == "real" for t in played[0].transitions)
    # ... only under the same evaluation: another step limit plays its own
    pipe.cfg.eval_max_steps = 3
    assert pipe._bundle_eval() is None
    pipe.close()
    assert experience["bundle"] == sft["bundle"] == bundle.id
    assert experience["model"] == f"hf/{bundle.experience_dir}"
    assert experience["demos"] == str(bundle.demos_file)
    assert not any("collecting" in line or "demonstrations:" in line for line in said), said
    assert sft["steps"] == 4 and (tmp_path / "run" / "checkpoints" / "sft" /
                                  "model.safetensors").exists()
    # with its settings: `eval --agent hf/<run>/checkpoints/sft` plays it in its own layout
    from dreamgym_agents.policy.model import trained_policy_settings

    settings = trained_policy_settings(tmp_path / "run" / "checkpoints" / "sft")
    assert settings is not None and settings.turn_format == "compact"
    assert settings.max_action_tokens == cfg.policy_view.max_action_tokens
    # the buffer was made from the shipped seed episodes on first use, once
    assert (tmp_path / "cache" / f"bundle-{bundle.id}" / "BUFFER_READY").exists()
    from dreamgym_agents.buffer.replay import BufferConfig, ReplayBuffer

    with ReplayBuffer(BufferConfig(path=experience["buffer"])) as buffer:
        assert buffer.count() == bundle.manifest["experience"]["collection"]["transitions"]
    # another warm start (other SFT steps) is not the bundle's: the run trains its own
    assert pipe._warm_start_key(replace(cfg.sft, max_steps=5)) != bundle.warm_start_key


@pytest.mark.browser
@pytest.mark.slow
def test_a_build_stopped_by_its_budget_is_partial_and_refused(tiny_build, tmp_path, capsys):
    # resume a copy of the tiny build after its collection, with a budget too small for SFT
    out = tmp_path / "build"
    out.mkdir()
    shutil.copytree(tiny_build / "build" / "collect", out / "collect")
    (out / "episodes").mkdir()
    shutil.copy2(tiny_build / "build" / COLLECT_FILE, out / COLLECT_FILE)
    record = json.loads((tiny_build / "build" / "build.json").read_text())
    record["phases"] = {"collect": record["phases"]["collect"]}
    slow = {**TINY_BUILD, "experience_recipe": {**TINY_RECIPE, "sft_steps": 100_000}}
    config = tmp_path / "build.yaml"
    config.write_text(json.dumps(slow))
    record["config"]["experience_recipe"]["sft_steps"] = 100_000
    (out / "build.json").write_text(json.dumps(record))
    code = main(["build-embedded", "--out", str(out), "--config", str(config),
                 "--time-budget-s", "3"])
    err = capsys.readouterr().err.strip()
    assert code == 3, err
    last = err.splitlines()[-1]  # (progress goes to stderr too)
    assert last.startswith("error: ") and "marked partial" in last and "step" in last, err
    assert "Traceback" not in err
    assert (out / "experience" / "PARTIAL").exists()
    assert not (out / "experience" / "READY").exists()
    assert not (out / "bundle" / "manifest.json").exists()
    with pytest.raises(ConfigError, match="not an embedded bundle"):
        Bundle.open(out / "bundle")


def test_a_partial_experience_model_is_never_the_recipes(tmp_path):
    from test_experience_training_data import episode

    from dreamgym_agents.pipeline.embedded import train_embedded

    recipe = family_recipe("webarena", **{**TINY_RECIPE, "sft_steps": 100_000})
    episodes = [episode("a", "$9.99", True), episode("b", "$1.00", False)]
    with pytest.raises(PartialBuildError, match="marked partial"):
        train_embedded(recipe, episodes, tmp_path, "webarena", say=lambda m: None,
                       time_budget_s=1.0)
    assert (tmp_path / "PARTIAL").exists() and not (tmp_path / "READY").exists()


def test_a_bundle_folder_without_a_manifest_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("DG_BUNDLE", str(tmp_path))
    with pytest.raises(ConfigError, match="not an embedded bundle"):
        shipped_bundle("webarena")
    (tmp_path / "manifest.json").write_text(json.dumps({"format": 1, "partial": True}))
    with pytest.raises(ConfigError, match="partial build"):
        shipped_bundle("webarena")
    monkeypatch.setenv("DG_BUNDLE", "none")
    assert shipped_bundle("webarena") is None


@pytest.mark.browser
@pytest.mark.slow
def test_the_precision_benchmark_compares_the_stored_weights(tiny_build, capsys, monkeypatch):
    """benchmarks/bundle_precision.py: the float32 models a build trained against the bfloat16
    ones it packaged, on the same recorded turns."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bundle_precision.py"
    spec = importlib.util.spec_from_file_location("bundle_precision", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    build = tiny_build / "build"
    episodes = build / "measure" / "test-oracle" / "trajectories.jsonl"
    monkeypatch.setattr(sys, "argv", ["bundle_precision.py", str(build), str(episodes)])
    module.main()
    out = capsys.readouterr().out
    assert "greedy actions identical" in out and "answers identical in text" in out
    assert "matching the real transition: float32" in out


@pytest.mark.browser
@pytest.mark.slow
def test_the_seeds_benchmark_retrains_and_measures_a_build(tiny_build, tmp_path, capsys,
                                                           monkeypatch):
    """benchmarks/experience_seeds.py: a build's experience model retrained with another seed
    (same recipe and examples) and measured as the build measures its bundle; a rerun reads
    the finished seed back."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "experience_seeds.py"
    spec = importlib.util.spec_from_file_location("experience_seeds", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    build, out = tiny_build / "build", tmp_path / "seeds"
    monkeypatch.setenv("DG_CACHE_DIR", str(tiny_build / "cache"))
    monkeypatch.setattr(sys, "argv", ["experience_seeds.py", str(build), "--seeds", "7",
                                      "--out", str(out)])
    module.main()
    first = capsys.readouterr().out
    figures = json.loads((out / "seed7" / "figures.json").read_text())
    assert figures["sft_seed"] == 7 and figures["training"]["steps"] == 10  # the recipe's steps
    assert figures["tasks"] == 1 and 0 <= figures["oracle_dream_success"] <= 1
    seeded = Bundle.open(out / "seed7" / "bundle")
    assert seeded.verify() == []
    assert seeded.manifest["experience"]["sft_seed"] == 7
    own = (build / "bundle" / "experience" / "model.safetensors").read_bytes()
    assert (out / "seed7" / "bundle" / "experience" / "model.safetensors").read_bytes() != own
    assert "| build |" in first and "| seed 7 |" in first and "over 2 models" in first
    module.main()  # finished seeds are read back, not retrained
    assert capsys.readouterr().out.splitlines()[-3:] == first.splitlines()[-3:]


def test_recipe_fields_set_one_by_one_are_typed_as_the_recipe():
    # `--set experience_recipe.decoy_tasks=240` is the number 240, not the text "240": the
    # recipe's key is the same as from YAML, and the collectors compare counts
    from dreamgym_agents.config import load_config
    from dreamgym_agents.pipeline.bundle_build import BuildConfig

    one = load_config(BuildConfig(), overrides=["experience_recipe.decoy_tasks=240",
                                                "experience_recipe.learning_rate=1e-3",
                                                "experience_recipe.use_history=false"])
    assert one.experience_recipe == {"decoy_tasks": 240, "learning_rate": 0.001,
                                     "use_history": False}
    assert all(type(v) is not str for v in one.experience_recipe.values())
    whole = load_config(BuildConfig(), overrides=[
        'experience_recipe={"decoy_tasks": 240, "learning_rate": 0.001, "use_history": false}'])
    assert whole.experience_recipe == one.experience_recipe


@pytest.mark.browser
@pytest.mark.slow
def test_a_build_resumes_another_bundles_episodes_instead_of_playing_them(tiny_build, tmp_path,
                                                                         capsys):
    # the tiny bundle's own recipe, trained differently: every episode is reused, none played
    source = tiny_build / "build"
    other = {**TINY_BUILD, "experience_recipe": {**TINY_RECIPE, "sft_steps": 12},
             "measure": False}
    config = tmp_path / "build.yaml"
    config.write_text(json.dumps(other))
    out = tmp_path / "build"
    code = main(["build-embedded", "--out", str(out), "--config", str(config),
                 "--reuse-episodes", str(source)])
    err = capsys.readouterr().err
    assert code == 0, err
    bundle = Bundle.open(out / "bundle")
    assert "reused from the bundle" in err and "9 collected episodes, 3 demonstrations" in err
    played = [t for path in [*(out / "collect").glob("*/trajectories.jsonl"),
                             out / "demos" / "oracle" / "trajectories.jsonl"]
              for t in read_trajectories(path)]
    assert len(played) == 12 and all(t.wall_seconds == 0 for t in played)  # none replayed
    for name in (COLLECT_FILE, DEMOS_FILE):  # the same episodes, byte for byte
        assert (out / name).read_bytes() == (source / name).read_bytes()
    assert bundle.manifest["built"]["reused_episodes"] == {
        "bundle": Bundle.open(source / "bundle").id, "collected": 9, "demos": 3}
    assert bundle.manifest["experience"]["training"]["steps"] == 12


@pytest.mark.skipif(importlib.util.find_spec("alfworld") is None,
                    reason="needs the alfworld extra")
def test_reused_episodes_are_those_the_recipe_would_play(tmp_path):
    from dreamgym_agents.pipeline.bundle_build import reuse_episodes

    source = shipped_bundle("alfworld")
    shipped = source.manifest["experience"]["recipe"]
    # another recipe with fewer random and decoy games: the episodes of the games it gives
    # each collector are reused, no other
    recipe = family_recipe("alfworld", random_tasks=shipped["random_tasks"] - 10,
                           decoy_tasks=shipped["decoy_tasks"] // 2)
    demos = source.manifest["demos"]["name"]
    reused = reuse_episodes(source, recipe, tmp_path, "alfworld", demos)
    from dreamgym_agents.episodes.env import make_family
    from dreamgym_agents.episodes.graph import episode_id_for

    family = make_family("alfworld")
    plan = {name: {episode_id_for(t, agent.name) for t in chosen}
            for name, agent, chosen, _ in family.collection_plan(recipe,
                                                                 family.load_tasks("train"))}
    family.close()
    by_name = {}
    for name in plan:
        path = tmp_path / "collect" / name / "trajectories.jsonl"
        by_name[name] = read_trajectories(path) if path.exists() else []
        theirs = {t.episode_id for t in read_episodes(source.collect_file, collectors=[name])}
        assert {t.episode_id for t in by_name[name]} == plan[name] & theirs, name
    assert len(by_name["oracle"]) == shipped["oracle_tasks"]
    assert len(by_name["noisy"]) == shipped["noisy_tasks"]
    assert 0 < len(by_name["random"]) < shipped["random_tasks"] - 10
    assert reused == {"bundle": source.id, "collected": sum(map(len, by_name.values())),
                      "demos": source.manifest["demos"]["episodes"]}
    assert all(t.provenance == "real" for t in by_name["random"])
    # a second call writes nothing twice
    assert reuse_episodes(source, recipe, tmp_path, "alfworld", demos)["collected"] == 0
    assert len(read_trajectories(tmp_path / "collect" / "oracle" / "trajectories.jsonl")) == \
        shipped["oracle_tasks"]
    # other episode settings, or another family's bundle: refused
    with pytest.raises(ConfigError, match="max_steps"):
        reuse_episodes(source, family_recipe("alfworld", max_steps=20), tmp_path / "x",
                       "alfworld", demos)
    with pytest.raises(ConfigError, match="family"):
        reuse_episodes(source, family_recipe("webarena"), tmp_path / "y", "webarena", demos)


@pytest.mark.parametrize("family", ["webarena", "alfworld"])
def test_a_shipped_warm_start_plays_as_the_policy_it_is(family):
    """``eval --agent hf/bundles/<family>/policy`` reads the view the bundle's manifest records
    for its warm start (the folder has no policy.json of its own), not a generic model's."""
    from dreamgym_agents.policy.model import trained_policy_settings, view_record

    bundle = shipped_bundle(family)
    settings = trained_policy_settings(bundle.policy_dir)
    assert settings is not None
    assert view_record(settings) == view_record(bundle.manifest["warm_start"]["view"])
