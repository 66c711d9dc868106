"""The project's error tree.

Infrastructure failures raise one of these typed errors; the CLI turns any ``DreamGymError`` into
one line on stderr and a non-zero exit. Model-caused failures (an unparseable action, an
unparseable experience-model answer) are *not* errors: they are recorded in the step and counted.
"""

from __future__ import annotations


class DreamGymError(Exception):
    """Base class: every error the CLI reports as one line."""

    exit_code: int = 1


class ConfigError(DreamGymError):
    """A bad value from the user: flag, config file, task file. Says how to fix it."""

    exit_code = 2


class TaskError(ConfigError):
    """A malformed task configuration or an unknown task family."""


class ModelError(DreamGymError):
    """A model call failed.

    Attributes:
        retryable: True for rate limits, timeouts, connection failures and 5xx answers; the
            gateway retries those with backoff before raising.
    """

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class ContextLengthError(ModelError):
    """The prompt does not fit the model's context window (never retryable).

    Callers that build prompts from data (the experience model) record it as a failed step
    instead of ending the run.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class EnvironmentError_(DreamGymError):
    """An environment could not be set up or driven (browser missing, site unreachable)."""


# Public name without the trailing underscore would shadow the builtin alias ``EnvironmentError``.
EnvError = EnvironmentError_


class UnplayableTaskError(EnvironmentError_):
    """A task its environment can never play (a broken game file, a game its planner rejects):
    its episode fails with this reason in ``errors.jsonl`` and the run goes on without it; a
    rerun fails it the same way, so a run whose only failures are these ends with its summary
    and exit 0."""


class MissingExtraError(DreamGymError):
    """An optional dependency is not installed; the message names the extra to install."""

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(
            f"{module} is not installed: install the '{extra}' extra "
            f"(pip install 'dreamgym-agents[{extra}]')"
        )


class PartialBuildError(DreamGymError):
    """A time budget stopped a build before its recipe's fixed steps: what was trained is kept,
    marked partial, and is never cached or loaded as the recipe's model."""

    exit_code = 3


class BenchError(DreamGymError):
    """Some of a bench's runs failed (the others finished and are in its table); each failed
    run's folder resumes when the bench is run again."""
