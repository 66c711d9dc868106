"""``dg-agents run`` and ``bench``: bad input gets one clear line; a tiny ``run --preset quick``
goes end to end on the bundled site (a tiny experience model, a few steps of each stage)."""

from __future__ import annotations

import json

import pytest

from dreamgym_agents.cli.main import main

TINY_RECIPE = ("{oracle_tasks: 6, noisy_tasks: 1, quitter_tasks: 2, random_tasks: 1, "
               "max_steps: 6, explorer_tasks: 1, explorer_pages: 1, explorer_steps: 5, "
               "order_explorer_tasks: 1, hidden_size: 32, num_layers: 1, vocab_size: 500, "
               "sft_steps: 10, batch_size: 4, counterfactual_answers: 1}")
TINY = ["--set", f"experience_recipe={TINY_RECIPE}", "--set", "demo_tasks=2",
        "--set", "eval_limit=2", "--set", "eval_concurrency=2", "--set", "eval_max_steps=3",
        "--set", "sft.max_steps=4", "--set", "sft.hidden_size=32", "--set", "sft.num_layers=1",
        "--set", "sft.vocab_size=400", "--set", "sft.max_length=4096",
        "--set", "dream.max_steps=1", "--set", "dream.tasks_per_step=2",
        "--set", "dream.num_generations=2", "--set", "dream.micro_batch=2",
        "--set", "dream.max_episode_steps=2", "--set", "dream.concurrency=4",
        "--set", "s2r.max_steps=1", "--set", "s2r.tasks_per_step=1",
        "--set", "s2r.num_generations=2", "--set", "s2r.micro_batch=2",
        "--set", "s2r.max_episode_steps=2", "--set", "s2r.concurrency=2",
        "--set", "s2r.real_transition_budget=2", "--set", "calibrate_limit=2",
        "--set", "dream.validate_limit=2", "--set", "s2r.validate_limit=2"]


@pytest.mark.parametrize(("args", "message"), [
    (["--preset", "fast"], "unknown preset 'fast': use quick or full"),
    (["--policy", "nonsense-model"], "unknown model 'nonsense-model'"),
    (["--set", "nope=1"], "unknown config key 'nope'"),
    (["--set", "dream.max_steps=many"], "config key 'dream.max_steps' expects int"),
    (["--set", "dream.num_generations=1"], "num_generations must be at least 2"),
    (["--set", "curriculum.synthetic_share=2"], "synthetic_share (λ) must be in [0, 1]"),
    (["--set", "experience_recipe={oracle: 3}"], "unknown experience_recipe key(s) oracle"),
    (["--set", "experience_model=hf/no/such/dir"], "local checkpoint not found: no/such/dir"),
    (["--set", "experience_buffer=/tmp"], "experience_buffer is the buffer of another"),
])
def test_bad_run_input_gets_one_clear_line(tmp_path, capsys, args, message):
    code = main(["run", "--out", str(tmp_path / "r"), *args])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and message in err, err


def test_a_pretrained_policy_trains_at_its_own_rates_unless_set():
    from dreamgym_agents.cli.policy import _pipeline_config
    from dreamgym_agents.pipeline.run import (
        PRETRAINED_RL_LR,
        PRETRAINED_SFT_LR,
        PRETRAINED_SFT_STEPS,
        RL_LR,
        WARM_START_LR,
    )

    embedded = _pipeline_config("quick", 0, "embedded", None, None, None, "webarena")
    assert embedded.sft.learning_rate == WARM_START_LR and embedded.dream.learning_rate == RL_LR
    hf = _pipeline_config("quick", 0, "hf/some/checkpoint", None, None, None, "webarena")
    assert hf.sft.learning_rate == PRETRAINED_SFT_LR and hf.sft.max_steps == PRETRAINED_SFT_STEPS
    assert hf.dream.learning_rate == hf.s2r.learning_rate == PRETRAINED_RL_LR
    assert hf.sft.entity_swaps == 0
    assert hf.policy_view.show_options and not embedded.policy_view.show_options
    chosen = _pipeline_config("quick", 0, "hf/some/checkpoint", None, None,
                              ["sft.learning_rate=3e-4", "dream.learning_rate=1e-5"], "webarena")
    assert chosen.sft.learning_rate == 3e-4 and chosen.dream.learning_rate == 1e-5


def test_bad_bench_input_gets_one_clear_line(tmp_path, capsys):
    assert main(["bench", "--out", str(tmp_path), "--seeds", "0"]) == 2
    assert "--seeds" in capsys.readouterr().err
    assert main(["bench", "--out", str(tmp_path), "--real-budget", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "real-budget must be at least 10" in err
    assert main(["bench", "--out", str(tmp_path), "--ablation", "no_memory"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown ablation 'no_memory'" in err
    assert main(["bench", "--out", str(tmp_path), "--no-ablations", "--ablation",
                 "no_reasoning"]) == 2
    assert "contradict" in capsys.readouterr().err


@pytest.mark.browser
@pytest.mark.slow
def test_tiny_run_end_to_end_then_resume(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DG_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "run"
    assert main(["run", "--task", "webarena", "--preset", "quick", "--out", str(out),
                 *TINY]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    summary = json.loads((out / "summary.json").read_text())
    for key in ("sft_success", "dream_success", "s2r_success", "real_transitions_used",
                "synthetic_transitions", "wall_seconds"):
        assert key in summary and printed[key] == summary[key]
    assert summary["synthetic_transitions"] > 0 and summary["dream_real_transitions"] == 0
    assert summary["real_transitions_used"] == 2  # the budget, never more
    assert (out / "report.md").exists() and (out / "success_vs_real.png").exists()
    for stage in ("sft", "dream_rl", "s2r"):
        assert (out / "checkpoints" / stage / "config.json").exists()
    assert (out / "stages" / "dream_rl" / "rollouts.jsonl").exists()
    state = json.loads((out / "state.json").read_text())
    assert state["done"]["sft"]["offline_episodes"] >= 2  # the demonstrations joined the data
    assert "demos-v" in state["done"]["experience"]["demos"]
    assert state["done"]["sft"]["from_scratch"] is False  # started from the experience model
    # training saw train tasks only (and curriculum variants of them), evaluation test tasks only
    from dreamgym_agents.types import read_trajectories

    rollouts = read_trajectories(out / "stages" / "dream_rl" / "rollouts.jsonl")
    assert rollouts and {t.task.split for t in rollouts} <= {"train", "synthetic"}
    assert all(t.task.config.get("synthetic_of") for t in rollouts if t.task.split == "synthetic")
    batches = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    for stage in ("dream_rl", "s2r"):  # every batch, those whose episodes a budget cut too
        splits = [b["rollout/task_splits"] for b in batches
                  if b.get("stage") == stage and "rollout/task_splits" in b]
        assert splits and all(set(s) <= {"train", "synthetic"} for s in splits), splits
    for stage in ("eval_sft", "eval_dream", "eval_s2r"):
        evaluated = read_trajectories(out / "eval" / stage / "trajectories.jsonl")
        assert evaluated and {t.task.split for t in evaluated} == {"test"}
    assert summary["held_out_rejected"]["sft"] == 0
    # the run's own buffer learnt S2R's real steps (train tasks only), and the dream sees them
    assert state["buffer_added"]["s2r"] == 2 == state["done"]["s2r"]["buffer_added"]
    assert "dream_rl" not in state["buffer_added"]  # the dream's own: only with buffer_dream
    from dreamgym_agents.buffer.replay import BufferConfig, ReplayBuffer
    from dreamgym_agents.episodes.env import make_family

    family = make_family("webarena")
    held_out = {str(t.task_id) for s in ("validation", "test") for t in family.load_tasks(s)}
    buffer = ReplayBuffer(BufferConfig(path=str(out / "buffer"), family="webarena"))
    try:
        records = buffer.transitions()
        assert not {t.task_id for t in records} & held_out  # no validation or test step
        played = [t for t in records if t.provenance == "real"]
        assert len(played) == 2 and all(t.episode_id.startswith("s2r-") for t in played)
        step = played[0]
        found = buffer.retrieve(step.state, step.action, k=3,
                                where={"provenance": {"$in": ["offline", "real"]}})
        assert found[0].episode_id == step.episode_id  # the next dream step retrieves it
    finally:
        buffer.close()
        family.close()
    # each RL stage's policies in the dream against their real validation episodes
    calibrated = state["done"]["dream_rl"]["calibration"]
    assert calibrated["start"]["all"]["tasks"] == 2 and calibrated["final"]["all"]["tasks"] == 2
    assert state["done"]["s2r"]["calibration"]["start"] == calibrated["final"]
    assert "The dream against reality" in (out / "report.md").read_text()
    assert summary["calibration"]["s2r"]["final"]["tasks"] == 2
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("rollout/success" in m for m in metrics) and any("grpo/loss" in m for m in metrics)
    # a rerun of the same command finds every stage done
    assert main(["run", "--task", "webarena", "--preset", "quick", "--out", str(out),
                 *TINY]) == 0
    assert "stage " not in capsys.readouterr().err


TINY_ALFWORLD = ["--set", "experience_recipe={oracle_tasks: 4, noisy_tasks: 1, random_tasks: 1, "
                 "decoy_tasks: 1, max_steps: 10, hidden_size: 32, num_layers: 1, "
                 "vocab_size: 500, sft_steps: 10, batch_size: 4}", "--set", "eval_max_steps=8",
                 *[arg for i in range(0, len(TINY), 2) for arg in TINY[i:i + 2]
                   if not TINY[i + 1].startswith(("experience_recipe", "eval_max_steps"))]]
"""The web tiny run's settings with an ALFWorld recipe (its episodes need a few more steps)."""


@pytest.mark.slow
def test_tiny_run_end_to_end_on_alfworld(tmp_path, monkeypatch, capsys):
    """The same pipeline on the second family: its recipe built on first use (no bundle), the
    expert's demonstrations, the dream with ALFWorld's codec and state format, real RL within
    the budget; training on train games, evaluation on test games."""
    monkeypatch.setenv("DG_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "run"
    assert main(["run", "--task", "alfworld", "--preset", "quick", "--out", str(out),
                 *TINY_ALFWORLD, "--set", "experience_refresh.enabled=true", "--set",
                 "experience_refresh.steps=2", "--set", "experience_refresh.min_transitions=1"]
                ) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["synthetic_transitions"] > 0 and summary["dream_real_transitions"] == 0
    assert summary["real_transitions_used"] == 2
    state = json.loads((out / "state.json").read_text())
    assert state["done"]["sft"]["offline_episodes"] >= 2  # no train game held out by its intent
    # the experience model refreshed on S2R's real steps: calibrated before and after, the
    # run dreams with the new checkpoint from then on
    refresh = state["refreshes"][-1]
    assert refresh["stage"] == "s2r" and refresh["steps"] == 2
    assert refresh["fresh_transitions"] == 2
    assert refresh["calibration_before"]["all"]["tasks"] == 2
    assert refresh["calibration_after"]["all"]["tasks"] == 2
    assert state["experience_now"] == f"hf/{refresh['model']}"
    assert summary["experience_refreshes"][-1]["steps"] == 2
    assert "/alfworld/" in state["done"]["experience"]["model"]
    from dreamgym_agents.types import read_trajectories

    for stage in ("eval_sft", "eval_dream", "eval_s2r"):
        evaluated = read_trajectories(out / "eval" / stage / "trajectories.jsonl")
        assert evaluated and {t.task.family for t in evaluated} == {"alfworld"}
        assert {t.task.split for t in evaluated} == {"test"}
    # another experience model plays the dream (here the same checkpoint, named), prompted as
    # its manifest says; the offline data and the warm start stay the recipe's (cached)
    done = state["done"]["experience"]
    other = tmp_path / "other"
    assert main(["run", "--task", "alfworld", "--preset", "quick", "--out", str(other),
                 *TINY_ALFWORLD, "--set", f"experience_model={done['model']}",
                 "--set", f"experience_buffer={done['buffer']}", "--no-sim-to-real"]) == 0
    again = json.loads((other / "state.json").read_text())["done"]
    assert again["experience"]["dream_model"] == done["model"]
    assert again["experience"]["dream_buffer"] == done["buffer"]
    assert json.loads((other / "summary.json").read_text())["synthetic_transitions"] > 0


def test_a_turn_lists_the_states_commands_only_when_asked():
    pytest.importorskip("alfworld")
    from dreamgym_agents.episodes.env import make_family
    from dreamgym_agents.policy.model import PolicyConfig, turn_text, view_record

    family = make_family("alfworld")
    task = family.load_tasks("test")[0]
    state = family.state_format().initial_state(task)
    view = family.policy_view()
    plain = turn_text(task, state, cfg=PolicyConfig(), view=view)
    listed = turn_text(task, state, cfg=PolicyConfig(show_options=True), view=view)
    assert "Commands:" not in plain and listed.startswith(plain.split("\nTask:")[0])
    commands = listed.split("Commands: ", 1)[1].split("\n", 1)[0].split("; ")
    assert "look" in commands or any(c.startswith("go to ") for c in commands)
    # off, the setting is left out of the records warm starts and bundles are matched by
    assert "show_options" not in view_record(PolicyConfig())
    assert view_record(PolicyConfig(show_options=True))["show_options"] is True
