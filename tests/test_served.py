"""Hosted models through a real OpenAI-compatible server (``transformers serve`` on 127.0.0.1,
no mock on the path): the embedded ALFWorld experience model served and used by ``dream`` as
a hosted experience model, and by ``eval`` as a hosted agent, with usage counted."""

from __future__ import annotations

import json
import shutil

import pytest
from served import transformers_serve

from dreamgym_agents.cli.experience import resolve_experience_model
from dreamgym_agents.cli.main import main
from dreamgym_agents.gateway.local import ROLE_CHAT_TEMPLATE

pytest.importorskip("alfworld")
pytestmark = pytest.mark.slow

KEY = ["--set", "llm.api_key_env=DG_SERVED_KEY"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A copy of the shipped ALFWorld experience model whose tokenizer carries the chat template
    of its prompt layout, served; with the embedded buffer it was trained with."""
    from transformers import AutoTokenizer

    model, buffer = resolve_experience_model(None, "alfworld")
    copy = tmp_path_factory.mktemp("served") / "experience"
    shutil.copytree(model[3:], copy)
    tokenizer = AutoTokenizer.from_pretrained(copy)
    tokenizer.chat_template = ROLE_CHAT_TEMPLATE
    tokenizer.save_pretrained(copy)
    with transformers_serve(copy) as base_url:
        yield copy, buffer, base_url


def _dream(out, model, buffer, *extra):
    code = main(["dream", "--task", "alfworld", "--agent", "oracle", "--split", "test",
                 "--limit", "2", "--max-steps", "3", "--concurrency", "2", "--out", str(out),
                 "--experience-model", model, "--buffer-path", buffer, *extra])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    steps = [s for line in (out / "trajectories.jsonl").read_text().splitlines()
             for s in json.loads(line)["transitions"]]
    return summary, sorted(steps, key=lambda s: (s["task_id"], s["step"]))


@pytest.mark.parametrize("provider", ["openai", "hosted_vllm"])
def test_a_served_experience_model_dreams_like_the_in_process_one(served, tmp_path,
                                                                  monkeypatch, provider):
    """``hosted_vllm/…`` is LiteLLM's route to a vLLM server (``vllm serve CHECKPOINT``), the
    GPU way to serve an experience model: the same OpenAI-compatible API as the server here.
    The codec's bad words (references a step cannot read back) reach the server in the field
    ``transformers serve`` reads (vLLM's own, ``bad_words``, by default for ``hosted_vllm``:
    test_llm): the oracle's ``look`` at the start, unmasked, is answered ``@1`` (no name)."""
    checkpoint, buffer, base_url = served
    monkeypatch.setenv("DG_SERVED_KEY", "not-a-real-key")
    hosted, hosted_steps = _dream(tmp_path / "served", f"{provider}/{checkpoint}", buffer,
                                  "--set", f"llm.api_base={base_url}",
                                  "--set", "llm.server_bad_words=transformers", *KEY)
    local, local_steps = _dream(tmp_path / "local", f"hf/{checkpoint}", buffer)
    # prompted alike (the checkpoint's settings are read through the served path), answered
    # readably, every call counted with its tokens
    assert hosted["em_failures"] == local["em_failures"] == 0
    assert hosted["synthetic_transitions"] == len(hosted_steps) > 0
    usage = hosted["experience_usage"]
    assert usage["calls"] == len(hosted_steps) and usage["prompt_tokens"] > 0
    assert usage["completion_tokens"] > 0
    assert [s["action"] for s in hosted_steps] == [s["action"] for s in local_steps]
    same = sum(h["next_state"] == h2["next_state"]
               for h, h2 in zip(hosted_steps, local_steps, strict=True))
    assert same >= len(local_steps) - 1, (same, len(local_steps))


def test_eval_with_a_served_model_as_the_agent_counts_its_usage(served, tmp_path, monkeypatch):
    checkpoint, _, base_url = served
    monkeypatch.setenv("DG_SERVED_KEY", "not-a-real-key")
    out = tmp_path / "eval"
    code = main(["eval", "--task", "alfworld", "--agent", f"openai/{checkpoint}", "--split",
                 "test", "--limit", "1", "--max-steps", "2", "--out", str(out),
                 "--set", f"llm.api_base={base_url}", "--set", "llm.max_tokens=24", *KEY])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 1 and summary["real_transitions"] == 2
    assert summary["usage"]["calls"] == 2 and summary["usage"]["prompt_tokens"] > 0
    traj = json.loads((out / "trajectories.jsonl").read_text().splitlines()[0])
    assert "not-a-real-key" not in json.dumps(traj) + json.dumps(summary)  # no secret recorded


def test_the_curriculums_llm_generator_asks_a_served_model(served, monkeypatch):
    from dreamgym_agents.episodes.env import make_family
    from dreamgym_agents.rl.curriculum import CurriculumConfig

    checkpoint, _, base_url = served
    monkeypatch.setenv("DG_SERVED_KEY", "not-a-real-key")
    cfg = CurriculumConfig(generator=f"openai/{checkpoint}",
                           generator_llm={"api_base": base_url, "api_key_env": "DG_SERVED_KEY",
                                          "max_tokens": 32})
    generator = cfg.llm_generator()
    seed = make_family("alfworld").load_tasks("train")[0]
    try:
        candidates, _ = generator.generate(seed, 2)
    finally:
        generator.gateway.close()
    # an experience model is no task generator: its answer is read as malformed, and counted
    assert isinstance(candidates, list) and candidates
    usage = generator.gateway.usage
    assert usage.calls == 1 and usage.prompt_tokens > 0 and usage.completion_tokens > 0


def test_optimize_a_served_agent_in_the_dream_and_play_its_program(served, tmp_path,
                                                                   monkeypatch):
    """``dg-agents optimize`` against the served model (agent and reflection model), then
    ``eval --program``: the saved program's worked example reaches the server."""
    checkpoint, _, base_url = served
    monkeypatch.setenv("DG_SERVED_KEY", "not-a-real-key")
    model = f"openai/{checkpoint}"
    hosted = [f"{section}.{k}" for section in ("agent", "reflection")
              for k in (f"api_base={base_url}", "api_key_env=DG_SERVED_KEY", "max_tokens=24")]
    out = tmp_path / "opt"
    code = main(["optimize", "--task", "alfworld", "--model", model, "--out", str(out),
                 "--budget", "4", "--confirm", "1", "--set", "optimize.val_tasks=2",
                 "--set", "optimize.train_tasks=2", "--set", "optimize.max_steps=2",
                 "--set", "optimize.demos=1", *[a for h in hosted for a in ("--set", h)]])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dream_episodes"] >= 2 and summary["real_transitions"] == 4
    agent = summary["usage"]["agent"]
    assert agent["calls"] == summary["synthetic_transitions"] + 4 and agent["prompt_tokens"] > 0
    assert summary["usage"]["reflection"]["calls"] >= 0
    text = (out / "program.json").read_text() + json.dumps(summary)
    assert "not-a-real-key" not in text

    def played(*extra):
        folder = tmp_path / f"eval{len(extra)}"
        assert main(["eval", "--task", "alfworld", "--agent", model, "--split", "test",
                     "--limit", "1", "--max-steps", "1", "--out", str(folder),
                     "--set", f"llm.api_base={base_url}", "--set", "llm.max_tokens=8",
                     *KEY, *extra]) == 0
        return json.loads((folder / "summary.json").read_text())["usage"]

    plain, with_program = played(), played("--program", str(out / "program.json"))
    assert plain["calls"] == with_program["calls"] == 1
    assert with_program["prompt_tokens"] > plain["prompt_tokens"]  # its worked example


def test_the_fidelity_judge_asks_a_served_model_and_counts_its_usage(served, tmp_path,
                                                                    monkeypatch):
    checkpoint, _, base_url = served
    monkeypatch.setenv("DG_SERVED_KEY", "not-a-real-key")
    real = tmp_path / "oracle"
    assert main(["eval", "--task", "alfworld", "--agent", "oracle", "--split", "test",
                 "--limit", "1", "--max-steps", "3", "--out", str(real)]) == 0
    out = tmp_path / "fidelity"
    assert main(["fidelity", "--task", "alfworld", "--real", str(real), "--out", str(out),
                 "--judge", f"openai/{checkpoint}", "--judge-samples", "1",
                 "--set", f"judge.api_base={base_url}", "--set", "judge.api_key_env=DG_SERVED_KEY",
                 "--set", "judge.max_tokens=16"]) == 0
    report = json.loads((out / "fidelity.json").read_text())
    judge = report["judge"]
    # an experience model is no judge: its answer is unreadable, and counted, as is the call
    assert judge["judged"] + judge["unparseable"] == 1
    assert judge["usage"]["calls"] == 1 and judge["usage"]["prompt_tokens"] > 0
