"""SFT of the experience model: a tiny from-scratch model learns (loss falls), is saved with its
manifest, and answers through the in-process provider."""

import json
import math

import pytest
from test_experience_training_data import ListRetriever, episode

from dreamgym_agents.buffer import BufferConfig, ReplayBuffer
from dreamgym_agents.cli import main
from dreamgym_agents.training.experience_data import ExampleConfig, build_examples
from dreamgym_agents.training.experience_pipeline import read_manifest, train_from_trajectories
from dreamgym_agents.training.experience_sft import ExperienceSFTConfig, train_experience_model
from dreamgym_agents.types import write_trajectories


def tiny(out, **kw):
    return ExperienceSFTConfig(output_dir=str(out), vocab_size=400, hidden_size=32, num_layers=1,
                               max_length=768, batch_size=2, learning_rate=3e-3, **kw)


def test_loss_falls_on_a_learnable_set(tmp_path):
    trajs = [episode("a", "$9.99", True), episode("b", "$1.00", False)]
    examples = build_examples(trajs, ListRetriever(trajs), ExampleConfig(top_k=1)) * 4
    result = train_experience_model(examples, tiny(tmp_path / "m", epochs=6))
    assert result.steps > 0 and math.isfinite(result.first_loss)
    assert result.last_loss < result.first_loss * 0.7
    assert (tmp_path / "m" / "config.json").exists()


@pytest.mark.parametrize("bf16", [False, True])
def test_loss_falls_in_either_precision(tmp_path, bf16):
    # bfloat16 autocast (the default on a CPU that computes it natively) or float32: the loss,
    # the optimizer and the saved weights stay float32 either way
    trajs = [episode("a", "$9.99", True), episode("b", "$1.00", False)]
    examples = build_examples(trajs, ListRetriever(trajs), ExampleConfig(top_k=1)) * 4
    result = train_experience_model(examples, tiny(tmp_path / "m", epochs=6, bf16=bf16))
    assert result.bf16 is bf16
    assert result.last_loss < result.first_loss * 0.7
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype", "float32")) == "float32"


def test_a_deadline_cuts_training_short(tmp_path):
    import time

    trajs = [episode("a", "$9.99", True), episode("b", "$1.00", False)]
    examples = build_examples(trajs, ListRetriever(trajs), ExampleConfig(top_k=1)) * 4
    # enough epochs that a full run takes several seconds even at ~75 steps/s (bf16 autocast)
    full = train_experience_model(examples, tiny(tmp_path / "full", epochs=40))
    assert full.seconds > 2
    # a build's deadline already passed: training gets the minimum (1 s), saved as usual
    late = train_experience_model(examples, tiny(tmp_path / "late", epochs=40, time_budget_s=600,
                                                 deadline=time.time() - 5))
    assert 1 <= late.steps < full.steps
    assert (tmp_path / "late" / "config.json").exists()


def test_a_step_count_trains_the_same_weights_twice(tmp_path):
    # max_steps: the run's length and schedule do not depend on the clock, so two runs from the
    # same checkpoint on the same examples and seed save the same weights (a time budget is then
    # only a cap). Both start from one checkpoint: a tokenizer trained from scratch may break
    # BPE count ties in another order each time (huggingface/tokenizers#1794).
    from safetensors.torch import load_file

    from dreamgym_agents.local_provider import make_tiny_checkpoint

    trajs = [episode("a", "$9.99", True), episode("b", "$1.00", False)]
    examples = build_examples(trajs, ListRetriever(trajs), ExampleConfig(top_k=1)) * 4
    base = tmp_path / "base"
    make_tiny_checkpoint(base, [e["messages"][-1]["content"] + e["completion"] for e in examples],
                         vocab_size=400, hidden_size=32, num_layers=1, max_positions=768)
    runs = [train_experience_model(examples, tiny(tmp_path / name, epochs=1, max_steps=9,
                                                  base_model=str(base), time_budget_s=600,
                                                  bf16=False))
            for name in ("one", "two")]
    assert [r.steps for r in runs] == [9, 9]  # more than one pass over the 8 examples
    assert all(r.clock_from_step is None for r in runs)
    one, two = (load_file(str(tmp_path / n / "model.safetensors")) for n in ("one", "two"))
    assert one.keys() == two.keys()
    assert all((one[k] == two[k]).all() for k in one)


def test_pipeline_writes_a_manifest(tmp_path):
    trajs = [episode("a", "$9.99", True), episode("b", "$1.00", False)]
    buffer = ReplayBuffer(BufferConfig(path=str(tmp_path / "buf")))
    manifest = train_from_trajectories(trajs, buffer, ExampleConfig(top_k=1),
                                       tiny(tmp_path / "m", epochs=1))
    buffer.close()
    assert manifest["rationale_source"] == "deterministic" and manifest["examples"] == 4
    assert isinstance(manifest["bf16_autocast"], bool)
    assert read_manifest(tmp_path / "m")["prompt_style"] == "compact"


def test_cli_train_experience(tmp_path, capsys):
    data = tmp_path / "offline.jsonl"
    write_trajectories(data, [episode("a", "$9.99", True), episode("b", "$1.00", False)])
    assert main(["train-experience", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path)]) == 2
    assert "not found" in capsys.readouterr().err
    code = main(["train-experience", str(data), "--out", str(tmp_path / "m"), "--steps", "3",
                 "--time-budget-s", "120"])
    assert code == 0, capsys.readouterr().err
    manifest = json.loads((tmp_path / "m" / "dreamgym_manifest.json").read_text())
    assert manifest["episodes"] == 2 and manifest["steps"] == 3
    assert manifest["schedule_followed_clock_from_step"] is None


def test_budgeted_schedule_follows_the_clock_and_the_steps():
    import time

    import torch

    from dreamgym_agents.training.experience_sft import ExperienceSFTConfig, _clock_schedule

    clocks: list[dict] = []

    def lrs(deadline_in: float, steps: int = 100, run: int = 10) -> list[float]:
        model = torch.nn.Linear(4, 4)
        cfg = ExperienceSFTConfig(output_dir="unused", learning_rate=1.0)
        clocks.append({})
        opt, sched = _clock_schedule(model, cfg, steps, clock=clocks[-1],
                                     deadline=time.perf_counter() + deadline_in)
        out = []
        for _ in range(run):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out

    far = lrs(3600.0)
    assert far[0] < far[4] and far[6] == pytest.approx(1.0, abs=0.01)  # warmup, then ~peak
    assert "behind" not in clocks[-1]  # the steps' schedule alone
    assert lrs(-1.0)[6] == pytest.approx(0.0, abs=1e-9)  # past the deadline: annealed
    assert "behind" in clocks[-1]  # and says so
    assert lrs(3600.0, steps=8, run=10)[9] == pytest.approx(0.0, abs=1e-9)  # out of steps
    assert "behind" not in clocks[-1]


def _lrs_at(monkeypatch, steps: int, deadline: float,
            times: list[float]) -> tuple[list[float], dict]:
    """Learning rates of a budgeted schedule after optimizer steps that end at ``times``
    (seconds on a fake clock that starts at 0), and the schedule's clock record."""
    import torch

    from dreamgym_agents.training import experience_sft
    from dreamgym_agents.training.experience_sft import ExperienceSFTConfig, _clock_schedule

    now = [0.0]
    monkeypatch.setattr(experience_sft.time, "perf_counter", lambda: now[0])
    model = torch.nn.Linear(4, 4)
    cfg = ExperienceSFTConfig(output_dir="unused", learning_rate=1.0)
    clock: dict = {}
    opt, sched = _clock_schedule(model, cfg, steps, deadline=deadline, clock=clock)
    out = []
    for second in times:
        now[0] = second
        opt.step()
        sched.step()
        out.append(opt.param_groups[0]["lr"])
    return out, clock


def test_budgeted_warmup_is_a_share_of_the_budget_not_of_the_planned_steps(monkeypatch):
    # 10,000 planned steps, a 100 s budget that will only fit a few hundred; the clock starts
    # at the first step (0 s)
    lrs, clock = _lrs_at(monkeypatch, 10_000, 100.0, [0.0, 1.0, 4.0, 7.0, 12.0, 55.0, 99.0])
    lrs = lrs[1:]
    # 5 % of the budget (5 s) behind the steps' pace before the clock counts: then it warms up
    # over the next 5 % of what is left, and the cosine ends at the deadline
    assert lrs[0] < lrs[1] < 0.01  # within the slack: the steps' warmup, 10,000 steps long
    assert 0.1 < lrs[2] < 0.9 and clock["behind"] == 4  # at 7 s: warming up by the clock
    assert lrs[3] == pytest.approx(1.0, abs=0.05)  # at 12 s: at the peak
    assert lrs[4] == pytest.approx(0.5, abs=0.05) and lrs[5] < 0.01  # cosine to the deadline


def test_a_run_a_little_behind_keeps_the_steps_schedule(monkeypatch):
    # uneven steps (the longest batches first) put a run that finishes in time briefly behind
    # the clock: within the slack, its learning rates are the steps' alone, as on any machine
    import itertools

    def ends(paces: list[float]) -> list[float]:
        return list(itertools.accumulate(paces))

    steady, _ = _lrs_at(monkeypatch, 100, 100.0, ends([0.5] * 100))
    # 4 s behind at the 3rd step, done at 64 s
    uneven, clock = _lrs_at(monkeypatch, 100, 100.0, ends([3.0] * 2 + [0.6] * 98))
    assert "behind" not in clock and uneven == steady


def test_examples_are_tokenized_with_prompt_masked_and_decisions_weighted(tmp_path):
    from transformers import AutoTokenizer

    from dreamgym_agents.local_provider import format_prompt, make_tiny_checkpoint
    from dreamgym_agents.training.experience_data import decision_spans
    from dreamgym_agents.training.experience_sft import tokenize_example

    completion = ("<reasoning>The agent stops. The task is complete.</reasoning>\n"
                  "<reward>1</reward>\n<done>true</done>\n<success>true</success>\n"
                  "<next_state>\n@state\n</next_state>")
    path = make_tiny_checkpoint(tmp_path / "m", [completion, "task: price?"], vocab_size=300)
    tok = AutoTokenizer.from_pretrained(path)
    example = {"messages": [{"role": "user", "content": "task: price?"}],
               "completion": completion, "decision_spans": decision_spans(completion)}
    row = tokenize_example(tok, example, decision_weight=4.0)
    prompt_len = row["labels"].count(-100)
    prompt, _ = format_prompt(tok, example["messages"])
    assert row["input_ids"][:prompt_len] == tok(prompt)["input_ids"]  # as inference sees it
    assert set(row["token_weights"][:prompt_len]) == {0.0}
    completion_ids = row["labels"][prompt_len:]
    assert tok.decode(completion_ids[:-1]) == completion
    assert completion_ids[-1] == tok.eos_token_id
    weighted = [i for i, w in zip(completion_ids, row["token_weights"][prompt_len:],
                                  strict=True) if w == 4.0]
    text = tok.decode(weighted)
    assert "complete" in text and "true" in text and "@state" in text
    # the block's end right after an unchanged reference is that decision ("no edit")
    assert "agent stops" not in text and text.endswith("@state\n</next_state>")
    assert "<next_state>" not in text
    plain = tokenize_example(tok, example)
    assert set(plain["token_weights"][prompt_len:]) == {1.0}


def test_a_judge_example_trains_only_its_decisions(tmp_path):
    from transformers import AutoTokenizer

    from dreamgym_agents.local_provider import make_tiny_checkpoint
    from dreamgym_agents.training.experience_data import decision_spans
    from dreamgym_agents.training.experience_sft import tokenize_example

    completion = ("<reasoning>The task is complete. Final answer.</reasoning>\n<reward>1</reward>"
                  "\n<done>true</done>\n<success>true</success>\n<next_state>\n@state\n"
                  "</next_state>")
    tok = AutoTokenizer.from_pretrained(make_tiny_checkpoint(tmp_path / "m", [completion],
                                                             vocab_size=300))
    example = {"messages": [{"role": "user", "content": "q"}], "completion": completion,
               "decision_spans": decision_spans(completion)[:-1], "loss": "decisions"}
    row = tokenize_example(tok, example, decision_weight=3.0)
    trained = [i for i, w in zip(row["input_ids"], row["token_weights"], strict=True) if w]
    assert set(row["token_weights"]) == {0.0, 3.0}
    assert "complete" in tok.decode(trained) and "@state" not in tok.decode(trained)
