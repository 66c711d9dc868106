"""The replay buffer: real and synthetic transitions in Chroma, retrieved by similarity.

The experience model is grounded by real transitions similar to the one it imagines: the top-k
transitions of the replay buffer most similar to the current state and action are put into its
context (DreamGym, Sec. 4.1). Each transition is one Chroma record with id
``"<episode_id>:<step>"`` (adding it again replaces it), its embedded ``(state, action)`` text and
filterable metadata (:func:`~dreamgym_agents.buffer.embedding.transition_record`) plus a digest
of that text (``key_hash``).

Chroma's vector index (HNSW) is approximate: when many stored vectors are about equally far apart
(short, similar texts under the hash embedding), its graph can leave some records unreachable, so
a query may miss even an exact copy of itself (the graph depends on the order Chroma inserts in,
which varies from run to run). A retrieval whose vector search returned something farther than
an exact copy therefore also looks the copies up by their digest (an exact match in SQLite) and
ranks those it missed before anything farther; otherwise its answer is kept as it is.

An embedded ``chromadb.PersistentClient`` keeps the buffer in a directory (every add is on disk
when it returns); ``url`` points several machines at one Chroma server instead. Embeddings are
computed here (:mod:`dreamgym_agents.buffer.embedding`, offline feature hashing by default) and
passed to Chroma, so Chroma's default embedding model never runs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import chromadb

from dreamgym_agents.buffer.embedding import (
    ACTION_WEIGHT,
    HASH_FEATURES,
    KEY_DIGEST,
    HashEmbeddingFunction,
    Record,
    check_embedding_spec,
    family_hash_features_of,
    key_digest,
    make_embedding_function,
    record_transition,
    split_key_text,
    transition_key_text,
    transition_record,
)
from dreamgym_agents.buffer.memory_index import MemoryIndex
from dreamgym_agents.episodes.env import TaskFamily, family_part, family_root
from dreamgym_agents.errors import ConfigError, DreamGymError, EnvError
from dreamgym_agents.types import PROVENANCES, Task, Trajectory, Transition, iter_trajectories

__all__ = ["BufferConfig", "ReplayBuffer", "transition_key_text", "split_key_text"]

logger = logging.getLogger(__name__)

_COLLECTION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,510}[A-Za-z0-9]$")
_PAGE = 2000  # records per get() when scanning the whole collection
_BATCH = 500  # records per upsert/delete (also bounded by the server's max batch size)
_START_PROVENANCES = ["real", "offline"]  # a start state must come from a real environment
_INDEX_RECHECK_S = 1.0  # how often a memory index asks whether the collection's size changed
INDEXES = ("auto", "chroma", "memory")
"""How the buffer searches (:attr:`BufferConfig.index`)."""
_SAME_VECTOR = 1e-4  # cosine distance at or below which two records' vectors are the same (float32)


@dataclass
class BufferConfig:
    """Where the replay buffer lives and how it embeds transitions.

    Attributes:
        path: Directory of the embedded Chroma database (``chromadb.PersistentClient``); created
            if missing. Ignored when ``url`` is set.
        url: URL of a Chroma server (``http://127.0.0.1:8000``, ``https://chroma.example:443``)
            so several machines share one buffer; None uses the embedded database at ``path``.
        collection: Name of the Chroma collection (3-512 characters from ``[A-Za-z0-9._-]``,
            starting and ending with a letter or digit).
        embedding: ``"hash"`` (offline feature hashing, the default),
            ``"st:<model name or local path>"`` (sentence-transformers, local files only) or
            ``"litellm:<model>"`` (an embedding API through LiteLLM). A collection keeps the
            embedding it was created with: reopen it with the same value.
        embedding_api_base: Base URL of the embedding API for ``litellm:`` embeddings.
        hash_dim: Dimension of the ``hash`` embedding (number of hash buckets).
        family: The task family whose features a new collection's ``hash`` embedding uses
            (its ``hash_features`` hook; ``""``: plain text features). A collection keeps the
            features it was created with.
        top_k: Transitions returned by :meth:`ReplayBuffer.retrieve` when ``k`` is not given.
        index: How :meth:`ReplayBuffer.retrieve` searches. ``auto`` (the default): ``memory``
            for a buffer in a folder, ``chroma`` for a Chroma server, which several processes
            or machines write: Chroma's query sees their writes at once, a snapshot only
            within a second. ``memory``: an exact search of a snapshot of the collection held
            in this process (:mod:`~dreamgym_agents.buffer.memory_index`, 4 bytes ×
            ``hash_dim`` per record), refreshed after this buffer's own writes and when the
            collection's size changes (another process's, or a server's, writes). Its answers
            differ from Chroma's only in the order of equally similar records and where
            Chroma's approximate graph misses one
            (evidence: docs/history/results-2026-11-to-12.md). ``chroma``: Chroma's filtered
            HNSW query, one at a time, slow enough that the dream waits on it at high
            concurrency. Chroma stays the store either way (``path`` or ``url``).
    """

    path: str = ".dreamgym/buffer"
    url: str | None = None
    collection: str = "transitions"
    embedding: str = "hash"
    embedding_api_base: str | None = None
    hash_dim: int = 1024
    family: str = ""
    top_k: int = 3
    index: str = "auto"

    def __post_init__(self) -> None:
        if not self.url and not str(self.path).strip():
            raise ConfigError("buffer.path is empty: set a directory (e.g. .dreamgym/buffer) "
                              "or buffer.url for a Chroma server")
        self.url = self.url or None  # an empty value from a config file means "no server"
        if self.url is not None:
            self.server_address  # noqa: B018 - validates the URL
        if self.embedding_api_base and not self.embedding_api_base.startswith(("http://",
                                                                               "https://")):
            raise ConfigError(f"buffer.embedding_api_base {self.embedding_api_base!r} must be "
                              "an http(s) URL, e.g. http://127.0.0.1:8000/v1")
        if not _COLLECTION_NAME.match(self.collection):
            raise ConfigError(
                f"buffer.collection {self.collection!r} is not a valid Chroma name: use 3-512 "
                "characters from [A-Za-z0-9._-], starting and ending with a letter or digit"
            )
        check_embedding_spec(self.embedding)
        if self.hash_dim < 16:
            raise ConfigError(f"buffer.hash_dim must be >= 16 (1024 is a good default), "
                              f"got {self.hash_dim}")
        if self.top_k < 1:
            raise ConfigError(f"buffer.top_k must be >= 1, got {self.top_k}")
        if self.index not in INDEXES:
            raise ConfigError(f"buffer.index {self.index!r}: choose from {', '.join(INDEXES)}")

    @property
    def search(self) -> str:
        """``memory`` or ``chroma``: :attr:`index` with ``auto`` resolved."""
        if self.index != "auto":
            return self.index
        return "chroma" if self.url else "memory"

    @property
    def server_address(self) -> tuple[str, int, bool]:
        """``(host, port, ssl)`` parsed from ``url``; the port defaults to 8000 (443 for https)."""
        hint = "use http://HOST:PORT or https://HOST[:PORT], e.g. http://127.0.0.1:8000"
        parts = urlsplit(self.url or "")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"buffer.url {self.url!r} is not a Chroma server URL: {hint}")
        if parts.path not in ("", "/") or parts.query:
            raise ConfigError(f"buffer.url {self.url!r} must not have a path or query: {hint}")
        try:
            port = parts.port
        except ValueError:
            raise ConfigError(f"buffer.url {self.url!r} has a bad port: {hint}") from None
        ssl = parts.scheme == "https"
        return parts.hostname, port or (443 if ssl else 8000), ssl


def _normalize_where(where: dict[str, Any]) -> dict[str, Any]:
    """Chroma wants one key per filter: turn ``{"a": 1, "b": 2}`` into an ``$and`` of both."""
    if len(where) <= 1:
        return where
    return {"$and": [{key: value} for key, value in where.items()]}


def _and(*clauses: dict[str, Any] | None) -> dict[str, Any] | None:
    kept = [_normalize_where(c) for c in clauses if c]
    if not kept:
        return None
    return kept[0] if len(kept) == 1 else {"$and": kept}


def _check_provenance(provenance: str) -> None:
    if provenance not in PROVENANCES:
        raise ConfigError(f"provenance must be one of {', '.join(PROVENANCES)}, "
                          f"got {provenance!r}")


class ReplayBuffer:
    """Transitions in a Chroma collection: add, retrieve by similarity, filter, prune, export.

    Thread-safe: concurrent dream rollouts may share one buffer (Chroma calls are serialised by a
    lock; embeddings are computed outside it).

    Args:
        cfg: Where the buffer lives and how it embeds transitions.
        family: The run's task family, resolved by its caller (``cfg.family`` names it): its
            hash features embed the transitions and its state format keys each episode's start.
            Without it, a buffer of a named family builds those parts by the name, as Chroma
            does when it reopens a saved collection's embedding function.

    Raises:
        EnvError: The Chroma server at ``cfg.url`` cannot be reached.
        ConfigError: The collection exists with a different embedding, or ``family`` is not
            the one ``cfg.family`` names.
    """

    def __init__(self, cfg: BufferConfig, family: TaskFamily | None = None) -> None:
        if family is not None and cfg.family and family_root(cfg.family) != family.name:
            raise ConfigError(f"buffer of family {cfg.family!r} opened with the "
                              f"{family.name!r} family")
        self.cfg = cfg
        self._lock = threading.RLock()
        # start states looked up while the collection keeps the size they were read at
        self._starts: dict[tuple[Any, ...], str | None] = {}
        self._starts_size = -1
        self._last_seq = 0
        self._closed = False
        self._start_keys: dict[str, Callable[[Task], str]] = {}
        self._family = family
        self._index: MemoryIndex | None = None  # buffer.index: memory
        self._index_checked = 0.0
        self._index_lock = threading.Lock()
        self._ef = make_embedding_function(
            cfg.embedding, hash_dim=cfg.hash_dim, api_base=cfg.embedding_api_base,
            family=cfg.family or (family.name if family is not None else ""),
            hash_features=family_hash_features_of(family, HASH_FEATURES)
            if family is not None else None)
        self._client = self._connect()
        try:
            self._collection = self._open_collection()
            with self._guard():
                self._batch = max(1, min(_BATCH, self._client.get_max_batch_size()))
            if cfg.search == "memory":
                self._memory_index()  # now, not in the first retrieval every episode waits on
        except BaseException:
            self._release()
            raise
        logger.info("replay buffer %s/%s: %d transitions (embedding %s)",
                    cfg.url or cfg.path, cfg.collection, self.count(), cfg.embedding)

    # -- connection -------------------------------------------------------------------------

    def _connect(self) -> Any:
        settings = chromadb.Settings(anonymized_telemetry=False)
        if self.cfg.url:
            host, port, ssl = self.cfg.server_address
            try:
                return chromadb.HttpClient(host=host, port=port, ssl=ssl, settings=settings)
            except Exception as exc:  # noqa: BLE001 - chromadb raises ValueError, httpx errors…
                raise self._unreachable(exc) from None
        Path(self.cfg.path).mkdir(parents=True, exist_ok=True)
        return chromadb.PersistentClient(path=str(self.cfg.path), settings=settings)

    def _unreachable(self, exc: BaseException) -> EnvError:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        return EnvError(f"cannot reach the Chroma server at {self.cfg.url} ({reason}); start it "
                        "with `chroma run --path DIR --port PORT` or fix buffer.url")

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """Hold the lock around a Chroma call; a lost server becomes an :class:`EnvError`."""
        with self._lock:
            if self._closed:
                raise DreamGymError("the replay buffer is closed")
            try:
                yield
            except DreamGymError:
                raise
            except Exception as exc:
                if self.cfg.url and (isinstance(exc, OSError)
                                     or type(exc).__module__.startswith(("httpx", "httpcore"))):
                    raise self._unreachable(exc) from exc
                raise

    def _open_collection(self) -> Any:
        name = self.cfg.collection
        with self._guard():
            try:
                collection = self._client.get_or_create_collection(
                    name, embedding_function=self._ef,
                    configuration={"hnsw": {"space": "cosine"}},
                    metadata={"dreamgym": "replay buffer"},
                )
            except ValueError as exc:
                if "conflict" not in str(exc):
                    raise
                # Created with another embedding function: open it bare to say which one.
                collection = self._client.get_collection(name, embedding_function=None)
        persisted = collection._model.configuration_json.get("embedding_function") or {}
        ours = {"name": self._ef.name(), "config": self._ef.get_config()}
        theirs = persisted.get("config") or {}
        if (persisted.get("name") == ours["name"] == HashEmbeddingFunction.name()
                and theirs.get("dim") == ours["config"]["dim"]
                and theirs != ours["config"]):
            # A buffer made with another state/action weighting, feature version (an older
            # default) or family's features keeps its own: they are part of its stored vectors.
            self._ef = self._saved_embedding(theirs)
            with self._guard():
                collection = self._client.get_collection(name, embedding_function=self._ef)
            return collection
        if (persisted.get("name"), persisted.get("config")) != (ours["name"], ours["config"]):
            raise ConfigError(
                f"collection {name!r} was created with embedding {persisted.get('name')} "
                f"{persisted.get('config', '')}, not {ours['name']} {ours['config']}: reopen it "
                "with the embedding and hash_dim it was created with, or set buffer.collection "
                "to a new name"
            )
        return collection

    def _saved_embedding(self, config: dict[str, Any]) -> HashEmbeddingFunction:
        """The hash embedding a collection was saved with; its family's features from the
        buffer's family where that is the one it names."""
        saved = HashEmbeddingFunction.build_from_config
        named = str(config.get("family", ""))
        if self._family is None or not named or family_root(named) != self._family.name:
            return saved(config)
        version = int(config.get("features", 1))
        return HashEmbeddingFunction(
            dim=int(config.get("dim", 1024)),
            action_weight=float(config.get("action_weight", ACTION_WEIGHT)),
            features=version, family=named,
            hash_features=family_hash_features_of(self._family, version))

    def close(self) -> None:
        """Release the Chroma client (the data stays on disk or on the server)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._release()

    def _release(self) -> None:
        close = getattr(self._client, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.cfg.url or self.cfg.path
        return f"ReplayBuffer({where!r}, collection={self.cfg.collection!r})"

    # -- writing ----------------------------------------------------------------------------

    def _next_seq(self) -> int:
        # Wall-clock nanoseconds keep the order meaningful across processes sharing one buffer;
        # within a process the sequence is strictly increasing.
        with self._lock:
            self._last_seq = max(self._last_seq + 1, time.time_ns())
            return self._last_seq

    def _start_key(self, task: Task) -> str:
        """Where ``task`` starts, by its family's ``StateFormat.start_key`` (the buffer's
        family's; another family's by its name; "" for a family not installed here)."""
        start_key = self._start_keys.get(task.family)
        if start_key is None:
            if self._family is not None and family_root(task.family) == self._family.name:
                start_key = self._family.state_format().start_key
            else:
                try:
                    start_key = family_part(task.family, lambda f: f.state_format().start_key)
                except ConfigError:
                    logger.warning("buffer: task family %r is not installed: its episodes are "
                                   "stored without a start key", task.family)
                    start_key = lambda _task: ""  # noqa: E731
            self._start_keys[task.family] = start_key
        return str(start_key(task) or "")

    def _record(self, t: Transition, family: str = "", intent: str = "",
                start: str = "", params: dict[str, str] | None = None) -> Record:
        return transition_record(t, family=family, intent=intent, start=start,
                                 seq=self._next_seq(), params=params)

    def _upsert(self, records: Iterable[Record]) -> int:
        """Write records a batch at a time (each batch is durable when its call returns).

        Returns:
            How many distinct transitions were written.
        """
        seen: set[str] = set()
        batch: dict[str, tuple[str, dict[str, Any]]] = {}  # ids are unique within one call
        for rid, doc, meta in records:
            batch.pop(rid, None)  # the last record of an id wins
            batch[rid] = (doc, meta)
            seen.add(rid)
            if len(batch) >= self._batch:
                self._flush(batch)
        self._flush(batch)
        if seen:
            logger.debug("buffer: upserted %d transitions", len(seen))
        return len(seen)

    def _flush(self, batch: dict[str, tuple[str, dict[str, Any]]]) -> None:
        if not batch:
            return
        ids = list(batch)
        docs = [batch[rid][0] for rid in ids]
        embeddings = self._ef(docs)  # outside the lock: may be slow (model, API)
        with self._guard():
            self._index = None
            self._collection.upsert(ids=ids, documents=docs, embeddings=embeddings,
                                    metadatas=[batch[rid][1] for rid in ids])
        batch.clear()

    def add(self, transitions: Iterable[Transition], *, family: str = "") -> int:
        """Add (or replace) transitions; returns how many were written.

        Args:
            transitions: The transitions; their ``provenance`` is kept.
            family: Task family stored with them (for ``where={"family": ...}``).
        """
        return self._upsert(self._record(t, family) for t in transitions)

    def add_trajectories(
        self, trajs: Iterable[Trajectory], *, provenance: str | None = None,
        stage: str | None = None,
    ) -> int:
        """Add every transition of some episodes, with the task's family, intent and start key
        (where it starts: its family's ``StateFormat.start_key``).

        Args:
            trajs: The episodes.
            provenance: If given, store the transitions with this provenance instead of their own
                (e.g. real evaluation episodes kept as ``offline`` seed data).
            stage: The run's stage that played them (``s2r``, ``dream_rl`` …), kept in each
                record's ``stage`` (the seed data has none).

        Returns:
            How many transitions were written.
        """
        if provenance is not None:
            _check_provenance(provenance)

        def records() -> Iterator[Record]:
            for traj in trajs:
                task = traj.task
                start = self._start_key(task)
                for t in traj.transitions:
                    if provenance is not None and t.provenance != provenance:
                        t = replace(t, provenance=provenance)
                    rid, doc, meta = self._record(t, task.family, task.intent, start,
                                                  task.params)
                    if stage is not None:
                        meta["stage"] = stage
                    yield rid, doc, meta

        return self._upsert(records())

    def seed_from_jsonl(self, path: str | Path, *, provenance: str = "offline") -> int:
        """Add the episodes of a ``trajectories.jsonl`` (as written by ``dg-agents eval``).

        Returns:
            How many transitions were written.
        """
        if not Path(path).is_file():
            raise ConfigError(f"no trajectories file at {path}: run `dg-agents eval --out DIR` "
                              "and pass DIR/trajectories.jsonl")
        count = self.add_trajectories(iter_trajectories(path), provenance=provenance)
        logger.info("buffer: seeded %d transitions from %s as %s", count, path, provenance)
        return count

    # -- reading ----------------------------------------------------------------------------

    def retrieve(
        self,
        state: str,
        action: str,
        *,
        k: int | None = None,
        where: dict[str, Any] | None = None,
        exclude_episode: str | None = None,
    ) -> list[Transition]:
        """The ``k`` stored transitions most similar to ``(state, action)``, best first.

        Args:
            state: The abstract state.
            action: The action taken in it.
            k: How many; ``cfg.top_k`` if None.
            where: A Chroma metadata filter, e.g. ``{"family": "webarena"}`` or
                ``{"provenance": {"$in": ["offline", "real"]}}``.
            exclude_episode: Leave out the transitions of this episode (a held-out episode must
                not retrieve itself).

        Returns:
            The transitions, each with its cosine similarity in ``info["similarity"]``, its
            task's instruction in ``info["intent"]`` and parameters in ``info["task_params"]``.
            Stored transitions with exactly this state and action come first (similarity 1.0),
            whether or not the approximate vector index reaches them (a record written before
            the digests were stored only where the index does).
        """
        k = self.cfg.top_k if k is None else k
        if k < 1:
            raise ConfigError(f"retrieve: k must be >= 1, got {k}")
        exclude = {"episode_id": {"$ne": exclude_episode}} if exclude_episode else None
        key = transition_key_text(state, action)
        query = self._ef([key])
        scope = _and(where, exclude)
        if self.cfg.search == "memory":
            rows = self._memory_index().query(query[0], k, scope, document=key)
            return self._transitions(rows)
        try:  # k larger than the collection (or the filtered set) returns what there is
            rows = self._query(query, k, scope)
            # at distance 0: exact copies, or other texts the embedding does not tell apart
            tied = [row for row in rows if row[2] <= _SAME_VECTOR]
            if len(tied) < k:
                seen = {row[0] for row in rows}
                missed = [row for row in self._exact(key, k, scope) if row[0] not in seen]
                if missed:  # the index did not reach them: before anything farther
                    rows = tied + missed + [row for row in rows if row[2] > _SAME_VECTOR]
        except ValueError as exc:
            raise ConfigError(f"bad buffer filter {where!r}: {exc}") from None
        return self._transitions(rows[:k])

    @staticmethod
    def _transitions(rows: list[tuple[str, dict[str, Any], float, str]]) -> list[Transition]:
        found: list[Transition] = []
        for _, meta, distance, _ in rows:
            t = record_transition(meta)
            t.info["similarity"] = 1.0 - float(distance)  # cosine space: distance = 1 - cos
            t.info["intent"] = str(meta.get("intent", ""))
            t.info["task_params"] = json.loads(meta.get("params") or "{}")
            found.append(t)
        return found

    def _query(self, embeddings: Any, n: int,
               where: dict[str, Any] | None) -> list[tuple[str, dict[str, Any], float, str]]:
        """The ``n`` nearest records (id, metadata, cosine distance, document) that pass
        ``where``, as far as the approximate vector index finds them."""
        with self._guard():
            result = self._collection.query(query_embeddings=embeddings, n_results=n,
                                            where=where,
                                            include=["metadatas", "distances", "documents"])
        return list(zip(result["ids"][0], result["metadatas"][0], result["distances"][0],
                        result["documents"][0], strict=True))

    def _memory_index(self) -> MemoryIndex:
        """The snapshot of the collection (``buffer.index: memory``), read again after this
        buffer's own writes and when the collection's size changed (looked at once a second)."""
        with self._index_lock:
            index, now = self._index, time.monotonic()
            if index is not None and now - self._index_checked < _INDEX_RECHECK_S:
                return index
            with self._guard():
                if index is not None and self._collection.count() == len(index):
                    self._index_checked = now
                    return index
                started = time.perf_counter()
                index = self._index = MemoryIndex.load(self._collection, page=_PAGE)
            self._index_checked = now
            logger.info("buffer: memory index of %d transitions read in %.2fs", len(index),
                        time.perf_counter() - started)
            return index

    def _exact(self, key: str, n: int,
               where: dict[str, Any] | None) -> list[tuple[str, dict[str, Any], float, str]]:
        """Up to ``n`` records whose document is ``key`` (id, metadata, distance 0.0, document)
        that pass ``where``: found by their digest in SQLite, not through the vector index.
        Records written before digests were stored have none and are left to :meth:`_query`."""
        with self._guard():
            page = self._collection.get(where=_and({KEY_DIGEST: key_digest(key)}, where),
                                        include=["metadatas", "documents"], limit=n)
        return [(rid, meta, 0.0, doc) for rid, meta, doc
                in zip(page["ids"], page["metadatas"], page["documents"], strict=True)
                if doc == key]

    def _scan(self, where: dict[str, Any] | None = None,
              include: list[str] | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
        """Yield ``(id, metadata)`` of every matching record, a page at a time."""
        include = ["metadatas"] if include is None else include
        offset = 0
        while True:
            with self._guard():
                page = self._collection.get(where=where, include=include, limit=_PAGE,
                                            offset=offset)
            metas = page.get("metadatas") or [{}] * len(page["ids"])
            yield from zip(page["ids"], metas, strict=True)
            if len(page["ids"]) < _PAGE:
                return
            offset += _PAGE

    def start_state(
        self, task_id: str | None = None, *, start: str | None = None,
        family: str | None = None,
    ) -> str | None:
        """A recorded real initial state: of ``task_id``, else of a task that starts at
        ``start`` (its family's ``StateFormat.start_key``).

        Only ``real`` and ``offline`` episodes count; among several, the newest wins.

        Returns:
            The state of step 0 of such an episode, or None when the buffer has none.
        """
        index = self._memory_index() if self.cfg.search == "memory" else None
        with self._guard():
            size = self._collection.count() if index is None else len(index)
            if size != self._starts_size:  # the collection changed: look again
                self._starts, self._starts_size = {}, size
            cache_key = (task_id, start, family)
            if cache_key in self._starts:
                return self._starts[cache_key]
        state = None
        base = {"$and": [{"step": 0}, {"provenance": {"$in": _START_PROVENANCES}}]
                + ([{"family": family}] if family else [])}
        # "start_url": the start key of a collection written before families had their own
        keys = [("task_id", task_id), ("start", start), ("start_url", start)]
        for key, value in keys:
            if not value:
                continue
            where = {"$and": [*base["$and"], {key: value}]}
            rows = index.where(where) if index is not None else list(self._scan(where))
            if rows:
                newest = max(rows, key=lambda row: row[1].get("seq", 0))[1]
                state = record_transition(newest).state
                break
        with self._lock:
            if size == self._starts_size:
                self._starts[cache_key] = state
        return state

    def count(self) -> int:
        """Number of stored transitions."""
        with self._guard():
            return self._collection.count()

    def stats(self) -> dict[str, Any]:
        """Totals: ``total``, ``by_provenance``, ``by_family``, ``by_stage`` (the run stages
        that added records; the seed data has none), ``episodes``, ``tasks``."""
        by_provenance: Counter[str] = Counter()
        by_family: Counter[str] = Counter()
        by_stage: Counter[str] = Counter()
        episodes: set[str] = set()
        tasks: set[str] = set()
        total = 0
        for _, meta in self._scan():
            total += 1
            by_provenance[str(meta.get("provenance", ""))] += 1
            by_family[str(meta.get("family", ""))] += 1
            if meta.get("stage"):
                by_stage[str(meta["stage"])] += 1
            episodes.add(str(meta.get("episode_id", "")))
            tasks.add(str(meta.get("task_id", "")))
        return {"total": total, "by_provenance": dict(by_provenance),
                "by_family": dict(by_family), "by_stage": dict(by_stage),
                "episodes": len(episodes), "tasks": len(tasks)}

    def transitions(self, where: dict[str, Any] | None = None) -> list[Transition]:
        """Every stored transition passing ``where`` (a Chroma filter), in insertion order; a
        record a run's stage added says which in ``info["buffer_stage"]``."""
        rows = sorted(self._scan(where), key=lambda row: row[1].get("seq", 0))
        out = []
        for _, meta in rows:
            t = record_transition(meta)
            if meta.get("stage"):
                t.info["buffer_stage"] = meta["stage"]
            out.append(t)
        return out

    # -- maintenance ------------------------------------------------------------------------

    def _delete(self, ids: list[str]) -> int:
        for i in range(0, len(ids), self._batch):
            with self._guard():
                self._index = None
                self._collection.delete(ids=ids[i:i + self._batch])
        return len(ids)

    def prune(
        self,
        *,
        provenance: str | None = None,
        max_size: int | None = None,
        keep: Literal["newest", "oldest"] = "newest",
    ) -> int:
        """Remove transitions; returns how many were removed.

        Args:
            provenance: Only consider transitions of this provenance. With no ``max_size``, all of
                them are removed (e.g. drop every ``synthetic`` transition).
            max_size: Keep at most this many of the considered transitions.
            keep: Which ones ``max_size`` keeps, by insertion order.
        """
        if provenance is None and max_size is None:
            raise ConfigError("prune needs provenance and/or max_size (use clear() to remove "
                              "everything)")
        if provenance is not None:
            _check_provenance(provenance)
        if max_size is not None and max_size < 0:
            raise ConfigError(f"prune: max_size must be >= 0, got {max_size}")
        if keep not in ("newest", "oldest"):
            raise ConfigError(f"prune: keep must be 'newest' or 'oldest', got {keep!r}")
        where = {"provenance": provenance} if provenance else None
        rows = sorted(self._scan(where), key=lambda row: row[1].get("seq", 0))
        if max_size is None:
            doomed = [rid for rid, _ in rows]
        else:
            excess = max(0, len(rows) - max_size)
            ordered = rows if keep == "newest" else rows[::-1]
            doomed = [rid for rid, _ in ordered[:excess]]
        removed = self._delete(doomed)
        logger.info("buffer: pruned %d transitions", removed)
        return removed

    def clear(self) -> None:
        """Remove every transition (the collection and its embedding setting stay)."""
        self._delete([rid for rid, _ in self._scan(include=[])])

    def export(self, path: str | Path) -> int:
        """Write every transition as one JSON line (with ``family``, ``intent``, ``start``),
        in insertion order. Returns how many were written."""
        rows = sorted(self._scan(), key=lambda row: row[1].get("seq", 0))
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            for _, meta in rows:
                data = json.loads(meta["transition"])
                for key in ("family", "intent"):
                    data[key] = meta.get(key, "")
                data["start"] = meta.get("start", meta.get("start_url", ""))
                data["task_params"] = json.loads(meta.get("params") or "{}")
                if meta.get("stage"):
                    data["stage"] = meta["stage"]
                fh.write(json.dumps(data, ensure_ascii=False, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        return len(rows)

    def import_(self, path: str | Path) -> int:
        """Add the transitions of a file written by :meth:`export`; returns how many."""
        def records() -> Iterator[Record]:
            with open(path, encoding="utf-8") as fh:
                for lineno, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        data = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise ConfigError(f"{path}:{lineno}: not a JSON line ({exc.msg})") from None
                    rid, doc, meta = self._record(
                        Transition.from_dict(data), str(data.get("family", "")),
                        str(data.get("intent", "")),
                        str(data.get("start", data.get("start_url", ""))),
                        data.get("task_params") or {})
                    if data.get("stage"):
                        meta["stage"] = str(data["stage"])
                    yield rid, doc, meta

        if not Path(path).is_file():
            raise ConfigError(f"no buffer export at {path}: write one with ReplayBuffer.export")
        return self._upsert(records())
