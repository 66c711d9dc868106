"""Fidelity metrics: state F1, transition accuracies, success rate, the judge rubric."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from test_experience import HOME, LAPTOPS, TASK, ScriptedModel

from dreamgym_agents.adapters.webarena.family import WebArenaFamily
from dreamgym_agents.episodes.env import ends_by_type, make_family
from dreamgym_agents.errors import ModelError
from dreamgym_agents.experience.fidelity import (
    RUBRIC,
    RubricParseError,
    episode_success_rate,
    judge_trajectories,
    parse_rubric,
    rubric_prompt,
    state_f1,
    transition_metrics,
)
from dreamgym_agents.experience.model import ExperienceOutput, ExperiencePrediction
from dreamgym_agents.types import Trajectory, Transition

CART = "URL: http://shop/cart\nTitle: Cart\n[4] button 'Checkout'\nStaticText 'Total $12.99'"


def real_steps() -> list[Transition]:
    return [
        Transition("ep", 0, "7", HOME, "click('1')", LAPTOPS),
        Transition("ep", 1, "7", LAPTOPS, "click('3')", CART),
        Transition("ep", 2, "7", CART, "send_msg_to_user('$12.99')", CART, reward=1.0,
                   done=True, success=True),
    ]


def perfect(t: Transition) -> ExperiencePrediction:
    return ExperiencePrediction(ExperienceOutput("", t.next_state, t.reward, t.done, t.success))


def test_state_f1_edge_cases():
    assert state_f1("", "") == 1.0 and state_f1("\n \n", "") == 1.0
    assert state_f1(HOME, "") == 0.0 and state_f1("", HOME) == 0.0
    assert state_f1(HOME, HOME) == 1.0
    shuffled = "\n".join(reversed(HOME.splitlines()))
    assert state_f1(shuffled, HOME) == 1.0  # a multiset of lines: order does not count
    spaced = "  URL:   http://shop/ \n\nTitle: Shop"
    assert state_f1(spaced, "URL: http://shop/\nTitle: Shop") == 1.0
    # 2 of 4 real lines, 2 of 2 predicted: P = 1, R = 0.5
    assert state_f1("URL: http://shop/\nTitle: Shop", HOME) == pytest.approx(2 / 3)
    # repeated lines count as often as they occur
    assert state_f1("StaticText 'a'\nStaticText 'a'", "StaticText 'a'") == pytest.approx(2 / 3)
    assert state_f1("[7] link 'Laptops'", "[1] link 'Laptops'") == 0.0
    strip = WebArenaFamily.state_format().strip_ids
    assert state_f1("[7] link 'Laptops'", "[1] link 'Laptops'", strip_ids=strip) == 1.0


def test_a_perfect_model_scores_one_on_every_metric():
    metrics = transition_metrics([(t, perfect(t)) for t in real_steps()])
    for name in ("reward_accuracy", "done_accuracy", "success_accuracy", "state_f1"):
        assert metrics[name] == 1.0 and metrics[f"{name}_ok"] == 1.0
    assert metrics["em_failure_rate"] == 0.0 and metrics["n"] == 3 and metrics["n_ok"] == 3


def test_a_corrupted_model_scores_lower():
    steps = real_steps()
    rng = random.Random(0)
    pairs = []
    for t in steps[:2]:  # wrong rewards and dropped/shuffled lines
        lines = t.next_state.splitlines()[1:]
        rng.shuffle(lines)
        out = ExperienceOutput("", "\n".join(lines), 1.0 - t.reward, t.done, t.success)
        pairs.append((t, ExperiencePrediction(out)))
    pairs.append((steps[2], ExperiencePrediction(None, failure="missing <next_state>")))
    metrics = transition_metrics(pairs)
    assert metrics["reward_accuracy"] == 0.0
    assert metrics["done_accuracy"] == pytest.approx(2 / 3)  # the failure counts as wrong
    assert metrics["done_accuracy_ok"] == 1.0  # … but not among the readable predictions
    assert 0.0 < metrics["state_f1"] < metrics["state_f1_ok"] < 1.0
    assert metrics["em_failure_rate"] == pytest.approx(1 / 3) and metrics["n_ok"] == 2


def test_final_steps_are_scored_apart_by_their_real_outcome():
    right = real_steps()[2]
    wrong = Transition("ep2", 2, "7", CART, "send_msg_to_user('$1')", CART, done=True)
    called = {True: ExperiencePrediction(ExperienceOutput("", CART, 1.0, True, True)),
              False: ExperiencePrediction(ExperienceOutput("", CART, 0.0, True, False))}
    failed = ExperiencePrediction(None, failure="garbage")
    navigation = [(t, perfect(t)) for t in real_steps()[:2]]
    metrics = transition_metrics([*navigation, (right, called[True]), (wrong, called[True])])
    assert metrics["final_success_recall"] == 1.0 and metrics["final_failure_recall"] == 0.0
    assert metrics["n_final_success"] == 1 and metrics["n_final_failure"] == 1
    metrics = transition_metrics([(right, called[False]), (wrong, called[False]),
                                  (wrong, failed)])
    assert metrics["final_success_recall"] == 0.0
    assert metrics["final_failure_recall"] == 0.5  # an EM failure is not a right call
    assert transition_metrics(navigation)["final_success_recall"] is None


def test_done_is_compared_with_termination_not_the_step_limit():
    cut = Transition("ep", 5, "7", HOME, "click('1')", LAPTOPS, done=True,
                     info={"truncated": True})
    says_done = ExperiencePrediction(ExperienceOutput("", LAPTOPS, 0.0, True, False))
    says_going = ExperiencePrediction(ExperienceOutput("", LAPTOPS, 0.0, False, False))
    assert transition_metrics([(cut, says_going)])["done_accuracy"] == 1.0
    assert transition_metrics([(cut, says_done)])["done_accuracy"] == 0.0


def test_rare_outcomes_are_scored_balanced_next_to_trivial_baselines():
    # 9 navigation steps and 1 right answer: predicting reward 0 everywhere is 90 % accurate
    steps = [Transition("ep", i, "7", HOME, "click('1')", LAPTOPS) for i in range(9)]
    steps.append(real_steps()[2])
    never = [(t, ExperiencePrediction(ExperienceOutput("", t.next_state, 0.0, False, False)))
             for t in steps]
    metrics = transition_metrics(never, is_terminal=ends_by_type(make_family("webarena")
                                                               .action_set()))
    assert metrics["reward_accuracy"] == pytest.approx(0.9)
    assert metrics["reward_balanced_accuracy"] == 0.5 and metrics["reward_f1"] == 0.0
    assert metrics["done_balanced_accuracy"] == 0.5 and metrics["done_f1"] == 0.0
    base = metrics["baselines"]
    assert base["reward_always_0"]["accuracy"] == pytest.approx(0.9)
    assert base["reward_always_0"]["balanced_accuracy"] == 0.5
    assert base["reward_always_0"]["f1"] == 0.0 and base["reward_always_0"]["positives"] == 1
    # done is read off the action's type: the answer ends the episode, a click does not
    assert base["done_from_action_type"]["accuracy"] == 1.0
    assert base["done_from_action_type"]["f1"] == 1.0
    # copying the current page: HOME → LAPTOPS shares nothing, CART → CART everything
    assert base["state_f1_copy_current_page"] == pytest.approx(0.1)
    assert transition_metrics(never)["baselines"]["done_from_action_type"] is None  # no set
    right = transition_metrics([(t, perfect(t)) for t in steps])
    assert right["reward_balanced_accuracy"] == right["reward_f1"] == 1.0
    assert right["done_balanced_accuracy"] == right["done_f1"] == 1.0
    # an experience-model failure counts as wrong in the balanced scores too
    failed = [*never[:9], (steps[9], ExperiencePrediction(None, failure="garbage"))]
    assert transition_metrics(failed)["reward_balanced_accuracy"] == 0.5


def test_binary_scores():
    from dreamgym_agents.experience.fidelity import binary_scores

    scores = binary_scores([True, True, False, False], [True, False, False, None])
    assert scores["accuracy"] == 0.5 and scores["balanced_accuracy"] == 0.5
    assert scores["f1"] == pytest.approx(2 * 1.0 * 0.5 / 1.5, abs=1e-4)
    assert binary_scores([False, False], [False, False])["f1"] is None  # no positive case


def test_no_pairs_gives_zeros():
    metrics = transition_metrics([])
    assert metrics["n"] == 0 and metrics["state_f1"] == 0.0 and metrics["em_failure_rate"] == 0.0


def test_episode_success_rate():
    won = Trajectory("a", TASK, success=True)
    lost = Trajectory("b", TASK)
    assert episode_success_rate([won, lost, lost, won]) == 0.5
    assert episode_success_rate([]) == 0.0


def judged(causal=2, diversity=1, info=2, halluc=2) -> str:
    return (f"Plausible.\n<causal_consistency>{causal}</causal_consistency>\n"
            f"<diversity>{diversity}</diversity>\n<informativeness>{info}</informativeness>\n"
            f"<hallucination>{halluc}</hallucination>")


def test_rubric_prompt_shows_the_task_and_every_step():
    trajectory = Trajectory("ep", TASK, real_steps(), provenance="synthetic")
    system, user = rubric_prompt(trajectory)
    for name in RUBRIC:
        assert f"<{name}>" in system["content"]
    assert "2 = no hallucination" in system["content"]
    assert TASK.intent in user["content"] and "## Step 3" in user["content"]
    assert "Action: send_msg_to_user('$12.99')" in user["content"]
    assert "reward 1, done true" in user["content"]


def test_parse_rubric():
    assert parse_rubric(judged()) == {"causal_consistency": 2, "diversity": 1,
                                      "informativeness": 2, "hallucination": 2}
    assert parse_rubric(judged().upper().replace("PLAUSIBLE.", ""))["diversity"] == 1
    with pytest.raises(RubricParseError, match="<diversity> '3'"):
        parse_rubric(judged(diversity=3))
    with pytest.raises(RubricParseError, match="<hallucination> missing"):
        parse_rubric(judged().split("<hallucination>")[0])


def test_judge_trajectories_means_and_counts_unreadable_answers():
    trajectories = [Trajectory(f"ep{i}", TASK, real_steps()) for i in range(5)]
    scripted = ScriptedModel([judged(2, 1, 2, 2), "I refuse", judged(0, 1, 1, 0)])
    report = judge_trajectories(scripted, trajectories, n=3, seed=1)
    assert len(scripted.requests) == 3
    assert report["judged"] == 2 and report["unparseable"] == 1
    assert report["causal_consistency"] == 1.0 and report["diversity"] == 1.0
    assert report["informativeness"] == 1.5 and report["hallucination"] == 1.0
    nothing = judge_trajectories(ScriptedModel(["?"]), trajectories, n=10)
    assert nothing["judged"] == 0 and nothing["unparseable"] == 5
    assert nothing["causal_consistency"] is None


def test_judge_model_errors_propagate():
    class Broken:
        def complete(self, messages):
            raise ModelError("judge down")

    with pytest.raises(ModelError):
        judge_trajectories(Broken(), [Trajectory("ep", TASK, real_steps())], n=1)


def test_a_limited_fidelity_run_spreads_its_tasks_over_the_templates():
    from dreamgym_agents.experience.fidelity_run import RealRun, held_out_tasks
    from dreamgym_agents.types import Task

    def task(i: int, template: int) -> Task:
        return Task(task_id=str(i), family="webarena", intent=f"task {i}", split="test",
                    template_id=str(template))

    # the way task files list them: each template's tasks together
    tasks = [task(i, template) for i, template in enumerate([1, 1, 1, 1, 2, 2, 3, 3, 3])]
    run = RealRun(path=Path("."), agent="oracle", trajectories=[
        Trajectory(episode_id=f"e{t.task_id}", task=t) for t in tasks])
    ids = [t.task_id for t in held_out_tasks([run], limit=5)]
    assert ids == ["0", "1", "4", "5", "6"]  # 2 + 2 + 1, in file order
    assert [t.task_id for t in held_out_tasks([run], limit=3)] == ["0", "4", "6"]
    assert len(held_out_tasks([run])) == 9 and len(held_out_tasks([run], limit=50)) == 9


def test_the_baselines_benchmark_rescores_recorded_predictions(tmp_path):
    """benchmarks/fidelity_baselines.py: a prediction file's reward/done beside the baselines,
    and state F1 beside copying the current page (from the real run it was made on)."""
    import importlib.util
    import json

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "fidelity_baselines.py"
    spec = importlib.util.spec_from_file_location("fidelity_baselines", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    steps = [Transition(episode_id="e", step=0, task_id="1", state="URL: a\nTitle: A",
                        action="click('3')", next_state="URL: b\nTitle: B"),
             Transition(episode_id="e", step=1, task_id="1", state="URL: b\nTitle: B",
                        action="send_msg_to_user('42')", next_state="URL: b\nTitle: B",
                        reward=1.0, done=True, success=True)]
    rows = [{"id": "e:0", "action": "click('3')", "state_f1": 1.0,
             "real": {"reward": 0.0, "done": False, "success": False},
             "predicted": {"reward": 0.0, "done": False, "success": False}},
            {"id": "e:1", "action": "send_msg_to_user('42')", "state_f1": None,
             "real": {"reward": 1.0, "done": True, "success": True}, "predicted": None}]
    scores = module.rescore(rows, {f"e:{t.step}": t for t in steps})
    assert scores["reward"]["model"]["accuracy"] == 0.5  # the failure counts as wrong
    assert scores["reward"]["baseline"]["balanced_accuracy"] == 0.5
    assert scores["done"]["baseline"]["accuracy"] == 1.0  # an answer ends the episode
    assert scores["state_f1"]["model"] == 0.5 and scores["state_f1"]["baseline"] == 0.5
    assert "copy the current page" in module.table(scores)
    with pytest.raises(SystemExit, match="not in the real runs"):
        module.rescore(rows, {})
    json.dumps(scores)


def test_exact_match_is_reported_apart_on_transitions_that_reveal_the_unknowable():
    """A family's reveals(state, next_state) splits the exact-match rate: the transitions whose
    next state shows what the state could not say are scored apart from the others."""
    steps = real_steps()
    wrong = ExperiencePrediction(ExperienceOutput("", HOME, 0.0, False, False))
    pairs = [(steps[0], wrong), (steps[1], perfect(steps[1])), (steps[2], perfect(steps[2]))]
    metrics = transition_metrics(pairs, reveals=lambda state, nxt: nxt == LAPTOPS)
    assert metrics["n_revealing"] == 1 and metrics["state_exact_revealing"] == 0.0
    assert metrics["n_determined"] == 2 and metrics["state_exact_determined"] == 1.0
    assert "state_exact_determined" not in transition_metrics(pairs)
