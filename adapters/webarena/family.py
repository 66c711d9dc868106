"""The ``webarena`` task family: WebArena task configs on real or bundled sites.

Sites are named as in WebArena (``SHOPPING``, ``SHOPPING_ADMIN``, ``REDDIT``, ``GITLAB``,
``WIKIPEDIA``, ``MAP``, ``HOMEPAGE``) or with BrowserGym's ``WA_`` prefix. When any of those
variables is set, ``--task webarena`` runs the real WebArena task file (``--tasks FILE`` or
``WEBARENA_TASKS_FILE``) against the user's sites; otherwise it runs the project's bundled shopping
site and task set (``tasks/webarena_shopping``), served on 127.0.0.1 with a fresh site instance per
episode. ``--tasks FILE`` runs any WebArena-format JSON file (one config or a list).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import urllib.error
import urllib.request
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dreamgym_agents.adapters.webarena.options import (
    WebEnvOptions,
    WebRecipeOptions,
    WebViewOptions,
)
from dreamgym_agents.adapters.webarena.state import parse_state
from dreamgym_agents.episodes.env import EnvConfig, Environment, Requirement, env_options
from dreamgym_agents.errors import ConfigError, EnvError, TaskError
from dreamgym_agents.types import Task, Trajectory

if TYPE_CHECKING:
    from dreamgym_agents.episodes.agent import Agent
    from dreamgym_agents.episodes.env import ActionSet
    from dreamgym_agents.experience.codec import ExperienceCodec
    from dreamgym_agents.policy.model import PolicyView

logger = logging.getLogger(__name__)

SITE_VARIABLES: dict[str, str] = {
    "shopping": "SHOPPING",
    "shopping_admin": "SHOPPING_ADMIN",
    "reddit": "REDDIT",
    "gitlab": "GITLAB",
    "wikipedia": "WIKIPEDIA",
    "map": "MAP",
    "homepage": "HOMEPAGE",
}
"""WebArena site name → environment variable holding its base URL."""

BUNDLED_TASK_DIR = "webarena_shopping"
BUNDLED_FOR_REAL = "DG_WEBARENA_ON_BUNDLED_SHOP"
"""Set to 1 to play real WebArena tasks on the bundled shop (refused otherwise)."""
BUNDLED_SHOP_DEVIATIONS = frozenset({"load_wait"})
"""The bundled shop's evaluator deviations by default (:meth:`WebArenaFamily.eval_deviations`)."""
REAL_MAX_STEPS = 30
"""WebArena's step limit (its ``run.py --max_steps``), the default on real sites."""
SPLITS = ("train", "validation", "test")


def placeholder(variable: str) -> str:
    """WebArena's placeholder for a site variable: ``SHOPPING`` → ``__SHOPPING__``."""
    return f"__{variable}__"


def configured_sites(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Site variable → base URL for every WebArena site set in the environment."""
    environ = dict(os.environ if environ is None else environ)
    sites = {}
    for variable in SITE_VARIABLES.values():
        url = environ.get(variable) or environ.get(f"WA_{variable}")
        if url:
            sites[variable] = url.rstrip("/")
    return sites


def resolve_url(url: str, site_urls: dict[str, str]) -> str:
    """Replace WebArena placeholders (``__SHOPPING__``) in a URL."""
    for key, value in site_urls.items():
        url = url.replace(key, value)
    return url


def config_to_task(config: Any, *, split: str, source: str) -> Task:
    """Validate one WebArena config and wrap it in a :class:`Task`."""
    from dreamgym_agents.adapters.webarena.evaluation import validate_config

    if not isinstance(config, dict):
        raise TaskError(f"{source}: each task config must be a JSON object")
    try:
        validate_config(config)
    except TaskError as exc:  # its message names the task already
        raise TaskError(f"{source}: {exc}") from None
    return Task(
        task_id=str(config["task_id"]),
        family="webarena",
        intent=config["intent"],
        split=split,
        config=config,
        oracle=config.get("oracle"),
        template=str(config.get("intent_template") or ""),
        template_id=str(config.get("intent_template_id", "")),
        params=raw if isinstance(raw := config.get("instantiation_dict"), dict) else {},
    )


def load_config_file(path: str | Path, *, split: str = "") -> list[Task]:
    """Load a WebArena-format JSON file holding one config or a list of configs."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskError(f"task file not found: {path}") from None
    except OSError as exc:
        raise TaskError(f"cannot read task file {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TaskError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    configs = data if isinstance(data, list) else [data]
    if not configs:
        raise TaskError(f"{path}: holds no task configs")
    tasks = [config_to_task(c, split=split, source=str(path)) for c in configs]
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise TaskError(f"{path}: task_id values are not unique")
    return tasks


def _make_browsergym_task_class() -> type:
    """The BrowserGym task class running one WebArena config (built lazily: an extra)."""
    from browsergym.core.task import AbstractBrowserTask

    from dreamgym_agents.adapters.webarena.evaluation import evaluate_task

    class _WebArenaConfigTask(AbstractBrowserTask):
        """Opens the config's start URL(s); evaluates when the agent stops (sends its answer)."""

        @classmethod
        def get_task_id(cls) -> str:
            return "dreamgym.webarena_config"

        def __init__(
            self,
            seed: int | None = None,
            config: dict | None = None,
            site_urls: dict | None = None,
            judge: Any = None,
            timeout_ms: int = 5000,
            helpers: dict | None = None,
            deviations: frozenset[str] = frozenset(),
        ) -> None:
            super().__init__(seed or 0)
            self.config = config or {}
            self.site_urls = site_urls or {}
            self.judge = judge
            self.helpers = helpers
            self.deviations = deviations
            self.slow_mo = 0
            self.timeout = timeout_ms

        def setup(self, page: Any) -> tuple[str, dict]:
            # WebArena joins several start pages with " |AND| ": one tab each.
            urls = [resolve_url(u.strip(), self.site_urls) for u in
                    self.config["start_url"].split(" |AND| ")]
            page.goto(urls[0])
            for url in urls[1:]:
                page.context.new_page().goto(url)
            page.bring_to_front()
            return self.config["intent"], {}

        def validate(self, page: Any, chat_messages: list) -> tuple[float, bool, str, dict]:
            last = chat_messages[-1] if chat_messages else None
            if not last or last["role"] not in ("assistant", "infeasible"):
                return 0.0, False, "", {}
            # report_infeasible is WebArena's "N/A" answer.
            answer = "N/A" if last["role"] == "infeasible" else last["message"]
            result = evaluate_task(
                self.config, answer=answer, page=page, site_urls=self.site_urls, judge=self.judge,
                helpers=self.helpers, deviations=self.deviations,
            )
            return result.score, True, "", {"score": result.score, "details": result.details,
                                            "answer": answer}

        def score_now(self, page: Any, answer: str) -> tuple[float, dict]:
            """Evaluate the episode as if the agent stopped here with ``answer`` (WebArena's
            early stop at its step limit)."""
            result = evaluate_task(
                self.config, answer=answer, page=page, site_urls=self.site_urls, judge=self.judge,
                helpers=self.helpers, deviations=self.deviations,
            )
            return result.score, {"score": result.score, "details": result.details,
                                  "answer": answer, "early_stop": True}

    return _WebArenaConfigTask


class WebStateFormat:
    """:class:`~dreamgym_agents.episodes.env.StateFormat` of web pages (``URL:``, ``Title:``, then
    ``[bid] role 'name'`` lines)."""

    @staticmethod
    def start_key(task: Task) -> str:
        return str(task.config.get("start_url") or "")

    def initial_state(self, task: Task) -> str:
        return f"URL: {self.start_key(task)}\nTitle: "

    @staticmethod
    def location(state: str) -> str:
        return parse_state(state).url

    @staticmethod
    def strip_ids(line: str) -> str:
        return _BID_PREFIX.sub("", line)


_BID_PREFIX = re.compile(r"^\[[^\]]*\]\s*")


class WebArenaFamily:
    """Task family ``webarena`` (see the module docstring)."""

    name = "webarena"
    agent_prompt = "web_agent.md"
    """The LLM agent's prompt: a page of ``[bid] role 'name'`` lines in a browser."""
    env_options = WebEnvOptions
    view_options = WebViewOptions
    """The browser's settings (``env.headless``, ``env.eval_deviations`` …)."""
    recipe_options = WebRecipeOptions
    """The web's collectors' settings (``experience_recipe.quitter_tasks``, the explorers')."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        self._sites = configured_sites(environ)
        self._environ = dict(os.environ if environ is None else environ)
        self._site: Any = None  # the bundled ShoppingSite, started by prepare()
        self._judge: Any = None
        self._lock = threading.Lock()
        self._task_class: type | None = None
        self._signins: Any = None  # the run's saved sign-ins (login.SignIns), made by prepare
        self._warned_reset = False
        self._signin_dir: Any = None

    @property
    def uses_real_sites(self) -> bool:
        return bool(self._sites)

    def action_set(self) -> ActionSet:
        """The web action set (BrowserGym's high-level actions and WebArena's brackets)."""
        from dreamgym_agents.adapters.webarena.actions import WebActionSet

        return WebActionSet()

    def offline_agents(self, seed: int = 0, noise: float = 0.3) -> dict[str, Agent]:
        """The family's offline agents by name: ``oracle`` (plays each task's recorded
        program), ``noisy`` (the oracle with random detours, at rate ``noise``), ``quitter``
        (wrong and early answers), ``random``, ``explorer`` (every listing's items) and
        ``orders`` (the signed-in customer's orders). The explorers need :meth:`assign`-ed
        tasks (one slot each) and at least ``min_steps`` steps."""
        from dreamgym_agents.adapters.webarena.agents import offline_agents

        return offline_agents(seed=seed, noise=noise)

    eval_types = ("string_match", "url_match", "program_html")
    """WebArena's evaluator kinds (:mod:`dreamgym_agents.adapters.webarena.evaluation`)."""

    dream_eval_types = ("string_match", "url_match")
    """The tasks the dream trains on by default: not ``program_html`` ones, whose outcome is the
    site's hidden state (a cart, an address, a placed order). The embedded experience model judges
    them from the final page and the last steps, calls far more of them successes than the real site
    does, and so teaches dream RL sloppy edits (evidence: docs/RESULTS.md, "Calibration of the
    dream")."""

    @staticmethod
    def task_eval_types(task: Task) -> list[str]:
        """The WebArena eval types of a task's evaluator (empty for a task without one)."""
        from dreamgym_agents.adapters.webarena.evaluation import task_eval_types

        return task_eval_types(task)

    @staticmethod
    def state_format() -> WebStateFormat:
        """Web pages: ``URL:`` and ``Title:``, then one line per element."""
        return WebStateFormat()

    @staticmethod
    def policy_view() -> PolicyView:
        """Compact pages, elements by name, the page's action grammar
        (:class:`.policy_view.WebPolicyView`)."""
        from dreamgym_agents.adapters.webarena.policy_view import WebPolicyView

        return WebPolicyView()

    @staticmethod
    def hash_features(version: int) -> Any:
        """The buffer's features of pages and actions (:class:`.retrieval.WebHashFeatures`)."""
        from dreamgym_agents.adapters.webarena.retrieval import WebHashFeatures

        return WebHashFeatures(version)

    @staticmethod
    def experience_codec(version: int | None = None) -> ExperienceCodec:
        """The experience model's web prompt and answer (:class:`.codec.WebCodec`; it has one
        version, whatever ``version`` a model recorded)."""
        from dreamgym_agents.adapters.webarena.codec import WebCodec

        del version
        return WebCodec()

    @staticmethod
    def embedded_recipe_defaults() -> dict[str, Any]:
        """The shared recipe's defaults
        (:class:`~dreamgym_agents.pipeline.embedded.EmbeddedRecipe`) and the web's options'
        (:class:`.options.WebRecipeOptions`), with relabelled endings (two other answers per
        right one, one earlier stop per episode), final answers trained on twice and six
        verdict-only copies of each."""
        return {"counterfactual_answers": 2, "final_answer_repeat": 2, "counterfactual_stops": 1,
                "judge_repeat": 6}

    collectors = ("oracle", "noisy", "quitter", "random", "explorer", "orders")
    """The collectors of :meth:`collection_plan`, in the order their episodes are read."""

    def collection_plan(self, recipe: Any, tasks: list[Task]) -> list[tuple[str, Any, list, int]]:
        """(collector, agent, its train tasks, step limit) for every collector of the embedded
        ``recipe`` (:class:`~dreamgym_agents.pipeline.embedded.EmbeddedRecipe`), each spread
        over the whole split (every template), deterministically."""
        from dreamgym_agents.adapters.webarena.agents import collection_plan

        return collection_plan(recipe, tasks)

    def relabel(self, trajectories: list[Trajectory], *, answers: int, stops: int,
                seed: int) -> tuple[list[Any], list[Any]]:
        """Relabelled variants of recorded episodes for the experience model's data: ``answers``
        other final answers per right answer and ``stops`` earlier stops per episode, each
        labelled by the task's own evaluator
        (:mod:`dreamgym_agents.adapters.webarena.counterfactual`). Only tasks whose evaluator
        reads just the answer or the final URL get them."""
        from dreamgym_agents.adapters.webarena.counterfactual import (
            counterfactual_trajectories,
            stop_trajectories,
        )

        return (counterfactual_trajectories(trajectories, per_answer=answers, seed=seed),
                stop_trajectories(trajectories, per_episode=stops, seed=seed))

    def task_generator(self, tasks: list[Task], seed: int) -> tuple[Any, Any]:
        """The curriculum's variants: on the bundled shop, new drafts of a seed's template
        with their evaluators (:class:`.curriculum.ShopTaskGenerator`), else the seed's
        template with other values (no evaluator); either way every value grounded in a real
        task (the dream has pages of it) and never a validation or test task."""
        from dreamgym_agents.adapters.webarena.curriculum import ShopTaskGenerator
        from dreamgym_agents.rl.curriculum import TemplateTaskGenerator, grounded_in

        generic = TemplateTaskGenerator(tasks, seed)
        if self.uses_real_sites:
            return generic, grounded_in("", tasks)
        held: list[Task] = []
        for split in ("validation", "test"):
            try:
                held += self.load_tasks(split)
            except ConfigError:
                continue  # a task file of its own: no such split
        return ShopTaskGenerator(tasks, seed, avoid=held, fallback=generic), \
            grounded_in("", tasks)

    @staticmethod
    def dream_verdict(task: Task, state: str, action: str) -> bool | None:
        """The task's own verdict of a dream step where its evaluators read only the answer
        and the page's URL (:mod:`dreamgym_agents.adapters.webarena.verdict`); None for the
        others (the experience model's verdict stands)."""
        from dreamgym_agents.adapters.webarena.verdict import dream_verdict

        return dream_verdict(task, state, action)

    def requirements(self) -> list[Requirement]:
        """Chromium (with its version), BrowserGym and Playwright, and which WebArena sites are
        configured (the bundled shop stands in for ``SHOPPING`` when none is)."""
        import subprocess

        from dreamgym_agents.adapters.webarena.chromium import find_chromium
        from dreamgym_agents.cli.doctor import dist_version, public_url

        rows = []
        path = find_chromium()
        if path is None:
            rows.append(Requirement("chromium", False, "not found: install one (Debian/Ubuntu: "
                                    "apt-get install chromium) or set DG_CHROMIUM=/path/to/chrome"))
        else:
            try:
                out = subprocess.run([path, "--version"], capture_output=True, text=True,
                                     timeout=20)
                version = out.stdout.strip() or out.stderr.strip().splitlines()[-1]
                rows.append(Requirement("chromium", True, f"{path} ({version})"))
            except (OSError, subprocess.TimeoutExpired, IndexError) as exc:
                rows.append(Requirement("chromium", False, f"{path} does not start ({exc})"))
        for dist in ("browsergym-core", "playwright"):
            version = dist_version(dist)
            rows.append(Requirement(dist, version is not None, version or
                                    "missing: pip install 'dreamgym-agents[web]'"))
        for variable in SITE_VARIABLES.values():
            url = self._sites.get(variable)
            rows.append(Requirement(f"site {variable}", None, public_url(url) if url else
                                    "not set (bundled site)" if variable == "SHOPPING"
                                    else "not set"))
        return rows

    # -- tasks --------------------------------------------------------------------------------
    def load_tasks(self, split: str) -> list[Task]:
        if split not in SPLITS:
            raise ConfigError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        if self.uses_real_sites:
            path = self._environ.get("WEBARENA_TASKS_FILE")
            if not path:
                names = ", ".join(sorted(self._sites))
                raise ConfigError(
                    f"real WebArena sites are configured ({names}) but no task file: pass "
                    "--tasks path/to/test.raw.json or set WEBARENA_TASKS_FILE (or unset the site "
                    "variables to use the bundled shopping site)"
                )
            if split != "test":
                raise ConfigError("WebArena's task file is a test set: use --split test")
            return load_config_file(path, split="test")
        ref = resources.files("dreamgym_agents.tasks") / BUNDLED_TASK_DIR / f"{split}.json"
        with resources.as_file(ref) as path:
            return load_config_file(path, split=split)

    def load_task_file(self, path: str) -> list[Task]:
        return load_config_file(path)

    # -- running ------------------------------------------------------------------------------
    def prepare(self, cfg: EnvConfig, tasks: list[Task] | None = None) -> str:
        """Start or check the sites; build the judge; describe the setup in one line."""
        from dreamgym_agents.adapters.webarena.browser import install_browsergym_patches

        install_browsergym_patches()
        if cfg.judge_model and self._judge is None:
            from dreamgym_agents.adapters.webarena.judge import make_llm_judge
            from dreamgym_agents.gateway.llm import Gateway, LLMConfig

            self._judge = make_llm_judge(Gateway(LLMConfig(model=cfg.judge_model)))
        needed = _sites_used(tasks or [])
        real = [t.task_id for t in tasks or []
                if str(t.config.get("storage_state") or "").startswith("./.auth/")]
        if real and not self.uses_real_sites and not self._environ.get(BUNDLED_FOR_REAL):
            raise ConfigError(
                f"{len(real)} task(s) are real WebArena tasks (they sign in with WebArena's "
                f"./.auth/ states; e.g. {', '.join(real[:3])}) and no site is set: set the "
                f"site variables (SHOPPING=URL …), or {BUNDLED_FOR_REAL}=1 to play them on "
                "the bundled shop")
        if self.uses_real_sites or (needed and needed != {"SHOPPING"}):
            missing = sorted(needed - set(self._sites))
            if missing:
                raise EnvError(
                    f"tasks need site(s) {', '.join(missing)}: set "
                    + ", ".join(f"{m}=http://host:port" for m in missing)
                )
            for variable in sorted(needed or self._sites):
                _check_reachable(variable, self._sites[variable])
            listing = ", ".join(f"{v}={self._sites[v]}" for v in sorted(needed or self._sites))
            names = {v: k for k, v in SITE_VARIABLES.items()}
            self._sign_ins({names[v]: url for v, url in self._sites.items()}, None)
            return f"real WebArena sites: {listing} (signed in as WebArena's accounts)"
        with self._lock:
            if self._site is None:
                from dreamgym_agents.adapters.shopping.server import ShoppingSite

                self._site = ShoppingSite(seed=cfg.seed)
                self._site.start()
        from dreamgym_agents.adapters.webarena.accounts import Account
        from dreamgym_agents.adapters.webarena.login import bundled_shop_login

        customer = self._site.catalog.accounts[0]
        self._sign_ins({"shopping": self._site.new_instance(login=False)},
                       {"shopping": bundled_shop_login(Account(customer.email,
                                                               customer.password))})
        return (f"bundled shopping site at {self._site.root_url} (seed {cfg.seed}; "
                "set SHOPPING=URL for a real one)")

    def _sign_ins(self, sites: dict[str, str], logins: dict[str, Any] | None) -> None:
        """The run's sign-ins to ``sites`` (made on an episode's first need, in a temporary
        folder removed by :meth:`close`)."""
        import tempfile
        from pathlib import Path

        from dreamgym_agents.adapters.webarena.chromium import thread_playwright
        from dreamgym_agents.adapters.webarena.login import SignIns

        with self._lock:
            if self._signins is None:
                self._signin_dir = tempfile.TemporaryDirectory(prefix="dg-signin-")
                self._signins = SignIns(
                    Path(self._signin_dir.name), sites,
                    lambda: thread_playwright().chromium.launch(headless=True),
                    logins=logins, environ=self._environ)

    @property
    def default_max_steps(self) -> int | None:
        """WebArena's 30 steps on real sites (None: the toolkit's default on the bundled shop)."""
        return REAL_MAX_STEPS if self.uses_real_sites else None

    def make_env(self, cfg: EnvConfig) -> Environment:
        from dreamgym_agents.adapters.webarena.browser import BrowserGymEnv

        deviations = self.eval_deviations(cfg)  # an unknown name: one line before any episode
        options = env_options(self, cfg)
        if options.score_at_step_limit is None:  # WebArena scores its early stops; the shop's
            options.score_at_step_limit = self.uses_real_sites  # figures never did
        if self._task_class is None:
            self._task_class = _make_browsergym_task_class()
        return BrowserGymEnv(cfg, self._task_class,
                             lambda task: self._bind(task, options, deviations), options=options)

    def _bind(self, task: Task, options: WebEnvOptions,
              deviations: frozenset[str]) -> tuple[dict[str, Any], Any]:
        from dreamgym_agents.adapters.webarena.evaluation import needs_judge

        if self._judge is None and needs_judge(task.config):
            raise ConfigError(f"task {task.task_id} needs an LLM judge: pass --judge MODEL")
        if task.config.get("require_reset") and self.uses_real_sites:
            self._reset_sites(options, task)
        signed_in = bool(task.config.get("require_login", True)) and self._signins is not None
        state, records = (self._signins.state_for(list(task.config.get("sites") or [])
                                                  or ["shopping"])
                          if signed_in else (None, []))
        if self._site is not None and not self.uses_real_sites:
            # signed in by the browser's saved session (the storage state), as on real sites
            base = self._site.new_instance(login=False)
            site_urls = {placeholder("SHOPPING"): base}

            def cleanup() -> None:
                self._site.drop_instance(base)
        else:
            site_urls = {placeholder(v): url for v, url in self._sites.items()}

            def cleanup() -> None:
                return None

        kwargs = {
            "config": task.config,
            "site_urls": site_urls,
            "judge": self._judge,
            "timeout_ms": int(options.step_timeout_s * 1000),
            "helpers": self._helpers(),
            "storage_state": state,
            "sign_ins": records,
            "deviations": deviations,
        }
        return kwargs, cleanup

    def eval_deviations(self, cfg: EnvConfig) -> frozenset[str]:
        """The evaluator's opt-in deviations (``env.eval_deviations``; evaluation.DEVIATIONS):
        none by default on real sites, ``load_wait`` on the bundled shop. Its pages are complete
        at their load event, so WebArena's fixed wait after each navigation changes no verdict
        there."""
        from dreamgym_agents.adapters.webarena.evaluation import check_deviations

        chosen = env_options(self, cfg).eval_deviations
        if chosen is not None:
            return check_deviations(chosen)
        return frozenset() if self.uses_real_sites else BUNDLED_SHOP_DEVIATIONS

    def _reset_sites(self, options: WebEnvOptions, task: Task) -> None:
        """Reset the real sites before a task that changes them, as configured (else say once
        that nobody resets them)."""
        from dreamgym_agents.adapters.webarena.accounts import reset_sites

        hook = options.site_reset or self._environ.get("WA_FULL_RESET")
        if hook:
            with self._lock:  # one reset at a time; episodes wait for it
                reset_sites(hook)
        elif not self._warned_reset:
            self._warned_reset = True
            logger.warning("task %s changes the sites (require_reset) and no reset is "
                           "configured (env.site_reset or WA_FULL_RESET): later tasks see its "
                           "changes", task.task_id)

    def _helpers(self) -> dict[str, Any]:
        """The ``func:`` helpers beyond the built-in ones: the shopping REST helpers, with
        WebArena's admin account, when a real shopping site is configured."""
        from dreamgym_agents.adapters.webarena.accounts import account, shopping_helpers

        if "SHOPPING" not in self._sites:
            return {}
        return shopping_helpers(self._sites["SHOPPING"],
                                account("shopping_site_admin", self._environ))

    def unscorable(self, tasks: list[Task], cfg: EnvConfig) -> dict[str, str]:
        """The tasks this setup cannot score, by id, with the reason (checked before a run):
        an LLM judge needed and none given, a ``func:`` helper this toolkit lacks, or the
        shopping REST helpers without a real shopping site (the bundled one has no such API)."""
        from dreamgym_agents.adapters.webarena.accounts import SHOPPING_REST_HELPERS
        from dreamgym_agents.adapters.webarena.evaluation import needs_judge
        from dreamgym_agents.adapters.webarena.page_helper import BUILTIN_HELPERS, helper_names

        known = set(BUILTIN_HELPERS) | set(SHOPPING_REST_HELPERS)
        out: dict[str, str] = {}
        for task in tasks:
            used = helper_names(task.config)
            if not cfg.judge_model and needs_judge(task.config):
                out[task.task_id] = "needs an LLM judge (pass --judge MODEL)"
            elif used - known:
                out[task.task_id] = f"uses the helper {sorted(used - known)[0]}, not implemented"
            elif used & set(SHOPPING_REST_HELPERS) and "SHOPPING" not in self._sites:
                out[task.task_id] = ("checks the shopping site's admin REST API, which only a "
                                     "real Magento site has (set SHOPPING=URL)")
        return out

    def close(self) -> None:
        with self._lock:
            if self._signins is not None:
                self._signins.close()
                self._signins = None
                self._signin_dir.cleanup()
            if self._site is not None:
                self._site.stop()
                self._site = None


def _sites_used(tasks: list[Task]) -> set[str]:
    needed: set[str] = set()
    for task in tasks:
        text = json.dumps(task.config)
        for variable in SITE_VARIABLES.values():
            if placeholder(variable) in text:
                needed.add(variable)
    return needed


def _check_reachable(variable: str, url: str) -> None:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - user-configured site
            resp.read(1)
    except urllib.error.HTTPError:
        return  # the server answered: reachable
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EnvError(f"site {variable} at {url} is unreachable ({reason})") from None

