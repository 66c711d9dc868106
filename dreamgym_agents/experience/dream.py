"""The dream environment: the experience model behind the
:class:`~dreamgym_agents.episodes.env.Environment` contract, so the same episode graph, agents
and runner play synthetic episodes (DreamGym, Sec. 4).

- ``reset(task)`` starts from the task's recorded initial state in the replay buffer (a
  curriculum's synthetic task: its seed's, ``config["synthetic_of"]``), or from that of a task
  that starts in the same place (``StateFormat.start_key``), made the task's own by the state
  format's optional ``for_task`` (an ALFWorld opening names the goal). When the buffer has none,
  it starts from the task's real opening if the family reads one without playing
  (``TaskFamily.opening``: an ALFWorld game's first observation), or from a minimal state the
  family builds from the task (``StateFormat.initial_state``; a web page: ``URL: <start_url>``,
  ``Title: ``). ``Observation.info["start_state"]`` says which: ``recorded``, ``opening`` or
  ``synthesised``.
- ``step(action)`` parses the action with the action set, then asks the experience model for the
  next state, reward, done and success, with the episode's own history.

Where the dream differs from a real environment, on purpose:

- An unparseable action does **not** leave the episode running: per Sec. 4.1 it moves the episode
  to a failure state (``valid=False``, ``done=True``, reward 0, no success). A real environment
  records the invalid step and lets the agent try again. ``DreamConfig.invalid_action_ends_episode``
  set to False gives the real environment's behaviour (the shared contract test runs that way).
- An experience-model failure (no readable answer after the parse retries) ends the episode with
  reward 0, ``info["em_failure"] = True`` and ``error="experience model failure: …"``; trainers
  keep such steps out of the data.
- Where the family can judge a step against the task's own reference with what the dream
  knows (``TaskFamily.dream_verdict``, e.g. a web answer by the task's evaluator), that verdict
  replaces the experience model's (``DreamConfig.verdicts``; the model's is kept in
  ``info["model_reward"]``).
- A terminal agent action, one the family's action set says ends the episode by its type (a
  web answer, ``send_msg_to_user`` or ``stop [...]``), is judged by the model like any action,
  but the episode ends after it even if the model says not done (the agent has stopped), with
  reward 0 in that case.

One environment serves one episode at a time; a run makes one per concurrent episode, all sharing
one (thread-safe) experience model.
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from dreamgym_agents.episodes.env import Observation, StepResult, TaskFamily
from dreamgym_agents.errors import ConfigError, EnvError
from dreamgym_agents.experience.model import ExperienceModel, Retriever
from dreamgym_agents.types import Task, Transition

logger = logging.getLogger(__name__)


class DreamBuffer(Retriever, Protocol):
    """What the dream needs of the replay buffer: retrieval plus recorded start states."""

    def start_state(
        self, task_id: str | None = None, *, start: str | None = None,
        family: str | None = None,
    ) -> str | None:
        """The recorded initial state of a task (by id, else by where it starts), or None."""
        ...


@dataclass
class DreamConfig:
    """Settings of the dream environment.

    Attributes:
        invalid_action_ends_episode: An unparseable action moves the episode to a failure state
            (Sec. 4.1). False keeps the episode running as a real environment does.
        real_openings: When the buffer holds no start state for a task, start from its real
            opening if the family reads one without playing a step (``TaskFamily.opening``: a
            game's first observation; a reset, no transition).
        synthesise_start: When there is neither, start from the family's minimal state for
            the task (``StateFormat.initial_state``). False makes ``reset`` raise instead.
        reward: Who gives each step's reward and success. ``model`` (the paper): the
            experience model. ``state``: the family's check of the state the model predicted
            (``TaskFamily.state_success``); the model's own verdict is kept in the step's
            ``info["model_reward"]``, and a done it claimed with its success stands only where
            the check agrees. A declared variant that isolates the predicted dynamics from the
            predicted rewards, not the method.
        verdicts: Where the family can judge a step against the task's own reference with
            what the dream knows (``TaskFamily.dream_verdict``), its verdict replaces the
            experience model's (kept in ``info["model_reward"]``): for the web family, an
            answer by the task's evaluator, the page's URL against its reference URL. The
            reward of a step the real environment would score the same way is then exact, and
            a policy cannot learn to fool the model there. Elsewhere (the site's hidden state,
            a curriculum's variant without a reference) the model's verdict stands.
    """

    invalid_action_ends_episode: bool = True
    real_openings: bool = True
    synthesise_start: bool = True
    reward: str = "model"
    verdicts: bool = True

    def __post_init__(self) -> None:
        if self.reward not in REWARD_SOURCES:
            raise ConfigError(f"dream reward {self.reward!r}: choose from "
                              f"{', '.join(REWARD_SOURCES)}")


REWARD_SOURCES = ("model", "state")
"""Who gives the dream's rewards (:attr:`DreamConfig.reward`)."""


def read_openings_ahead(family: TaskFamily, tasks: list[Task]) -> int:
    """Before a dream plays ``tasks``: the family's openings of them (and what its codec shows
    of a task's start) read at once, where the family reads them ahead
    (``TaskFamily.read_openings``, optional: ALFWorld's first looks, a textworld load each);
    otherwise each is read when a dream step first asks. Returns how many were read."""
    hook = getattr(family, "read_openings", None)
    return 0 if hook is None or not tasks else int(hook(list(tasks)))


class DreamEnv:
    """An environment whose transitions are predicted by the experience model.

    Args:
        cfg: Its settings.
        experience_model: The model that predicts each step.
        buffer: The replay buffer (start states); None always synthesises the start state.
        family: The tasks' family: its action set parses the agent's actions, its state format
            says where an episode starts and where the agent is.
    """

    provenance = "synthetic"

    def __init__(
        self,
        cfg: DreamConfig,
        experience_model: ExperienceModel,
        buffer: DreamBuffer | None,
        family: TaskFamily,
    ) -> None:
        self.cfg = cfg
        self.model = experience_model
        self.buffer = buffer
        self.family = family
        self.action_set = family.action_set()
        self.format = family.state_format()
        self._check = getattr(family, "state_success", None) if cfg.reward == "state" else None
        self._verdict = getattr(family, "dream_verdict", None) if cfg.verdicts else None
        if cfg.reward == "state" and self._check is None:
            raise ConfigError(f"dream reward 'state' needs a family that checks states "
                              f"(TaskFamily.state_success); {family.name!r} has none")
        self._lock = threading.Lock()
        self._task: Task | None = None
        self._state = ""
        self._history: list[Transition] = []
        self._episode_id = ""
        self._done = False

    @property
    def history(self) -> list[Transition]:
        """A copy of this episode's transitions so far."""
        with self._lock:
            return list(self._history)

    def reset(self, task: Task) -> Observation:
        """Start an episode of ``task`` from its recorded (or synthesised) initial state."""
        start = self.format.start_key(task)
        state = None
        if self.buffer is not None:
            # a curriculum's synthetic task starts where its seed task starts
            seed = str(task.config.get("synthetic_of") or task.task_id)
            state = self.buffer.start_state(seed, start=start or None, family=task.family)
        source = "recorded"
        for_task = getattr(self.format, "for_task", None)
        if state and for_task is not None:
            state = for_task(state, task)
        opening = getattr(self.family, "opening", None) if self.cfg.real_openings else None
        if not state and opening is not None:
            state, source = opening(task), "opening"
        if not state:
            if not self.cfg.synthesise_start:
                raise EnvError(
                    f"no recorded start state for task {task.task_id} in the buffer: add real "
                    "episodes of it, or set dream.synthesise_start: true"
                )
            state, source = self.format.initial_state(task), "synthesised"
        with self._lock:
            self._task, self._state, self._history, self._done = task, state, [], False
            self._episode_id = f"dream-{uuid.uuid4().hex[:12]}"
        logger.debug("dream reset of %s from a %s start state", task.task_id, source)
        return self._observe(state, start_state=source)

    def step(self, action: str) -> StepResult:
        """Play one action in the dream (see the module docstring for the failure rules)."""
        with self._lock:
            if self._task is None:
                raise RuntimeError("DreamEnv.step() called before reset()")
            if self._done:
                raise RuntimeError("DreamEnv.step() called after the episode ended: reset()")
            return self._step(self._task, action)

    def _step(self, task: Task, action: str) -> StepResult:
        state = self._state
        try:
            parsed = self.action_set.parse(action)
        except ValueError as exc:
            error = str(exc) or "unparseable action"
            ends = self.cfg.invalid_action_ends_episode
            info = {"em_failure": False, "failure_state": ends}
            self._record(action, state, 0.0, ends, False, valid=False, error=error, info=info)
            obs = self._observe(state, error=error)
            return StepResult(obs, reward=0.0, done=ends, success=False, valid=False, error=error,
                              info=info)
        prediction = self.model.predict(task, list(self._history), state, action)
        info: dict[str, Any] = {"reasoning": "", "em_failure": not prediction.ok,
                                "demos": list(prediction.demos),
                                "em_attempts": prediction.attempts,
                                "em_usage": asdict(prediction.usage)}
        if prediction.output is None:
            error = f"experience model failure: {prediction.failure}"
            self._record(action, state, 0.0, True, False, error=error, info=info)
            return StepResult(self._observe(state), reward=0.0, done=True, success=False,
                              error=error, info=info)
        out = prediction.output
        info["reasoning"] = out.reasoning
        reward, done, success = out.reward, out.done, out.success
        verdict = self._verdict(task, state, action) if self._verdict is not None else None
        if verdict is not None:
            info["model_reward"] = {"reward": reward, "done": done, "success": success}
            info["verdict"] = "task"
            # a failure end the model predicted stands; a success it claimed needs the check
            done = verdict or (done and not success)
            reward, success = (1.0, True) if verdict else (0.0, False)
        elif self._check is not None:
            met = self._check(task, out.next_state)
            if met is not None:
                info["model_reward"] = {"reward": reward, "done": done, "success": success}
                # the model's done stands where it claimed no success (a failure end)
                done = bool(met) or (done and not success)
                reward, success = (1.0, True) if met else (0.0, False)
        if any(a.is_terminal for a in parsed) and not done:
            # The agent has stopped: nothing more can happen, whatever the model thinks.
            reward, done, success = 0.0, True, False
            info["forced_done"] = "terminal action judged not done"
        self._state = out.next_state
        self._record(action, state, reward, done, success, info=info)
        obs = self._observe(out.next_state)
        return StepResult(obs, reward=reward, done=done, success=success, info=info)

    def _observe(self, state: str, error: str = "", **info: Any) -> Observation:
        """The observation of ``state``: its location and, when the family's state format
        derives them (``StateFormat.admissible``: a text game's commands), the commands it
        accepts, as a real environment offers them."""
        admissible = getattr(self.format, "admissible", None)
        if admissible is not None:
            info["admissible"] = admissible(state)
        return Observation(state=state, url=self.format.location(state), error=error, info=info)

    def _record(
        self, action: str, state: str, reward: float, done: bool, success: bool, *,
        valid: bool = True, error: str = "", info: dict[str, Any] | None = None,
    ) -> None:
        # The step's info (em_failure, reasoning, demos) stays with the recorded transition, so
        # episodes read from ``history`` (fidelity replays) count failures like graph runs do.
        assert self._task is not None
        self._history.append(Transition(
            episode_id=self._episode_id, step=len(self._history), task_id=self._task.task_id,
            state=state, action=action, next_state=self._state, reward=reward, done=done,
            success=success, provenance="synthetic", valid=valid, error=error,
            info=dict(info or {}),
        ))
        self._done = done

    def close(self) -> None:
        """Forget the episode (the model and buffer belong to the caller)."""
        with self._lock:
            self._task, self._history, self._done = None, [], False


class Dream:
    """An experience model, its gateway and the replay buffer it retrieves from, opened
    together for one task family: environments made from them (:meth:`env`, :meth:`pool`)
    play the family's tasks in the dream. :meth:`close` (or ``with``) releases the model, the
    buffer and every environment made.

    Args:
        family: The tasks' family.
        experience_model: A model string (``hf/<checkpoint>``, a LiteLLM model, …); a
            checkpoint trained by this pipeline is prompted as it was trained
            (:func:`~dreamgym_agents.experience.training.trained_settings`).
        buffer_path: The Chroma buffer's directory.
        cfg: The dream environments' settings.
        concurrency: Experience-model requests in flight at once.
        **settings: :class:`~dreamgym_agents.experience.model.ExperienceConfig` fields over
            the trained ones.
    """

    def __init__(self, family: TaskFamily, experience_model: str, buffer_path: str, *,
                 cfg: DreamConfig | None = None, concurrency: int = 4, **settings: Any) -> None:
        from dreamgym_agents.buffer.replay import BufferConfig, ReplayBuffer
        from dreamgym_agents.experience.model import ExperienceConfig
        from dreamgym_agents.experience.training import trained_settings
        from dreamgym_agents.gateway.llm import Gateway, LLMConfig

        self.family = family
        self.cfg = cfg or DreamConfig()
        exp_cfg = ExperienceConfig(**{**trained_settings(experience_model), **settings})
        self.gateway = Gateway(LLMConfig(model=experience_model, max_concurrency=concurrency))
        try:
            self.buffer = ReplayBuffer(BufferConfig(path=str(buffer_path), family=family.name),
                                       family)
        except BaseException:
            self.gateway.close()
            raise
        self.model = ExperienceModel(exp_cfg, self.gateway, self.buffer,
                                     codec=family.experience_codec(exp_cfg.codec_version))
        self._pools: list[Any] = []

    def env(self) -> DreamEnv:
        """A new dream environment (one episode at a time)."""
        return DreamEnv(self.cfg, self.model, self.buffer, self.family)

    def pool(self, size: int) -> Any:
        """An :class:`~dreamgym_agents.episodes.graph.EnvPool` of up to ``size`` dream
        environments (what :func:`~dreamgym_agents.rl.grpo.train_grpo` plays in)."""
        from dreamgym_agents.episodes.graph import EnvPool

        pool = EnvPool(self.env, size)
        self._pools.append(pool)
        return pool

    def close(self) -> None:
        for pool in self._pools:
            pool.close()
        self._pools = []
        self.buffer.close()
        self.gateway.close()

    def __enter__(self) -> Dream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
