"""``dg-agents run --policy <hosted model>``: DreamGym's loop learning a prompt, not weights.

A hosted model (any LiteLLM model string: ``openai/…``, ``anthropic/…``, a server on
127.0.0.1) cannot be fine-tuned here, so each training stage optimises its prompt program
instead, with the same stages, folder, ``state.json``, ``summary.json`` and report as a
weight-trained run (:mod:`dreamgym_agents.pipeline.run`):

1. ``experience``: the embedded experience model and the demonstrations (as for any run).
2. ``sft``: the warm start is a prompt: the family's template with worked examples that
   ``dspy.LabeledFewShot`` picks from the demonstrations' successful steps.
3. ``dream_rl``: ``dspy.GEPA`` rewrites the instruction, every candidate scored by success in
   the dream (``prompt.budget`` episodes; 0 real transitions).
4. ``s2r``: GEPA again from the dream's program, scored on real episodes within
   ``s2r.real_transition_budget`` real transitions.
5. The ``eval_*`` stages play each program on the real test tasks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dreamgym_agents.pipeline.run import Pipeline, PipelineConfig, Reporter, is_hosted
from dreamgym_agents.prompts.programs import load_program, save_program

PROGRAM_FILE = "program.json"


class PromptPipeline(Pipeline):
    """A run whose policy is a hosted model: its stages learn a prompt program."""

    learns_prompts = True

    def __init__(self, cfg: Any, out: Any, reporter: Any = None, **kwargs: Any) -> None:
        super().__init__(cfg, out, reporter, **kwargs)
        if cfg.real_rl:
            from dreamgym_agents.errors import ConfigError

            raise ConfigError("real_rl (the GRPO-real baseline) trains weights: a hosted "
                              "policy has none (its sim-to-real search plays real episodes)")
        self._gateway: Any = None

    def gateway(self) -> Any:
        """The hosted policy's gateway (``policy_llm`` settings), opened on first use."""
        from dreamgym_agents.gateway.llm import Gateway, LLMConfig, check_model_string

        if self._gateway is None:
            check_model_string(self.cfg.policy)
            settings = {"max_concurrency": self.cfg.eval_concurrency, **self.cfg.policy_llm}
            self._gateway = Gateway(LLMConfig(model=self.cfg.policy, **settings))
        return self._gateway

    def close(self) -> None:
        if self._gateway is not None:
            self._gateway.close()
            self._gateway = None
        super().close()

    def _used(self, result: dict[str, Any]) -> dict[str, Any]:
        """``result`` with the policy model's calls, tokens and cost since the last stage."""
        usage = self.gateway().reset_usage()
        return {**result, "policy_calls": usage.calls,
                "policy_tokens": usage.prompt_tokens + usage.completion_tokens,
                "policy_cost_usd": round(usage.cost_usd, 6)}

    def _program_path(self, stage: str) -> str:
        folder = self.out / "checkpoints" / stage
        folder.mkdir(parents=True, exist_ok=True)
        return str(folder / PROGRAM_FILE)

    # -- stages -----------------------------------------------------------------------------

    def stage_sft(self) -> dict[str, Any]:
        from dreamgym_agents.optimize.agent import baseline_program, choose_demos

        episodes = self.offline_episodes()
        demos = choose_demos(episodes, self.family().name, self.cfg.prompt.demos, self.cfg.seed)
        program = baseline_program(self.family(), self.cfg.policy, demos)
        path = save_program(program, self._program_path("sft"))
        self.reporter.say(f"sft: a prompt with {len(demos)} worked example(s) chosen by "
                          f"dspy.LabeledFewShot from {len(episodes)} offline episodes → {path}")
        return {"path": str(path), "worked_examples": len(demos),
                "offline_episodes": len(episodes),
                "offline_transitions": sum(len(t.transitions) for t in episodes),
                "held_out_rejected": self.held_out().rejected.get("offline_episodes", 0)}

    def evaluate(self, stage: str, checkpoint: str) -> dict[str, Any]:
        from dreamgym_agents.episodes.env import EnvConfig
        from dreamgym_agents.optimize.agent import evaluate_program
        from dreamgym_agents.pipeline.run import eval_result

        tasks = self.test_tasks()
        tick = self.reporter.bar(f"{stage} episodes", len(tasks))
        family = self.family()
        env_cfg = EnvConfig(max_steps=self.cfg.eval_max_steps)
        folder = self.out / "eval" / stage
        summary = evaluate_program(load_program(checkpoint), self.gateway(), family,
                                   lambda: family.make_env(env_cfg), tasks, folder,
                                   max_steps=self.cfg.eval_max_steps,
                                   concurrency=self.cfg.eval_concurrency, name=stage,
                                   on_episode=lambda t: tick(1, t))
        return self._used(eval_result(summary, folder))

    def stage_eval_sft(self) -> dict[str, Any]:
        return self.evaluate("eval_sft", self.checkpoint("sft"))

    def _search(self, stage: str, start: str, *, real: bool) -> dict[str, Any]:
        from dreamgym_agents.episodes.env import EnvConfig
        from dreamgym_agents.experience.dream import DreamConfig, DreamEnv
        from dreamgym_agents.optimize.agent import search_instruction

        prompt = self.cfg.prompt
        family = self.family()
        held_out = self.held_out()
        train = held_out.keep(family.load_tasks("train"), f"{stage}_tasks")[:prompt.train_tasks]
        val = family.load_tasks("validation")[:prompt.val_tasks]
        if real:
            env_cfg = EnvConfig(max_steps=prompt.max_steps)
            budget = self.cfg.s2r.real_transition_budget
            episodes = max(len(val), (budget or 0) // prompt.max_steps)

            def make_env() -> Any:
                return family.make_env(env_cfg)
        else:
            model, _, buffer = self.dream()
            dream_cfg = DreamConfig(reward=self.cfg.dream_reward,
                                    verdicts=self.cfg.dream_verdicts)
            budget, episodes = None, prompt.budget

            def make_env() -> Any:
                return DreamEnv(dream_cfg, model, buffer, family)
        self.reporter.say(f"{stage}: GEPA on the instruction, {episodes} "
                          f"{'real' if real else 'dream'} episodes at most"
                          + (f" within {budget} real transitions" if budget else ""))
        found = search_instruction(
            load_program(start), family=family, gateway=self.gateway(),
            reflection=self.gateway(), make_env=make_env, train=train, val=val,
            budget=episodes, max_steps=prompt.max_steps, minibatch=prompt.minibatch,
            seed=self.cfg.seed, out=self._stage_dir(stage), transition_budget=budget)
        path = save_program(found.program, self._program_path(stage))
        played = {"real_transitions": found.transitions if real else 0,
                  "synthetic_transitions": 0 if real else found.transitions}
        return self._used({
            "path": str(path), "episodes": found.episodes, **played,
            "rollout_success_validation_before": found.scores.get("validation_before"),
            "rollout_success_validation_after": found.scores.get("validation_after"),
            "candidates": found.scores.get("candidates"), "train_tasks": len(train),
            "held_out_rejected": held_out.rejected.get(f"{stage}_tasks", 0)})

    def stage_dream_rl(self) -> dict[str, Any]:
        return self._search("dream_rl", self.checkpoint("sft"), real=False)

    def stage_s2r(self) -> dict[str, Any]:
        return self._search("s2r", self.checkpoint("dream_rl"), real=True)


def make_pipeline(cfg: PipelineConfig, out: str | Path, reporter: Reporter | None = None,
                  **kwargs: Any) -> Pipeline:
    """The run of ``cfg``'s policy: weights trained (embedded, ``hf/…``: :class:`Pipeline`),
    or, for a hosted model, its prompt learnt (:class:`PromptPipeline`)."""
    if is_hosted(cfg.policy):
        return PromptPipeline(cfg, out, reporter, **kwargs)
    return Pipeline(cfg, out, reporter, **kwargs)
