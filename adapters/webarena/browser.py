"""A real browser environment on BrowserGym, safe to run several at once.

BrowserGym drives Chromium through Playwright's *sync* API, whose objects belong to the thread that
created them, and it keeps one global Playwright instance. To run many episodes concurrently we give
every :class:`BrowserGymEnv` its own worker thread, with its own Playwright instance, and marshal
every call onto that thread. :mod:`dreamgym_agents.adapters.webarena.chromium` makes BrowserGym's
global getter thread-local, and gives every launch the system Chromium and the flags that work
offline as root.

Two more patches keep episodes fast: the chat window BrowserGym opens in a *second* browser is
replaced by an in-memory message list (the agent talks to the task through ``send_msg_to_user``;
nobody watches a chat window headless), and the per-step screenshot is skipped unless
``env.screenshots`` (:class:`~dreamgym_agents.adapters.webarena.options.WebEnvOptions`) asks
for it (text agents never read it, and it is a large share of a step's time).
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import re
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from dreamgym_agents.adapters.webarena.actions import ActionParseError, WebActionSet
from dreamgym_agents.adapters.webarena.axtree import map_axtree
from dreamgym_agents.adapters.webarena.chromium import (
    patch_browsergym_launch,
    require_chromium,
    stop_thread_playwright,
    thread_playwright,
)
from dreamgym_agents.adapters.webarena.options import WebEnvOptions
from dreamgym_agents.episodes.env import EnvConfig, Observation, StepResult
from dreamgym_agents.errors import EnvError, MissingExtraError
from dreamgym_agents.types import Task

logger = logging.getLogger(__name__)
T = TypeVar("T")
_ACTION_TIMEOUT = re.compile(r"\btimeout=500\b")

TaskBinder = Callable[[Task], tuple[dict[str, Any], Callable[[], None]]]
"""Given a task, returns the keyword arguments of the BrowserGym task class for this episode and a
cleanup callable run when the episode ends (e.g. dropping a site instance)."""


class ThreadWorker:
    """Runs callables on one dedicated thread (Playwright sync objects must stay on theirs)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.Queue[tuple[Callable[[], Any], concurrent.futures.Future] | None] = (
            queue.Queue()
        )
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, fut = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                fut.set_exception(exc)

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((fn, fut))
        return fut

    def call(self, fn: Callable[[], T]) -> T:
        if threading.current_thread() is self._thread:
            return fn()
        return self.submit(fn).result()

    def stop(self) -> None:
        self._jobs.put(None)


class _MessageChat:
    """In-memory stand-in for BrowserGym's chat window (same attributes the env uses)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.messages: list[dict[str, Any]] = []
        self.page = None
        self.recording_start_time = None

    def add_message(self, role: str, msg: str) -> None:
        self.messages.append({"role": role, "timestamp": time.time(), "message": msg})

    def wait_for_user_message(self) -> None:
        return None

    def close(self) -> None:
        return None


_patch_lock = threading.Lock()
_patched = False
_screenshots = threading.local()


def _blank_screenshot(extract: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Skip BrowserGym's per-step screenshot unless this thread's env asked for it."""

    def extract_screenshot(page: Any) -> Any:
        if getattr(_screenshots, "wanted", False):
            return extract(page)
        import numpy as np

        return np.zeros((1, 1, 3), dtype=np.uint8)

    return extract_screenshot


def install_browsergym_patches() -> None:
    """Thread-local, system-Chromium Playwright for BrowserGym, and an in-memory chat (idempotent).

    Raises:
        MissingExtraError: BrowserGym is not installed.
        EnvError: No Chromium was found (the message says how to install one).
    """
    global _patched
    with _patch_lock:
        if _patched:
            return
        try:
            import browsergym.core.env as bg_env
        except ImportError:
            raise MissingExtraError("browsergym-core", "web") from None
        patch_browsergym_launch(require_chromium())
        _light_playwright_stacks()
        bg_env.Chat = _MessageChat
        bg_env.extract_screenshot = _blank_screenshot(bg_env.extract_screenshot)
        _patched = True


class _LightInspect:
    """The ``inspect`` module as Playwright's call wrappers see it, with a ``stack()`` that reads
    no source files.

    Playwright 1.44 (BrowserGym's pin) takes ``inspect.stack()`` on every API call, only to
    name the call's frames (file, line, function) for its traces. ``inspect.stack()`` looks up
    each frame's source file and lines on disk (``os.path.exists``, ``linecache``): with the
    policy's generation fast, that is the largest part of a web evaluation's CPU. The frames,
    names and line numbers are the same; the source lines, which Playwright never reads, are
    left out.
    """

    def __init__(self, module: Any) -> None:
        self._module = module

    @staticmethod
    def stack(context: int = 1) -> list[Any]:
        import inspect
        import sys

        del context
        frames, frame = [], sys._getframe(1)
        while frame is not None:
            frames.append(inspect.FrameInfo(frame, frame.f_code.co_filename, frame.f_lineno,
                                            frame.f_code.co_name, None, None))
            frame = frame.f_back
        return frames

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


class _LightTraceback:
    """The ``traceback`` module for Playwright's sync wrapper: ``extract_stack()`` without
    reading each frame's source line up front (it is read if the summary is ever printed)."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def extract_stack(self, f: Any = None, limit: int | None = None) -> Any:
        import sys

        frame = f if f is not None else sys._getframe(1)
        summary = self._module.StackSummary.extract(self._module.walk_stack(frame),
                                                    limit=limit, lookup_lines=False)
        summary.reverse()
        return summary

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def _light_playwright_stacks() -> None:
    """Give Playwright's call wrappers :class:`_LightInspect` and :class:`_LightTraceback`."""
    import inspect
    import traceback

    try:
        from playwright._impl import _connection, _network, _sync_base
    except ImportError:  # another Playwright layout: leave it as it is
        logger.debug("playwright's call wrappers not found; stacks left as they are")
        return
    for module in (_connection, _network, _sync_base):
        if isinstance(getattr(module, "inspect", None), type(inspect)):
            module.inspect = _LightInspect(inspect)  # type: ignore[attr-defined]
    if isinstance(getattr(_sync_base, "traceback", None), type(traceback)):
        _sync_base.traceback = _LightTraceback(traceback)  # type: ignore[attr-defined]


class _ReusedBrowser:
    """A Chromium kept across episodes: ``close()`` closes its contexts, not the process.

    BrowserGym launches a new browser at every reset, a large part of the reset's time; a fresh
    browser *context* per episode gives the same clean slate (cookies, storage, cache, pages).
    """

    def __init__(self, browser: Any) -> None:
        self._browser = browser

    def close(self) -> None:
        for context in list(self._browser.contexts):
            context.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._browser, name)


def _reuse_browsers(pw: Any) -> None:
    """Make ``pw.chromium.launch`` hand back one live browser per set of launch options."""
    browser_type = pw.chromium
    if getattr(browser_type, "_dreamgym_reuse", False):
        return
    launch = browser_type.launch
    browsers: dict[str, Any] = {}

    def reusing_launch(**kwargs: Any) -> Any:
        key = repr(sorted(kwargs.items()))
        browser = browsers.get(key)
        if browser is None or not browser.is_connected():
            browser = browsers[key] = launch(**kwargs)
        return _ReusedBrowser(browser)

    browser_type.launch = reusing_launch
    browser_type._dreamgym_reuse = True


class BrowserGymEnv:
    """A real web environment: BrowserGym's ``BrowserEnv`` behind the project's env contract.

    Args:
        cfg: Environment settings.
        task_entrypoint: The BrowserGym task class (``AbstractBrowserTask`` subclass).
        bind_task: Prepares one episode's task kwargs (see :data:`TaskBinder`).
        name: Name of the worker thread (for logs).
        options: The browser's settings (None: the defaults).
    """

    provenance = "real"

    def __init__(
        self,
        cfg: EnvConfig,
        task_entrypoint: type,
        bind_task: TaskBinder,
        name: str = "browser",
        options: WebEnvOptions | None = None,
    ) -> None:
        install_browsergym_patches()
        self.cfg = cfg
        self.options = options or WebEnvOptions()
        self.action_set = WebActionSet()
        self._entrypoint = task_entrypoint
        self._bind_task = bind_task
        self._worker = ThreadWorker(name)
        self._worker.call(lambda: setattr(_screenshots, "wanted", self.options.screenshots))
        self._env: Any = None
        self._cleanup: Callable[[], None] | None = None
        self._obs: Observation | None = None
        self._site_urls: dict[str, str] = {}
        self._steps = 0
        self._sign_ins: list[dict[str, Any]] = []

    # -- contract ---------------------------------------------------------------------------
    def reset(self, task: Task) -> Observation:
        return self._worker.call(lambda: self._reset(task))

    def step(self, action: str) -> StepResult:
        return self._worker.call(lambda: self._step(action))

    def close(self) -> None:
        try:
            self._worker.call(self._close)
        finally:
            self._worker.stop()

    # -- on the worker thread -----------------------------------------------------------------
    def _reset(self, task: Task) -> Observation:
        from browsergym.core.env import BrowserEnv

        self._end_episode()
        task_kwargs, cleanup = self._bind_task(task)
        self._cleanup = cleanup
        # the run's saved sign-in goes into this episode's browser context; what it was is
        # recorded with the first step (no password)
        state = task_kwargs.pop("storage_state", None)
        self._sign_ins = task_kwargs.pop("sign_ins", None) or []
        context_kwargs = {"storage_state": state} if state else {}
        self._site_urls = dict(task_kwargs.get("site_urls", {}))
        _reuse_browsers(thread_playwright())
        if self._env is None:
            self._env = BrowserEnv(
                task_entrypoint=self._entrypoint,
                task_kwargs=task_kwargs,
                headless=self.options.headless,
                action_mapping=None,  # we hand BrowserGym python code (WebActionSet.to_python)
                pre_observation_delay=0.0,
                wait_for_user_message=False,
                pw_context_kwargs=context_kwargs,
            )
        else:
            self._env.task_kwargs = task_kwargs
            self._env.pw_context_kwargs = context_kwargs
        try:
            obs, _info = self._env.reset()
        except EnvError:
            raise
        except Exception as exc:
            raise EnvError(f"could not start task {task.task_id}: {_one_line(exc)}") from exc
        self._obs = self._observe(obs)
        self._steps = 0
        return self._obs

    def _step(self, action: str) -> StepResult:
        if self._env is None or self._obs is None:
            raise EnvError("step() called before reset()")
        self._steps += 1
        try:
            actions = self.action_set.parse(action)
        except ActionParseError as exc:
            # Model-caused: an invalid-action step, the page is unchanged.
            error = f"invalid action: {exc}"
            self._obs = Observation(self._obs.state, self._obs.url, error, self._obs.info)
            return self._result(StepResult(self._obs, valid=False, error=error), {})
        actions = [self._from_placeholders(a) for a in actions]
        code = self.action_set.to_python(actions)
        # BrowserGym's action functions give Playwright 500 ms; a click that starts a navigation
        # on a loaded 2-core machine can take longer and would be recorded as failed although the
        # page changed.
        code = _ACTION_TIMEOUT.sub(f"timeout={int(self.options.action_timeout_s * 1000)}", code)
        # A key press can submit a form; Playwright does not wait for the navigation it starts
        # (a click does), so give the page a moment before BrowserGym observes it.
        settle = any(a.name == "keyboard_press" for a in actions)
        self._env.pre_observation_delay = self.options.key_settle_s if settle else 0.0
        obs, reward, terminated, truncated, info = self._execute(code)
        self._obs = self._observe(obs)
        error = self._obs.error
        task_info = info.get("task_info", {}) or {}
        done = bool(terminated or truncated)
        result = StepResult(self._obs, reward=float(reward), done=done,
                            success=done and float(reward) >= 1.0, valid=not error, error=error,
                            info={"code": code, **({"eval": task_info} if task_info else {})})
        return self._result(result, task_info)

    def _result(self, result: StepResult, task_info: dict[str, Any]) -> StepResult:
        """``result``, scored at the step limit when the config says (WebArena's early stop:
        the last page is evaluated with an answer saying so), with the episode's sign-ins on
        its first step."""
        info = dict(result.info)
        if not result.done and self.options.score_at_step_limit and \
                self._steps >= self.cfg.max_steps:
            answer = f"Early stop: Reach max steps {self.cfg.max_steps}"
            reward, task_info = self._env.task.score_now(self._env.page, answer)
            info.update(eval=task_info, step_limit=True)
            result = StepResult(result.observation, reward=float(reward), done=True,
                                success=float(reward) >= 1.0, valid=result.valid,
                                error=result.error, info=info)
        if self._steps == 1 and self._sign_ins:
            result.info = {**info, "sign_in": self._sign_ins}
        return result

    def _execute(self, code: str) -> tuple[Any, ...]:
        """Run BrowserGym's step; settle and observe again if a navigation raced the observation.

        An action that submits a form (Enter in a search box) can start its navigation after
        BrowserGym waited for the page, so extracting the observation hits a destroyed execution
        context. The action itself has run; waiting for the new page and redoing the post-step
        (wait, validate, observe) gives the right observation.
        """
        from playwright.sync_api import Error as PlaywrightError

        try:
            return self._env.step(code)
        except PlaywrightError as first:
            error: Exception = first
            for _ in range(3):
                try:
                    self._env.page.wait_for_load_state("load")
                    return self._env.post_step({})
                except PlaywrightError as again:
                    error = again
            raise EnvError(f"browser step failed: {_one_line(error)}") from error

    def _to_placeholders(self, url: str) -> str:
        """Show site URLs as WebArena placeholders (``__SHOPPING__/cart``).

        The bundled site gives every episode its own base URL; written as the placeholder, the
        same page reads the same in every episode, on the bundled and on a real site, which is
        what retrieval and the experience model need.
        """
        for key, base in sorted(self._site_urls.items(), key=lambda kv: -len(kv[1])):
            if base and url.startswith(base):
                return key + url[len(base):]
        return url

    def _from_placeholders(self, action: Any) -> Any:
        """Resolve placeholders in ``goto`` URLs, so agents can navigate as they read."""
        if action.name != "goto" or not action.args:
            return action
        url = str(action.args[0])
        for key, base in self._site_urls.items():
            url = url.replace(key, base)
        return type(action)(action.name, (url, *action.args[1:]))

    def _observe(self, obs: dict[str, Any]) -> Observation:
        titles = obs.get("open_pages_titles") or ("",)
        index = int(obs.get("active_page_index", [0])[0]) if len(titles) else 0
        title = titles[index] if index < len(titles) else ""
        url = obs.get("url", "")
        state = map_axtree(
            obs["axtree_object"],
            url=self._to_placeholders(url),
            title=title,
            extra_properties=obs.get("extra_element_properties"),
        )
        return Observation(
            state=state.render(),
            url=url,
            error=obs.get("last_action_error", "") or "",
            info={"site_urls": self._site_urls},
        )

    def _end_episode(self) -> None:
        if self._cleanup is not None:
            cleanup, self._cleanup = self._cleanup, None
            try:
                cleanup()
            except Exception as exc:  # noqa: BLE001 - cleanup must not hide the episode's result
                logger.warning("episode cleanup failed: %s", exc)

    def _close(self) -> None:
        self._end_episode()
        if self._env is not None:
            env, self._env = self._env, None
            try:
                env.close()
            except Exception as exc:  # noqa: BLE001 - closing a dead browser
                logger.debug("browser close failed: %s", exc)
        stop_thread_playwright()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
