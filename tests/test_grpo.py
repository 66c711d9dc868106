"""Multi-turn GRPO: what a rollout hands TRL (environment tokens masked exactly), how turns are
scored, and GRPO on a tiny model in a tiny dream moving the reward upward."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch
from conftest import CounterEnv, counter_tasks
from test_dream_contract import SAY_HI, make_env
from test_policy import counter_demos, tiny_sft

from dreamgym_agents.adapters.webarena.policy_view import WebPolicyView
from dreamgym_agents.episodes.graph import EnvPool
from dreamgym_agents.errors import ConfigError
from dreamgym_agents.policy.model import PolicyConfig, PolicyModel
from dreamgym_agents.rl.grpo import (
    ConstraintBook,
    EpisodeRollout,
    GRPOStageConfig,
    train_grpo,
    turn_logps,
)
from dreamgym_agents.types import Task, Trajectory, Transition, read_trajectories

pytestmark = pytest.mark.slow


class FakeTrainer:
    """What the rollout reads of TRL's trainer."""

    def __init__(self, path: str, generations: int) -> None:
        policy = PolicyModel.load(path)
        self.model, self.processing_class = policy.model, policy.tokenizer
        self.num_generations = generations


def test_rollout_masks_exactly_the_environment_tokens(tmp_path, counter_env_factory):
    demos = counter_demos(tmp_path, counter_env_factory, 6)
    path = tiny_sft(tmp_path, demos, steps=20)
    tasks = counter_tasks(2)
    pool = EnvPool(CounterEnv, 4)
    cfg = GRPOStageConfig(num_generations=2, tasks_per_step=2, micro_batch=2,
                          max_episode_steps=4)
    rollout = EpisodeRollout(tasks, pool, cfg, PolicyConfig(max_action_tokens=16), tmp_path)
    trainer = FakeTrainer(path, 2)
    torch.manual_seed(0)
    out = rollout(["0", "0", "1", "1"], trainer)
    pool.close()
    episodes = read_trajectories(tmp_path / "rollouts.jsonl")
    assert len(out["completion_ids"]) == len(out["prompt_ids"]) == 4 == len(episodes)
    policy = PolicyModel.load(path)
    by_id = {t.episode_id: t for t in episodes}
    for i, (prompt, completion, mask) in enumerate(zip(out["prompt_ids"], out["completion_ids"],
                                                       out["env_mask"], strict=True)):
        traj = by_id[f"grpo-0-{i // 2}-{i % 2}"]
        steps = traj.transitions
        assert len(completion) == len(mask)
        # the prompt is the first turn's environment segment, exactly
        assert prompt == policy.segment_ids(traj.task, steps[0].state)
        # mask 1: the actions the policy wrote, each with its end token; mask 0: every later
        # turn's environment segment, exactly as the policy saw it
        written, env, runs = [], [], []
        for tok, m in zip(completion, mask, strict=True):
            (written if m else env).append(tok)
            if not runs or runs[-1][0] != m:
                runs.append((m, []))
            runs[-1][1].append(tok)
        assert [policy.decode(ids).strip() for m, ids in runs if m] == [s.action for s in steps]
        assert written.count(policy.eos_id) == len(steps)
        expected_env = []
        for k, s in enumerate(steps[1:], 1):
            error = steps[k - 1].error if not steps[k - 1].valid else ""
            expected_env += policy.segment_ids(traj.task, s.state,
                                               [p.action for p in steps[:k]], error)
        assert env == expected_env
    assert out["episode_reward"] == [1.0 if by_id[f"grpo-0-{i // 2}-{i % 2}"].success else 0.0
                                     for i in range(4)]


def test_turns_are_scored_from_their_own_segment(tmp_path, counter_env_factory):
    demos = counter_demos(tmp_path, counter_env_factory, 3)
    policy = PolicyModel.load(tiny_sft(tmp_path, demos, steps=5))
    from dreamgym_agents.policy.model import episode_tokens

    tokens = episode_tokens(policy, demos[2].task, demos[2].transitions)
    prompt, completion = tokens.prompt_ids, tokens.completion_ids
    pad = 3  # left padding of the prompt, right padding of the completion
    ids = torch.tensor([[policy.pad_id] * pad + prompt + completion + [policy.pad_id] * pad])
    mask = torch.tensor([[0] * pad + [1] * (len(prompt) + len(completion)) + [0] * pad])
    keep = len(completion) + pad
    with torch.no_grad():
        logps, _ = turn_logps(policy.model, ids, mask, keep, user_id=policy.user_id,
                              assistant_id=policy.tokenizer.convert_tokens_to_ids("<|assistant|>"),
                              pad_id=policy.pad_id)
        expected = torch.zeros(keep)
        for i in range(len(tokens.turns)):  # each turn alone, from its <|user|> token
            turn = tokens.turn_ids(i)
            start = tokens.turns[i]
            logits = policy.model(input_ids=torch.tensor([turn])).logits[0].float()
            lp = torch.log_softmax(logits, -1)
            for j in range(1, len(turn)):
                pos = start + j - len(prompt)
                if pos >= 0 and tokens.mask[start + j]:
                    expected[pos] = lp[j - 1, turn[j]]
    assert torch.allclose(logps[0], expected, atol=1e-4)
    assert (logps[0][torch.tensor(tokens.env_mask + [0] * pad) == 0] == 0).all()


def test_a_turns_value_reads_its_observation_and_not_its_action(tmp_path, counter_env_factory):
    """PPO's critic values each turn at its first action token (the context before it): a
    change of the turn's observation changes its value; a change of its action does not, nor
    does any later token."""
    from dreamgym_agents.policy.model import episode_tokens
    from dreamgym_agents.rl.advantages import action_runs

    demos = counter_demos(tmp_path, counter_env_factory, 3)
    policy = PolicyModel.load(tiny_sft(tmp_path, demos, steps=5))
    tokens = episode_tokens(policy, demos[2].task, demos[2].transitions)
    prompt, completion, env_mask = tokens.prompt_ids, tokens.completion_ids, tokens.env_mask
    runs = action_runs(env_mask)
    assert len(runs) >= 2
    torch.manual_seed(0)
    head = torch.nn.Linear(policy.model.config.hidden_size, 1)
    assistant = policy.tokenizer.convert_tokens_to_ids("<|assistant|>")

    def turn_values(completion_ids):
        ids = torch.tensor([prompt + completion_ids])
        with torch.no_grad():
            _, _, values = turn_logps(policy.model, ids, torch.ones_like(ids),
                                      len(completion_ids), user_id=policy.user_id,
                                      assistant_id=assistant, pad_id=policy.pad_id,
                                      value_head=head)
        return [float(values[0, start]) for start, _ in runs]

    before = turn_values(completion)
    k = 1  # the second turn: its observation is the environment tokens before its action
    start, end = runs[k]
    seen = list(completion)
    observed = [i for i in range(runs[k - 1][1], start) if not env_mask[i]]
    digit = next(i for i in observed if policy.tokenizer.decode([seen[i]]).strip().isdigit())
    other = policy.tokenizer.convert_tokens_to_ids(
        "7" if policy.tokenizer.decode([seen[digit]]).strip() != "7" else "8")
    seen[digit] = other
    changed_observation = turn_values(seen)
    # another action, every token of it (the next turn's segment starts at its own <|user|>)
    changed_action = turn_values(completion[:start] + [other] * (end - start) + completion[end:])
    assert changed_observation[k] != pytest.approx(before[k])
    assert changed_observation[:k] == pytest.approx(before[:k])  # an earlier turn's is its own
    assert changed_action == pytest.approx(before)


def test_constrained_actions_are_scored_under_the_distribution_they_were_sampled_from(
        tmp_path, counter_env_factory):
    """Actions sampled under the page's grammar: the log-probabilities the loss (and the KL)
    uses are those of the constrained distribution the tokens were drawn from, as the sampler
    itself reported them; over the whole vocabulary they would be lower (biased)."""
    from dreamgym_agents.policy.model import EpisodeTokens

    demos = counter_demos(tmp_path, counter_env_factory, 3)
    policy = PolicyModel.load(tiny_sft(tmp_path, demos, steps=5), view=WebPolicyView())
    task = Task(task_id="t", family="webarena", intent="Open the Laptops page")
    page = ("URL: http://s/\nTitle: Shop\n[3] link 'Laptops'\n[4] link 'Headphones'\n"
            "[5] searchbox 'Search'\n[6] button 'Search'")
    segment = policy.segment_ids(task, page)
    assistant = policy.tokenizer.convert_tokens_to_ids("<|assistant|>")
    for trial in range(3):
        constraint = policy.constraint(task, page)
        assert constraint is not None
        torch.manual_seed(trial)
        generated = policy.generate_traced(segment, 1.0, constraint)
        assert len(generated.ids) == len(generated.allowed) == len(generated.logps) > 1
        # the trace is the grammar's: what it allowed after each prefix of the action
        check = policy.constraint(task, page)
        for k in range(len(generated.ids)):
            assert generated.allowed[k] == (check.allowed(generated.ids[:k]) or None)
            assert generated.ids[k] in generated.allowed[k]
        tokens = EpisodeTokens()
        tokens.add_env(segment)
        tokens.add_action(generated.ids, generated.allowed)
        book = ConstraintBook()
        book.add(tokens)
        pad = 2  # TRL pads the rows; the book finds a row by its tokens
        ids = torch.tensor([[policy.pad_id] * pad + tokens.ids])
        mask = torch.tensor([[0] * pad + [1] * len(tokens.ids)])
        keep = len(tokens.completion_ids)
        score = {"user_id": policy.user_id, "assistant_id": assistant, "pad_id": policy.pad_id,
                 "temperature": 1.0}
        with torch.no_grad():
            constrained, entropy = turn_logps(policy.model, ids, mask, keep, constraints=book,
                                              compute_entropy=True, **score)
            free, _ = turn_logps(policy.model, ids, mask, keep, **score)
        sampled = torch.tensor(generated.logps)
        assert torch.allclose(constrained[0], sampled, atol=1e-4), (constrained, sampled)
        assert (free[0] <= constrained[0] + 1e-6).all() and (free[0] < sampled - 1e-3).any()
        assert torch.isfinite(entropy).all()


def test_the_loss_normalisation_is_a_setting():
    from dreamgym_agents.errors import ConfigError

    assert GRPOStageConfig().loss_type == "dapo"
    assert GRPOStageConfig(loss_type="grpo").loss_type == "grpo"
    with pytest.raises(ConfigError, match="loss_type must be one of"):
        GRPOStageConfig(loss_type="mean")


def test_a_real_transition_budget_is_never_exceeded(tmp_path, counter_env_factory):
    demos = counter_demos(tmp_path, counter_env_factory, 6)
    path = tiny_sft(tmp_path, demos, steps=5)
    pool = EnvPool(CounterEnv, 4)
    cfg = GRPOStageConfig(num_generations=2, tasks_per_step=2, micro_batch=2,
                          max_episode_steps=4, real_transition_budget=3)
    turns = PolicyConfig(max_action_tokens=8)  # four turns fit the tiny model's context
    rollout = EpisodeRollout(counter_tasks(2), pool, cfg, turns, tmp_path)
    out = rollout(["0", "0", "1", "1"], FakeTrainer(path, 2))
    pool.close()
    log = tmp_path / "rollouts.jsonl"
    recorded = read_trajectories(log) if log.exists() else []
    finished = [t for t in recorded if t.termination != "cut"]
    assert rollout.budget.used == 3 and rollout.counters.real_transitions == 3
    # every real step played is recorded, those of the episodes the budget cut too
    assert sum(len(t.transitions) for t in recorded) == 3
    cut = 4 - len(finished)
    assert cut >= 1 and rollout.counters.masked_episodes == cut  # cut episodes: no loss
    assert sum(m == [0] for m in out["env_mask"]) == cut


def hi_demo(action: str, i: int) -> Trajectory:
    state = "URL: http://s/\nTitle: "  # the dream's start state without a buffer
    step = Transition(episode_id=f"d{i}", step=0, task_id=SAY_HI.task_id, state=state,
                      action=action, next_state=state, done=True, success=True)
    return Trajectory(episode_id=f"d{i}", task=SAY_HI, transitions=[step], success=True)


def undecided_warm_start(tmp_path) -> str:
    """Half the demonstrations answer right, half wrong: the policy is undecided."""
    demos = [hi_demo("stop [hi]" if i % 2 else "stop [bye]", i) for i in range(16)]
    return tiny_sft(tmp_path, demos, steps=80)


def test_grpo_in_a_tiny_dream_moves_reward_upward(tmp_path):
    path = undecided_warm_start(tmp_path)
    pool = EnvPool(lambda: make_env()[0], 8)  # the dream, its experience model scripted
    torch.manual_seed(0)
    other = Task(task_id="hi2", family="webarena", intent="Say hi", config=SAY_HI.config)
    result = train_grpo(path, tmp_path / "grpo", [SAY_HI, other], pool,
                        GRPOStageConfig(num_generations=8, tasks_per_step=2, micro_batch=8,
                                        max_steps=30, learning_rate=5e-4, beta=0.04,
                                        concurrency=8, max_episode_steps=2))
    pool.close()
    success = [json.loads(line)["rollout/success"]
               for line in open(tmp_path / "grpo" / "metrics.jsonl") if "rollout/success" in line]
    # Rollouts run concurrently (their order, hence the sampling, is not deterministic) and a
    # batch holds 16 episodes, so compare the least-squares line through all 30 batches, not
    # two windows (first 5 against last 5 batches failed CI once at lr 1e-3: 0.475 -> 0.675).
    # At lr 5e-4 the line rose 0.24-0.37 over 11 runs (8 with the old 2-step warmup, 3 without);
    # without learning its rise has a standard deviation of about 0.08 around 0.
    n = len(success)
    rise = statistics.linear_regression(range(n), success).slope * (n - 1)
    assert n == 30 and rise > 0.15, success
    assert result["synthetic_transitions"] > 0 and result["real_transitions"] == 0

    assert say_hi_margin(result["path"]) > say_hi_margin(path) + 1.0


def say_hi_margin(checkpoint: str) -> float:
    """log p(stop [hi]) - log p(stop [bye]) at the dream's start: how much the policy prefers
    the rewarded answer."""
    policy = PolicyModel.load(checkpoint)
    seg = policy.segment_ids(SAY_HI, "URL: http://s/\nTitle: ")
    scores = []
    for action in ("stop [hi]", "stop [bye]"):
        ids = seg + policy.action_ids(action)
        with torch.no_grad():
            lp = torch.log_softmax(policy.model(input_ids=torch.tensor([ids])).logits[0], -1)
        scores.append(sum(lp[j - 1, ids[j]].item() for j in range(len(seg), len(ids))))
    return scores[0] - scores[1]


def test_a_one_batch_stage_updates_the_policy(tmp_path):
    # Sim-to-real on a small budget is one batch: its only step must not run at a rate of 0.
    path = undecided_warm_start(tmp_path)
    pool = EnvPool(lambda: make_env()[0], 8)
    torch.manual_seed(0)
    result = train_grpo(path, tmp_path / "grpo", [SAY_HI], pool,
                        GRPOStageConfig(num_generations=16, tasks_per_step=1, micro_batch=16,
                                        max_steps=1, learning_rate=1e-3, concurrency=8,
                                        max_episode_steps=2))
    pool.close()
    logged = [json.loads(line) for line in open(tmp_path / "grpo" / "metrics.jsonl")
              if "grpo/learning_rate" in line]
    assert result["steps"] == 1 and logged[0]["grpo/learning_rate"] == 1e-3
    rollouts = read_trajectories(tmp_path / "grpo" / "rollouts.jsonl")
    assert 0 < sum(t.success for t in rollouts) < len(rollouts)  # the group has a signal
    # the one step moved the policy toward the rewarded answer, not just anywhere
    assert say_hi_margin(result["path"]) > say_hi_margin(path) + 0.05


def test_num_iterations_reuses_each_batch_of_rollouts(tmp_path, counter_env_factory):
    demos = counter_demos(tmp_path, counter_env_factory, 6)
    path = tiny_sft(tmp_path, demos, steps=5)
    pool = EnvPool(CounterEnv, 4)
    result = train_grpo(path, tmp_path / "grpo", counter_tasks(2), pool,
                        GRPOStageConfig(num_generations=2, tasks_per_step=2, micro_batch=2,
                                        max_steps=2, num_iterations=3, max_episode_steps=3,
                                        concurrency=4),
                        PolicyConfig(max_action_tokens=16))
    pool.close()
    # two batches of rollouts, three optimisation steps on each
    assert result["batches"] == 2 and result["steps"] == 6 and result["episodes"] == 8
    logged = [json.loads(line) for line in open(tmp_path / "grpo" / "metrics.jsonl")
               if "grpo/loss" in line]
    assert len(logged) == 6


def _weights(checkpoint) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(checkpoint) / "model.safetensors"))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(("every", "patience", "scores", "validated", "steps", "selected",
                          "lora_r"), [
    # after the start (0.5) two validations in a row below it: the stage stops, the start wins
    (1, 2, [0.5, 0.25, 0.5, 0.75], [0, 1, 2], 2, 0, 0),
    # every 2 batches, and the last (3) too; the earliest of the best (2, not 3) wins
    (2, 0, [0.25, 0.5, 0.5], [0, 2, 3], 3, 2, 0),
    # LoRA: a validated policy is a merged copy, the adapters train on
    (2, 0, [0.25, 0.5, 0.5], [0, 2, 3], 3, 2, 4),
])
def test_validation_ends_a_stage_with_its_best_policy(tmp_path, every, patience, scores,
                                                       validated, steps, selected, lora_r):
    # the undecided policy's groups always hold winners and losers: every batch moves it
    start = undecided_warm_start(tmp_path)
    played: dict[int, dict] = {}
    figures = iter(scores)

    def validate(path, step):
        PolicyModel.load(str(path))  # a whole policy checkpoint, settings and all
        played[step] = _weights(path)
        return {"success": next(figures), "successes": 1, "episodes": 4,
                "eval_real_transitions": 7}

    pool = EnvPool(lambda: make_env()[0], 8)
    out = tmp_path / "grpo"
    torch.manual_seed(0)
    result = train_grpo(start, out, [SAY_HI], pool,
                        GRPOStageConfig(num_generations=16, tasks_per_step=1, micro_batch=16,
                                        max_steps=3, max_episode_steps=2, concurrency=8,
                                        learning_rate=1e-3 if not lora_r else 1e-2,
                                        validate_every=every, validate_patience=patience,
                                        lora_r=lora_r),
                        validate=validate)
    pool.close()
    assert sorted(played) == validated and result["steps"] == steps
    v = result["validation"]
    assert v["selected_step"] == selected and v["real_transitions"] == 7 * len(validated)
    assert [h["step"] for h in v["history"]] == validated
    assert _same(_weights(result["path"]), played[selected])
    assert not _same(played[validated[-1]], played[0])  # the stage did move the weights
    assert _same(played[0], _weights(start))
    assert list((out / "validation").iterdir()) == []  # only the selected one was kept, moved
    logged = [json.loads(line) for line in open(out / "metrics.jsonl")
              if '"validation"' in line]
    assert [line["step"] for line in logged] == validated
    PolicyModel.load(result["path"])


def test_keep_at_keeps_the_policy_after_those_batches(tmp_path):
    """A scaling curve's points: the policy after batches 1 and 3 of 3, each a whole
    checkpoint, with the episodes and seconds the stage had spent by then."""
    start = undecided_warm_start(tmp_path)
    pool = EnvPool(lambda: make_env()[0], 8)
    out = tmp_path / "grpo"
    torch.manual_seed(0)
    result = train_grpo(start, out, [SAY_HI], pool,
                        GRPOStageConfig(num_generations=8, tasks_per_step=1, micro_batch=8,
                                        max_steps=3, max_episode_steps=2, concurrency=8,
                                        learning_rate=1e-3, keep_at=[1, 3]))
    pool.close()
    lines = [json.loads(line) for line in open(out / "kept" / "kept.jsonl")]
    assert [k["batch"] for k in lines] == [1, 3] == [k["batch"] for k in result["kept"]]
    assert [k["episodes"] for k in lines] == [8, 24]
    assert lines[0]["seconds"] <= lines[1]["seconds"]
    first, last = (PolicyModel.load(k["path"]) and _weights(k["path"]) for k in lines)
    assert _same(last, _weights(result["path"]))  # the last batch's is the stage's own
    # A batch whose eight rewards are all equal has no advantage, hence no update (the
    # sampling is concurrent, so that happens now and then: it failed CI once): the kept
    # copies differ exactly where a batch between them had a spread of rewards.
    spread = {json.loads(line)["step"]: json.loads(line)["grpo/reward_std"] > 0
              for line in open(out / "metrics.jsonl") if "grpo/reward_std" in line}
    assert _same(first, _weights(start)) == (not spread[1])
    assert _same(first, last) == (not (spread[2] or spread[3]))
    with pytest.raises(ConfigError, match="keep_at lists batches"):
        GRPOStageConfig(keep_at=[0])


def test_validate_every_needs_a_validation_split(tmp_path):
    with pytest.raises(ConfigError, match="validate_every needs a validation split"):
        train_grpo(tmp_path, tmp_path / "grpo", counter_tasks(1), None,
                   GRPOStageConfig(validate_every=1))
    with pytest.raises(ConfigError, match="validate_limit"):
        GRPOStageConfig(validate_limit=0)


class VLLMGenerationStandIn:
    """What the rollout reads of TRL's ``trainer.vllm_generation`` (vLLM needs a CUDA machine):
    ``generate`` of token prompts, one completion each, sampled by the same weights through
    ``transformers``, with the log-probability of each sampled token."""

    def __init__(self, model, eos_id: int) -> None:
        self.model, self.eos_id = model, eos_id
        self.max_completion_length = 4096  # the trainer's: a whole episode
        self.calls: list[int] = []

    def generate(self, prompts, images, num_generations):
        assert images is None and num_generations == 1
        self.calls.append(len(prompts))
        completions, logprobs = [], []
        for ids in prompts:
            with torch.no_grad():
                out = self.model.generate(
                    input_ids=torch.tensor([ids]), do_sample=True, top_k=0,
                    max_new_tokens=self.max_completion_length, pad_token_id=self.eos_id,
                    eos_token_id=self.eos_id, output_scores=True, return_dict_in_generate=True)
            new = out.sequences[0, len(ids):].tolist()
            completions.append(new)
            logprobs.append([[float(torch.log_softmax(out.scores[k][0], -1)[tok])]
                             for k, tok in enumerate(new)])
        return prompts, completions, logprobs, None


def test_rollouts_sample_their_actions_through_trl_s_vllm_generation(tmp_path,
                                                                      counter_env_factory):
    demos = counter_demos(tmp_path, counter_env_factory, 6)
    path = tiny_sft(tmp_path, demos, steps=20)
    pool = EnvPool(CounterEnv, 4)
    cfg = GRPOStageConfig(num_generations=2, tasks_per_step=2, micro_batch=2,
                          max_episode_steps=3, use_vllm=True)
    view = PolicyConfig(max_action_tokens=12, constrained_decoding=False)
    rollout = EpisodeRollout(counter_tasks(2), pool, cfg, view, tmp_path)
    trainer = FakeTrainer(path, 2)
    trainer.use_vllm = True
    trainer.vllm_generation = VLLMGenerationStandIn(trainer.model, int(
        trainer.processing_class.eos_token_id))
    torch.manual_seed(0)
    out = rollout(["0", "0", "1", "1"], trainer)
    pool.close()
    episodes = read_trajectories(tmp_path / "rollouts.jsonl")
    turns = sum(len(t.transitions) for t in episodes)
    generation = trainer.vllm_generation
    # every action came from vLLM's generate (concurrent turns batched), one action long each
    assert sum(generation.calls) == turns > 0 and generation.max_completion_length == 12
    assert len(out["completion_ids"]) == 4 and all(out["completion_ids"])
    assert rollout.counters.episodes == 4


def test_a_vllm_stage_is_handed_to_trl_and_refused_when_it_cannot_run(monkeypatch):
    from dreamgym_agents.errors import ConfigError, MissingExtraError
    from dreamgym_agents.rl.grpo import check_vllm, vllm_args

    assert vllm_args(GRPOStageConfig()) == {}
    server = GRPOStageConfig(use_vllm=True, vllm_server_base_url="http://10.0.0.2:8000")
    assert vllm_args(server) == {"use_vllm": True, "vllm_mode": "server",
                                 "vllm_importance_sampling_correction": False,
                                 "vllm_server_base_url": "http://10.0.0.2:8000"}
    colocate = GRPOStageConfig(use_vllm=True, vllm_mode="colocate",
                               vllm_gpu_memory_utilization=0.4)
    assert vllm_args(colocate)["vllm_gpu_memory_utilization"] == 0.4
    with pytest.raises(ConfigError, match="vllm_mode must be one of server, colocate"):
        GRPOStageConfig(use_vllm=True, vllm_mode="remote")
    with pytest.raises(ConfigError, match="constrained_decoding=false"):
        check_vllm(server, PolicyConfig(), "dream_rl")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(MissingExtraError, match=r"dreamgym-agents\[vllm\]"):
        check_vllm(server, PolicyConfig(constrained_decoding=False), "dream_rl")


def test_ppo_in_a_tiny_dream_moves_toward_the_rewarded_answer_and_learns_its_values(tmp_path):
    """``algorithm: ppo`` on GRPO's rollout path: the critic (zero at the start) learns the
    state's value while it alone trains (the warm-up), then the policy moves toward the
    rewarded answer; the head is saved beside the policy and read back by the next stage."""
    from safetensors.torch import load_file

    from dreamgym_agents.rl.ppo import VALUE_HEAD_FILE, PPOSettings

    path = undecided_warm_start(tmp_path)
    pool = EnvPool(lambda: make_env()[0], 8)
    torch.manual_seed(0)
    cfg = GRPOStageConfig(num_generations=16, tasks_per_step=1, micro_batch=16, max_steps=6,
                          learning_rate=1e-3, concurrency=8, max_episode_steps=2,
                          algorithm="ppo", ppo=PPOSettings(critic_warmup=3), keep_at=[3])
    result = train_grpo(path, tmp_path / "ppo", [SAY_HI], pool, cfg)
    lines = [json.loads(line) for line in open(tmp_path / "ppo" / "metrics.jsonl")]
    losses = [line["grpo/ppo/value_loss"] for line in lines if "grpo/ppo/value_loss" in line]
    values = [line["grpo/ppo/value_mean"] for line in lines if "grpo/ppo/value_mean" in line]
    successes = [line["rollout/success"] for line in lines if "rollout/success" in line]
    assert result["algorithm"] == "ppo" and result["steps"] == 6 and len(losses) == 6
    assert values[0] == 0.5  # the critic starts undecided: every state worth half a win
    # the warm-up: the critic learned the state's value while the policy was held still
    assert abs(values[3] - statistics.mean(successes[:3])) < 0.25
    assert _same(_weights(result["kept"][0]["path"]), _weights(path))
    assert not _same(_weights(result["path"]), _weights(path))
    settings = json.loads((Path(result["path"]) / "policy.json").read_text())
    assert settings["algorithm"] == "ppo"
    head = load_file(str(Path(result["path"]) / VALUE_HEAD_FILE))
    assert head["linear.weight"].abs().sum() > 0
    assert say_hi_margin(result["path"]) > say_hi_margin(path) + 0.05
    # a stage that starts from it starts from its critic
    again = train_grpo(result["path"], tmp_path / "ppo2", [SAY_HI], pool,
                       GRPOStageConfig(num_generations=16, tasks_per_step=1, micro_batch=16,
                                       max_steps=1, concurrency=8, max_episode_steps=2,
                                       algorithm="ppo"))
    pool.close()
    first = [json.loads(line) for line in open(tmp_path / "ppo2" / "metrics.jsonl")
             if "grpo/ppo/value_mean" in line][0]["grpo/ppo/value_mean"]
    assert first != 0.5 and again["algorithm"] == "ppo"
    with pytest.raises(ConfigError, match="algorithm must be one of grpo, ppo"):
        GRPOStageConfig(algorithm="a2c")


def test_the_first_ppo_step_of_one_epoch_is_the_plain_policy_gradient(tmp_path, monkeypatch):
    """With one epoch the ratio is 1, so PPO's clipped surrogate moves the policy by the plain
    policy gradient of its GAE advantages, -∇ Σ A·log π over the action tokens; the critic's
    loss adds nothing to the policy's gradient (the head reads the body's detached features)."""
    import dreamgym_agents.rl.grpo as grpo_module
    from dreamgym_agents.rl.ppo import PPOSettings

    real = grpo_module.ppo_trainer_class
    seen: list[tuple[list, list, float]] = []

    def capturing(base, **kw):
        class Capturing(real(base, **kw)):
            def _compute_loss(self, model, inputs):
                loss = super()._compute_loss(model, inputs)
                if not seen:
                    params = [p for p in model.parameters() if p.requires_grad]
                    ppo = torch.autograd.grad(loss, params, retain_graph=True)
                    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
                    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
                    logps, _, _ = self.turn_scores(model, ids, mask,
                                                   inputs["completion_ids"].shape[1])
                    action = inputs["completion_mask"] * inputs.get("tool_mask", 1)
                    pg = -(inputs["advantages"] * logps * action).sum() / action.sum()
                    plain = torch.autograd.grad(pg, params)
                    seen.append((ppo, plain, float(inputs["advantages"].abs().max())))
                return loss

        return Capturing

    monkeypatch.setattr(grpo_module, "ppo_trainer_class", capturing)
    pool = EnvPool(lambda: make_env()[0], 8)
    torch.manual_seed(0)
    train_grpo(undecided_warm_start(tmp_path), tmp_path / "ppo", [SAY_HI], pool,
               GRPOStageConfig(num_generations=8, tasks_per_step=1, micro_batch=8, max_steps=1,
                               concurrency=8, max_episode_steps=2, beta=0.0, loss_type="bnpo",
                               algorithm="ppo", ppo=PPOSettings(vf_coef=1.0)))
    pool.close()
    ((ppo, plain, largest),) = seen
    assert largest > 0  # the critic starts at 0.5: every outcome has an advantage
    ppo, plain = torch.cat([g.flatten() for g in ppo]), torch.cat([g.flatten() for g in plain])
    assert plain.abs().max() > 0
    torch.testing.assert_close(ppo, plain, rtol=1e-4, atol=1e-6)


def test_ppo_s_target_kl_holds_the_policy_for_the_rest_of_a_batch(tmp_path):
    """A target KL no policy update stays under: each batch's first epoch moves the policy
    (its KL to itself is 0), every later one is stopped, counted and logged."""
    from dreamgym_agents.rl.ppo import PPOSettings

    pool = EnvPool(lambda: make_env()[0], 8)
    torch.manual_seed(0)
    start = undecided_warm_start(tmp_path)

    def run(name, target_kl):
        out = tmp_path / name
        train_grpo(start, out, [SAY_HI], pool,
                   GRPOStageConfig(num_generations=8, tasks_per_step=1, micro_batch=8,
                                   max_steps=2, num_iterations=3, learning_rate=1e-2,
                                   concurrency=8, max_episode_steps=2, algorithm="ppo",
                                   ppo=PPOSettings(target_kl=target_kl)))
        lines = [json.loads(line) for line in open(out / "metrics.jsonl")]
        return [line for line in lines if "grpo/loss" in line]

    stopped = run("stopped", 1e-12)
    free = run("free", None)
    pool.close()
    assert len(stopped) == len(free) == 6  # two batches × three epochs
    kl = [line.get("grpo/ppo/approx_kl") for line in stopped]
    assert kl[0] == kl[3] == 0.0  # a batch's first epoch: the policy that played it
    assert kl[1] > 1e-12  # the first update moved it past the target: held from then on
    stops = [line.get("grpo/ppo/kl_stops") for line in stopped]
    assert stops[1] == stops[4] == 1.0 and stops[0] is None and stops[3] is None
    assert all("grpo/ppo/approx_kl" not in line for line in free)
    with pytest.raises(ConfigError, match="target_kl"):
        PPOSettings(target_kl=0)


@pytest.mark.parametrize("critic", ["separate", "lora"])
def test_a_critic_with_a_network_of_its_own_learns_and_is_read_back(tmp_path, critic):
    """``ppo.critic: separate`` (a copy of the starting policy, trained as the critic) and
    ``lora`` (that copy frozen, with adapters): the critic's own forward pass learns the state's
    value, its network is saved in ``critic/`` beside the policy, and a stage that starts from
    that checkpoint starts from that critic; the policy's own network never gets the critic's
    gradient (the critic's warm-up leaves it exactly as it was)."""
    from dreamgym_agents.rl.ppo import CRITIC_DIR, PPOSettings

    path = undecided_warm_start(tmp_path)
    pool = EnvPool(lambda: make_env()[0], 8)
    torch.manual_seed(0)
    settings = PPOSettings(critic=critic, critic_warmup=3, critic_lr=1e-3)
    result = train_grpo(path, tmp_path / "ppo", [SAY_HI], pool,
                        GRPOStageConfig(num_generations=16, tasks_per_step=1, micro_batch=16,
                                        max_steps=3, concurrency=8, max_episode_steps=2,
                                        algorithm="ppo", ppo=settings))
    lines = [json.loads(line) for line in open(tmp_path / "ppo" / "metrics.jsonl")]
    values = [line["grpo/ppo/value_mean"] for line in lines if "grpo/ppo/value_mean" in line]
    successes = [line["rollout/success"] for line in lines if "rollout/success" in line]
    assert values[0] == 0.5 and values[-1] != 0.5
    assert abs(values[-1] - statistics.mean(successes)) < abs(0.5 - statistics.mean(successes))
    assert _same(_weights(result["path"]), _weights(path))  # the warm-up: policy held still
    saved = Path(result["path"]) / CRITIC_DIR
    body = _weights(str(saved))
    assert not _same(body, _weights(path))  # the critic's network learnt (LoRA merged)
    assert not any("lora" in k for k in body)
    again = train_grpo(result["path"], tmp_path / "ppo2", [SAY_HI], pool,
                       GRPOStageConfig(num_generations=16, tasks_per_step=1, micro_batch=16,
                                       max_steps=1, concurrency=8, max_episode_steps=2,
                                       algorithm="ppo", ppo=PPOSettings(critic=critic)))
    pool.close()
    first = [json.loads(line) for line in open(tmp_path / "ppo2" / "metrics.jsonl")
             if "grpo/ppo/value_mean" in line][0]["grpo/ppo/value_mean"]
    assert abs(first - values[-1]) < 0.2 and first != 0.5  # its critic, not a new one
    assert (Path(again["path"]) / CRITIC_DIR).is_dir()
    with pytest.raises(ConfigError, match="ppo.critic must be one of"):
        PPOSettings(critic="twin")
    with pytest.raises(ConfigError, match="shared_backbone"):
        PPOSettings(critic=critic, shared_backbone=True)


def test_a_stage_s_peak_memory_sees_what_the_block_held():
    import time

    from dreamgym_agents.rl.grpo import PeakMemory

    with PeakMemory(every_s=0.05) as memory:
        before = memory.now_mb()
        block = bytearray(200 * 2**20)
        block[::4096] = b"x" * len(block[::4096])  # touched: resident, not only reserved
        time.sleep(0.3)
        del block
    assert memory.peak_mb >= before + 150


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_a_stage_killed_mid_way_goes_on_from_its_last_resume_point(tmp_path, algorithm, caplog):
    """A crash in batch 3 of 4 (resume points every 2 batches): started again on its folder,
    the stage goes on after batch 2, plays batches 3 and 4 once each, and its records hold
    every batch once (what the crashed batch wrote is gone)."""
    import logging

    from dreamgym_agents.rl.grpo import RESUME_STATE, resume_point, resumed_batches

    start = undecided_warm_start(tmp_path)
    pool = EnvPool(lambda: make_env()[0], 8)
    cfg = GRPOStageConfig(num_generations=8, tasks_per_step=1, micro_batch=8, max_steps=4,
                          concurrency=8, max_episode_steps=2, resume_every=2,
                          algorithm=algorithm, keep_at=[1, 4])
    out = tmp_path / "stage"

    def crash_in_batch_3(figures):
        if figures["batch"] == 3:
            raise RuntimeError("killed")

    torch.manual_seed(0)
    with pytest.raises(RuntimeError, match="killed"):
        train_grpo(start, out, [SAY_HI], pool, cfg, on_batch=crash_in_batch_3, resumable=True)
    point = resume_point(out)
    assert point is not None and point.name == "checkpoint-2" and resumed_batches(out) == 2
    assert json.loads((point / RESUME_STATE).read_text())["batches"] == 2
    seen = []
    with caplog.at_level(logging.WARNING, logger="dreamgym_agents.rl.grpo"):
        result = train_grpo(start, out, [SAY_HI], pool, cfg, resumable=True,
                            on_batch=lambda figures: seen.append(figures["batch"]))
    pool.close()
    assert "resuming after batch 2 of 4" in caplog.text
    assert seen == [3, 4] and result["batches"] == 4 and result["episodes"] == 32
    assert result["steps"] == 4  # the trainer's own count went on too
    ids = [json.loads(line)["episode_id"] for line in open(out / "rollouts.jsonl")]
    assert len(ids) == len(set(ids)) == 32
    assert {i.split("-")[1] for i in ids} == {"0", "1", "2", "3"}
    batches = [json.loads(line)["batch"] for line in open(out / "metrics.jsonl")
               if "rollout/success" in line]
    assert batches == [1, 2, 3, 4]
    assert [k["batch"] for k in result["kept"]] == [1, 4]
    assert [json.loads(line)["batch"] for line in open(out / "kept" / "kept.jsonl")] == [1, 4]
    assert not (out / "trainer").exists()  # the stage is whole: no resume point left
    if algorithm == "ppo":  # the critic went on from where it was, not from a new head
        from dreamgym_agents.rl.ppo import VALUE_HEAD_FILE

        values = [json.loads(line)["grpo/ppo/value_mean"] for line in open(out / "metrics.jsonl")
                  if "grpo/ppo/value_mean" in line]
        assert len(values) == 4 and values[0] == 0.5 and values[2] != 0.5
        assert (Path(result["path"]) / VALUE_HEAD_FILE).is_file()
