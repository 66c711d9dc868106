"""DSPy on this toolkit's terms: model calls through the gateway, prompts in our layouts.

:class:`GatewayEngine` is a DSPy engine (``complete(Request) -> Response``) that answers through a
:class:`~dreamgym_agents.gateway.llm.Gateway`, so an optimiser's calls get the gateway's
retries, cache, usage and cost accounting, concurrency, secret redaction and every model it
reaches (LiteLLM providers, OpenAI-compatible servers, ``hf/`` checkpoints in-process).
:class:`AgentAdapter` renders a DSPy signature and its demos with the agent's own template
(:func:`~dreamgym_agents.episodes.agent.render_agent_prompt`) and reads the answer with the
agent's parser, so what the optimiser scores is exactly what ``eval --program`` plays.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

from dreamgym_agents.episodes.agent import parse_answer, render_agent_prompt, template_instruction

if TYPE_CHECKING:
    from dreamgym_agents.gateway.llm import Gateway

AGENT_INPUTS = ("intent", "action_space", "options", "history", "state")
AGENT_OUTPUTS = ("reasoning", "action")


class GatewayEngine:
    """A DSPy engine answering through ``gateway`` (one attempt: the gateway retries)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def complete(self, request: Any) -> Any:
        from dspy.clients.engines.base import validate_request
        from dspy.lm15 import Message, Response, TextPart, Usage

        validate_request(request)
        messages = []
        if request.system is not None:
            system = (request.system if isinstance(request.system, str)
                      else "".join(p.text for p in request.system))
            messages.append({"role": "system", "content": system})
        messages.extend({"role": m.role, "content": m.text or ""} for m in request.messages)
        config = request.config
        # what the optimiser asks for (GEPA samples its rollouts); the gateway's settings else
        overrides = {k: getattr(config, k) for k in ("temperature", "max_tokens", "top_p")
                     if getattr(config, k, None) is not None}
        if config.stop:
            overrides["stop"] = list(config.stop)
        completion = self.gateway.complete(messages, **overrides)
        usage = completion.usage
        return Response(
            id=None, model=self.gateway.cfg.model,
            message=Message.assistant([TextPart(completion.full_text)]),
            finish_reason=completion.finish_reason or "stop",
            usage=Usage(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
                        total_tokens=usage.prompt_tokens + usage.completion_tokens))

    def stream(self, request: Any) -> Any:
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self) -> None:
        """The gateway belongs to the caller, who closes it."""


def dspy_lm(gateway: Gateway) -> Any:
    """A ``dspy.LM`` whose every call goes through ``gateway`` (DSPy's own cache off: the
    gateway has one)."""
    import dspy

    # DSPy sets its own loggers up when imported: keep them at the application's level
    # (the CLI's -v shows DSPy's progress lines, its default only errors)
    verbose = logging.getLogger().level <= logging.INFO
    logging.getLogger("dspy").setLevel(logging.INFO if verbose else logging.ERROR)
    return dspy.LM(model=gateway.cfg.model, engine=GatewayEngine(gateway), cache=False,
                   num_retries=0)


@functools.cache
def agent_signature(template: str) -> type:
    """The DSPy signature of one agent step; its instruction is ``template``'s
    ``# How to act`` paragraph."""
    import dspy

    class AgentStep(dspy.Signature):
        __doc__ = template_instruction(template)

        intent: str = dspy.InputField(desc="the task")
        action_space: str = dspy.InputField(desc="the actions the environment accepts")
        options: str = dspy.InputField(desc="the commands possible now, when the game lists them")
        history: str = dspy.InputField(desc="the previous steps")
        state: str = dspy.InputField(desc="the current state")
        reasoning: str = dspy.OutputField(desc="what is seen, what remains, why the action helps")
        action: str = dspy.OutputField(desc="exactly one action")

    return AgentStep


def agent_adapter(template: str) -> Any:
    """A DSPy adapter prompting in ``template``'s layout (see :func:`render_agent_prompt`)."""
    import dspy

    class AgentAdapter(dspy.Adapter):
        def format(self, signature: Any, demos: list[dict[str, Any]],
                   inputs: dict[str, Any]) -> list[dict[str, Any]]:
            fields = {k: str(inputs.get(k) or "") for k in AGENT_INPUTS}
            shown = [{k: str(d.get(k) or "") for k in ("intent", "history", "state",
                                                        "reasoning", "action")} for d in demos]
            content = render_agent_prompt(template, fields, instruction=signature.instructions,
                                          demos=shown)
            return [{"role": "user", "content": content}]

        def parse(self, signature: Any, completion: str) -> dict[str, Any]:
            reasoning, action = parse_answer(completion)
            return {"reasoning": reasoning, "action": action}

    return AgentAdapter()


def feedback_metric(gold: Any, pred: Any, trace: Any = None, pred_name: Any = None,
                    pred_trace: Any = None) -> Any:
    """GEPA's metric for every program here: the prediction's own ``score`` and ``feedback``.

    Each program scores what it predicted: an episode's success, a step's fidelity, the share
    of accepted task variants.
    """
    import dspy

    return dspy.Prediction(score=float(pred.score), feedback=str(pred.feedback))


def index_examples(count: int, train: int) -> tuple[list[Any], list[Any]]:
    """DSPy examples ``index=0..count-1``: the first ``train`` (at least 1, leaving 1) for
    the reflection, the rest for validation."""
    import dspy

    n_train = max(1, min(train, count - 1))
    examples = [dspy.Example(index=i).with_inputs("index") for i in range(count)]
    return examples[:n_train], examples[n_train:]


def compile_gepa(student: Any, trainset: list[Any], valset: list[Any], *, budget: int,
                 reflection: Gateway, minibatch: int, seed: int,
                 log_dir: str) -> tuple[Any, dict[str, Any]]:
    """``dspy.GEPA`` as every target here runs it: the compiled program, its validation scores
    before (the starting program) and after (the best), and how many candidates it kept.

    GEPA makes at most ``budget`` metric calls, reflects with ``reflection`` on minibatches of
    ``minibatch`` and logs to ``log_dir``; it runs one thread, since the programs play episodes
    with their own concurrency, and merges no candidates.
    """
    import dspy

    optimizer = dspy.GEPA(metric=feedback_metric, max_metric_calls=budget,
                          reflection_lm=dspy_lm(reflection),
                          reflection_minibatch_size=max(1, min(minibatch, len(trainset))),
                          num_threads=1, track_stats=True, use_merge=False, seed=seed,
                          log_dir=log_dir, warn_on_score_mismatch=False)
    compiled = optimizer.compile(student, trainset=trainset, valset=valset)
    details = compiled.detailed_results
    values = list(details.val_aggregate_scores)
    return compiled, {"validation_before": round(float(values[0]), 4),
                      "validation_after": round(float(values[details.best_idx]), 4),
                      "candidates": len(details.candidates)}
