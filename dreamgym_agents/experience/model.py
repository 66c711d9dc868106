"""The reasoning experience model (DreamGym, Sec. 4.1): an LLM that replaces the environment.

Given the task, the last ``history_steps`` steps, the ``top_k`` most similar real transitions from
the replay buffer, the current abstract state and the agent's action, the model reasons step by
step and writes the next abstract state, the (outcome) reward, ``done`` and ``success``::

    <reasoning>…</reasoning>
    <next_state>
    …the state, in the family's format…
    </next_state>
    <reward>0</reward> <done>false</done> <success>false</success>

The task family's experience codec (:mod:`dreamgym_agents.experience.codec`) says how states and
actions read: a state's one-line name in histories, which action gives a final answer, how the
demonstrations are ranked, and, with the compact prompt (small models), the whole prompt and how
the next state is written (the web codec: a reference plus edits). The full prompt lives in
``prompts/experience_model.md``; the same text backs the DSPy signature
:data:`ExperienceStep` (built on first access, since ``dspy`` is heavy), so the instruction can be
optimised with DSPy and rendered back with :func:`render_signature_messages`.

An answer that cannot be read is retried with feedback (``max_parse_retries``); after that the step
is an *experience-model failure*: recorded in the prediction and counted, never turned into reward
0 (callers keep such steps out of training data). Model infrastructure errors
(:class:`~dreamgym_agents.errors.ModelError`) propagate.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from dreamgym_agents.errors import ConfigError, ContextLengthError
from dreamgym_agents.experience.codec import ExperienceCodec, StateReferenceError
from dreamgym_agents.prompts import prompt_blocks
from dreamgym_agents.types import ModelUsage, Task, Trajectory, Transition

logger = logging.getLogger(__name__)

PROMPT_FILE = "experience_model.md"
INPUT_FIELDS = ("task", "history", "retrieved", "state", "action")
OUTPUT_FIELDS = ("reasoning", "next_state", "reward", "done", "success")
_REQUIRED = ("next_state", "reward", "done")
_CLOSED_STATE = re.compile(r"<\s*/\s*next_state\s*>", re.I)
COMPACT_RETRY_TEMPERATURE = 0.7
"""Sampling temperature of a retry after an unreadable answer with the compact prompt."""
_TRUE, _FALSE = {"true", "yes", "1", "y"}, {"false", "no", "0", "n"}
_FENCE_LINE = re.compile(r"^\s*```[\w+-]*\s*$", re.M)
_NUMBER = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)")


# --------------------------------------------------------------------------------------------
# The prompt
# --------------------------------------------------------------------------------------------


def load_template(name: str = PROMPT_FILE) -> dict[str, str]:
    """The blocks of a full experience prompt by name (``instruction``, ``inputs``, …):
    ``experience_model.md`` (the web family's) unless a codec names another
    (``ExperienceCodec.prompt_file``)."""
    return prompt_blocks(name, ("instruction", "inputs", "output_reasoning", "output_direct",
                                "retry"))


def render_messages(
    instructions: str, inputs: dict[str, str | None], *, use_reasoning: bool = True,
    prompt_file: str = PROMPT_FILE,
) -> list[dict[str, str]]:
    """The chat messages: the instruction as system message, the inputs and format as user message.

    Args:
        instructions: The instruction (the template's, or an optimised signature's).
        inputs: Rendered text of each input field; a field set to None drops its section.
        use_reasoning: Ask for step-by-step reasoning (False: an empty ``<reasoning>``).
        prompt_file: The full prompt whose layout is used.
    """
    template = load_template(prompt_file)
    sections = re.split(r"\n(?=## )", template["inputs"])
    rendered = []
    for section in sections:
        names = re.findall(r"\{(\w+)\}", section)
        if any(inputs.get(name) is None for name in names):
            continue
        rendered.append(section.strip("\n").format_map({n: inputs[n] for n in names}))
    rendered.append(template["output_reasoning" if use_reasoning else "output_direct"])
    return [
        {"role": "system", "content": instructions.strip()},
        {"role": "user", "content": "\n\n".join(rendered)},
    ]


@functools.cache
def build_signature(prompt_file: str = PROMPT_FILE) -> type:
    """The DSPy signature ``ExperienceStep``; its docstring is the template's instruction."""
    import dspy

    class ExperienceStep(dspy.Signature):
        __doc__ = load_template(prompt_file)["instruction"]

        task: str = dspy.InputField(desc="the task the agent is working on")
        history: str = dspy.InputField(desc="recent steps: action → the state it led to")
        # Not "demos": dspy.Predict(...)(demos=...) takes its few-shot examples from that name.
        retrieved: str = dspy.InputField(desc="similar real transitions, most similar first")
        state: str = dspy.InputField(desc="the current abstract state")
        action: str = dspy.InputField(desc="the agent's action")
        reasoning: str = dspy.OutputField(desc="the causal effect of the action, step by step")
        next_state: str = dspy.OutputField(desc="the next abstract state, in the state's format")
        reward: float = dspy.OutputField(desc="1 only if this step completes the task, else 0")
        done: bool = dspy.OutputField(desc="whether the episode ends with this step")
        success: bool = dspy.OutputField(desc="whether the task has been accomplished")

    return ExperienceStep


def __getattr__(name: str) -> Any:  # PEP 562: ``from dreamgym_agents.experience.model import ...``
    if name == "ExperienceStep":
        return build_signature()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def render_signature_messages(
    signature: type, inputs: dict[str, str | None], *, use_reasoning: bool = True,
    prompt_file: str = PROMPT_FILE,
) -> list[dict[str, str]]:
    """Render the prompt of a (possibly optimised) DSPy signature: its instructions, our layout."""
    unknown = set(signature.input_fields) - set(INPUT_FIELDS)
    if unknown:
        raise ConfigError(f"signature has input fields {sorted(unknown)} the prompt cannot show")
    return render_messages(signature.instructions, inputs, use_reasoning=use_reasoning,
                           prompt_file=prompt_file)


def clip_state(state: str, max_lines: int) -> str:
    """At most ``max_lines`` non-blank lines of a state, then a note of how many were cut."""
    lines = [s for s in state.strip().splitlines() if s.strip()]
    if len(lines) <= max_lines:
        return "\n".join(lines)
    return "\n".join(lines[:max_lines] + [f"… ({len(lines) - max_lines} more lines not shown)"])


def render_history(history: list[Transition], last: int, codec: ExperienceCodec) -> str:
    """The last ``last`` steps, each as its action and the state it led to (named by the
    family's ``codec``: a web page by its URL and title)."""
    if not history:
        return "(none: this is the first step)"
    lines = []
    for t in history[-last:]:
        result = f"invalid action ({t.error})" if not t.valid else codec.head(t.next_state)
        lines.append(f"step {t.step + 1}: {t.action} → {result}")
    return "\n".join(lines)


def render_demos(demos: list[Transition], max_lines: int) -> str:
    """Retrieved transitions, best first: state, action → next state, reward, done."""
    if not demos:
        return "(none retrieved)"
    blocks = []
    for i, t in enumerate(demos, 1):
        blocks.append(
            f"### Example {i}\nState:\n{clip_state(t.state, max_lines)}\nAction: {t.action}\n"
            f"Next state:\n{clip_state(t.next_state, max_lines)}\n"
            f"Reward: {t.reward:g} | Done: {str(t.terminated).lower()} | "
            f"Success: {str(t.success).lower()}"
        )
    return "\n\n".join(blocks)


FINAL_ANSWER_CANDIDATES = 16
"""Candidates fetched per demonstration slot for a final answer, before re-ranking by their checks
(the web codec's tally is made of them too)."""

STEP_CANDIDATES = 16
"""Candidates fetched for any other step, before the family's codec re-ranks them by action and
state (``ExperienceCodec.rank_step_demos``)."""


def retrieve_demos(
    retriever: Retriever, codec: ExperienceCodec, intent: str, state: str, action: str, *,
    k: int, where: dict | None = None, exclude_episode: str | None = None,
    params: dict[str, str] | None = None,
) -> list[Transition]:
    """The ``k`` demonstrations of one step, as training and inference both choose them.

    A final answer is an action the family's ``codec`` reads an answer from, in a task with a
    known ``intent`` and ``params``. Its demonstrations are recorded final answers of similar
    tasks, right and wrong ones, ranked by ``ExperienceCodec.rank_final_answer_demos``:
    demonstrations chosen by similarity alone mostly share the step's outcome (a giving-up
    answer on the home page finds other giving-up answers), so they do not show what tells a
    right answer from a wrong one, and a small model trained on them copies their outcome
    (evidence: docs/history/results-2026-11-to-12.md). Other steps take the
    :data:`STEP_CANDIDATES` nearest transitions by embedding and keep the ``k`` that
    ``ExperienceCodec.rank_step_demos`` ranks first.
    """
    if not intent or codec.answer_text(action) is None:
        found = retriever.retrieve(state, action, k=max(k, STEP_CANDIDATES), where=where,
                                   exclude_episode=exclude_episode)
        return codec.rank_step_demos(state, action, found, k)
    candidates: list[Transition] = []
    for success in (True, False):
        scope = {**(where or {}), "done": True, "success": success}
        found = retriever.retrieve(state, action, k=k * FINAL_ANSWER_CANDIDATES, where=scope,
                                   exclude_episode=exclude_episode)
        # Final answers only (``done`` also marks steps cut by the step limit); a retriever
        # that ignores filters (a test double) still yields the right outcome.
        candidates += [t for t in found if bool(t.success) == success and t.terminated
                       and codec.answer_text(t.action) is not None]
    return codec.rank_final_answer_demos(intent, state, action, params or {}, candidates, k)


def transition_id(t: Transition) -> str:
    """A transition's id in reports: ``<episode_id>:<step>``."""
    return f"{t.episode_id}:{t.step}"


# --------------------------------------------------------------------------------------------
# The parser
# --------------------------------------------------------------------------------------------


class ExperienceParseError(ValueError):
    """The answer lacks a required field or has an unreadable one; the caller retries.

    Attributes:
        missing: Fields whose tag is absent.
        invalid: Fields present but unreadable.
    """

    def __init__(self, missing: list[str], invalid: list[str]) -> None:
        self.missing, self.invalid = missing, invalid
        parts = []
        if missing:
            parts.append("missing " + ", ".join(f"<{f}>" for f in missing))
        if invalid:
            parts.append("unreadable " + ", ".join(invalid))
        super().__init__("; ".join(parts))


@dataclass
class ExperienceOutput:
    """One parsed answer of the experience model.

    Attributes:
        reasoning: The reasoning (empty when the model gave none).
        next_state: The predicted abstract state.
        reward: Outcome reward in [0, 1].
        done: Whether the episode ends.
        success: Whether the task was accomplished.
        adjusted: Consistency fixes applied (e.g. ``"success implies done"``).
    """

    reasoning: str
    next_state: str
    reward: float
    done: bool
    success: bool
    adjusted: list[str] = field(default_factory=list)


def _tag_span(text: str, name: str, start: int = 0) -> tuple[str, int] | None:
    """Content of ``<name>…</name>`` at or after ``start`` and the index where it ends.

    A missing closing tag ends the field at the next known opening tag, or at the end of text.
    """
    opening = re.compile(rf"<\s*{name}\s*>", re.I).search(text, start)
    if opening is None:
        return None
    closing = re.compile(rf"<\s*/\s*{name}\s*>", re.I).search(text, opening.end())
    if closing is not None:
        return text[opening.end() : closing.start()], closing.end()
    tags = "|".join(f for f in OUTPUT_FIELDS if f != name)
    nxt = re.compile(rf"<\s*(?:{tags})\s*>", re.I).search(text, opening.end())
    end = nxt.start() if nxt else len(text)
    return text[opening.end() : end], end


def _read_bool(raw: str) -> bool | None:
    word = raw.strip().strip("\"'`*.").strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    number = _NUMBER.match(word)
    return float(number.group()) >= 1 if number and word.startswith(("0.", "1.")) else None


def parse_experience_output(text: str) -> ExperienceOutput:
    """Read an answer ``<reasoning>…<next_state>…<reward>…<done>…<success>…`` (the fields after
    the reasoning in any order: the compact format puts the outcome before the page).

    Tolerates surrounding whitespace and code fences, any case, a missing closing tag at the
    end, booleans as ``true/false/yes/no/1/0`` and rewards such as ``1.0``. ``<reasoning>`` is
    optional (text before the first tag counts as reasoning); ``<success>`` may be missing
    (then it is ``reward == 1``). The reward is clamped to [0, 1]. The outcome is an outcome
    reward (Sec. 4.1): reward 1, success and done go together. An answer whose fields say
    otherwise (``<reward>1`` with ``<success>false``, or a success that is not done) is
    unreadable, not silently resolved, and the caller retries: a small model that loses its
    thread in a long rationale writes such answers, and reading a stray ``<reward>1`` as a
    success would end ordinary steps as successes.

    Raises:
        ExperienceParseError: ``next_state``, ``reward`` or ``done`` is absent or unreadable, or
            the outcome fields contradict each other.
    """
    text = _FENCE_LINE.sub("", text or "").strip()
    found = _tag_span(text, "reasoning")
    if found is not None:
        reasoning, rest_at = found
    else:
        first = re.search(r"<\s*(?:next_state|reward|done|success)\s*>", text, re.I)
        reasoning, rest_at = (text[: first.start()], first.start()) if first else ("", 0)
    raw = {name: _tag_span(text, name, rest_at) for name in OUTPUT_FIELDS[1:]}
    missing = [n for n in _REQUIRED if raw[n] is None]
    invalid: list[str] = []
    values: dict[str, Any] = {}
    if raw["next_state"] is not None:
        lines = [s.strip() for s in raw["next_state"][0].splitlines()]
        values["next_state"] = "\n".join(s for s in lines if s)
        if not values["next_state"]:
            invalid.append("<next_state>: empty")
    if raw["reward"] is not None:
        number = _NUMBER.match(raw["reward"][0].strip().strip("\"'`*"))
        reward = float(number.group()) if number else math.nan
        if math.isnan(reward):
            invalid.append(f"<reward>: {raw['reward'][0].strip()[:40]!r} is not a number")
        values["reward"] = reward
    for name in ("done", "success"):
        if raw[name] is not None:
            values[name] = _read_bool(raw[name][0])
            if values[name] is None:
                invalid.append(f"<{name}>: {raw[name][0].strip()[:40]!r} is not true or false")
    if not missing and not invalid:
        won = values["reward"] >= 1.0
        success = values.get("success")
        if success is not None and success != won:
            invalid.append(f"<reward>{values['reward']:g} contradicts <success>"
                           f"{str(success).lower()}")
        elif (won or success) and not values["done"]:
            invalid.append("a success that is not <done>")
    if missing or invalid:
        raise ExperienceParseError(missing, invalid)
    out = ExperienceOutput(
        reasoning=reasoning.strip(),
        next_state=values["next_state"],
        reward=min(1.0, max(0.0, values["reward"])),
        done=values["done"],
        success=values.get("success", values["reward"] >= 1.0),
    )
    if out.reward != values["reward"]:
        out.adjusted.append("reward clamped to [0, 1]")
    return out


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


class ChatModel(Protocol):
    """What the experience model needs of a model: :class:`~dreamgym_agents.gateway.llm.Gateway`."""

    def complete(self, messages: list[dict[str, Any]]) -> Any:
        """Return an answer with ``.text``, ``.reasoning``, ``.full_text`` and ``.usage``."""
        ...


class Retriever(Protocol):
    """What the experience model needs of the replay buffer (``dreamgym_agents.buffer.replay``)."""

    def retrieve(
        self,
        state: str,
        action: str,
        *,
        k: int | None = None,
        where: dict | None = None,
        exclude_episode: str | None = None,
    ) -> list[Transition]:
        """The ``k`` transitions most similar to ``(state, action)``, best first."""
        ...


@dataclass
class ExperienceConfig:
    """Settings of the experience model (the three flags are the paper's ablations, Sec. 5).

    Attributes:
        history_steps: H, how many previous steps the prompt shows (action + the resulting
            state's one-line name).
        top_k: How many similar real transitions are retrieved and shown as demonstrations.
        use_history: Show the recent steps.
        use_retrieval: Retrieve and show similar real transitions.
        use_reasoning: Ask for step-by-step reasoning before the prediction.
        max_parse_retries: Extra attempts after an unreadable answer (with feedback); after them
            the step is an experience-model failure.
        retrieval_where: Metadata filter of the retrieval (Chroma ``where`` syntax); by default
            only recorded transitions, never the model's own dreams.
        max_state_lines: Lines of each state shown in the prompt (current state and demos).
        prompt_style: ``full`` (``prompts/experience_model.md``: every state in full, for hosted
            and large models) or ``compact`` (``prompts/experience_model_compact.md``: states as
            differences), for small models trained on it such as the embedded default.
        exclude_same_task: Never retrieve a record of the task being played (by task id), as
            the experience model's training retrieved demonstrations from other tasks only
            (:class:`~dreamgym_agents.experience.data.ExampleConfig`): a model trained
            so must not be shown the task's own recorded answer and outcome at inference.
        temperature: Sampling temperature of every answer (0: greedy); None: the family
            codec's ``sampling`` of the step, else the gateway's ``llm.temperature``.
        top_p: Nucleus mass when sampling; None: the codec's ``sampling``, else none.
        program: A saved prompt program (``dg-agents optimize --target experience``) whose
            instruction replaces the full prompt's (None: the template's).
        codec_version: The family's experience codec version the model was trained with, as
            :func:`~.training.trained_settings` records it (0: a checkpoint without a recorded
            version); None: the family's latest (``TaskFamily.experience_codec(version)``).
    """

    history_steps: int = 4
    top_k: int = 3
    use_history: bool = True
    use_retrieval: bool = True
    use_reasoning: bool = True
    max_parse_retries: int = 2
    retrieval_where: dict | None = field(
        default_factory=lambda: {"provenance": {"$in": ["offline", "real"]}}
    )
    max_state_lines: int = 120
    prompt_style: str = "full"
    exclude_same_task: bool = True
    temperature: float | None = None
    top_p: float | None = None
    program: str | None = None
    codec_version: int | None = None

    def __post_init__(self) -> None:
        if self.program and self.prompt_style != "full":
            raise ConfigError("experience.program replaces the full prompt's instruction; the "
                              "compact prompt has none (set experience.prompt_style=full)")
        if self.prompt_style not in ("full", "compact"):
            raise ConfigError(
                f"experience.prompt_style must be full or compact, got {self.prompt_style!r}"
            )
        if self.history_steps < 1:
            raise ConfigError(
                f"experience.history_steps must be >= 1, got {self.history_steps} "
                "(set experience.use_history: false to show no history)"
            )
        if self.top_k < 1:
            raise ConfigError(
                f"experience.top_k must be >= 1, got {self.top_k} "
                "(set experience.use_retrieval: false to retrieve nothing)"
            )
        if self.max_parse_retries < 0:
            raise ConfigError(
                f"experience.max_parse_retries must be >= 0, got {self.max_parse_retries}"
            )
        if self.temperature is not None and self.temperature < 0:
            raise ConfigError(f"experience.temperature must be >= 0 (0 = greedy), got "
                              f"{self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError(f"experience.top_p must be in (0, 1], got {self.top_p}")
        if self.max_state_lines < 2:
            raise ConfigError(
                f"experience.max_state_lines must be >= 2, got {self.max_state_lines}"
            )
        if self.retrieval_where is not None and not isinstance(self.retrieval_where, dict):
            raise ConfigError(
                "experience.retrieval_where must be a mapping such as "
                f"{{provenance: {{$in: [offline, real]}}}} or null, got {self.retrieval_where!r}"
            )


@dataclass
class ExperiencePrediction:
    """The experience model's prediction for one step.

    Attributes:
        output: The parsed answer, or None for an experience-model failure.
        raw: The last answer of the model (with its ``<think>`` block, if any).
        usage: Model usage summed over the attempts.
        attempts: Model calls made (1 + parse retries).
        failure: Why the prediction failed (the last parse error); empty when fine.
        demos: Ids (``episode_id:step``) of the retrieved demonstrations, best first.
    """

    output: ExperienceOutput | None
    raw: str = ""
    usage: ModelUsage = field(default_factory=ModelUsage)
    attempts: int = 0
    failure: str = ""
    demos: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the model's answer was read."""
        return self.output is not None


class ExperienceModel:
    """Predicts ``(s', r, done, success)`` from ``(task, history, s, a, demos)`` with an LLM.

    Thread-safe: one instance serves every dream environment of a run.

    Args:
        cfg: Its settings.
        gateway: The model (a :class:`~dreamgym_agents.gateway.llm.Gateway` or a test double).
        buffer: The replay buffer to retrieve demonstrations from; None retrieves nothing.
        codec: The task family's part of the prompt and answer
            (``TaskFamily.experience_codec()``; :mod:`dreamgym_agents.experience.codec`).
    """

    def __init__(
        self, cfg: ExperienceConfig, gateway: ChatModel, buffer: Retriever | None = None, *,
        codec: ExperienceCodec,
    ) -> None:
        self.cfg = cfg
        self.gateway = gateway
        self.buffer = buffer
        self.codec = codec
        self.instruction = load_template(codec.prompt_file)["instruction"]
        if cfg.program:
            from dreamgym_agents.prompts.programs import load_program

            program = load_program(cfg.program)
            if (program.target, program.template) != ("experience", codec.prompt_file):
                raise ConfigError(f"program {cfg.program!r} prompts the {program.target} "
                                  f"through {program.template}, not this experience model "
                                  f"({codec.prompt_file})")
            self.instruction = program.instruction
        self._lock = threading.Lock()
        self._counts = {"predictions": 0, "failures": 0, "parse_retries": 0}

    @property
    def metrics(self) -> dict[str, float]:
        """Running counts: ``experience/predictions``, ``…/failures``, ``…/failure_rate``, …."""
        with self._lock:
            counts = dict(self._counts)
        rate = counts["failures"] / counts["predictions"] if counts["predictions"] else 0.0
        return {**{f"experience/{k}": v for k, v in counts.items()},
                "experience/failure_rate": rate}

    def retrieve(self, state: str, action: str, exclude_episode: str | None = None, *,
                 intent: str = "", params: dict[str, str] | None = None,
                 task_id: str = "") -> list:
        """The demonstrations for this step (none when retrieval is off or there is no buffer).

        For a final answer with a known task ``intent`` (and ``params``), the demonstrations are
        recorded final answers chosen by their answer checks (:func:`retrieve_demos`). Records
        of the task ``task_id`` itself are left out (``exclude_same_task``).
        """
        if not self.cfg.use_retrieval or self.buffer is None:
            return []
        where = self.cfg.retrieval_where
        if self.cfg.exclude_same_task and task_id:
            where = {**(where or {}), "task_id": {"$ne": str(task_id)}}
        return retrieve_demos(self.buffer, self.codec, intent, state, action, k=self.cfg.top_k,
                              where=where, exclude_episode=exclude_episode, params=params)

    def render_inputs(
        self, task: Task | str, history: list[Transition], state: str, action: str,
        demos: list[Transition],
    ) -> dict[str, str | None]:
        """The text of each input field (None for a field switched off by an ablation flag)."""
        cfg = self.cfg
        return {
            "task": task.intent if isinstance(task, Task) else task,
            "history": (render_history(history, cfg.history_steps, self.codec)
                        if cfg.use_history else None),
            "retrieved": render_demos(demos, cfg.max_state_lines) if cfg.use_retrieval else None,
            "state": clip_state(state, cfg.max_state_lines),
            "action": action.strip(),
        }

    def build_messages(
        self, task: Task | str, history: list[Transition], state: str, action: str,
        demos: list[Transition], instruction: str | None = None, *,
        codec: ExperienceCodec | None = None,
    ) -> list[dict[str, str]]:
        """The chat messages of one prediction.

        ``instruction`` replaces the full prompt's instruction (None: the program's, else the
        template's); ``codec`` is the one already bound to ``task`` (None: bound here).
        """
        if self.cfg.prompt_style == "compact":
            cfg = self.cfg
            return (codec or self.task_codec(task)).render(
                task.intent if isinstance(task, Task) else task,
                history if cfg.use_history else None, state, action,
                demos if cfg.use_retrieval else None,
                history_steps=min(cfg.history_steps, 2), use_reasoning=cfg.use_reasoning,
                params=task.params if isinstance(task, Task) else {},
            )
        inputs = self.render_inputs(task, history, state, action, demos)
        template = self.codec.prompt_file
        return render_messages(instruction or self.instruction, inputs,
                               use_reasoning=self.cfg.use_reasoning, prompt_file=template)

    def task_codec(self, task: Task | str) -> ExperienceCodec:
        """The codec bound to ``task`` (``ExperienceCodec.for_task``; a bare intent: none)."""
        return self.codec.for_task(task if isinstance(task, Task) else None)

    def sampling(self, state: str, action: str,
                 codec: ExperienceCodec | None = None) -> dict[str, Any]:
        """The decoding settings of a first answer; empty: the gateway's own.

        :class:`ExperienceConfig`'s ``temperature`` and ``top_p`` override the codec's
        ``sampling`` of the step, whose ``bad_words`` are kept. ``codec`` is the one bound to the
        step's task (None: the model's).
        """
        out = dict((codec or self.codec).sampling(state, action))
        for key in ("temperature", "top_p"):
            if getattr(self.cfg, key) is not None:
                out[key] = getattr(self.cfg, key)
        if out.get("temperature") == 0:
            out.pop("top_p", None)
        return out

    def predict(
        self, task: Task | str, history: list[Transition], state: str, action: str, *,
        exclude_episode: str | None = None, instruction: str | None = None,
    ) -> ExperiencePrediction:
        """Predict the outcome of ``action`` in ``state``.

        Args:
            task: The task (its intent is shown).
            history: The episode's previous transitions, oldest first (the last H are shown).
            state: The current abstract state.
            action: The agent's action text.
            exclude_episode: Episode whose transitions must not be retrieved (when replaying a
                recorded episode, so the model cannot copy the answer).
            instruction: The full prompt's instruction for this call (an optimiser's
                candidate); None: the model's own.

        Returns:
            The prediction; ``failure`` is set when no answer could be read.

        Raises:
            ModelError: The model call failed (after the gateway's own retries).
        """
        intent = task.intent if isinstance(task, Task) else task
        params = task.params if isinstance(task, Task) else {}
        task_id = str(task.task_id) if isinstance(task, Task) else ""
        demos = self.retrieve(state, action, exclude_episode, intent=intent, params=params,
                              task_id=task_id)
        codec = self.task_codec(task)  # bound once: prompt, decoding and reading alike
        messages = self.build_messages(task, history, state, action, demos, instruction,
                                       codec=codec)
        prediction = ExperiencePrediction(output=None, demos=[transition_id(t) for t in demos])
        overrides = self.sampling(state, action, codec)
        for attempt in range(1 + self.cfg.max_parse_retries):
            try:
                completion = self.gateway.complete(messages, **overrides)
            except ContextLengthError as exc:
                # The step's prompt is too long for this model: a failed prediction, counted
                # like an unreadable one, not the end of the run.
                prediction.failure = str(exc)
                prediction.attempts = attempt + 1
                break
            prediction.usage.add(completion.usage)
            prediction.attempts = attempt + 1
            prediction.raw = completion.full_text
            try:
                if completion.finish_reason == "length" and not _CLOSED_STATE.search(
                        completion.text):
                    # Stopped by the token limit inside the page: a cut page is not a prediction.
                    raise ExperienceParseError([], ["<next_state>: cut at the token limit"])
                prediction.output = parse_experience_output(completion.text)
                # A next state written as a reference plus edits (the family's codec) is
                # expanded here, so everything downstream sees full states. The compact prompt
                # shows the demos as the codec does (demo_pages); the full one as recorded.
                pages = (codec.demo_pages(demos, state, action)
                         if self.cfg.prompt_style == "compact"
                         else [d.next_state for d in demos])
                prediction.output.next_state = codec.expand_state(
                    prediction.output.next_state, state, pages,
                    codec.back_page(history) if self.cfg.use_history else None,
                    action,
                )
            except (ExperienceParseError, StateReferenceError) as exc:
                prediction.output = None
                prediction.failure = str(exc)
                logger.info("experience answer unreadable (attempt %d): %s", attempt + 1, exc)
                if self.cfg.prompt_style == "compact":
                    # Small models trained on the compact prompt never saw a feedback turn (and a
                    # long failed answer would overflow their context): sample a fresh answer.
                    overrides = {**overrides, "temperature": max(
                        COMPACT_RETRY_TEMPERATURE, overrides.get("temperature", 0.0))}
                    continue
                retry = load_template(self.codec.prompt_file)["retry"].format(error=exc)
                messages = [*messages, {"role": "assistant", "content": completion.text},
                            {"role": "user", "content": retry}]
                continue
            if not prediction.output.reasoning and completion.reasoning:
                prediction.output.reasoning = completion.reasoning.strip()
            prediction.failure = ""
            break
        with self._lock:
            self._counts["predictions"] += 1
            self._counts["parse_retries"] += prediction.attempts - 1
            self._counts["failures"] += not prediction.ok
        if not prediction.ok:
            logger.warning("experience-model failure after %d attempts: %s",
                           prediction.attempts, prediction.failure)
        return prediction

    def predict_trajectory(
        self, trajectory: Trajectory
    ) -> list[tuple[Transition, ExperiencePrediction]]:
        """Replay a recorded episode step by step (teacher forcing) for fidelity metrics.

        Each step sees the recorded history and state; the episode itself is excluded from
        retrieval. Invalid-action steps are skipped (the environment, not the model, decided them).
        """
        pairs = []
        for i, t in enumerate(trajectory.transitions):
            if not t.valid:
                continue
            prediction = self.predict(trajectory.task, trajectory.transitions[:i], t.state,
                                      t.action, exclude_episode=trajectory.episode_id)
            pairs.append((t, prediction))
        return pairs
