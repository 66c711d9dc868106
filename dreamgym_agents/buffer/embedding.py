"""How a transition is represented in the replay buffer's Chroma collection.

A transition is one Chroma record (:func:`transition_record`): its id, its document (the
:func:`transition_key_text` of its state and action, the text that is embedded) and its metadata
(filter fields plus the whole transition as JSON, read back by :func:`record_transition`).

Documents are embedded by one of three kinds of embedding function, chosen by a spec string
(:func:`make_embedding_function`):

- ``"hash"`` (the default): a deterministic feature-hashing embedding of an abstract state and an
  action (:class:`HashEmbeddingFunction`) by the features of the buffer's task family (its
  ``hash_features`` hook, else plain :class:`TextFeatures`). Downloads nothing, needs no model,
  and is the same on every machine and Python run (stable ``blake2b`` hashing, not Python's
  salted ``hash``).
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
from typing import Any, Protocol

import numpy as np

from dreamgym_agents.errors import ConfigError, MissingExtraError, ModelError
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

_WORD = re.compile(r"[^\W_]+(?:[.,'][^\W_]+)*|\$", re.UNICODE)


def transition_key_text(state: str, action: str) -> str:
    """The text that represents a transition's ``(state, action)`` in the buffer.

    It is the document stored in Chroma and the query text of a retrieval; the hash embedding
    splits it back into its state and action parts at :data:`ACTION_MARKER`.
    """
    return f"{state.strip()}{ACTION_MARKER}{action.strip()}"


Record = tuple[str, str, dict[str, Any]]
"""One Chroma record: ``(id, document, metadata)``."""


KEY_DIGEST = "key_hash"
"""The metadata field holding :func:`key_digest` of a record's key text."""


def key_digest(text: str) -> str:
    """The digest of a transition's key text that finds its exact copies in the buffer."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def transition_record(
    t: Transition, *, family: str = "", intent: str = "", start: str = "", seq: int = 0,
    params: dict[str, str] | None = None,
) -> Record:
    """The Chroma record of a transition.

    Args:
        t: The transition.
        family: Its task family.
        intent: Its task's instruction.
        start: Where its task starts, in its family's terms (``StateFormat.start_key``: a web
            task's start URL, a game's id), matched by
            :meth:`~dreamgym_agents.buffer.replay.ReplayBuffer.start_state`.
        seq: Insertion order (for pruning and export order).
        params: Its task's parameters (:attr:`~dreamgym_agents.types.Task.params`), kept as JSON.

    Returns:
        ``("<episode_id>:<step>", key text, metadata)``; metadata values are str, int, float or
        bool, as Chroma requires; :data:`KEY_DIGEST` is the key text's digest.
    """
    key = transition_key_text(t.state, t.action)
    meta: dict[str, Any] = {
        "provenance": t.provenance, "family": family, "task_id": t.task_id,
        "episode_id": t.episode_id, "step": int(t.step), "reward": float(t.reward),
        "done": bool(t.done), "success": bool(t.success), "valid": bool(t.valid),
        "intent": intent, "start": start, "seq": int(seq),
        "params": json.dumps(params or {}, ensure_ascii=False, sort_keys=True),
        "transition": json.dumps(t.to_dict(), ensure_ascii=False, sort_keys=True, default=str),
        KEY_DIGEST: key_digest(key),
    }
    return f"{t.episode_id}:{t.step}", key, meta


def record_transition(meta: dict[str, Any]) -> Transition:
    """Rebuild the transition stored in a record's metadata."""
    return Transition.from_dict(json.loads(meta["transition"]))


def split_key_text(text: str) -> tuple[str, str]:
    """Split a :func:`transition_key_text` document into ``(state, action)``."""
    state, marker, action = text.rpartition(ACTION_MARKER)
    if not marker:
        return text, ""
    return state, action


def words(text: str) -> list[str]:
    """The lower-cased words of ``text`` (numbers with their separators, ``$`` as a word)."""
    return _WORD.findall(text.lower())


def add_ngrams(feats: Counter[str], prefix: str, words: list[str]) -> None:
    """Count the word unigrams (``<prefix>w:``) and bigrams (``<prefix>b:``) of ``words``."""
    for i, word in enumerate(words):
        feats[f"{prefix}w:{word}"] += 1
        if i:
            feats[f"{prefix}b:{words[i - 1]}_{word}"] += 1


class HashFeatures(Protocol):
    """A task family's features of a state and an action, for the hash embedding.

    ``state`` returns the state's features and whatever the action's features need from it
    (the web family: its elements by id, so ``click('12')`` becomes the element it clicks);
    ``action`` the action's features given the state and that context. A family hands its own
    through the optional ``hash_features(version)`` hook; :class:`TextFeatures` serves the
    others.
    """

    def state(self, text: str) -> tuple[Counter[str], Any]: ...

    def action(self, text: str, state: str, context: Any) -> Counter[str]: ...


class TextFeatures:
    """Features of plain text: the word unigrams and bigrams within each line of the state,
    and the action's (prefixed ``a``). Enough for short text-game states, where the same
    command in a room with the same things is the same transition."""

    def state(self, text: str) -> tuple[Counter[str], Any]:
        feats: Counter[str] = Counter()
        for line in text.splitlines():
            if line.strip():
                add_ngrams(feats, "", words(line.strip()))
        return feats, None

    def action(self, text: str, state: str, context: Any) -> Counter[str]:
        feats: Counter[str] = Counter()
        add_ngrams(feats, "a", words(text))
        return feats


_FEATURES: dict[tuple[str, int], HashFeatures] = {}
_FEATURES_LOCK = threading.Lock()


def family_hash_features_of(family: Any, version: int) -> HashFeatures:
    """The hash features of a resolved task family at ``version`` (its ``hash_features``
    hook; plain :class:`TextFeatures` for a family without one)."""
    hook = getattr(family, "hash_features", None)
    return hook(version) if hook is not None else TextFeatures()


def family_hash_features(family: str, version: int) -> HashFeatures:
    """The hash features of task ``family`` at ``version`` (its ``hash_features`` hook; plain
    :class:`TextFeatures` for ``""`` or a family without one), built once per process.

    Raises:
        ConfigError: No family has that name, or it has no such version of its features.
    """
    if not family:
        return TextFeatures()
    with _FEATURES_LOCK:
        found = _FEATURES.get((family, version))
        if found is None:
            from dreamgym_agents.episodes.env import family_part

            found = family_part(family, lambda f: family_hash_features_of(f, version))
            _FEATURES[(family, version)] = found
        return found


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
"""Share of the hash similarity given to the action: what an action does matters more than which
near-identical page it is done on, and at this share the top-3 demonstrations hold the real next
page more often than at a lower one on the bundled site."""


HASH_FEATURES = 2
"""Version of a family's hash features that new buffers use (the web family's 2 adds the shape
of what a form submit sends). A buffer keeps the version it was created with."""

LEGACY_FEATURES_FAMILY = "webarena"
"""The features of a collection saved before families chose their own (0.1.0): every buffer
then held web pages, embedded with the web features."""


@register_embedding_function
class HashEmbeddingFunction(EmbeddingFunction[Documents]):
    """Offline feature-hashing embedding of ``(state, action)`` texts.

    The state and the action are embedded separately and combined so that the cosine similarity
    of two documents is about ``(1 - w) * state_similarity + w * action_similarity`` with ``w`` the
    ``action_weight``: on the same page, a different action ranks below the same action.

    Args:
        dim: Number of hash buckets (the embedding dimension).
        action_weight: Share of the similarity given to the action, in ``[0, 1]``.
        features: Version of the family's features (:data:`HASH_FEATURES`).
        family: The task family whose features embed the texts, as the collection's config
            records it (``""``: plain :class:`TextFeatures`).
        hash_features: Those features, of the family the caller resolved
            (:func:`family_hash_features_of`); without them, built from ``family``'s name
            (:func:`family_hash_features`) when the first text is embedded, as by a function
            Chroma rebuilt from a saved collection's config.
    """

    def __init__(self, dim: int = 1024, action_weight: float = ACTION_WEIGHT,
                 features: int = HASH_FEATURES, family: str = "",
                 hash_features: HashFeatures | None = None) -> None:
        if dim < 16:
            raise ConfigError(f"hash embedding dim must be >= 16, got {dim}")
        if not 0.0 <= action_weight <= 1.0:
            raise ConfigError(f"action_weight must be in [0, 1], got {action_weight}")
        if features < 1:
            raise ConfigError(f"hash embedding features must be a version >= 1, got {features}")
        self.dim = int(dim)
        self.action_weight = float(action_weight)
        self.features = int(features)
        self.family = family
        self._given = hash_features

    @property
    def _features(self) -> HashFeatures:
        # by the family's name only when a text is embedded: Chroma rebuilds a collection's
        # function from its saved config to compare it with the one it is given, and that
        # copy embeds nothing
        if self._given is None:
            self._given = family_hash_features(self.family, self.features)
        return self._given

    def embed_text(self, text: str) -> np.ndarray:
        """Embed one document (a :func:`transition_key_text` or any text)."""
        state, action = split_key_text(text)
        feats, context = self._features.state(state)
        state_vec = hash_vector(feats, self.dim)
        action_vec = hash_vector(self._features.action(action, state, context), self.dim)
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
        return {"dim": self.dim, "action_weight": self.action_weight, "features": self.features,
                "family": self.family}

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> HashEmbeddingFunction:
        # A collection saved before the features had versions has version 1, and one saved
        # before families chose their features has the web family's.
        return HashEmbeddingFunction(dim=int(config.get("dim", 1024)),
                                     action_weight=float(config.get("action_weight",
                                                                    ACTION_WEIGHT)),
                                     features=int(config.get("features", 1)),
                                     family=str(config.get("family", LEGACY_FEATURES_FAMILY)))


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
        from dreamgym_agents.gateway.llm import import_litellm

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
    spec: str, *, hash_dim: int = 1024, api_base: str | None = None, family: str = "",
    hash_features: HashFeatures | None = None,
) -> EmbeddingFunction[Documents]:
    """Build the embedding function named by ``spec`` (see the module docstring); a ``hash``
    one with ``family``'s features (``hash_features``, where the caller has them)."""
    check_embedding_spec(spec)
    kind, _, arg = spec.partition(":")
    if kind == "hash":
        return HashEmbeddingFunction(dim=hash_dim, family=family, hash_features=hash_features)
    if kind == "st":
        return SentenceTransformerEmbedding(model=arg.strip())
    return LiteLLMEmbedding(model=arg.strip(), api_base=api_base)
