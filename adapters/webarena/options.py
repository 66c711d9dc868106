"""The web family's own settings: of its environment (``--set env.<name>=…``, a config's
``env:`` section, read from :attr:`~dreamgym_agents.episodes.env.EnvConfig.options` by
:func:`~dreamgym_agents.episodes.env.env_options`), of its embedded recipe and of its policy
view (``--set policy.<name>=…``, read by :func:`~dreamgym_agents.policy.model.view_options`)."""

from __future__ import annotations

from dataclasses import dataclass

from dreamgym_agents.errors import ConfigError
from dreamgym_agents.pipeline.embedded import NoRecipeOptions


@dataclass(frozen=True)
class WebRecipeOptions(NoRecipeOptions):
    """The web family's own embedded recipe options (``--set experience_recipe.<name>=…``):
    its collectors beyond the oracle, the noisy oracle and the random agent.

    Attributes:
        quitter_tasks: Train tasks where the agent answers wrongly or too early.
        explorer_tasks: Episodes of the explorer (one per site section and listing page; 8
            sections × 3 pages cover every item of the bundled shop).
        explorer_pages: Listing pages per section the explorer covers.
        explorer_steps: Episode length limit of the explorer (it opens and leaves each item).
        order_explorer_tasks: Episodes of the order explorer (one per page of the signed-in
            customer's My Orders; it opens every order and goes back): the order pages that
            the catalogue explorer never reaches.
    """

    quitter_tasks: int = 90
    explorer_tasks: int = 24
    explorer_pages: int = 3
    explorer_steps: int = 27
    order_explorer_tasks: int = 3


@dataclass
class WebEnvOptions:
    """A browser environment's settings.

    Attributes:
        headless: Run browsers headless.
        step_timeout_s: Default Playwright timeout of the page (navigation, evaluation).
        action_timeout_s: Timeout of one browser action (a click, a fill) before it counts as
            failed; BrowserGym's own 0.5 s is too tight on a loaded machine.
        key_settle_s: Pause after a key press before observing (a key can submit a form, and
            Playwright does not wait for the navigation a key press starts).
        screenshots: Capture a screenshot at every browser step (for vision agents; slower).
        score_at_step_limit: Score an episode that reaches ``max_steps`` as if the agent
            stopped there (WebArena's early stop: its final page is evaluated); None: real
            WebArena sites yes, the bundled shop no.
        site_reset: How to reset the sites before a task that changes them (WebArena's
            ``require_reset``): a URL (BrowserGym's ``WA_FULL_RESET`` convention) or a command;
            None reads ``WA_FULL_RESET``, else such tasks run on sites nobody resets (said once).
        eval_deviations: Opt-in deviations of the evaluator from WebArena's own verdicts, by
            name (a list, or one comma-separated string: README); None: real sites none, the
            bundled shop ``load_wait``.
    """

    headless: bool = True
    step_timeout_s: float = 5.0
    action_timeout_s: float = 2.0
    key_settle_s: float = 0.3
    screenshots: bool = False
    score_at_step_limit: bool | None = None
    site_reset: str | None = None
    eval_deviations: list[str] | str | None = None

    def __post_init__(self) -> None:
        if self.action_timeout_s <= 0:
            raise ConfigError(f"env.action_timeout_s must be positive, got "
                              f"{self.action_timeout_s}")
        if self.step_timeout_s <= 0:
            raise ConfigError(f"env.step_timeout_s must be positive, got {self.step_timeout_s}")


@dataclass
class WebViewOptions:
    """The web family's own policy view settings (``--set policy.<name>=…``;
    ``TaskFamily.view_options``).

    Attributes:
        element_refs: How the policy names an element: ``name``, as the embedded policy does,
            shows pages without bids, and an action written as ``click(link 'Name')`` is
            resolved to the bid on the page by :mod:`.grounding`; ``bid`` shows pages with
            their bids, for BrowserGym's ``click('84')``.
        mark_task_terms: Mark the page lines the task mentions with ``* ``.
        extractive_answers: With constrained decoding, an answer is a span of the page's
            text or the task, or ``done`` (the bundled site's answers are, but for sums over
            several orders): a small model copies an answer instead of making up a number.
    """

    element_refs: str = "name"
    mark_task_terms: bool = True
    extractive_answers: bool = True

    def __post_init__(self) -> None:
        if self.element_refs not in ("name", "bid"):
            raise ConfigError(f"policy.element_refs must be name or bid, got "
                              f"{self.element_refs!r}")
