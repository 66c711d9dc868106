"""How a transition is represented in the replay buffer's Chroma collection.

A transition is one Chroma record (:func:`transition_record`): its id, its document (the
:func:`transition_key_text` of its state and action, the text that is embedded) and its metadata
(filter fields plus the whole transition as JSON, read back by :func:`record_transition`).

Documents are embedded by one of three kinds of embedding function, chosen by a spec string
(:func:`make_embedding_function`):

- ``"hash"`` (the default): a deterministic feature-hashing embedding of an abstract state and an
  action (:class:`HashEmbeddingFunction`). Downloads nothing, needs no model, and is the same on
  every machine and Python run (stable ``blake2b`` hashing, not Python's salted ``hash``).
- ``"st:<model name or local path>"``: a sentence-transformers model, loaded from local files only
  and cached once per process.
- ``"litellm:<model>"``: an embedding API called through LiteLLM's ``embedding()``.

Each function is registered with Chroma under its own name and round-trips through
``get_config()``/``build_from_config()``, so a collection reopened later (even by a bare Chroma
client) is rebuilt with the same function and never falls back to Chroma's default ONNX model,
which downloads weights at first use and fails offline.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import threading
from collections import Counter
from functools import lru_cache
from typing import Any

import numpy as np

from dreamgym_agents.errors import ConfigError, MissingExtraError, ModelError
from dreamgym_agents.state import parse_state
from dreamgym_agents.types import Transition

try:
    from chromadb.api.types import Documents, EmbeddingFunction, Embeddings, Space
    from chromadb.utils.embedding_functions import register_embedding_function
except ImportError:  # pragma: no cover - depends on the environment
    raise MissingExtraError("chromadb", "buffer") from None

logger = logging.getLogger(__name__)

ACTION_MARKER = "\n>>> ACTION: "
"""Separates the state from the action in a buffer document (see :func:`transition_key_text`)."""

EMBEDDING_FORMS = (
    "'hash' (offline feature hashing), 'st:<sentence-transformers model name or local path>', "
    "'litellm:<LiteLLM embedding model, e.g. openai/text-embedding-3-small>'"
)

_BID_LINE = re.compile(r"^\[(?P<bid>[^\]\s]+)\]\s+(?P<rest>.*)$")
_ELEMENT = re.compile(r"^(?P<role>[A-Za-z][\w-]*)(?:\s+'(?P<name>(?:[^'\\]|\\.)*)')?")
_WORD = re.compile(r"[^\W_]+(?:[.,'][^\W_]+)*|\$", re.UNICODE)
_CALL = re.compile(r"^\s*(?P<fn>[A-Za-z_]\w*)\s*\((?P<args>.*)\)\s*$", re.DOTALL)
_STRING_ARG = re.compile(r"'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"")
_URL_HOST = re.compile(r"^[a-z][a-z0-9+.-]*://[^/]*", re.IGNORECASE)


def transition_key_text(state: str, action: str) -> str:
    """The text that represents a transition's ``(state, action)`` in the buffer.

    It is the document stored in Chroma and the query text of a retrieval; the hash embedding
    splits it back into its state and action parts at :data:`ACTION_MARKER`.
    """
    return f"{state.strip()}{ACTION_MARKER}{action.strip()}"


Record = tuple[str, str, dict[str, Any]]
"""One Chroma record: ``(id, document, metadata)``."""


def transition_record(
    t: Transition, *, family: str = "", intent: str = "", start_url: str = "", seq: int = 0,
    params: dict[str, str] | None = None,
) -> Record:
    """The Chroma record of a transition.

    Args:
        t: The transition.
        family: Its task family.
        intent: Its task's instruction.
        start_url: Its task's start URL (matched by
            :meth:`~dreamgym_agents.buffer.ReplayBuffer.start_state`).
        seq: Insertion order (for pruning and export order).
        params: Its task's parameters (:attr:`~dreamgym_agents.types.Task.params`), kept as JSON.

    Returns:
        ``("<episode_id>:<step>", key text, metadata)``; metadata values are str, int, float or
        bool, as Chroma requires.
    """
    meta: dict[str, Any] = {
        "provenance": t.provenance, "family": family, "task_id": t.task_id,
        "episode_id": t.episode_id, "step": int(t.step), "reward": float(t.reward),
        "done": bool(t.done), "success": bool(t.success), "valid": bool(t.valid),
        "intent": intent, "start_url": start_url, "seq": int(seq),
        "params": json.dumps(params or {}, ensure_ascii=False, sort_keys=True),
        "transition": json.dumps(t.to_dict(), ensure_ascii=False, sort_keys=True, default=str),
    }
    return f"{t.episode_id}:{t.step}", transition_key_text(t.state, t.action), meta


def record_transition(meta: dict[str, Any]) -> Transition:
    """Rebuild the transition stored in a record's metadata."""
    return Transition.from_dict(json.loads(meta["transition"]))


def split_key_text(text: str) -> tuple[str, str]:
    """Split a :func:`transition_key_text` document into ``(state, action)``."""
    state, marker, action = text.rpartition(ACTION_MARKER)
    if not marker:
        return text, ""
    return state, action


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _add_ngrams(feats: Counter[str], prefix: str, words: list[str]) -> None:
    for i, word in enumerate(words):
        feats[f"{prefix}w:{word}"] += 1
        if i:
            feats[f"{prefix}b:{words[i - 1]}_{word}"] += 1


def _url_path(url: str) -> str:
    """Drop scheme and host so ``http://127.0.0.1:7770/x`` and ``__SHOPPING__/x`` share ``/x``."""
    url = _URL_HOST.sub("", url.strip())
    url = re.sub(r"^__[A-Z_]+__", "", url)
    return url.split("#", 1)[0] or "/"


def state_features(state: str) -> tuple[Counter[str], dict[str, tuple[str, str]]]:
    """Features of an abstract state, and its elements by bid (to resolve action targets).

    Features are word unigrams and bigrams within each line, the URL path and its segments, and
    each element as ``role|name`` with its bid stripped (bids differ between visits of one page).
    """
    feats: Counter[str] = Counter()
    elements: dict[str, tuple[str, str]] = {}
    for raw in state.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("URL:"):
            path = _url_path(line[4:])
            base = path.split("?", 1)[0]
            feats[f"url:{base.lower()}"] += 2
            for seg in filter(None, base.lower().split("/")):
                feats[f"seg:{seg}"] += 1
            _add_ngrams(feats, "", _words(path.replace("/", " ")))
            continue
        if line.startswith("Title:"):
            title = " ".join(_words(line[6:]))
            feats[f"title:{title}"] += 1
            _add_ngrams(feats, "", _words(title))
            continue
        bid = ""
        match = _BID_LINE.match(line)
        if match:
            bid, line = match["bid"], match["rest"]
        element = _ELEMENT.match(line)
        if element and element["name"] is not None:
            role, name = element["role"], " ".join(_words(element["name"]))
            feats[f"el:{role.lower()}|{name}"] += 1
            feats[f"role:{role.lower()}"] += 1
            if bid:
                elements[bid] = (role.lower(), name)
            _add_ngrams(feats, "", _words(element["name"]))
            rest = line[element.end():]
            if rest.strip():
                _add_ngrams(feats, "", _words(rest))
            continue
        _add_ngrams(feats, "", _words(line))
    return feats, elements


_SENT_FIELDS = ("textbox", "searchbox", "combobox")
"""Fields a submit sends (a combobox too, unlike the web codec's ``state_delta.typed_text``,
which looks for typed text only)."""


def typed_texts(state: str) -> list[str]:
    """The non-empty values of the state's fields that a submit sends."""
    return [e.value for e in parse_state(state).elements
            if e.role.lower() in _SENT_FIELDS and e.value.strip()]


SHAPE_WEIGHT = 4
"""Count given to each shape feature of a submitted query (see :func:`action_features`)."""


def _submits(fn: str, args: list[str], target_role: str | None) -> bool:
    """Whether an action sends a form: Enter pressed, or a button clicked."""
    if fn == "keyboard_press":
        return bool(args) and args[0].lower() == "enter"
    return fn == "click" and target_role == "button"


def action_features(action: str, elements: dict[str, tuple[str, str]],
                    typed: list[str] | None = None) -> Counter[str]:
    """Features of an action such as ``click('12')`` or ``fill('15', 'usb')``.

    The function name, the target element resolved through the state's bids to ``role|name``
    (so clicking "Laptops" matches across pages with different bids), and the words of the other
    string arguments. An action in no known shape contributes its words.

    With ``typed`` (the state's text-field values, :func:`typed_texts`), an action that sends a
    form (Enter, or a click on a button) also gets the shape of what it sends: submitted at all,
    how many words (1, 2, 3, 4 or more) and whether there is a comma. What a search page shows
    depends on the kind of query far more than on which button sent it: a whole product name
    finds that one product, a keyword a list. Without the shape, a product-name search sent by
    the Search button retrieved only keyword searches sent the same way, and the dream wrote
    their lists (measured: docs/RESULTS.md).
    """
    feats: Counter[str] = Counter()
    call = _CALL.match(action)
    if not call:
        _add_ngrams(feats, "a", _words(action))
        return feats
    fn = call["fn"].lower()
    feats[f"afn:{fn}"] += 1
    args = [m.group(1) if m.group(1) is not None else m.group(2)
            for m in _STRING_ARG.finditer(call["args"])]
    target = elements.get(args[0]) if args else None
    if typed and _submits(fn, args, target[0] if target else None):
        feats["asubmit"] += 2
        for text in typed:
            feats[f"atyped:n{min(len(_words(text)), 4)}"] += SHAPE_WEIGHT
            if "," in text:
                feats["atyped:comma"] += SHAPE_WEIGHT
    if target is not None:
        role, name = target
        feats[f"ael:{role}|{name}"] += 2
        feats[f"arole:{role}"] += 1
        _add_ngrams(feats, "an", name.split())
        args = args[1:]
    elif args and re.fullmatch(r"[a-z]?\d+", args[0]):
        feats[f"abid:{args[0]}"] += 1  # a bid absent from the state: weak evidence only
        args = args[1:]
    for arg in args:
        _add_ngrams(feats, "aa", _words(arg))
    if not args and not call["args"].strip():
        feats[f"afn0:{call['fn'].lower()}"] += 1
    return feats


@lru_cache(maxsize=1 << 17)
def _bucket(feature: str, dim: int) -> tuple[int, float]:
    digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
    value = int.from_bytes(digest, "little")
    return (value >> 1) % dim, 1.0 if value & 1 else -1.0


def hash_vector(feats: Counter[str], dim: int) -> np.ndarray:
    """Signed feature hashing with sublinear term frequency (``1 + log tf``), L2-normalised."""
    if not feats:
        return np.zeros(dim, dtype=np.float32)
    indices, weights = [], []
    for feature, count in feats.items():
        index, sign = _bucket(feature, dim)
        indices.append(index)
        weights.append(sign * (1.0 + math.log(count)) if count > 1 else sign)
    vec = np.bincount(indices, weights=weights, minlength=dim).astype(np.float32)
    norm = float(np.linalg.norm(vec))
    return vec / norm if norm > 0 else vec


ACTION_WEIGHT = 0.5
"""Share of the hash similarity given to the action. Measured on the bundled site (60 held-out
tasks, oracle and random steps, 1,544 offline transitions): the top-3 demonstrations contain the
real next page for 52 % of steps at 0.5 against 42 % at 0.35 (and 51 % at 0.65) — what an action
does matters more than which near-identical page it is done on."""


HASH_FEATURES = 2
"""Version of the hash features: 2 adds the shape of what a form submit sends
(:func:`action_features`). A buffer keeps the version it was created with."""


@register_embedding_function
class HashEmbeddingFunction(EmbeddingFunction[Documents]):
    """Offline feature-hashing embedding of ``(state, action)`` texts.

    The state and the action are embedded separately and combined so that the cosine similarity
    of two documents is about ``(1 - w) * state_similarity + w * action_similarity`` with ``w`` the
    ``action_weight``: on the same page, a different action ranks below the same action.

    Args:
        dim: Number of hash buckets (the embedding dimension).
        action_weight: Share of the similarity given to the action, in ``[0, 1]``.
    """

    def __init__(self, dim: int = 1024, action_weight: float = ACTION_WEIGHT,
                 features: int = HASH_FEATURES) -> None:
        if dim < 16:
            raise ConfigError(f"hash embedding dim must be >= 16, got {dim}")
        if not 0.0 <= action_weight <= 1.0:
            raise ConfigError(f"action_weight must be in [0, 1], got {action_weight}")
        if features not in (1, 2):
            raise ConfigError(f"hash embedding features must be 1 or 2, got {features}")
        self.dim = int(dim)
        self.action_weight = float(action_weight)
        self.features = int(features)

    def embed_text(self, text: str) -> np.ndarray:
        """Embed one document (a :func:`transition_key_text` or any text)."""
        state, action = split_key_text(text)
        feats, elements = state_features(state)
        state_vec = hash_vector(feats, self.dim)
        typed = typed_texts(state) if self.features >= 2 else None
        action_vec = hash_vector(action_features(action, elements, typed), self.dim)
        if not action_vec.any():
            return state_vec
        if not state_vec.any():
            return action_vec
        vec = math.sqrt(1.0 - self.action_weight) * state_vec
        vec += math.sqrt(self.action_weight) * action_vec
        norm = float(np.linalg.norm(vec))
        return vec / norm if norm > 0 else vec

    def __call__(self, input: Documents) -> Embeddings:  # noqa: A002 - Chroma's signature
        return [self.embed_text(text) for text in input]

    @staticmethod
    def name() -> str:
        return "dreamgym_hash"

    def default_space(self) -> Space:
        return "cosine"

    def supported_spaces(self) -> list[Space]:
        return ["cosine", "ip"]

    def get_config(self) -> dict[str, Any]:
        return {"dim": self.dim, "action_weight": self.action_weight, "features": self.features}

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> HashEmbeddingFunction:
        # A collection saved before the features had versions has version 1.
        return HashEmbeddingFunction(dim=int(config.get("dim", 1024)),
                                     action_weight=float(config.get("action_weight",
                                                                    ACTION_WEIGHT)),
                                     features=int(config.get("features", 1)))


_ST_MODELS: dict[str, Any] = {}
_ST_LOCK = threading.Lock()


def load_sentence_transformer(model: str) -> Any:
    """Load a sentence-transformers model from local files only, once per process."""
    with _ST_LOCK:
        if model in _ST_MODELS:
            return _ST_MODELS[model]
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise MissingExtraError("sentence-transformers", "embeddings") from None
        try:
            loaded = SentenceTransformer(model, device="cpu", local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - hub/OS errors of many types mean "not here"
            raise ConfigError(
                f"sentence-transformers model {model!r} not found in local files "
                f"({type(exc).__name__}): give a local folder (st:/path/to/model) or a model "
                "already in the Hugging Face cache"
            ) from None
        _ST_MODELS[model] = loaded
        return loaded


@register_embedding_function
class SentenceTransformerEmbedding(EmbeddingFunction[Documents]):
    """A local sentence-transformers model (normalised embeddings, cosine space).

    Args:
        model: A model name in the local Hugging Face cache, or a local folder.
    """

    def __init__(self, model: str) -> None:
        self.model = model
        self._model = load_sentence_transformer(model)

    def __call__(self, input: Documents) -> Embeddings:  # noqa: A002 - Chroma's signature
        vectors = self._model.encode(list(input), convert_to_numpy=True,
                                     normalize_embeddings=True)
        return [np.asarray(v, dtype=np.float32) for v in vectors]

    @staticmethod
    def name() -> str:
        return "dreamgym_sentence_transformer"

    def default_space(self) -> Space:
        return "cosine"

    def get_config(self) -> dict[str, Any]:
        return {"model": self.model}

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> SentenceTransformerEmbedding:
        return SentenceTransformerEmbedding(model=str(config["model"]))


@register_embedding_function
class LiteLLMEmbedding(EmbeddingFunction[Documents]):
    """An embedding API reached through LiteLLM's ``embedding()``.

    Args:
        model: A LiteLLM embedding model string (``openai/text-embedding-3-small``).
        api_base: Base URL of the API; None uses the provider's default. API keys come from the
            provider's usual environment variables and are never stored.
    """

    def __init__(self, model: str, api_base: str | None = None) -> None:
        self.model = model
        self.api_base = api_base

    def __call__(self, input: Documents) -> Embeddings:  # noqa: A002 - Chroma's signature
        from dreamgym_agents.llm import import_litellm

        litellm = import_litellm()
        kwargs: dict[str, Any] = {"model": self.model, "input": list(input)}
        if self.api_base:
            kwargs["api_base"] = self.api_base
        try:
            response = litellm.embedding(**kwargs)
        except Exception as exc:  # noqa: BLE001 - LiteLLM raises many provider types
            first_line = (str(exc).splitlines() or [""])[0][:300]
            raise ModelError(f"embedding call to {self.model} failed: "
                             f"{type(exc).__name__}: {first_line}") from exc
        data = sorted(response.data, key=lambda d: d["index"] if isinstance(d, dict) else d.index)
        vectors = [d["embedding"] if isinstance(d, dict) else d.embedding for d in data]
        return [np.asarray(v, dtype=np.float32) for v in vectors]

    @staticmethod
    def name() -> str:
        return "dreamgym_litellm"

    def default_space(self) -> Space:
        return "cosine"

    def get_config(self) -> dict[str, Any]:
        return {"model": self.model, "api_base": self.api_base}

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> LiteLLMEmbedding:
        return LiteLLMEmbedding(model=str(config["model"]), api_base=config.get("api_base"))


def check_embedding_spec(spec: str) -> None:
    """Raise :class:`ConfigError` unless ``spec`` has one of the valid forms (loads nothing)."""
    kind, sep, arg = spec.partition(":")
    if spec == "hash" or (sep and kind in ("st", "litellm") and arg.strip()):
        return
    raise ConfigError(f"bad embedding {spec!r}: use one of {EMBEDDING_FORMS}")


def make_embedding_function(
    spec: str, *, hash_dim: int = 1024, api_base: str | None = None
) -> EmbeddingFunction[Documents]:
    """Build the embedding function named by ``spec`` (see the module docstring)."""
    check_embedding_spec(spec)
    kind, _, arg = spec.partition(":")
    if kind == "hash":
        return HashEmbeddingFunction(dim=hash_dim)
    if kind == "st":
        return SentenceTransformerEmbedding(model=arg.strip())
    return LiteLLMEmbedding(model=arg.strip(), api_base=api_base)
