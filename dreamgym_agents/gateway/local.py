"""In-process LiteLLM provider ``hf``: ``model="hf/<checkpoint dir>"`` runs a local causal LM.

The gateway registers the provider when it is created with an ``hf/`` model
(:func:`register_local_provider`); LiteLLM then routes ``completion(model="hf/<path>")`` to
:class:`LocalHFProvider` with ``model="<path>"``. The checkpoint is a directory written by
``save_pretrained`` (tokenizer and model); it is loaded once per path on CPU and kept in a
module-level registry.

Generation is batched per model (:func:`make_batcher`), so concurrent callers (dream rollouts,
fidelity runs, RL groups) share the forward passes instead of queueing behind one another: a
small model on a CPU costs about the same per token for a batch of rows as for one
(evidence: docs/history/results-2026-11-to-12.md). The fast path is the running batch of
:mod:`~dreamgym_agents.gateway.engine`; on the reference path (:class:`Batcher`) one worker
thread per loaded model runs ``generate`` on every request waiting when it starts a batch.
There greedy requests go together, unseeded sampling requests with the same settings together,
and a seeded request alone so its sample stays reproducible; prompts are left-padded with an
attention mask, and a batched greedy answer equals the answer alone up to floating-point
summation order.

``transformers`` and ``torch`` belong to the ``train`` extra: without them a call raises
:class:`~dreamgym_agents.errors.MissingExtraError`. Importing this module is cheap: neither they
nor LiteLLM are imported until used.

:func:`make_tiny_checkpoint` builds a tiny random checkpoint in a few seconds for tests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dreamgym_agents.errors import (
    ConfigError,
    ContextLengthError,
    MissingExtraError,
    ModelError,
)
from dreamgym_agents.gateway.engine import (  # the interruption is this module's API too
    check_interrupted,
    eos_ids,
    interrupt_local_generation,  # noqa: F401
    interrupted,
    resume_local_generation,  # noqa: F401
)

logger = logging.getLogger(__name__)

LOCAL_PROVIDER = "hf"
"""LiteLLM provider name of the in-process provider (model strings ``hf/<path>``)."""

DEFAULT_VOCAB_TEXTS: tuple[str, ...] = (
    "<think>I should click the button.</think><action>click('3')</action>",
    "<think>The page lists items.</think><action>fill('12', 'blue shoes')</action>",
    "<action>scroll(0, 200)</action> <action>go_back()</action> <action>send_msg_to_user('done')"
    "</action>",
    "The quick brown fox jumps over the lazy dog. 0123456789 [button] 'Submit' link textbox",
    "You are an agent acting in a web page. Observation: RootWebArea 'Shop' [3] button 'Buy'",
)
"""Default texts the tiny tokenizer is trained on: agent-style answers and observations."""

_ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>")

ENGINE_ENV = "DG_LOCAL_ENGINE"
ENGINES = ("auto", "fast", "reference")
"""How local generations run (``$DG_LOCAL_ENGINE``): ``auto`` (the default) the fast path
(:mod:`dreamgym_agents.gateway.engine`: continuous batching with a KV cache) for the
architectures it knows and transformers' ``generate`` for the others; ``reference`` always
``generate`` (:class:`Batcher`); ``fast`` refuses a model the fast path cannot run."""

MAX_BATCH_ENV = "DG_LOCAL_MAX_BATCH"
DEFAULT_MAX_BATCH = 32
"""Most requests generating at once (the fast path's running batch, or one ``generate`` call
of the reference path); ``$DG_LOCAL_MAX_BATCH`` overrides (1 turns batching off). Larger local
checkpoints on a small machine may want fewer."""


@dataclass
class LocalGeneration:
    """Result of one local generation.

    Attributes:
        text: Decoded new text, special tokens removed, cut at the first stop string.
        prompt_tokens: Number of prompt tokens.
        completion_tokens: Number of tokens generated (before the stop-string cut).
        finish_reason: ``"stop"`` (end of sequence or stop string) or ``"length"``.
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


@dataclass
class GenerationRequest:
    """One generation waiting for the batcher: prompt ids and its own sampling settings."""

    ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float | None
    seed: int | None
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    constraint: Any = None
    """Optional: an object whose ``allowed(new_ids) -> list[int] | None`` restricts the next
    token (:class:`~dreamgym_agents.policy.grammar.Constraint`); None: no restriction."""
    trace: bool = False
    """Record, per new token, the tokens the constraint allowed (``allowed``) and the
    log-probability the token had under the distribution it was drawn from (``logps``): what
    an RL trainer must score it with."""
    allowed: list[list[int] | None] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    banned: list[list[int]] = field(default_factory=list)
    """Token sequences the answer never contains: the last token of each is masked wherever
    the new tokens end with the rest (:func:`bad_word_ids`)."""

    @property
    def group(self) -> tuple[Any, ...] | None:
        """Requests with the same group share a batch; None runs alone (a seeded sample)."""
        if self.temperature > 0 and self.seed is not None:
            return None
        return (self.temperature > 0, self.temperature if self.temperature > 0 else 0.0,
                self.top_p if self.temperature > 0 else None)


Engine = Callable[[list[GenerationRequest]], list[list[int]]]
"""What generates a batch of requests instead of the model's own ``generate``: each request's
new token ids, and (requests that ``trace``) their ``logps`` and ``allowed`` filled in. TRL's
vLLM generation is one (:func:`dreamgym_agents.rl.grpo.vllm_engine`)."""


class Batcher:
    """Runs one model's generations in a worker thread, in batches of the requests waiting.

    No request waits for company: the worker takes whatever is queued when it is free, so a lone
    caller sees no added latency and concurrent callers fill the next batch while one runs.
    An ``engine`` generates the batches instead of the model (:data:`Engine`).
    """

    IDLE_EXIT_S = 30.0

    def __init__(self, model: Any, pad_id: int, max_batch: int,
                 engine: Engine | None = None) -> None:
        self.model = model
        self.engine = engine
        self.pad_id = pad_id
        self.max_batch = max(1, max_batch)
        self._queue: list[GenerationRequest] = []
        self._cond = threading.Condition()
        self._worker: threading.Thread | None = None
        self.batches = 0
        self.rows = 0
        self._eos = eos_ids(model, None)

    def submit(self, request: GenerationRequest) -> list[int]:
        """Queue ``request``; block until its new token ids (cut at its own limit) are in."""
        return self.enqueue(request).result()

    def enqueue(self, request: GenerationRequest) -> concurrent.futures.Future:
        """Queue ``request``; the future of its new token ids."""
        with self._cond:
            self._queue.append(request)
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._loop, name="hf-generate",
                                                daemon=True)
                self._worker.start()
            self._cond.notify()
        return request.future

    def _take(self) -> list[GenerationRequest] | None:
        with self._cond:
            if not self._queue and not self._cond.wait_for(lambda: self._queue,
                                                           timeout=self.IDLE_EXIT_S):
                self._worker = None  # idle: the next submit starts a new worker
                return None
            first = self._queue[0]
            if first.group is None:
                batch = [first]
            else:
                batch = [r for r in self._queue if r.group == first.group][: self.max_batch]
            for r in batch:
                self._queue.remove(r)
            return batch

    def _loop(self) -> None:
        while (batch := self._take()) is not None:
            try:
                rows = (self.engine or self._generate)(batch)
            except BaseException as exc:  # handed to every caller of the batch
                for r in batch:
                    r.future.set_exception(exc)
                continue
            for r, row in zip(batch, rows, strict=True):
                r.future.set_result(row)

    def _generate(self, batch: list[GenerationRequest]) -> list[list[int]]:
        import torch

        width = max(len(r.ids) for r in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for i, r in enumerate(batch):  # left padding: every row continues at the same column
            input_ids[i, width - len(r.ids):] = torch.tensor(r.ids, dtype=torch.long)
            attention[i, width - len(r.ids):] = 1
        device = getattr(self.model, "device", None)
        if device is not None and device.type != "cpu":  # a trainer's model on a GPU
            input_ids, attention = input_ids.to(device), attention.to(device)
        first = batch[0]
        kwargs: dict[str, Any] = {"max_new_tokens": max(r.max_tokens for r in batch),
                                  "pad_token_id": self.pad_id}
        if first.temperature > 0:
            # no top-k cut: the sampling distribution is the (constrained) softmax at the
            # temperature, which a trainer can score exactly
            kwargs.update(do_sample=True, temperature=first.temperature, top_k=0)
            if first.top_p is not None:
                kwargs["top_p"] = first.top_p
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if any(r.constraint is not None or r.banned for r in batch):
            kwargs["logits_processor"] = _constrained(batch, width)
        kwargs["stopping_criteria"] = _interruptible()
        traced = any(r.trace for r in batch)
        if traced:
            kwargs.update(output_scores=True, return_dict_in_generate=True)
        seeded = first.seed is not None and first.temperature > 0
        with torch.no_grad(), torch.random.fork_rng(devices=[], enabled=seeded):
            if seeded:
                torch.manual_seed(int(first.seed))
            check_interrupted()
            output = self.model.generate(input_ids=input_ids, attention_mask=attention, **kwargs)
        check_interrupted()  # a cut answer is no answer
        sequences = output.sequences if traced else output
        self.batches += 1
        self.rows += len(batch)
        rows = []
        for i, r in enumerate(batch):
            new = sequences[i, width:].tolist()[: r.max_tokens]
            end = next((j for j, tok in enumerate(new) if tok in self._eos), None)
            new = new if end is None else new[: end + 1]  # rows that ended are padded
            if r.trace:
                # the scores are the processed logits the token was drawn from: constraint,
                # temperature (and top-p) applied
                r.logps = [float(torch.log_softmax(output.scores[k][i].float(), -1)[tok])
                           for k, tok in enumerate(new)]
                r.allowed = (r.allowed + [None] * len(new))[: len(new)]
            rows.append(new)
        return rows


def local_engine() -> str:
    """The engine ``$DG_LOCAL_ENGINE`` asks for (:data:`ENGINES`; unset: ``auto``)."""
    value = os.environ.get(ENGINE_ENV, "").strip().lower() or "auto"
    if value not in ENGINES:
        raise ModelError(f"{ENGINE_ENV} must be one of {', '.join(ENGINES)}, got {value!r}",
                         retryable=False)
    return value


def make_batcher(model: Any, pad_id: int, max_batch: int, engine: Engine | None = None,
                 *, kind: str | None = None) -> Any:
    """The batcher of one model: :class:`~dreamgym_agents.gateway.engine.ContinuousBatcher`
    where the fast path runs the model and nothing else generates for it, else
    :class:`Batcher` (``engine``, such as TRL's vLLM generation, is always the reference
    path's). ``kind``: an :data:`ENGINES` value (None: ``$DG_LOCAL_ENGINE``).

    Raises:
        ModelError: ``fast`` asked of a model the fast path cannot run.
    """
    from dreamgym_agents.gateway.engine import ContinuousBatcher, fast_path_refusal

    kind = kind or local_engine()
    if engine is not None or kind == "reference":
        return Batcher(model, pad_id, max_batch, engine)
    refusal = fast_path_refusal(model)
    if refusal is None:
        return ContinuousBatcher(model, pad_id, max_batch)
    if kind == "fast":
        raise ModelError(f"{ENGINE_ENV}=fast: the fast path cannot run this model ({refusal})",
                         retryable=False)
    logger.info("local generation through transformers' generate: %s", refusal)
    return Batcher(model, pad_id, max_batch)


def _interruptible() -> Any:
    """Stopping criteria that end a generation at the next token once interrupted."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class Interrupted(StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            return torch.full((input_ids.shape[0],), interrupted(), dtype=torch.bool,
                              device=input_ids.device)

    return StoppingCriteriaList([Interrupted()])


def _constrained(batch: list[GenerationRequest], width: int) -> Any:
    """A logits processor masking, row by row, the tokens a request's constraint forbids and
    the last token of each of its banned sequences the new tokens are about to complete."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    class Constrained(LogitsProcessor):
        def __call__(self, input_ids: Any, scores: Any) -> Any:
            for i, r in enumerate(batch):
                if r.banned:
                    new = input_ids[i, width:].tolist()
                    for seq in r.banned:
                        head = seq[:-1]
                        if len(new) >= len(head) and new[len(new) - len(head):] == head:
                            scores[i, seq[-1]] = float("-inf")
                if r.constraint is None:
                    continue
                allowed = r.constraint.allowed(input_ids[i, width:].tolist())
                if r.trace:
                    r.allowed.append(list(allowed) if allowed else None)
                if not allowed:  # None: unrestricted ([] never happens: see the grammar)
                    continue
                mask = torch.full_like(scores[i], float("-inf"))
                mask[torch.tensor(allowed, dtype=torch.long)] = 0.0
                scores[i] = scores[i] + mask
            return scores

    return LogitsProcessorList([Constrained()])


def bad_word_ids(tokenizer: Any, words: list[str]) -> list[list[int]]:
    """The token sequences of ``words`` as an answer writes them: alone and after a space
    (a word inside a sentence is usually tokenised with its space)."""
    out: list[list[int]] = []
    for word in words:
        for text in (word, f" {word}"):
            ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
            if ids and ids not in out:
                out.append(ids)
    return out


def _max_batch() -> int:
    raw = os.environ.get(MAX_BATCH_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_BATCH
    try:
        value = int(raw)
    except ValueError:
        raise ModelError(f"{MAX_BATCH_ENV} must be a whole number of requests, got {raw!r}",
                         retryable=False) from None
    if value < 1:
        raise ModelError(f"{MAX_BATCH_ENV} must be at least 1, got {value}", retryable=False)
    return value


@dataclass
class _LoadedModel:
    tokenizer: Any
    model: Any
    signature: tuple[float, ...]
    lock: threading.Lock
    """Guards the tokenizer (fast tokenizers are not safe to share between threads)."""
    batcher: Any
    """:func:`make_batcher`'s: the fast path's or the reference path's."""
    banned: dict[tuple[str, ...], list[list[int]]] = field(default_factory=dict)
    """Banned words' token sequences by the words (:func:`_banned`)."""


_MODELS: dict[str, _LoadedModel] = {}
_MODELS_LOCK = threading.Lock()
_PROVIDER: Any = None
_PROVIDER_LOCK = threading.Lock()


def _import_torch_transformers() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError:
        raise MissingExtraError("transformers", "train") from None
    configure_torch_threads()
    return torch, transformers


def torch_threads() -> int:
    """The CPU threads torch should compute with in this process.

    ``DG_TORCH_THREADS`` when set, else ``OMP_NUM_THREADS`` when the user set it, else the
    cores this process may run on less those other processes keep busy (the 1-minute load
    average, read once), at least 1. Torch's own default, every core, oversubscribes a busy
    machine, where threads that wait on a taken core slow every step down.
    """
    for name in ("DG_TORCH_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value:
            try:
                return max(1, int(value))
            except ValueError:
                raise ConfigError(f"{name}={value!r}: a number of threads, such as 1") from None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    busy = round(os.getloadavg()[0]) if hasattr(os, "getloadavg") else 0
    return max(1, cores - busy)


@functools.cache
def configure_torch_threads() -> int:
    """Set torch's CPU thread count once per process (:func:`torch_threads`); returns it."""
    import torch

    threads = torch_threads()
    torch.set_num_threads(threads)
    logger.info("torch computes with %d CPU thread(s) (DG_TORCH_THREADS sets it)", threads)
    return threads


def _checkpoint_signature(path: Path) -> tuple[float, ...]:
    """Modification times of the checkpoint's files: a re-saved checkpoint is reloaded."""
    return tuple(sorted(p.stat().st_mtime for p in path.iterdir() if p.is_file()))


def load_causal_lm(path: str | os.PathLike[str]) -> tuple[Any, Any]:
    """A fresh ``(tokenizer, model)`` from a ``save_pretrained`` directory, the model's weights
    in float32 whatever they are stored in: checkpoints may be saved in bfloat16 (the embedded
    bundle is), and on a CPU bfloat16 matmuls are emulated (slow) and round every activation."""
    torch, transformers = _import_torch_transformers()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return tokenizer, model


def load_local_model(path: str | os.PathLike[str]) -> tuple[Any, Any]:
    """Load (or fetch from the registry) the tokenizer and model saved in ``path``.

    Args:
        path: A directory written by ``save_pretrained`` (relative paths are resolved against the
            current directory).

    Returns:
        ``(tokenizer, model)``; the model is on CPU in eval mode.

    Raises:
        ModelError: (not retryable) the path does not exist or is not a loadable checkpoint.
        MissingExtraError: transformers/torch are not installed.
    """
    loaded = _get_loaded(path)
    return loaded.tokenizer, loaded.model


def _get_loaded(path: str | os.PathLike[str]) -> _LoadedModel:
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_dir():
        raise ModelError(
            f"local checkpoint {str(path)!r} does not exist: model 'hf/<path>' must name a "
            "directory written by save_pretrained (tokenizer and model)",
            retryable=False,
        )
    signature = _checkpoint_signature(resolved)
    key = str(resolved)
    with _MODELS_LOCK:
        loaded = _MODELS.get(key)
        if loaded is not None and loaded.signature == signature:
            return loaded
        started = time.perf_counter()
        try:
            tokenizer, model = load_causal_lm(key)
        except (OSError, ValueError, KeyError) as exc:
            lines = str(exc).strip().splitlines()
            first_line = lines[0] if lines else type(exc).__name__
            raise ModelError(
                f"local checkpoint {key!r} could not be loaded ({first_line}); it must be a "
                "directory written by save_pretrained with a tokenizer and a causal LM",
                retryable=False,
            ) from exc
        model.to("cpu")
        model.eval()
        pad_id = tokenizer.pad_token_id
        if pad_id is None:
            pad_id = tokenizer.eos_token_id
        loaded = _LoadedModel(tokenizer, model, signature, threading.Lock(),
                              make_batcher(model, int(pad_id or 0), _max_batch()))
        _MODELS[key] = loaded
        logger.info("loaded local model %s in %.2fs", key, time.perf_counter() - started)
        return loaded


def unload_local_models() -> None:
    """Drop every loaded local model from the registry (frees their memory)."""
    with _MODELS_LOCK:
        _MODELS.clear()


def _content_text(content: Any) -> str:
    """Message content as text (OpenAI content-part lists keep their text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return "".join(str(p) for p in parts)
    return str(content)


ROLE_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""The plain ``<|role|>`` layout of :func:`format_prompt` as a Jinja chat template: stored with
the checkpoints this toolkit makes, so an OpenAI-compatible server (vLLM, ``transformers
serve``) prompts them exactly as the in-process provider does."""


def format_prompt(tokenizer: Any, messages: list[dict[str, Any]]) -> tuple[str, bool]:
    """Render chat messages as the prompt text.

    Uses the tokenizer's chat template when it has one; otherwise concatenates
    ``"<|role|>\\ncontent\\n"`` per message and ends with ``"<|assistant|>\\n"``.

    Returns:
        ``(prompt, templated)``: ``templated`` is True when the chat template was used (its
        special tokens are then already in the text).
    """
    plain = [
        {"role": m.get("role", "user"), "content": _content_text(m.get("content"))}
        for m in messages
    ]
    if getattr(tokenizer, "chat_template", None):
        prompt = tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
        return str(prompt), True
    text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in plain)
    return text + "<|assistant|>\n", False


def generate_local(
    path: str | os.PathLike[str],
    messages: list[dict[str, Any]],
    *,
    max_tokens: int = 512,
    temperature: float = 0.0,
    top_p: float | None = None,
    stop: list[str] | str | None = None,
    seed: int | None = None,
    bad_words: list[str] | None = None,
) -> LocalGeneration:
    """Generate an answer to chat ``messages`` with the local checkpoint in ``path``.

    Args:
        path: Checkpoint directory (see :func:`load_local_model`).
        messages: OpenAI-style chat messages.
        max_tokens: Maximum number of new tokens.
        temperature: 0 means greedy decoding; above 0, sampling at that temperature.
        top_p: Nucleus sampling mass (only used when sampling).
        stop: Stop strings: the text is cut at the first occurrence of any of them.
        seed: Seed for sampling (reproducible answers at temperature > 0); the global torch RNG
            is left untouched.
        bad_words: Strings the answer never contains (vLLM's ``bad_words``): their tokens, as
            :func:`bad_word_ids` writes them, are masked.

    Raises:
        ModelError: (not retryable) missing checkpoint, or a prompt longer than the model's
            context (``max_tokens`` is lowered to what the context leaves).
        MissingExtraError: transformers/torch are not installed.
    """
    loaded, request, stops = _local_request(path, messages, max_tokens=max_tokens,
                                            temperature=temperature, top_p=top_p, stop=stop,
                                            seed=seed, bad_words=bad_words)
    return _local_answer(loaded, request, loaded.batcher.submit(request), stops)


async def agenerate_local(path: str | os.PathLike[str], messages: list[dict[str, Any]],
                          **kwargs: Any) -> LocalGeneration:
    """:func:`generate_local` awaited on the caller's event loop: no thread waits for the
    answer, since a pool of threads each blocked on one answer would cap how many requests
    join the model's running batch at the pool's size (asyncio's default: cores + 4)."""
    if Path(path).expanduser().resolve().as_posix() not in _MODELS:
        await asyncio.to_thread(_get_loaded, path)  # the first call loads it off the loop
    loaded, request, stops = _local_request(path, messages, **kwargs)
    new_ids = await asyncio.wrap_future(loaded.batcher.enqueue(request))
    return _local_answer(loaded, request, new_ids, stops)


def _local_request(path: str | os.PathLike[str], messages: list[dict[str, Any]], *,
                   max_tokens: int = 512, temperature: float = 0.0, top_p: float | None = None,
                   stop: list[str] | str | None = None, seed: int | None = None,
                   bad_words: list[str] | None = None,
                   ) -> tuple[_LoadedModel, GenerationRequest, list[str]]:
    """The loaded model, the generation request of ``messages`` and the stop strings."""
    _import_torch_transformers()
    loaded = _get_loaded(path)
    tokenizer, model = loaded.tokenizer, loaded.model
    stops = [stop] if isinstance(stop, str) else [s for s in (stop or []) if s]
    with loaded.lock:
        prompt, templated = format_prompt(tokenizer, messages)
        # A chat template already writes BOS and friends; a plain prompt gets the defaults.
        ids = list(tokenizer(prompt, add_special_tokens=not templated)["input_ids"])
        banned = _banned(loaded, tuple(w for w in bad_words or [] if w))
    prompt_tokens = len(ids)
    context = getattr(model.config, "max_position_embeddings", None)
    if context is not None and prompt_tokens >= context:
        raise ContextLengthError(
            f"local model {str(path)!r}: prompt of {prompt_tokens} tokens does not fit its "
            f"context of {context} tokens; shorten the prompt"
        )
    if context is not None:
        # The answer may use what the prompt leaves of the context (finish_reason "length"
        # tells when it was cut).
        max_tokens = min(max_tokens, context - prompt_tokens)
    return loaded, GenerationRequest(ids, max_tokens, temperature, top_p, seed,
                                     banned=banned), stops


def _banned(loaded: _LoadedModel, words: tuple[str, ...]) -> list[list[int]]:
    """:func:`bad_word_ids` of ``words`` for the model's tokenizer, kept per set of words (a
    codec bans the same few words at most steps; the caller holds the tokenizer's lock)."""
    found = loaded.banned.get(words)
    if found is None:
        found = loaded.banned[words] = bad_word_ids(loaded.tokenizer, list(words))
        if len(loaded.banned) > 4096:
            loaded.banned.clear()
    return [list(seq) for seq in found]


def _local_answer(loaded: _LoadedModel, request: GenerationRequest, new_ids: list[int],
                  stops: list[str]) -> LocalGeneration:
    tokenizer, model = loaded.tokenizer, loaded.model
    completion_tokens = len(new_ids)
    with loaded.lock:
        text = tokenizer.decode(new_ids, skip_special_tokens=True)
    ends = eos_ids(model, tokenizer)
    ended = completion_tokens > 0 and int(new_ids[-1]) in ends
    finish_reason = "stop" if ended or completion_tokens < request.max_tokens else "length"
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    if cut >= 0:
        text, finish_reason = text[:cut], "stop"
    return LocalGeneration(text, len(request.ids), completion_tokens, finish_reason)


def _generation_args(optional_params: dict | None) -> dict[str, Any]:
    """:func:`generate_local`'s arguments from LiteLLM's ``optional_params``."""
    params = dict(optional_params or {})
    return {"max_tokens": int(params.get("max_tokens") or params.get("max_completion_tokens")
                              or 512),
            "temperature": float(params.get("temperature") or 0.0),
            "top_p": params.get("top_p"), "stop": params.get("stop"),
            "seed": params.get("seed"), "bad_words": params.get("bad_words")}


def _build_provider() -> Any:
    """Define the ``CustomLLM`` subclass (LiteLLM is imported only now) and instantiate it."""
    from dreamgym_agents.gateway.litellm_setup import import_litellm

    litellm = import_litellm()
    from litellm.types.utils import ModelResponse, Usage

    class LocalHFProvider(litellm.CustomLLM):
        """LiteLLM ``CustomLLM`` running local transformers checkpoints (provider ``hf``)."""

        def completion(  # type: ignore[override]
            self,
            model: str,
            messages: list,
            *args: Any,
            optional_params: dict | None = None,
            model_response: Any = None,
            **kwargs: Any,
        ) -> Any:
            result = generate_local(model, messages, **_generation_args(optional_params))
            return _response(model, result, model_response)

        async def acompletion(  # type: ignore[override]
            self,
            model: str,
            messages: list,
            *args: Any,
            optional_params: dict | None = None,
            model_response: Any = None,
            **kwargs: Any,
        ) -> Any:
            # awaited on the gateway's loop: every request in flight joins the running batch
            result = await agenerate_local(model, messages, **_generation_args(optional_params))
            return _response(model, result, model_response)

    def _response(model: str, result: LocalGeneration, model_response: Any) -> Any:
        response = model_response if model_response is not None else ModelResponse()
        response.choices[0].message.content = result.text
        response.choices[0].finish_reason = result.finish_reason
        response.model = f"{LOCAL_PROVIDER}/{model}"
        response.created = int(time.time())
        response.usage = Usage(  # type: ignore[attr-defined]
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            total_tokens=result.prompt_tokens + result.completion_tokens,
        )
        return response

    return LocalHFProvider()


def get_local_provider() -> Any:
    """The process-wide ``LocalHFProvider`` instance (a ``litellm.CustomLLM``)."""
    global _PROVIDER
    with _PROVIDER_LOCK:
        if _PROVIDER is None:
            _PROVIDER = _build_provider()
        return _PROVIDER


def register_local_provider() -> None:
    """Register the ``hf`` provider in ``litellm.custom_provider_map`` (idempotent).

    Other custom providers already registered are kept; an ``hf`` entry with another handler is
    replaced (with a warning).
    """
    from dreamgym_agents.gateway.litellm_setup import import_litellm

    litellm = import_litellm()
    handler = get_local_provider()
    with _PROVIDER_LOCK:
        entries = list(litellm.custom_provider_map or [])
        ours = [e for e in entries if e.get("provider") == LOCAL_PROVIDER]
        if len(ours) == 1 and ours[0].get("custom_handler") is handler:
            return
        if any(e.get("custom_handler") is not handler for e in ours):
            logger.warning("replacing the custom LiteLLM provider %r", LOCAL_PROVIDER)
        others = [e for e in entries if e.get("provider") != LOCAL_PROVIDER]
        litellm.custom_provider_map = [
            *others,
            {"provider": LOCAL_PROVIDER, "custom_handler": handler},
        ]


def make_tiny_checkpoint(
    path: str | os.PathLike[str],
    vocab_texts: list[str] | None = None,
    *,
    chat_template: str | None = ROLE_CHAT_TEMPLATE,
    vocab_size: int = 512,
    hidden_size: int = 64,
    num_layers: int = 2,
    max_positions: int = 8192,
    seed: int = 0,
) -> str:
    """Save a tiny randomly initialised Qwen2 causal LM and its tokenizer to ``path``.

    The tokenizer is a byte-level BPE trained with ``tokenizers`` on ``vocab_texts`` (any text
    can be encoded; the texts only decide the merges), wrapped in ``PreTrainedTokenizerFast`` with
    ``<|endoftext|>`` (eos), ``<|pad|>`` (pad, left padding) and the role tokens ``<|system|>``,
    ``<|user|>``, ``<|assistant|>``, ``<|tool|>`` as special tokens. Takes a few seconds on CPU.

    Args:
        path: Output directory (created if needed).
        vocab_texts: Texts to train the tokenizer on; defaults to :data:`DEFAULT_VOCAB_TEXTS`.
        chat_template: Jinja chat template stored with the tokenizer: by default the plain
            ``<|role|>`` layout the local provider prompts with (:data:`ROLE_CHAT_TEMPLATE`), so
            a server prompts the checkpoint alike; None stores none.
        vocab_size: Target vocabulary size (256 byte tokens plus merges plus special tokens).
        hidden_size: Model width (the intermediate size is twice this).
        num_layers: Number of transformer layers.
        max_positions: Context length in tokens (agent prompts on web pages run to thousands of
            tokens with a small vocabulary).
        seed: Seed of the random initialisation (the global torch RNG is left untouched).

    Returns:
        The checkpoint directory as a string, ready for ``model=f"hf/{path}"``.
    """
    torch, transformers = _import_torch_transformers()
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise MissingExtraError("tokenizers", "train") from None
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    special = ["<|endoftext|>", "<|pad|>", *_ROLE_TOKENS]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(list(vocab_texts or DEFAULT_VOCAB_TEXTS), trainer=trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
        additional_special_tokens=list(_ROLE_TOKENS),
        padding_side="left",
    )
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    config = transformers.Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return str(out)
