"""The trainable policy: a local causal LM that writes one action per turn.

An episode is one token sequence of alternating segments, the environment's and the policy's::

    <|user|><page>\\nTask: What is the price of …?\\nSteps: (none)\\n<|assistant|>  ← environment
    fill(searchbox 'Search', 'Acumen Vector …')<|endoftext|>                    ← policy
    <|user|><next page>\\nTask: …\\nSteps: fill(searchbox 'Search', …)\\n<|assistant|>
    keyboard_press('Enter')<|endoftext|>                                        ← policy

The policy is *turn-level* (Markov in what it sees): each environment segment is self-contained —
the page, the task, the last actions and any error of the last one — and the policy conditions
on its own turn only, from the segment's ``<|user|>`` token to its action: a small model on a
CPU cannot afford attention over every earlier page of an episode. The same layout serves SFT
examples (loss on action tokens), GRPO rollouts and evaluation; in a rollout ``env_mask`` is 0
on environment segments and the trainer scores each turn from its own ``<|user|>`` token
(:mod:`dreamgym_agents.rl.grpo`).

The task and the last actions come after the page, next to the action: a small model trained
from scratch attends to what is near, and a warm start shown the task first, a page away from
its action, ignores it and plays one template's actions for every task.

The state is shown as the task family's policy view has it (:class:`PolicyView`): the web
family's (:mod:`dreamgym_agents.adapters.webarena.policy_view`) shows a page compactly and names
elements instead of numbering them; :class:`PlainView` shows short text states as they are. The
view also says how a recorded action is written, how a written one is executed, and the turn's
grammar for constrained decoding.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from dreamgym_agents.episodes.agent import Decision
from dreamgym_agents.episodes.env import Observation
from dreamgym_agents.errors import ConfigError, ModelError
from dreamgym_agents.types import ModelUsage, Task, Transition

logger = logging.getLogger(__name__)

USER, ASSISTANT = "<|user|>", "<|assistant|>"


@dataclass
class PolicyConfig:
    """How the policy sees a turn and decodes its action.

    Attributes:
        max_action_tokens: Longest action, in tokens (a fill with a long product name is ~30).
        max_state_lines: Lines of each page shown (the rest is cut, and says so).
        max_text_chars: Longest text line shown (descriptions and reviews are cut).
        history_actions: How many previous actions each turn lists.
        temperature: 0 decodes greedily (evaluation); above 0 samples (RL rollouts).
        max_batch: Most generations batched into one ``generate`` call.
        constrained_decoding: Decode only actions of the turn's grammar, where the family's
            view gives one (``PolicyView.grammar``: the web's elements on the page and typed
            text from the task, ALFWorld's admissible commands, τ²'s tools); tokenizers that
            are not byte-level BPE (with a warning) decode unconstrained.
        turn_format: How a turn is laid out in tokens, in SFT, RL and evaluation alike:
            ``compact`` uses the from-scratch policy's own markers (``<|user|>`` turn
            ``<|assistant|>`` action ``<|endoftext|>``); ``chat`` uses the checkpoint's chat
            template, one user message answered by the action, so a pretrained chat model keeps
            the format it was tuned on; ``auto`` is compact when the tokenizer has the markers,
            else chat when it has a template.
        show_options: List the commands the state accepts in each turn (a family whose view
            knows them: ALFWorld's admissible commands), for a pretrained model to copy
            from; the embedded policy decodes within them instead.
        options: The family's own view settings (a run's ``--set policy_view.<name>=…``: any
            key that is not a field above lands here), read by its view through the family's
            ``view_options`` dataclass, which names the valid keys (:func:`view_options`; the
            web's ``element_refs``, ``mark_task_terms``, ``extractive_answers``).
    """

    __extra_keys__ = "options"

    max_action_tokens: int = 48
    max_state_lines: int = 80
    max_text_chars: int = 100
    history_actions: int = 4
    temperature: float = 0.0
    max_batch: int = 32
    constrained_decoding: bool = True
    turn_format: str = "auto"
    show_options: bool = False
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_action_tokens < 4:
            raise ConfigError(f"policy.max_action_tokens must be at least 4, got "
                              f"{self.max_action_tokens}")
        if self.max_state_lines < 2:
            raise ConfigError(f"policy.max_state_lines must be at least 2, got "
                              f"{self.max_state_lines}")
        if self.max_text_chars < 10:
            raise ConfigError(f"policy.max_text_chars must be at least 10, got "
                              f"{self.max_text_chars}")
        if self.history_actions < 0:
            raise ConfigError(f"policy.history_actions must be >= 0, got "
                              f"{self.history_actions}")
        if self.temperature < 0:
            raise ConfigError(f"policy.temperature must be >= 0, got {self.temperature}")
        if self.turn_format not in TURN_FORMATS:
            raise ConfigError(f"policy.turn_format must be one of {', '.join(TURN_FORMATS)}, "
                              f"got {self.turn_format!r}")


TURN_FORMATS = ("auto", "compact", "chat")
"""The policy's turn layouts (:attr:`PolicyConfig.turn_format`)."""


RECORDED_VIEW_OPTIONS: dict[str, Any] = {"element_refs": "name", "mark_task_terms": True,
                                         "extractive_answers": True}
"""View settings every record made before they became the web family's options carries, at
these values (they were fields of :class:`PolicyConfig` then, whatever the family): a record
shows them so, where the options do not set them, and every record made before still matches."""


def view_record(view: PolicyConfig | dict[str, Any]) -> dict[str, Any]:
    """A policy view as records compare it (a warm start's key, a bundle's measured episodes):
    flat, the family's options beside the fields (:data:`RECORDED_VIEW_OPTIONS` where unset);
    ``turn_format`` left out at ``auto`` or ``compact``, the layout the embedded policy (which
    has the markers) always had, and ``show_options`` when off, so records made before the
    settings existed still match."""
    shown = dict(asdict(view) if isinstance(view, PolicyConfig) else view)
    options = shown.pop("options", None) or {}
    shown = {**RECORDED_VIEW_OPTIONS, **shown, **options}
    if shown.get("turn_format") in ("auto", "compact"):
        del shown["turn_format"]
    if not shown.get("show_options", True):
        del shown["show_options"]
    return shown


def turn_format(tokenizer: Any, asked: str = "auto") -> str:
    """``compact`` or ``chat`` for ``tokenizer`` (``asked``: a :data:`TURN_FORMATS` value).

    Raises:
        ConfigError: ``chat`` asked of a tokenizer without a chat template.
    """
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if asked == "chat" and not has_template:
        raise ConfigError("policy.turn_format chat: the checkpoint's tokenizer has no chat "
                          "template (use compact)")
    if asked != "auto":
        return asked
    marker = tokenizer.convert_tokens_to_ids(USER)
    if isinstance(marker, int) and marker != tokenizer.unk_token_id:
        return "compact"
    return "chat" if has_template else "compact"


class PolicyView(Protocol):
    """A family's part of the policy: how a state reads to it, how an action is written and
    executed, and the grammar of a turn (``TaskFamily.policy_view``)."""

    def page(self, state: str, intent: str, cfg: PolicyConfig) -> str:
        """The state as the policy sees it (its turn's first lines)."""
        ...

    def written(self, action: str, state: str, cfg: PolicyConfig) -> str:
        """A recorded action as the policy writes it (on the state it was taken in)."""
        ...

    def resolve(self, written: str, state: str, cfg: PolicyConfig) -> str | None:
        """The environment's action for what the policy wrote (None: none on this state)."""
        ...

    def grammar(self, state: str, intent: str, cfg: PolicyConfig) -> Any:
        """The turn's action grammar for constrained decoding (None: unconstrained)."""
        ...


class PlainView:
    """:class:`PolicyView` of short text states: the state's lines as they are (at most
    ``max_state_lines``, each cut at ``max_text_chars``), actions as written, and optionally
    decoding constrained to the commands ``options(state)`` lists
    (:class:`~dreamgym_agents.policy.grammar.ChoiceGrammar`)."""

    def __init__(self, options: Any = None) -> None:
        self.options = options

    def page(self, state: str, intent: str, cfg: PolicyConfig) -> str:
        del intent
        out = [ln if len(ln) <= cfg.max_text_chars else ln[:cfg.max_text_chars] + "…"
               for ln in state.strip().splitlines()]
        if len(out) > cfg.max_state_lines:
            out = [*out[:cfg.max_state_lines], f"(… {len(out) - cfg.max_state_lines} more lines)"]
        if cfg.show_options and self.options is not None:
            out.append("Commands: " + "; ".join(self.options(state)))
        return "\n".join(out)

    @staticmethod
    def written(action: str, state: str, cfg: PolicyConfig) -> str:
        del state, cfg
        return action

    @staticmethod
    def resolve(written: str, state: str, cfg: PolicyConfig) -> str | None:
        del state, cfg
        return written

    def grammar(self, state: str, intent: str, cfg: PolicyConfig) -> Any:
        from dreamgym_agents.policy.grammar import ChoiceGrammar

        del intent
        if self.options is None or not cfg.constrained_decoding:
            return None
        options = list(self.options(state))
        return ChoiceGrammar(options) if options else None


def turn_text(task: Task | str, state: str, actions: list[str] | None = None,
              error: str = "", cfg: PolicyConfig | None = None,
              view: PolicyView | None = None) -> str:
    """What the policy reads in one turn, in any layout: page (as the family's ``view`` shows
    it; None: :class:`PlainView`), task, last actions (as the policy writes them,
    :func:`written_actions`), error."""
    cfg = cfg or PolicyConfig()
    intent = task.intent if isinstance(task, Task) else task
    recent = (actions or [])[-cfg.history_actions:] if cfg.history_actions else []
    steps = "; ".join(recent) if recent else "(none)"
    note = f"Error: {error.strip().splitlines()[0][:160]}\n" if error.strip() else ""
    page = (view or PlainView()).page(state, intent, cfg)
    return f"{page}\nTask: {intent}\nSteps: {steps}\n{note}"


def render_segment(task: Task | str, state: str, actions: list[str] | None = None,
                   error: str = "", cfg: PolicyConfig | None = None,
                   view: PolicyView | None = None) -> str:
    """The environment's segment of one turn in the compact layout (:func:`turn_text` between
    the turn markers)."""
    return f"{USER}{turn_text(task, state, actions, error, cfg, view)}{ASSISTANT}"


def written_actions(history: list[Transition], cfg: PolicyConfig,
                    view: PolicyView | None = None) -> list[str]:
    """The episode's actions as the policy writes them, through the family's ``view`` (the
    web family's ``name`` references write a bid as its element's role and name on its page;
    None: :class:`PlainView`, as recorded)."""
    view = view or PlainView()
    return [view.written(t.action, t.state, cfg) for t in history]


@dataclass
class EpisodeTokens:
    """One episode's tokens: each turn's environment segment, then the action written.

    ``mask`` is 1 on action tokens (generated, or the recorded action for SFT) and 0 on
    environment tokens; ``turns`` holds where each turn's segment starts. The first segment is
    the prompt of a GRPO rollout, the rest its completion. ``allowed`` holds, for each token,
    the tokens its decoding constraint allowed (None: unconstrained, and every environment
    token): an RL trainer scores a sampled action under the same constraint.
    """

    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    allowed: list[list[int] | None] = field(default_factory=list)

    def add_env(self, ids: list[int]) -> None:
        self.turns.append(len(self.ids))
        self.ids.extend(ids)
        self.mask.extend([0] * len(ids))
        self.allowed.extend([None] * len(ids))

    def add_action(self, ids: list[int], allowed: list[list[int] | None] | None = None) -> None:
        self.ids.extend(ids)
        self.mask.extend([1] * len(ids))
        allowed = list(allowed or [])
        self.allowed.extend((allowed + [None] * len(ids))[: len(ids)])

    @property
    def constrained(self) -> bool:
        """Whether any token was decoded under a constraint."""
        return any(a is not None for a in self.allowed)

    def turn_ids(self, index: int = -1) -> list[int]:
        """The tokens of one turn so far (its segment, and its action once written)."""
        start = self.turns[index]
        following = [t for t in self.turns if t > start]
        return self.ids[start:following[0] if following else len(self.ids)]

    @property
    def prompt_len(self) -> int:
        """Length of the first segment (up to the first action token)."""
        return next((i for i, m in enumerate(self.mask) if m), len(self.ids))

    @property
    def prompt_ids(self) -> list[int]:
        return self.ids[:self.prompt_len]

    @property
    def completion_ids(self) -> list[int]:
        return self.ids[self.prompt_len:]

    @property
    def env_mask(self) -> list[int]:
        return self.mask[self.prompt_len:]


@dataclass
class Generated:
    """New tokens of one generation, with what :meth:`PolicyModel.generate_traced` traced."""

    ids: list[int]
    allowed: list[list[int] | None]
    """Per new token, the tokens its constraint allowed (None: unconstrained)."""
    logps: list[float]
    """Per new token, its log-probability under the distribution it was sampled from."""


POLICY_FILE = "policy.json"
"""A trained policy's settings beside its checkpoint (:meth:`PolicyModel.save_settings`)."""


def trained_policy_settings(directory: str | os.PathLike[str]) -> PolicyConfig | None:
    """The settings a policy checkpoint was trained with: its :data:`POLICY_FILE`, or for an
    embedded bundle's warm start (``<bundle>/policy``) the view its ``manifest.json`` records
    (None: not a policy checkpoint of ours, or one written before they were kept)."""
    from dreamgym_agents.pipeline.bundle import MANIFEST_FILE, POLICY_DIR

    path = Path(directory, POLICY_FILE)
    manifest = Path(directory).parent / MANIFEST_FILE
    if path.is_file():
        data = json.loads(path.read_text())
    elif Path(directory).name == POLICY_DIR and manifest.is_file():
        try:
            data = json.loads(manifest.read_text())["warm_start"]["view"]
        except (ValueError, KeyError, TypeError):
            return None
    else:
        return None
    known = {f.name for f in fields(PolicyConfig)} - {"options"}
    options = {**(data.get("options") or {}),
               **{k: v for k, v in data.items() if k not in known | _SETTINGS_NOT_VIEW}}
    return PolicyConfig(**{k: v for k, v in data.items() if k in known}, options=options)


_SETTINGS_NOT_VIEW = {"options", "algorithm"}
"""Keys of a :data:`POLICY_FILE` that are not view settings (the RL algorithm that trained it)."""


def view_options(cls: type | None, cfg: PolicyConfig, where: str = "policy.") -> Any:
    """The family's view settings from ``cfg.options``: an instance of its ``view_options``
    dataclass ``cls`` (None: the family has none).

    Raises:
        ConfigError: A key the family does not take (the message lists the valid ones;
            :data:`RECORDED_VIEW_OPTIONS` at their recorded values are taken by every family,
            as older records carry them), or a value its dataclass refuses.
    """
    from dreamgym_agents.config import apply_mapping

    given = {k: v for k, v in cfg.options.items()
             if not (RECORDED_VIEW_OPTIONS.get(k, object()) == v
                     and (cls is None or k not in {f.name for f in fields(cls)}))}
    if cls is None:
        if given:
            raise ConfigError(f"unknown config key(s) {', '.join(where + k for k in given)}: "
                              "this family's policy view takes no settings of its own")
        return None
    options = cls()
    apply_mapping(options, given, where)
    return options


def typed_view_options(cls: type | None, cfg: PolicyConfig,
                       where: str = "policy.") -> dict[str, Any]:
    """``cfg.options`` checked against the family's ``view_options`` dataclass (names, types
    and values), the keys given only; those every older record carries at their recorded
    values are dropped where the family does not take them.

    Raises:
        ConfigError: As :func:`view_options`.
    """
    options = view_options(cls, cfg, where)
    if options is None:
        return {}
    return {k: getattr(options, k) for k in cfg.options if hasattr(options, k)}


def save_policy_settings(directory: str | os.PathLike[str], cfg: PolicyConfig,
                         layout: str, algorithm: str | None = None) -> None:
    """Write a trained policy's settings beside its checkpoint as :data:`POLICY_FILE`, so
    ``eval --agent hf/<checkpoint>`` plays it as it was trained: its ``layout`` (``compact``
    or ``chat``), view and decoding (the family's options among them, flat), and the RL
    ``algorithm`` that trained it last, if any."""
    fields_ = asdict(cfg)
    settings = {**fields_.pop("options"), **fields_, "turn_format": layout,
                **({"algorithm": algorithm} if algorithm else {})}
    Path(directory, POLICY_FILE).write_text(json.dumps(settings, indent=2, sort_keys=True))


class PolicyModel:
    """A causal LM (a checkpoint directory, or a live model and tokenizer) as a policy.

    Generations of concurrent episodes are batched (one worker thread, see
    :func:`~dreamgym_agents.gateway.local.make_batcher`). The model object is used as is, so a
    trainer's model keeps generating with its latest weights; an ``engine``
    (:data:`~dreamgym_agents.gateway.local.Engine`, such as TRL's vLLM generation) generates
    instead of it.
    """

    def __init__(self, model: Any, tokenizer: Any, cfg: PolicyConfig | None = None,
                 name: str = "policy", engine: Any = None,
                 view: PolicyView | None = None) -> None:
        from dreamgym_agents.gateway.local import eos_ids, make_batcher

        self.model = model
        self.tokenizer = tokenizer
        self.cfg = cfg or PolicyConfig()
        self.name = name
        self.view: PolicyView = view or PlainView()
        """How the policy sees its family's states (``TaskFamily.policy_view``, handed in by
        whoever resolved the family); :class:`PlainView` without one."""
        self._viewless: set[str] = set()
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
            else tokenizer.eos_token_id
        self.pad_id = int(pad or 0)
        self.eos_id = int(tokenizer.eos_token_id)
        self.eos = eos_ids(model, tokenizer) | {self.eos_id}
        self._lock = threading.Lock()  # fast tokenizers are not safe to share between threads
        self.format = turn_format(tokenizer, self.cfg.turn_format)
        self.user_id = -1  # the compact layout's turn marker (none in the chat layout)
        self.turn_end = [self.eos_id]
        if self.format == "compact":
            user = tokenizer.convert_tokens_to_ids(USER)
            if not isinstance(user, int) or user == tokenizer.unk_token_id:
                raise ConfigError(f"the policy's tokenizer has no {USER} token: train the "
                                  "policy with dg-agents (its SFT adds it), add it as a special "
                                  "token, or use policy.turn_format chat")
            self.user_id = int(user)
        else:
            self.turn_end = self._chat_turn_end()
        self.batcher = make_batcher(model, self.pad_id, self.cfg.max_batch, engine)
        self._vocab: Any = None

    @classmethod
    def load(cls, path: str | os.PathLike[str], cfg: PolicyConfig | None = None,
             view: PolicyView | None = None) -> PolicyModel:
        """Load a checkpoint directory written by ``save_pretrained``; with no ``cfg``, in the
        settings it was trained with (its :data:`POLICY_FILE`) when it says them; ``view``: its
        tasks' family's policy view."""
        from dreamgym_agents.gateway.local import load_local_model

        directory = Path(path).expanduser()
        if not directory.is_dir():
            raise ConfigError(f"policy checkpoint not found: {path} (a directory written by "
                              "save_pretrained, e.g. a run's checkpoints/sft)")
        tokenizer, model = load_local_model(directory)
        return cls(model, tokenizer, cfg or trained_policy_settings(directory),
                   name=f"policy-{directory.name}", view=view)

    def save_settings(self, directory: str | os.PathLike[str]) -> None:
        """Write the settings this policy plays with beside its checkpoint
        (:func:`save_policy_settings`)."""
        save_policy_settings(directory, self.cfg, self.format)

    def encode(self, text: str) -> list[int]:
        with self._lock:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        with self._lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _chat(self, messages: list[dict[str, str]], prompt: bool) -> str:
        with self._lock:
            return str(self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                          add_generation_prompt=prompt))

    def _chat_turn_end(self) -> list[int]:
        """The tokens the chat template closes an assistant's answer with, up to the first
        end token (what the policy writes after its action)."""
        mark = "\u2402ACTION\u2402"
        text = self._chat([{"role": "user", "content": "u"},
                           {"role": "assistant", "content": mark}], prompt=False)
        after = self.encode(text.split(mark, 1)[1]) if mark in text else []
        ends = [i for i, t in enumerate(after) if t in self.eos]
        return after[:ends[0] + 1] if ends else [self.eos_id]

    def segment_ids(self, task: Task | str, state: str, actions: list[str] | None = None,
                    error: str = "") -> list[int]:
        """The environment's segment of one turn, in the policy's layout (``format``)."""
        view = self.view_for(task)
        if self.format == "compact":
            return self.encode(render_segment(task, state, actions, error, self.cfg, view))
        text = turn_text(task, state, actions, error, self.cfg, view)
        return self.encode(self._chat([{"role": "user", "content": text}], prompt=True))

    def view_for(self, task: Task | str) -> PolicyView:
        """The view the policy sees ``task`` through: its own (the same for every task); a
        task of a named family met without a view is said once, as it plays as plain text."""
        if isinstance(self.view, PlainView) and isinstance(task, Task) and task.family \
                and task.family not in self._viewless:
            self._viewless.add(task.family)
            logger.info("%s was given no policy view: tasks of family %r are shown as plain "
                        "text (pass the family's policy_view())", self.name, task.family)
        return self.view

    def action_ids(self, action: str) -> list[int]:
        """A recorded action as the policy would have written it (with its end of turn)."""
        return [*self.encode(action), *self.turn_end]

    def constraint(self, task: Task | str, state: str) -> Any:
        """The decoding constraint of one turn (None when decoding is unconstrained): the
        family's grammar of the turn (``PolicyView.grammar``)."""
        from dreamgym_agents.policy.grammar import Constraint, Vocabulary

        if not self.cfg.constrained_decoding:
            return None
        with self._lock:
            if self._vocab is None:
                self._vocab = Vocabulary(self.tokenizer)
                if not self._vocab.ok:
                    logger.warning("%s: the tokenizer is not byte-level BPE; actions are "
                                   "decoded unconstrained", self.name)
        if not self._vocab.ok:
            return None
        intent = task.intent if isinstance(task, Task) else task
        grammar = self.view_for(task).grammar(state, intent, self.cfg)
        return None if grammar is None else Constraint(grammar, self._vocab, self.eos)

    def generate(self, ids: list[int], temperature: float | None = None,
                 constraint: Any = None) -> list[int]:
        """New token ids after ``ids`` (blocking; batched with concurrent callers), within
        ``constraint`` if one is given (:meth:`constraint`)."""
        return self.generate_traced(ids, temperature, constraint, trace=False).ids

    def generate_traced(self, ids: list[int], temperature: float | None = None,
                        constraint: Any = None, *, trace: bool = True,
                        seed: int | None = None) -> Any:
        """:meth:`generate`, with (``trace``) the tokens the constraint allowed at each new
        token and each token's log-probability under the distribution it was drawn from;
        ``seed``: a sample drawn from its own generator (the same seed, the same draws)."""
        from dreamgym_agents.gateway.local import GenerationRequest

        temp = self.cfg.temperature if temperature is None else temperature
        context = getattr(self.model.config, "max_position_embeddings", None)
        budget = self.cfg.max_action_tokens
        if context is not None:
            if len(ids) >= context:
                raise ModelError(f"a policy turn of {len(ids)} tokens does not fit the model's "
                                 f"context of {context}: lower policy.max_state_lines",
                                 retryable=False)
            budget = min(budget, context - len(ids))
        request = GenerationRequest(ids, budget, temp, None, seed, constraint=constraint,
                                    trace=trace)
        new = self.batcher.submit(request)
        return Generated(new, request.allowed, request.logps)


class PolicyAgent:
    """The policy behind the :class:`~dreamgym_agents.episodes.agent.Agent` contract.

    It keeps each episode's tokens (:class:`EpisodeTokens`) so a trainer can take them back with
    :meth:`pop_episode`; evaluation calls :meth:`forget` instead. With a ``seed``, a sampled
    turn draws from a generator seeded by the seed, the episode and the turn: the same episode
    played twice (in the dream and for real, say) draws the same numbers turn by turn.
    """

    def __init__(self, policy: PolicyModel, *, temperature: float | None = None,
                 name: str | None = None, keep_tokens: bool = True,
                 seed: int | None = None) -> None:
        self.policy = policy
        self.temperature = policy.cfg.temperature if temperature is None else temperature
        self.name = name or policy.name
        self.keep_tokens = keep_tokens
        self.seed = seed
        self._episodes: dict[str, EpisodeTokens] = {}
        self._lock = threading.Lock()

    def pop_episode(self, episode_id: str) -> EpisodeTokens | None:
        with self._lock:
            return self._episodes.pop(episode_id, None)

    def _segment(self, task: Task, observation: Observation, history: list[Transition],
                 episode_id: str) -> tuple[EpisodeTokens, list[int]]:
        ids = self.policy.segment_ids(task, observation.state,
                                      written_actions(history, self.policy.cfg,
                                                      self.policy.view),
                                      observation.error)
        with self._lock:
            tokens = self._episodes.get(episode_id)
            if tokens is None or len(tokens.turns) != len(history) or not self.keep_tokens:
                tokens = EpisodeTokens()  # a resumed episode: only its new turns are recorded
            tokens.add_env(ids)
            self._episodes[episode_id] = tokens
        return tokens, ids

    async def act(self, task: Task, observation: Observation, history: list[Transition],
                  episode_id: str) -> Decision:
        start = time.perf_counter()
        tokens, ids = await asyncio.to_thread(self._segment, task, observation, history,
                                              episode_id)
        constraint = self.policy.constraint(task, observation.state)
        seed = None if self.seed is None or self.temperature <= 0 else \
            turn_seed(self.seed, episode_id, len(history))
        generated = await asyncio.to_thread(self.policy.generate_traced, ids, self.temperature,
                                            constraint, trace=self.keep_tokens, seed=seed)
        new, allowed = list(generated.ids), list(generated.allowed)
        if not new or new[-1] not in self.policy.eos:
            new = [*new, self.policy.eos_id]  # cut at max_action_tokens: the action ends here
        with self._lock:
            tokens.add_action(new, allowed)
            if not self.keep_tokens:
                self._episodes.pop(episode_id, None)
        written = self.policy.decode(new).strip()
        # nothing on the state to resolve to: the environment refuses the text as written
        action = self.policy.view.resolve(written, observation.state, self.policy.cfg) \
            or written
        return Decision(action=action, raw=written,
                        usage=ModelUsage(calls=1, prompt_tokens=len(ids),
                                         completion_tokens=len(new)),
                        seconds=time.perf_counter() - start)


def turn_seed(seed: int, episode_id: str, turn: int) -> int:
    """A sampled turn's seed: stable across processes and runs (not Python's salted hash)."""
    import hashlib

    digest = hashlib.sha256(f"{seed}:{episode_id}:{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & (2**63 - 1)


def error_seen(transitions: list[Transition], index: int) -> str:
    """The error shown with step ``index``'s page: that of the step before, if invalid."""
    if index == 0:
        return ""
    prev = transitions[index - 1]
    return prev.error if not prev.valid else ""


def episode_tokens(policy: PolicyModel, task: Task, transitions: list[Transition]) -> EpisodeTokens:
    """A recorded episode in the policy's layout (for SFT): every action after its turn."""
    tokens = EpisodeTokens()
    written = written_actions(transitions, policy.cfg, policy.view)
    for i, t in enumerate(transitions):
        tokens.add_env(policy.segment_ids(task, t.state, written[:i],
                                          error_seen(transitions, i)))
        tokens.add_action(policy.action_ids(written[i]))
    return tokens
