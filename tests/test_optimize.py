"""Prompt programs (``dg-agents optimize``): saved and loaded by name, rendered by the agent in
its own template, DSPy's calls through the gateway, and the whole optimisation on ALFWorld with
scripted model answers (LiteLLM's ``mock_response``: the served-model run is in
``test_served.py``)."""

from __future__ import annotations

import json

import pytest
from test_cli import assert_one_line_error, dg

from dreamgym_agents.episodes.agent import (
    LLMAgent,
    render_agent_prompt,
    template_instruction,
)
from dreamgym_agents.episodes.env import Observation
from dreamgym_agents.errors import ConfigError
from dreamgym_agents.gateway.llm import Gateway, LLMConfig
from dreamgym_agents.prompts import load_prompt
from dreamgym_agents.prompts.programs import PromptProgram, load_program, save_program
from dreamgym_agents.types import Task

FIELDS = {"intent": "put an apple in the fridge", "action_space": "text commands",
          "options": "", "history": "(none)", "state": "You see a fridge {1}"}
DEMO = {"intent": "put a mug in {the} sink", "history": "", "state": "At: sink 1",
        "reasoning": "the mug is here", "action": "take mug 1 from sink 1"}


@pytest.mark.parametrize("name", ["agent.md", "web_agent.md"])
def test_a_template_renders_as_written_without_a_program(name):
    template = load_prompt(name)
    assert render_agent_prompt(template, FIELDS) == template.format(**FIELDS)
    assert "finish once it is done" in template_instruction(template)


def test_a_program_replaces_the_instruction_and_shows_its_worked_examples():
    template = load_prompt("agent.md")
    old = template_instruction(template)
    text = render_agent_prompt(template, FIELDS, instruction="Open the fridge {id} first.",
                               demos=[DEMO])
    assert old not in text and "# How to act\nOpen the fridge {id} first.\n" in text
    examples, task = text.index("# Worked examples"), text.index("# Task\n")
    assert examples < task  # the examples come before the task at hand
    assert "put a mug in {the} sink" in text and "<action>take mug 1 from sink 1</action>" in text
    assert "You see a fridge {1}" in text  # braces of fields and examples both survive


def test_a_template_without_an_instruction_paragraph_cannot_be_optimised():
    with pytest.raises(ConfigError, match="How to act"):
        template_instruction("Task: {intent}\n{state}")


def test_programs_save_and_load_by_path_and_are_checked(tmp_path):
    program = PromptProgram(target="agent", family="alfworld", template="agent.md",
                            instruction="Look first.", demos=[DEMO], model="openai/m")
    path = save_program(program, str(tmp_path / "p.json"))
    loaded = load_program(str(path))
    assert loaded == program and loaded.check("agent", "alfworld") is loaded
    with pytest.raises(ConfigError, match="not the agent of 'webarena'"):
        loaded.check("agent", "webarena")
    with pytest.raises(ConfigError, match="no prompt program 'nope'"):
        load_program("nope")
    with pytest.raises(ConfigError, match="program name"):
        load_program("x y")
    (tmp_path / "bad.json").write_text("[1]")
    with pytest.raises(ConfigError, match="not a prompt program"):
        load_program(str(tmp_path / "bad.json"))
    with pytest.raises(ConfigError, match="target"):
        PromptProgram(target="policy", family="a", template="agent.md", instruction="x")


def test_the_agent_plays_with_its_program():
    template = "agent.md"
    program = PromptProgram(target="agent", family="alfworld", template=template,
                            instruction="Open the fridge first.", demos=[DEMO])
    gateway = Gateway(LLMConfig(model="openai/m", mock_response="<action>look</action>"))
    agent = LLMAgent(gateway, "text commands", prompt=template, program=program)
    task = Task(task_id="t", family="alfworld", intent="put an apple in the fridge")
    content = agent.messages(task, Observation(state="At: fridge 1"), [])[0]["content"]
    assert "Open the fridge first." in content and "## Example 1" in content


def test_dspy_calls_go_through_the_gateway_and_the_agents_layout():
    dspy = pytest.importorskip("dspy")
    from dreamgym_agents.optimize.dspy_bridge import agent_adapter, agent_signature, dspy_lm

    template = load_prompt("agent.md")
    gateway = Gateway(LLMConfig(model="openai/m",
                                mock_response="<think>it is here</think><action>look</action>"))
    predict = dspy.Predict(agent_signature(template))
    predict.demos = [dspy.Example(**DEMO)]
    lm = dspy_lm(gateway)
    with dspy.context(lm=lm, adapter=agent_adapter(template)):
        out = predict(**FIELDS)
    assert (out.reasoning, out.action) == ("it is here", "look")
    assert gateway.usage.calls == 1  # counted by the gateway
    # exactly the prompt the agent renders with that program
    [message] = lm.history[-1]["messages"]
    assert message["content"] == render_agent_prompt(template, FIELDS, demos=[DEMO])


def test_a_program_for_an_offline_agent_or_another_family_is_refused(tmp_path):
    program = PromptProgram(target="agent", family="alfworld", template="agent.md",
                            instruction="Look first.")
    path = save_program(program, str(tmp_path / "p.json"))
    proc = dg("eval", "--task", "alfworld", "--agent", "oracle", "--program", str(path),
              "--out", str(tmp_path / "o"), "--limit", "1")
    assert_one_line_error(proc, "offline agent")
    proc = dg("eval", "--task", "webarena", "--agent", "openai/m", "--program", str(path),
              "--out", str(tmp_path / "o2"), "--limit", "1")
    assert_one_line_error(proc, "not the agent of 'webarena'")
    proc = dg("optimize", "--task", "alfworld", "--model", "openai/m", "--target",
              "planner", "--out", str(tmp_path / "o3"))
    assert proc.returncode != 0 and "planner" in proc.stderr


@pytest.mark.slow
def test_optimize_plays_the_dream_confirms_on_real_games_and_saves_a_loadable_program(
        tmp_path):
    pytest.importorskip("alfworld")
    pytest.importorskip("dspy")
    from dreamgym_agents.cli.main import main

    out = tmp_path / "opt"
    proposal = json.dumps({"new_instruction": "Go to the place the task names, then look."})
    code = main(["optimize", "--task", "alfworld", "--model", "openai/scripted", "--out",
                 str(out), "--budget", "6", "--confirm", "1",
                 "--set", "optimize.val_tasks=2", "--set", "optimize.train_tasks=2",
                 "--set", "optimize.max_steps=3",
                 "--set", "agent.mock_response=<think>first look</think><action>look</action>",
                 "--set", f"reflection.mock_response={proposal}"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    dream = (out / "dream" / "trajectories.jsonl").read_text().splitlines()
    # every scoring episode was played in the dream and kept; none cost a real step
    assert summary["dream_episodes"] == len(dream) >= 2
    assert all(json.loads(line)["provenance"] == "synthetic" for line in dream)
    assert summary["synthetic_transitions"] == sum(len(json.loads(line)["transitions"])
                                                   for line in dream)
    # the confirmation: one real test game before and one after, 3 steps each
    assert summary["real_transitions"] == 6
    assert {"real_test_before", "real_test_after", "dream_validation_before"} <= set(
        summary["scores"])
    assert summary["usage"]["agent"]["calls"] == summary["synthetic_transitions"] + 6
    assert summary["usage"]["reflection"]["calls"] >= 1
    program = load_program(str(out / "program.json"))
    assert program.family == "alfworld" and len(program.demos) == 2
    assert all(d["action"] and d["state"] for d in program.demos)  # real demonstration steps
    # it plays: eval with the program
    code = main(["eval", "--task", "alfworld", "--agent", "openai/scripted", "--program",
                 str(out / "program.json"), "--limit", "1", "--max-steps", "2", "--out",
                 str(tmp_path / "eval"), "--set", "llm.mock_response=<action>look</action>"])
    assert code == 0
    meta = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert meta["program"].endswith("program.json") and meta["real_transitions"] == 2


@pytest.mark.slow
def test_run_with_a_hosted_policy_learns_its_prompt_through_every_stage(tmp_path):
    """``run --policy openai/…``: the same stages, folder, summary and report, a prompt program
    per training stage, 0 real transitions in the dream, the sim-to-real search within its
    real budget; a rerun resumes with nothing left to do."""
    pytest.importorskip("alfworld")
    pytest.importorskip("dspy")
    from dreamgym_agents.cli.main import main

    out = tmp_path / "run"
    args = ["run", "--task", "alfworld", "--policy", "openai/scripted", "--out", str(out),
            "--set", "eval_limit=2", "--set", "eval_max_steps=2", "--set", "prompt.budget=2",
            "--set", "prompt.val_tasks=1", "--set", "prompt.train_tasks=1",
            "--set", "prompt.max_steps=2", "--set", "s2r.real_transition_budget=4",
            "--set", 'policy_llm={mock_response: "<think>x</think><action>look</action>"}']
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    state = json.loads((out / "state.json").read_text())["done"]
    assert summary["dream_real_transitions"] == 0 and summary["synthetic_transitions"] == 4
    assert 0 < summary["s2r_real_transitions"] <= 4
    assert summary["eval_episodes"] == 2 and summary["sft_success"] is not None
    for stage in ("sft", "dream_rl", "s2r"):
        program = load_program(state[stage]["path"])
        assert program.target == "agent" and program.model == "openai/scripted"
        assert len(program.demos) == 2  # the warm start's worked examples are kept
    assert state["eval_sft"]["policy_calls"] == 4  # 2 episodes × 2 steps, counted per stage
    assert "DreamGym (dream GEPA)" in (out / "report.md").read_text()
    assert main(args) == 0  # resumed: nothing to redo
    assert json.loads((out / "summary.json").read_text())["wall_seconds"] == (
        summary["wall_seconds"])


EM_ANSWER = ("<reasoning>the agent looks</reasoning>\n<next_state>\nAt: toilet 1\n"
             "Holding: nothing\nFeedback: Nothing happens.\n</next_state>\n"
             "<reward>0</reward> <done>false</done> <success>false</success>")


@pytest.mark.slow
def test_optimize_the_experience_prompt_by_fidelity_on_held_out_real_steps(tmp_path):
    pytest.importorskip("alfworld")
    pytest.importorskip("dspy")
    from dreamgym_agents.cli.main import main

    out = tmp_path / "opt"
    proposal = json.dumps({"new_instruction": "Write the game's next state line by line."})
    code = main(["optimize", "--target", "experience", "--task", "alfworld", "--model",
                 "openai/scripted-em", "--out", str(out), "--budget", "8", "--confirm", "1",
                 "--set", "optimize.val_tasks=2", "--set", "optimize.train_steps=3",
                 "--set", "optimize.val_steps=3", "--set", "optimize.max_steps=4",
                 "--set", f"llm.mock_response={EM_ANSWER}",
                 "--set", f"reflection.mock_response={proposal}"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    scores = summary["scores"]
    # scored by fidelity: a fixed answer gets part of the reward/done/state credit, never all
    assert 0 < scores["validation_before"] < 1 and 0 < scores["test_before"] < 1
    assert scores["validation_after"] >= scores["validation_before"]
    # held-out steps were played here by the oracle and random agents (validation and test)
    assert summary["real_transitions"] > 0 and summary["dream_episodes"] == 0
    assert (out / "real-validation" / "oracle" / "trajectories.jsonl").is_file()
    program = load_program(str(out / "program.json"))
    from dreamgym_agents.episodes.env import make_family

    codec = make_family("alfworld").experience_codec()
    assert program.target == "experience" and program.template == codec.prompt_file
    # the program is used through --set experience.program on the dream
    code = main(["dream", "--task", "alfworld", "--agent", "random", "--limit", "1",
                 "--max-steps", "1", "--experience-model", "openai/scripted-em",
                 "--out", str(tmp_path / "dream"), "--buffer-path", str(tmp_path / "buf"),
                 "--set", f"experience.program={out / 'program.json'}",
                 "--set", f"llm.mock_response={EM_ANSWER}"])
    assert code == 0


def test_optimize_the_task_generator_by_the_share_of_variants_the_curriculum_accepts(tmp_path):
    pytest.importorskip("dspy")
    from dreamgym_agents.cli.main import main
    from dreamgym_agents.rl.curriculum import CurriculumConfig

    answer = json.dumps({"candidates": [
        {"intent": "Tell me the price of the cheapest laptop the shop sells", "params": {}},
        {"intent": "x"}], "choice": 0})  # one new feasible variant, one malformed
    proposal = json.dumps({"new_instruction": "Propose variants with real products only."})
    out = tmp_path / "gen"
    assert main(["optimize", "--target", "task-generator", "--task", "webarena", "--model",
                 "openai/scripted-gen", "--out", str(out), "--budget", "8",
                 "--set", "optimize.train_tasks=2", "--set", "optimize.val_tasks=2",
                 "--set", f"agent.mock_response={answer}",
                 "--set", f"reflection.mock_response={proposal}"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["scores"]["validation_before"] == 0.5  # by the curriculum's rules
    assert summary["usage"]["generator"]["calls"] >= 4 and summary["real_transitions"] == 0
    program = load_program(str(out / "program.json"))
    assert program.target == "task-generator" and program.template == "task_generator.md"
    # the curriculum's generator is prompted by it
    cfg = CurriculumConfig(generator="openai/scripted-gen", generator_program=str(
        out / "program.json"), generator_llm={"mock_response": answer})
    generator = cfg.llm_generator()
    from dreamgym_agents.episodes.env import make_family

    seed = next(t for t in make_family("webarena").load_tasks("train") if t.params)
    assert generator.messages(seed, 4)[0]["content"].startswith(program.instruction.strip())
    generator.gateway.close()
