"""SFT of the experience model: a tiny from-scratch model learns (loss falls), is saved with its
manifest, and answers through the in-process provider."""

import json
import math

import pytest
import torch
from test_experience_training_data import ListRetriever, episode

from dreamgym_agents.adapters.webarena.codec import WebCodec
from dreamgym_agents.buffer.replay import BufferConfig, ReplayBuffer
from dreamgym_agents.cli.main import main
from dreamgym_agents.episodes.env import make_family
from dreamgym_agents.experience.data import ExampleConfig, build_examples
from dreamgym_agents.experience.sft import ExperienceSFTConfig, train_experience_model
from dreamgym_agents.experience.training import read_manifest, train_from_trajectories
from dreamgym_agents.types import write_trajectories

WEB = WebCodec()
WEB_FAMILY = make_family("webarena")


def tiny(out, **kw):
    return ExperienceSFTConfig(output_dir=str(out), vocab_size=400, hidden_size=32, num_layers=1,
                               max_length=768, batch_size=2, learning_rate=3e-3, **kw)


def test_loss_falls_on_a_learnable_set(tmp_path):
    trajs = [episode("a", "$9.99", True), episode("b", "$1.00", False)]
    examples = build_examples(trajs, ListRetriever(trajs), ExampleConfig(top_k=1), WEB) * 4
    result = train_experience_model(examples, tiny(tmp_path / "m", epochs=6))
    assert result.steps > 0 and math.isfinite(result.first_loss)
    # it trained where training runs: a visible CUDA device, else the CPU (the result says)
    assert result.device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert result.last_loss < result.first_loss * 0.7
    assert (tmp_path / "m" / "config.json").exists()


@pytest.mark.parametrize("bf16", [False, True])
def test_loss_falls_in_either_precision(tmp_path, bf16):
    # bfloat16 autocast (the default on a CPU that computes it natively) or float32: the loss,
    # the optimizer and the saved weights stay float32 either way
    trajs = [episode("a", "$9.99", True), episode("b", "$1.00", False)]
    examples = build_examples(trajs, ListRetriever(trajs), ExampleConfig(top_k=1), WEB) * 4
    result = train_experience_model(examples, tiny(tmp_path / "m", epochs=6, bf16=bf16))
    assert result.bf16 is bf16
    assert result.last_loss < result.first_loss * 0.7
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype", "float32")) == "float32"


def test_a_time_budget_stops_training_and_the_result_says_partial(tmp_path):
    trajs = [episode("a", "$9.99", True), episode("b", "$1.00", False)]
    examples = build_examples(trajs, ListRetriever(trajs), ExampleConfig(top_k=1), WEB) * 4
    # enough steps that a full run takes several seconds even at ~75 steps/s (bf16 autocast)
    full = train_experience_model(examples, tiny(tmp_path / "full", max_steps=400))
    assert full.steps == full.planned_steps == 400 and not full.partial
    assert full.seconds > 2
    cut = train_experience_model(examples, tiny(tmp_path / "cut", max_steps=400,
                                                time_budget_s=1.0))
    assert 1 <= cut.steps < 400 and cut.planned_steps == 400 and cut.partial
    assert (tmp_path / "cut" / "config.json").exists()  # saved, for the caller to mark


def test_the_schedule_is_the_steps_alone():
    import torch

    from dreamgym_agents.experience.sft import WARMUP_SHARE, cosine_schedule

    def lrs(steps: int, run: int) -> list[float]:
        opt, sched = cosine_schedule(torch.nn.Linear(4, 4), 1.0, steps)
        out = []
        for _ in range(run):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out

    rates = lrs(100, 100)
    warm = int(100 * WARMUP_SHARE)
    assert rates[0] < rates[warm - 2] < rates[warm] == pytest.approx(1.0, abs=0.01)
    assert rates[50] == pytest.approx(0.5, abs=0.05) and rates[99] < 0.01
    assert lrs(100, 100) == rates  # no clock in it: the same on any machine


def examples_and_base(tmp_path):
    """Eight examples and one tiny checkpoint to start from: runs from one checkpoint compare
    (a tokenizer trained from scratch may break BPE count ties in another order each time)."""
    from dreamgym_agents.gateway.local import make_tiny_checkpoint

    trajs = [episode("a", "$9.99", True), episode("b", "$1.00", False)]
    examples = build_examples(trajs, ListRetriever(trajs), ExampleConfig(top_k=1), WEB) * 4
    base = tmp_path / "base"
    make_tiny_checkpoint(base, [e["messages"][-1]["content"] + e["completion"] for e in examples],
                         vocab_size=400, hidden_size=32, num_layers=1, max_positions=768)
    return examples, base


def test_a_checkpointed_run_resumes_where_it_stopped(tmp_path):
    # stopped by a budget after a checkpoint, rerun into the same folder: it resumes from the
    # checkpoint and trains the remaining steps only (a killed embedded build does the same)
    from safetensors.torch import load_file

    examples, base = examples_and_base(tmp_path)
    cfg = tiny(tmp_path / "run", max_steps=12, base_model=str(base), checkpoint_every=4,
               bf16=False)
    stopped = []

    def stop_after_five(*_: object) -> None:
        stopped.append(1)
        if len(stopped) == 5:
            raise KeyboardInterrupt  # killed mid-run, after the step-4 checkpoint

    with pytest.raises(KeyboardInterrupt):
        train_experience_model(examples, cfg, on_step=stop_after_five)
    assert (tmp_path / "run" / "trainer" / "checkpoint-4").is_dir()
    resumed = train_experience_model(examples, cfg)
    assert resumed.resumed_from_step == 4 and resumed.steps == 12 and not resumed.partial
    whole = train_experience_model(examples, tiny(tmp_path / "whole", max_steps=12,
                                                  base_model=str(base), bf16=False))
    assert whole.resumed_from_step is None and whole.steps == 12
    one = load_file(str(tmp_path / "run" / "model.safetensors"))
    two = load_file(str(tmp_path / "whole" / "model.safetensors"))
    # the same 12 steps: the resumed run's weights are the uninterrupted run's
    assert all(torch_close(one[k], two[k]) for k in one)


def torch_close(a, b) -> bool:
    import torch

    return bool(torch.allclose(a, b, atol=1e-5, rtol=1e-4))


def test_a_step_count_trains_the_same_weights_twice(tmp_path):
    # max_steps: the run's length and schedule do not depend on the clock, so two runs from the
    # same checkpoint on the same examples and seed save the same weights (a time budget is then
    # only a cap). Both start from one checkpoint: a tokenizer trained from scratch may break
    # BPE count ties in another order each time (huggingface/tokenizers#1794).
    from safetensors.torch import load_file

    examples, base = examples_and_base(tmp_path)
    runs = [train_experience_model(examples, tiny(tmp_path / name, epochs=1, max_steps=9,
                                                  base_model=str(base), time_budget_s=600,
                                                  bf16=False))
            for name in ("one", "two")]
    assert [r.steps for r in runs] == [9, 9]  # more than one pass over the 8 examples
    assert not any(r.partial for r in runs)
    one, two = (load_file(str(tmp_path / n / "model.safetensors")) for n in ("one", "two"))
    assert one.keys() == two.keys()
    assert all((one[k] == two[k]).all() for k in one)


def test_pipeline_writes_a_manifest(tmp_path):
    trajs = [episode("a", "$9.99", True), episode("b", "$1.00", False)]
    buffer = ReplayBuffer(BufferConfig(path=str(tmp_path / "buf")))
    manifest = train_from_trajectories(trajs, buffer, ExampleConfig(top_k=1),
                                       tiny(tmp_path / "m", epochs=1), family=WEB_FAMILY)
    buffer.close()
    assert manifest["rationale_source"] == "deterministic" and manifest["examples"] == 4
    assert isinstance(manifest["bf16_autocast"], bool)
    assert read_manifest(tmp_path / "m")["prompt_style"] == "compact"
    # the codec version it was trained in is recorded, and it is prompted in it (the web codec
    # has one version: 0; a checkpoint that recorded none was trained before versions: 0)
    from dreamgym_agents.experience.training import trained_settings

    assert manifest["codec_version"] == 0
    assert trained_settings(f"hf/{tmp_path / 'm'}")["codec_version"] == 0
    path = tmp_path / "m" / "dreamgym_manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "codec_version": 3}))
    assert trained_settings(f"hf/{tmp_path / 'm'}")["codec_version"] == 3
    assert "codec_version" not in trained_settings("openai/gpt-4o-mini")  # the latest


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
    assert manifest["partial"] is False and manifest["planned_steps"] == 3
    # a budget that stops training: saved, marked partial, one line, exit 3
    code = main(["train-experience", str(data), "--out", str(tmp_path / "cut"), "--steps",
                 "100000", "--time-budget-s", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 3 and err.splitlines()[-1].startswith("error: --time-budget-s stopped")
    assert json.loads((tmp_path / "cut" / "dreamgym_manifest.json").read_text())["partial"]


def test_examples_are_tokenized_with_prompt_masked_and_decisions_weighted(tmp_path):
    from transformers import AutoTokenizer

    from dreamgym_agents.experience.data import decision_spans
    from dreamgym_agents.experience.sft import tokenize_example
    from dreamgym_agents.gateway.local import format_prompt, make_tiny_checkpoint

    completion = ("<reasoning>The agent stops. The task is complete.</reasoning>\n"
                  "<reward>1</reward>\n<done>true</done>\n<success>true</success>\n"
                  "<next_state>\n@state\n</next_state>")
    path = make_tiny_checkpoint(tmp_path / "m", [completion, "task: price?"], vocab_size=300)
    tok = AutoTokenizer.from_pretrained(path)
    example = {"messages": [{"role": "user", "content": "task: price?"}],
               "completion": completion, "decision_spans": decision_spans(completion, WEB)}
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

    from dreamgym_agents.experience.data import decision_spans
    from dreamgym_agents.experience.sft import tokenize_example
    from dreamgym_agents.gateway.local import make_tiny_checkpoint

    completion = ("<reasoning>The task is complete. Final answer.</reasoning>\n<reward>1</reward>"
                  "\n<done>true</done>\n<success>true</success>\n<next_state>\n@state\n"
                  "</next_state>")
    tok = AutoTokenizer.from_pretrained(make_tiny_checkpoint(tmp_path / "m", [completion],
                                                             vocab_size=300))
    example = {"messages": [{"role": "user", "content": "q"}], "completion": completion,
               "decision_spans": decision_spans(completion, WEB)[:-1], "loss": "decisions"}
    row = tokenize_example(tok, example, decision_weight=3.0)
    trained = [i for i, w in zip(row["input_ids"], row["token_weights"], strict=True) if w]
    assert set(row["token_weights"]) == {0.0, 3.0}
    assert "complete" in tok.decode(trained) and "@state" not in tok.decode(trained)


def test_a_run_killed_after_its_last_checkpoint_trains_no_more(tmp_path):
    # the last checkpoint written, the model not yet saved (a killed build, or a run trained on
    # another machine into this folder): a rerun saves the checkpoint's weights, no step more
    from safetensors.torch import load_file

    examples, base = examples_and_base(tmp_path)
    cfg = tiny(tmp_path / "run", max_steps=8, base_model=str(base), checkpoint_every=4,
               bf16=False)
    first = train_experience_model(examples, cfg)
    assert first.steps == 8 and (tmp_path / "run" / "trainer" / "checkpoint-8").is_dir()
    trained = load_file(str(tmp_path / "run" / "model.safetensors"))
    (tmp_path / "run" / "model.safetensors").unlink()
    again = train_experience_model(examples, cfg)
    assert again.steps == 8 and again.resumed_from_step == 8
    assert again.first_loss == first.first_loss and again.last_loss == first.last_loss
    saved = load_file(str(tmp_path / "run" / "model.safetensors"))
    assert all(torch_close(trained[k], saved[k]) for k in trained)
    state = json.loads((tmp_path / "run" / "trainer" / "checkpoint-8" / "trainer_state.json")
                       .read_text())
    assert state["global_step"] == 8 and not (tmp_path / "run" / "trainer"
                                              / "checkpoint-9").exists()
