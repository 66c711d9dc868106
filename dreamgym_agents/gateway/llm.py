"""The model gateway: every model call of the project goes through :class:`Gateway`.

A gateway wraps LiteLLM for one model (:class:`LLMConfig`) and adds what the rest of the project
relies on: bounded concurrency, retries with exponential backoff and jitter (the only place that
retries model calls), typed errors (:class:`~dreamgym_agents.errors.ModelError`), running usage
and cost totals, an optional sqlite disk cache for reproducible reruns, and uniform handling of
``<think>…</think>`` reasoning.

Any LiteLLM model string works (``openai/…``, ``anthropic/…``, ``ollama/…``, ``hosted_vllm/…``);
``hf/<checkpoint dir>`` runs a local transformers checkpoint in-process
(:mod:`dreamgym_agents.gateway.local`).

Importing this module is cheap and offline: LiteLLM is imported on first use, with its model
price list read from the copy bundled in the wheel instead of being fetched from GitHub.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import random
import re
import sqlite3
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from dreamgym_agents.errors import ConfigError, ContextLengthError, DreamGymError, ModelError
from dreamgym_agents.gateway.litellm_setup import (
    import_litellm,
    prepare_request_path,
    request_path_ready,
)
from dreamgym_agents.types import ModelUsage

# Without this, importing LiteLLM fetches its model price list from GitHub (and waits on it).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

logger = logging.getLogger(__name__)

_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_THREAD: threading.Thread | None = None
_LOOP_PID = 0
_LOOP_LOCK = threading.Lock()
_JITTER = random.Random()  # own generator: seeding the global RNG must not synchronise retries
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_THINK = re.compile(r"^\s*<(think|thinking)>(.*?)</\1>(.*)$", re.DOTALL)
_SECRET_LIKE = re.compile(r"(sk-[A-Za-z0-9_\-]{6,}|Bearer\s+\S+)")
_SAMPLING_KEYS = ("temperature", "max_tokens", "top_p", "stop")
SERVER_BAD_WORDS = ("auto", "vllm", "transformers", "off")
"""The values of :attr:`LLMConfig.server_bad_words`."""
# Owned by the gateway or a config field: neither ``extra`` nor per-call overrides may set them.
_RESERVED_KEYS = frozenset(
    "model messages stream api_key api_base base_url timeout num_retries max_retries".split()
)


def _gateway_loop() -> asyncio.AbstractEventLoop:
    """The process-wide event loop, on a daemon thread, that runs every gateway's calls.

    LiteLLM keeps loop-bound state (its async logging worker, cached HTTP clients): running all
    calls on one long-lived loop keeps that state valid whatever loops and threads the callers
    use, and makes each gateway's concurrency bound global. Recreated after a fork.
    """
    global _LOOP, _LOOP_THREAD, _LOOP_PID
    with _LOOP_LOCK:
        alive = _LOOP_THREAD is not None and _LOOP_THREAD.is_alive()
        if _LOOP is None or not alive or _LOOP_PID != os.getpid():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="dreamgym-gateway", daemon=True)
            thread.start()
            _LOOP, _LOOP_THREAD, _LOOP_PID = loop, thread, os.getpid()
        return _LOOP


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None



_TOKENIZERS: dict[str, Any] = {}
_TOKENIZERS_LOCK = threading.Lock()


def _served_bad_word_ids(checkpoint: str, words: tuple[str, ...]) -> list[list[int]]:
    """The token sequences of ``words`` in the tokenizer of the served ``checkpoint`` (as the
    local provider masks them)."""
    from dreamgym_agents.gateway.local import bad_word_ids

    with _TOKENIZERS_LOCK:  # fast tokenizers are not safe to share between threads
        tokenizer = _TOKENIZERS.get(checkpoint)
        if tokenizer is None:
            try:
                from transformers import AutoTokenizer
            except ImportError as exc:
                raise ConfigError("llm.server_bad_words=transformers needs transformers "
                                  "installed to read the checkpoint's tokenizer") from exc
            tokenizer = _TOKENIZERS[checkpoint] = AutoTokenizer.from_pretrained(checkpoint)
        return bad_word_ids(tokenizer, list(words))


def check_model_string(model: str) -> None:
    """Raise :class:`ConfigError` unless LiteLLM can route ``model`` (checked before a long run).

    ``hf/<path>`` must name an existing local checkpoint folder.
    """
    from dreamgym_agents.gateway.local import LOCAL_PROVIDER

    hint = ("use oracle, random, or a LiteLLM model string such as openai/gpt-4o-mini, "
            "anthropic/claude-sonnet-4-5, ollama/llama3, hosted_vllm/<name>, hf/<checkpoint dir>")
    if not model.strip():
        raise ConfigError(f"empty model string: {hint}")
    if model.startswith(f"{LOCAL_PROVIDER}/"):
        path = model.split("/", 1)[1]
        if not Path(path).is_dir():
            raise ConfigError(f"local checkpoint not found: {path} (hf/<path> needs a folder "
                              "saved with save_pretrained)")
        return
    litellm = import_litellm()
    try:
        litellm.get_llm_provider(model)
    except Exception:  # noqa: BLE001 - LiteLLM raises several types for an unknown route
        raise ConfigError(f"unknown model {model!r}: {hint}") from None


@dataclass
class LLMConfig:
    """How to call one model.

    Attributes:
        model: A LiteLLM model string (``openai/gpt-4o-mini``, ``anthropic/…``, ``ollama/…``,
            ``hosted_vllm/…``) or ``hf/<checkpoint dir>`` for the in-process local provider.
        api_base: Base URL of the provider's API (``http://127.0.0.1:8000/v1`` for a local
            vLLM); None uses the provider's default.
        api_key_env: Name of the environment variable holding the API key. The key is read at
            call time and never logged or stored; None lets LiteLLM use its provider defaults.
        temperature: Sampling temperature; 0 is greedy.
        max_tokens: Maximum number of tokens to generate.
        top_p: Nucleus sampling mass; None leaves the provider default.
        stop: Stop strings.
        timeout_s: Timeout of one request, in seconds.
        max_concurrency: Requests of one gateway in flight at once, whatever threads and event
            loops its callers use.
        max_retries: Retries after the first attempt for rate limits, timeouts, connection
            errors and 5xx answers.
        backoff_initial_s: Delay before the first retry; doubles with each retry (with jitter).
        backoff_max_s: Upper bound of a retry delay.
        cache_dir: Directory of the sqlite answer cache; None turns the cache off.
        cache_sampled: Also cache answers sampled at temperature > 0 (a rerun then replays them).
        mock_response: Fixed answer returned by LiteLLM without any request (tests, dry runs);
            its cost counts as 0.
        extra: Extra keyword arguments passed to ``litellm.acompletion`` (``seed``,
            ``response_format``, provider options, …).
        server_bad_words: How a served model is told a call's ``bad_words``, the strings it must
            never write (the experience codec's unreadable references), which a local ``hf/`` model
            masks itself: ``vllm``, vLLM's ``bad_words`` request field; ``transformers``,
            ``transformers serve``'s ``generation_config`` with the strings' ``bad_words_ids``, read
            with the tokenizer of the checkpoint the model string names
            (``openai/<checkpoint dir>``); ``off``, not sent (hosted APIs have no such field: the
            answer is checked, and an unreadable one is sampled again); ``auto``, ``vllm`` for
            ``hosted_vllm/…`` models, else ``off``.
    """

    model: str = "openai/gpt-4o-mini"
    api_base: str | None = None
    api_key_env: str | None = None
    temperature: float = 0.0
    max_tokens: int = 512
    top_p: float | None = None
    stop: list[str] | None = None
    timeout_s: float = 60.0
    max_concurrency: int = 4
    max_retries: int = 4
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 30.0
    cache_dir: str | None = None
    cache_sampled: bool = False
    mock_response: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    server_bad_words: str = "auto"

    def __post_init__(self) -> None:
        self.model = (self.model or "").strip()
        if not self.model:
            raise ConfigError(
                "llm.model is empty: set a LiteLLM model string such as 'openai/gpt-4o-mini', "
                "'ollama/qwen2.5:7b' or 'hf/<checkpoint dir>'"
            )
        if self.is_local and not self.model[3:].strip():
            raise ConfigError("llm.model 'hf/' needs a checkpoint directory: 'hf/<path>'")
        if self.api_key_env is not None and not _ENV_NAME.match(self.api_key_env):
            # Never echo the value: it may be the key itself, pasted in the wrong field.
            raise ConfigError(
                "llm.api_key_env must be the NAME of an environment variable holding the key "
                "(e.g. 'OPENAI_API_KEY'), not the key itself"
            )
        if self.temperature < 0:
            raise ConfigError(f"llm.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if int(self.max_tokens) != self.max_tokens or self.max_tokens < 1:
            raise ConfigError(f"llm.max_tokens must be a positive integer, got {self.max_tokens}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError(f"llm.top_p must be in (0, 1] or None, got {self.top_p}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None and not all(isinstance(s, str) and s for s in self.stop):
            raise ConfigError(f"llm.stop must be a list of non-empty strings, got {self.stop!r}")
        if self.timeout_s <= 0:
            raise ConfigError(f"llm.timeout_s must be > 0 seconds, got {self.timeout_s}")
        if self.max_concurrency < 1:
            raise ConfigError(
                f"llm.max_concurrency must be >= 1 (requests in flight), got {self.max_concurrency}"
            )
        if self.max_retries < 0:
            raise ConfigError(f"llm.max_retries must be >= 0, got {self.max_retries}")
        if self.backoff_initial_s < 0 or self.backoff_max_s < self.backoff_initial_s:
            raise ConfigError(
                "llm.backoff_initial_s must be >= 0 and llm.backoff_max_s >= backoff_initial_s, "
                f"got {self.backoff_initial_s} and {self.backoff_max_s}"
            )
        if not isinstance(self.extra, dict):
            raise ConfigError(
                f"llm.extra must be a mapping of litellm arguments, got {self.extra!r}"
            )
        if self.server_bad_words not in SERVER_BAD_WORDS:
            raise ConfigError(f"llm.server_bad_words must be one of {', '.join(SERVER_BAD_WORDS)}"
                              f", got {self.server_bad_words!r}")
        if self.bad_words_route == "transformers" and not self.served_checkpoint:
            raise ConfigError(
                f"llm.server_bad_words=transformers reads the served checkpoint's tokenizer: the "
                f"model string must name its directory (openai/<checkpoint dir>), got "
                f"{self.model!r}")
        owned = _RESERVED_KEYS | set(_SAMPLING_KEYS) | {"mock_response"}
        clash = sorted(set(self.extra) & owned)
        if clash:
            raise ConfigError(
                f"llm.extra may not set {', '.join(clash)}: use the llm fields instead "
                "(temperature, max_tokens, top_p, stop, mock_response, api_base, api_key_env for "
                "the key, timeout_s); retries belong to the gateway (max_retries)"
            )

    @property
    def is_local(self) -> bool:
        """True for ``hf/<path>`` models run in-process."""
        return self.model.startswith("hf/")

    @property
    def bad_words_route(self) -> str:
        """``local``, ``vllm``, ``transformers`` or ``off``: how ``bad_words`` reach the model
        (:attr:`server_bad_words` with ``auto`` resolved)."""
        if self.is_local:
            return "local"
        if self.server_bad_words == "auto":
            return "vllm" if self.model.startswith("hosted_vllm/") else "off"
        return self.server_bad_words

    @property
    def served_checkpoint(self) -> str | None:
        """The local checkpoint directory a served model string names (vLLM and ``transformers
        serve`` name a model by the path they loaded it from), or None."""
        path = self.model.partition("/")[2]
        return path if path and Path(path, "tokenizer_config.json").is_file() else None


@dataclass
class Completion:
    """One model answer.

    Attributes:
        text: The message content, without a leading ``<think>…</think>`` block.
        reasoning: The reasoning (``<think>`` content, or the provider's ``reasoning_content``);
            empty when there is none.
        usage: Usage of this call. A cache hit counts only ``cache_hits=1``: tokens and cost
            count what was actually sent to a provider.
        cached: True when the answer came from the disk cache.
        latency_s: Wall time of the call as seen by the caller (queueing and retries included).
        model: The configured model string.
        finish_reason: ``stop``, ``length``, … as reported by the provider, when known.
    """

    text: str
    reasoning: str = ""
    usage: ModelUsage = field(default_factory=ModelUsage)
    cached: bool = False
    latency_s: float = 0.0
    model: str = ""
    finish_reason: str | None = None

    @property
    def full_text(self) -> str:
        """``<think>{reasoning}</think>{text}`` when there is reasoning, else ``text``."""
        return f"<think>{self.reasoning}</think>{self.text}" if self.reasoning else self.text


def split_reasoning(content: str) -> tuple[str, str]:
    """Split a leading ``<think>…</think>`` block off ``content``: returns ``(reasoning, text)``."""
    match = _THINK.match(content)
    if match is None:
        return "", content
    return match.group(2), match.group(3)


class _DiskCache:
    """Answers keyed by request hash in ``<dir>/llm_cache.sqlite3`` (safe across processes)."""

    def __init__(self, directory: str) -> None:
        path = Path(directory).expanduser()
        try:
            path.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(
                path / "llm_cache.sqlite3",
                timeout=30,
                check_same_thread=False,
                isolation_level=None,
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS completions (key TEXT PRIMARY KEY, model TEXT NOT NULL,"
                " value TEXT NOT NULL, created_at REAL NOT NULL)"
            )
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(
                f"llm.cache_dir {directory!r} cannot hold the answer cache ({exc}); choose a "
                "writable directory or set cache_dir to null"
            ) from exc
        self._lock = threading.Lock()

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT value FROM completions WHERE key = ?", (key,)
            ).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, model: str, value: dict[str, Any]) -> None:
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO completions VALUES (?, ?, ?, ?)",
                (key, model, json.dumps(value, ensure_ascii=False), time.time()),
            )

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class Gateway:
    """Calls one model through LiteLLM with concurrency bounds, retries, cache and usage totals.

    Example::

        gw = Gateway(LLMConfig(model="openai/gpt-4o-mini", api_key_env="OPENAI_API_KEY"))
        answer = gw.complete([{"role": "user", "content": "Say hi"}])
        answer.text, gw.usage.cost_usd

    Thread-safe; one gateway can serve many threads and event loops.
    """

    def __init__(self, cfg: LLMConfig) -> None:
        self.cfg = cfg
        self._lock = threading.Lock()
        self._usage = ModelUsage()
        self._semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]
        self._semaphores = weakref.WeakKeyDictionary()
        self._unpriced_logged = False
        self._cache = _DiskCache(cfg.cache_dir) if cfg.cache_dir else None
        if cfg.is_local:
            from dreamgym_agents.gateway.local import register_local_provider

            register_local_provider()

    # ----------------------------------------------------------------- usage
    @property
    def usage(self) -> ModelUsage:
        """A snapshot of this gateway's running totals (calls, tokens, cost, cache hits)."""
        with self._lock:
            return ModelUsage(**vars(self._usage))

    def reset_usage(self) -> ModelUsage:
        """Zero the running totals and return what they were."""
        with self._lock:
            old, self._usage = self._usage, ModelUsage()
        return old

    def _record(self, usage: ModelUsage) -> None:
        with self._lock:
            self._usage.add(usage)

    # ----------------------------------------------------------------- calls
    def complete(self, messages: list[dict[str, Any]], **overrides: Any) -> Completion:
        """Synchronous :meth:`acomplete`; works whether or not the calling thread runs a loop.

        Blocks the calling thread (and its event loop, if it runs one) until the answer is in.
        """
        loop = _gateway_loop()
        if _running_loop() is loop:
            raise RuntimeError(
                "Gateway.complete() called from inside a model call: await acomplete()"
            )
        future = asyncio.run_coroutine_threadsafe(self._acomplete(messages, overrides), loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # KeyboardInterrupt & co: do not leave the call running
            raise

    async def acomplete(self, messages: list[dict[str, Any]], **overrides: Any) -> Completion:
        """Answer chat ``messages``.

        The call runs on the gateway event loop thread shared by all gateways (see
        :func:`_gateway_loop`), whatever loop awaits it; cancelling the awaiting task cancels it.

        Args:
            messages: OpenAI-style chat messages (``{"role": ..., "content": ...}``).
            **overrides: Per-call sampling settings (``temperature``, ``max_tokens``, ``top_p``,
                ``stop``, ``mock_response``, ``bad_words``) or extra LiteLLM arguments; None
                removes a setting. ``bad_words`` are strings a local ``hf/`` model never writes;
                other providers ignore them.

        Returns:
            The answer, with this call's usage; the gateway's totals are updated.

        Raises:
            ModelError: The call failed (after retries when the failure was retryable). The
                message names the model and the failure, never the API key.
            ConfigError: ``api_key_env`` names an unset environment variable.
        """
        loop = _gateway_loop()
        if _running_loop() is loop:
            return await self._acomplete(messages, overrides)
        future = asyncio.run_coroutine_threadsafe(self._acomplete(messages, overrides), loop)
        return await asyncio.wrap_future(future)

    async def _acomplete(
        self, messages: list[dict[str, Any]], overrides: dict[str, Any]
    ) -> Completion:
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ValueError("messages must be a list of {'role': ..., 'content': ...} dicts")
        bad = sorted(set(overrides) & _RESERVED_KEYS)
        if bad:
            raise ValueError(f"per-call overrides may not set {', '.join(bad)}")
        started = time.perf_counter()
        params = self._params(overrides)
        mock = params.pop("mock_response", None)
        if not self.cfg.is_local:
            params = self._served_bad_words(params)
        cache = self._get_cache()
        cacheable = cache is not None and (
            float(params.get("temperature", 0.0)) == 0.0 or self.cfg.cache_sampled
        )
        key = self._cache_key(messages, params, mock) if cacheable else ""
        if cacheable and cache is not None:
            hit = await asyncio.to_thread(cache.get, key)  # sqlite may wait on a lock
            if hit is not None:
                usage = ModelUsage(cache_hits=1)
                self._record(usage)
                return Completion(
                    text=hit["text"],
                    reasoning=hit.get("reasoning", ""),
                    usage=usage,
                    cached=True,
                    latency_s=time.perf_counter() - started,
                    model=self.cfg.model,
                    finish_reason=hit.get("finish_reason"),
                )
        response = await self._call_with_retries(messages, params, mock)
        completion = self._to_completion(response, mock is not None)
        completion.latency_s = time.perf_counter() - started
        self._record(completion.usage)
        if cacheable and cache is not None:
            await asyncio.to_thread(
                cache.put,
                key,
                self.cfg.model,
                {
                    "text": completion.text,
                    "reasoning": completion.reasoning,
                    "finish_reason": completion.finish_reason,
                },
            )
        logger.debug(
            "%s: %d+%d tokens in %.2fs",
            self.cfg.model,
            completion.usage.prompt_tokens,
            completion.usage.completion_tokens,
            completion.latency_s,
        )
        return completion

    def _params(self, overrides: dict[str, Any]) -> dict[str, Any]:
        cfg = self.cfg
        params: dict[str, Any] = {
            "temperature": cfg.temperature,
            "max_tokens": cfg.max_tokens,
            "top_p": cfg.top_p,
            "stop": list(cfg.stop) if cfg.stop else None,
            "mock_response": cfg.mock_response,
            **cfg.extra,
            **overrides,
        }
        return {k: v for k, v in params.items() if v is not None}

    def _served_bad_words(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` with their ``bad_words`` in the request field of the server
        (:attr:`LLMConfig.server_bad_words`), or dropped where there is none."""
        words = [w for w in params.pop("bad_words", None) or [] if w]
        route = self.cfg.bad_words_route
        if not words or route == "off":
            if words:
                logger.debug("%s: bad_words not sent (llm.server_bad_words=off)", self.cfg.model)
            return params
        body = dict(params.get("extra_body") or {})
        if route == "vllm":
            body["bad_words"] = words
        else:  # transformers serve: a generation config on top of the model's own
            # the directory was checked when the config was made: no file look-up per call
            ids = _served_bad_word_ids(self.cfg.model.partition("/")[2], tuple(words))
            body["generation_config"] = json.dumps({"bad_words_ids": ids})
        return {**params, "extra_body": body}

    def _cache_key(self, messages: list[dict[str, Any]], params: dict[str, Any], mock: Any) -> str:
        material = {
            "model": self.cfg.model,
            "api_base": self.cfg.api_base,
            "messages": messages,
            "params": params,
            "mock_response": mock,
        }
        blob = json.dumps(material, sort_keys=True, ensure_ascii=False, default=str)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    async def _call_with_retries(
        self, messages: list[dict[str, Any]], params: dict[str, Any], mock: Any
    ) -> Any:
        litellm = import_litellm()
        cfg = self.cfg
        api_key = None
        if cfg.api_key_env and mock is None:
            api_key = os.environ.get(cfg.api_key_env)
            if not api_key:
                raise ConfigError(
                    f"environment variable {cfg.api_key_env} is empty or unset: export the API "
                    f"key for {cfg.model} in it (llm.api_key_env names it)"
                )
        kwargs: dict[str, Any] = {
            "model": cfg.model,
            "messages": messages,
            **params,
            "timeout": cfg.timeout_s,
            "num_retries": 0,
            "max_retries": 0,  # only the gateway retries
        }
        if cfg.api_base:
            kwargs["api_base"] = cfg.api_base
        if api_key:
            kwargs["api_key"] = api_key
        if mock is not None:
            kwargs["mock_response"] = mock
        if mock is None and not cfg.is_local and not request_path_ready():
            # requests that start together must not each run into LiteLLM's first-request
            # imports: one thread does them while the others wait (see prepare_request_path)
            await asyncio.to_thread(prepare_request_path)
        attempt = 0
        while True:
            try:
                async with self._semaphore():
                    return await litellm.acompletion(**kwargs)
            except Exception as exc:
                error = self._model_error(exc, attempt + 1, api_key)
                if error is None:
                    raise  # not a model failure: a bug, surface it unchanged
                if not isinstance(error, ModelError) or not error.retryable:
                    raise error from _chain_cause(exc, error, api_key)
                if attempt >= cfg.max_retries:
                    raise error from _chain_cause(exc, error, api_key)
                delay = self._backoff_s(attempt, exc)
                logger.warning(
                    "%s; retry %d/%d in %.2fs", error, attempt + 1, cfg.max_retries, delay
                )
                await asyncio.sleep(delay)
                attempt += 1

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        with self._lock:
            sem = self._semaphores.get(loop)
            if sem is None:
                sem = asyncio.Semaphore(self.cfg.max_concurrency)
                self._semaphores[loop] = sem
            return sem

    def _backoff_s(self, attempt: int, exc: BaseException) -> float:
        delay = min(self.cfg.backoff_max_s, self.cfg.backoff_initial_s * 2**attempt)
        delay = delay / 2 + _JITTER.uniform(0, delay / 2)  # "equal jitter"
        retry_after = _retry_after_s(exc)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.cfg.backoff_max_s))
        return delay

    def _model_error(
        self, exc: BaseException, attempts: int, api_key: str | None
    ) -> DreamGymError | None:
        """Map an exception raised by LiteLLM to the error tree; None when it is not one."""
        for inner in _exception_chain(exc):
            if isinstance(inner, DreamGymError):  # raised by our own provider, wrapped by LiteLLM
                return inner
        retryable = _is_retryable(exc, import_litellm())
        if retryable is None:
            return None
        status = getattr(exc, "status_code", None)
        detail = _one_line(str(exc), api_key, prefix=type(exc).__name__)
        where = f" (HTTP {status})" if isinstance(status, int) else ""
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        message = f"{self.cfg.model}: {type(exc).__name__}{where}{tries}: {detail}"
        if isinstance(exc, import_litellm().ContextWindowExceededError):
            return ContextLengthError(message)
        return ModelError(message, retryable=retryable)

    def _to_completion(self, response: Any, mocked: bool) -> Completion:
        choice = response.choices[0]
        message = choice.message
        text = message.content if isinstance(message.content, str) else ""
        reasoning = getattr(message, "reasoning_content", None) or ""
        if not reasoning:
            reasoning, text = split_reasoning(text)
        raw_usage = getattr(response, "usage", None)
        usage = ModelUsage(
            calls=1,
            prompt_tokens=int(getattr(raw_usage, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(raw_usage, "completion_tokens", 0) or 0),
            cost_usd=0.0 if mocked or self.cfg.is_local else self._cost(response),
        )
        return Completion(
            text=text,
            reasoning=reasoning,
            usage=usage,
            model=self.cfg.model,
            finish_reason=getattr(choice, "finish_reason", None),
        )

    def _cost(self, response: Any) -> float:
        # LiteLLM prices each answer as it arrives (``_hidden_params["response_cost"]``), and
        # pricing it again costs milliseconds a call; a model with no known price is not priced
        # again after its first answer
        hidden = getattr(response, "_hidden_params", None) or {}
        if hidden.get("response_cost") is not None:
            return float(hidden["response_cost"])
        if self._unpriced_logged:
            return 0.0
        try:
            return float(import_litellm().completion_cost(completion_response=response) or 0.0)
        except Exception as exc:  # unknown price: the cost is not known, never a failure
            if not self._unpriced_logged:
                self._unpriced_logged = True
                logger.info(
                    "%s: no known price (%s); its cost is counted as 0",
                    self.cfg.model,
                    type(exc).__name__,
                )
            return 0.0

    # ----------------------------------------------------------------- life cycle
    def prepare(self) -> None:
        """Do this process's one-time request set-up, LiteLLM's first-request imports, now,
        before a run's first requests would wait on it
        (:func:`~dreamgym_agents.gateway.litellm_setup.prepare_request_path`). Nothing to do
        for a local or mocked model."""
        if not self.cfg.is_local and self.cfg.mock_response is None:
            prepare_request_path()

    def _get_cache(self) -> _DiskCache | None:
        with self._lock:
            if self._cache is None and self.cfg.cache_dir:
                self._cache = _DiskCache(self.cfg.cache_dir)
            return self._cache

    def close(self) -> None:
        """Close the disk cache (reopened if the gateway is used again)."""
        with self._lock:
            cache, self._cache = self._cache, None
        if cache is not None:
            cache.close()

    def __enter__(self) -> Gateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Gateway(model={self.cfg.model!r}, max_concurrency={self.cfg.max_concurrency})"


def _exception_chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain and len(chain) < 10:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _is_retryable(exc: BaseException, litellm: ModuleType) -> bool | None:
    """True/False for model-call failures, None for anything else (a bug to surface as is)."""
    never = (
        litellm.AuthenticationError,
        litellm.PermissionDeniedError,
        litellm.BadRequestError,
        litellm.NotFoundError,
        litellm.UnprocessableEntityError,
    )
    transient = (
        litellm.RateLimitError,
        litellm.Timeout,
        litellm.APIConnectionError,
        litellm.InternalServerError,
        litellm.ServiceUnavailableError,
        litellm.BadGatewayError,
    )
    if isinstance(exc, never):  # ContextWindowExceeded, ContentPolicy… are BadRequestErrors
        return False
    if isinstance(exc, transient) or isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    import openai

    if isinstance(exc, openai.OpenAIError):  # litellm.APIError and other generic failures
        status = getattr(exc, "status_code", None)
        return isinstance(status, int) and (status in (408, 409, 429) or status >= 500)
    return None


def _retry_after_s(exc: BaseException) -> float | None:
    """Seconds asked for by a ``Retry-After`` header, when the failure carries one."""
    # LiteLLM keeps the provider's headers in ``litellm_response_headers``; ``response`` is
    # often a synthetic response without them.
    for headers in (
        getattr(exc, "litellm_response_headers", None),
        getattr(getattr(exc, "response", None), "headers", None),
    ):
        if headers is None:
            continue
        value = headers.get("retry-after", headers.get("Retry-After"))
        if value is None:
            continue
        try:
            return max(0.0, float(value))
        except (TypeError, ValueError):  # an HTTP date: fall back to our own backoff
            return None
    return None


def _one_line(message: str, api_key: str | None, prefix: str = "", limit: int = 300) -> str:
    """First line of an error message, without litellm's prefix and with secrets masked."""
    line = next((s.strip() for s in message.splitlines() if s.strip()), "no details")
    line = re.sub(r"^litellm\.\w+:\s*", "", line)
    if prefix and line.startswith(f"{prefix}:"):
        line = line[len(prefix) + 1 :].lstrip()
    if api_key:
        line = line.replace(api_key, "***")
    line = _SECRET_LIKE.sub("***", line)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _chain_cause(
    exc: BaseException, error: BaseException, api_key: str | None
) -> BaseException | None:
    """The cause to chain to a raised error: none when its text would show the API key."""
    if error is exc or error in _exception_chain(exc):
        return error.__cause__
    if api_key and any(api_key in str(e) for e in _exception_chain(exc)):
        return None
    return exc
