"""An exact nearest-neighbour index of a buffer's records in memory (``buffer.index: memory``).

Chroma answers a filtered query (``where``) through SQLite and its HNSW graph, costly in CPU and
under one lock, which caps a dream against a hosted experience model at a few dozen steps a
second whatever its concurrency (evidence: docs/history/results-2026-11-to-12.md, "the dream's
throughput by concurrency"). This index holds a snapshot of the collection (ids, normalised
vectors, metadata, documents) and answers the same queries by brute force, one matrix-vector
product and a filter mask, with no lock held.

What it answers differs from Chroma's only where Chroma's approximate graph does: it is exact
(every record within the filter is compared), and records at the same distance come in a fixed
order (an exact copy of the query text first, then insertion order) where Chroma's order among
them depends on its graph. Filters pass what Chroma's pass (:meth:`MemoryIndex.mask`; a test
holds them to Chroma 1.5's answers): ``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte``,
``$in``, ``$nin``, ``$and``, ``$or``; booleans, numbers and strings never equal one another
(``True`` is not ``1``); ``$ne``/``$nin`` match a record that lacks the key; a fractional filter
value meets a stored integer as the integer it truncates to (Chroma's reading: ``{"n": 1.5}``
passes ``n = 1``).
"""

from __future__ import annotations

import json
import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dreamgym_agents.errors import ConfigError

Row = tuple[str, dict[str, Any], float, str]
"""One retrieved record: id, metadata, cosine distance, document."""

_MISSING = object()  # a record without the key
_MASKS_KEPT = 1024  # filter masks cached per snapshot (one per distinct clause)
_ORDERING = {"$gt": operator.gt, "$gte": operator.ge, "$lt": operator.lt, "$lte": operator.le}
_OPERATORS = ("$eq", "$ne", "$in", "$nin", *_ORDERING)


def _kind(value: Any) -> str:
    """Chroma's comparison class of a metadata value: bool, number or string."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return "str" if isinstance(value, str) else type(value).__name__


def _check_value(value: Any, where: dict[str, Any]) -> None:
    if _kind(value) not in ("bool", "number", "str"):
        raise ConfigError(f"bad buffer filter {where!r}: {value!r} is not a string, number or "
                          "boolean")


class MemoryIndex:
    """A snapshot of a collection's records, queried exactly.

    Args:
        ids: Record ids, in the collection's order.
        embeddings: One vector per record (any scale: rows are normalised here).
        metadatas: One metadata mapping per record.
        documents: One document (the embedded text) per record.
    """

    def __init__(self, ids: Sequence[str], embeddings: Any, metadatas: Sequence[dict[str, Any]],
                 documents: Sequence[str]) -> None:
        if not len(ids) == len(metadatas) == len(documents) == len(embeddings):
            raise ValueError("ids, embeddings, metadatas and documents differ in length")
        self.ids = list(ids)
        self.metadatas = [dict(m or {}) for m in metadatas]
        self.documents = [str(d or "") for d in documents]
        vectors = np.asarray(embeddings, dtype=np.float32)
        vectors = vectors.reshape(len(self.ids), -1) if self.ids else np.zeros((0, 0), np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        # by dimension (d × n): a sparse query (the hash embedding's) reads only its own rows
        self.by_dim = np.ascontiguousarray(
            np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0).T)
        self._columns: dict[str, np.ndarray] = {}
        self._groups: dict[str, dict[tuple[str, Any], np.ndarray]] = {}
        self._masks: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()  # guards the caches (queries run outside it)

    @classmethod
    def load(cls, collection: Any, *, page: int = 2000) -> MemoryIndex:
        """Read every record of a Chroma collection (a page at a time)."""
        ids: list[str] = []
        vectors: list[Any] = []
        metas: list[dict[str, Any]] = []
        docs: list[str] = []
        offset = 0
        while True:
            got = collection.get(include=["embeddings", "metadatas", "documents"], limit=page,
                                 offset=offset)
            ids += got["ids"]
            if len(got["ids"]):
                vectors.append(np.asarray(got["embeddings"], dtype=np.float32))
            metas += got["metadatas"] or [{}] * len(got["ids"])
            docs += got["documents"] or [""] * len(got["ids"])
            if len(got["ids"]) < page:
                break
            offset += page
        dim = vectors[0].shape[1] if vectors else 0
        matrix = np.concatenate(vectors) if vectors else np.zeros((0, dim), dtype=np.float32)
        return cls(ids, matrix, metas, docs)

    def __len__(self) -> int:
        return len(self.ids)

    # -- filters ----------------------------------------------------------------------------

    def _column(self, key: str) -> np.ndarray:
        with self._lock:
            column = self._columns.get(key)
            if column is None:
                column = np.empty(len(self.ids), dtype=object)
                column[:] = [m.get(key, _MISSING) for m in self.metadatas]
                self._columns[key] = column
            return column

    def _equal(self, key: str, value: Any) -> np.ndarray:
        """Which records hold ``value`` under ``key`` (Chroma's equality)."""
        if isinstance(value, float) and not value.is_integer():
            return _equal(self._column(key), value)  # meets integers truncated: compare each
        with self._lock:
            groups = self._groups.get(key)
        if groups is None:
            found: dict[tuple[str, Any], list[int]] = {}
            for i, stored in enumerate(self._column(key)):
                if stored is not _MISSING:
                    found.setdefault((_kind(stored), stored), []).append(i)
            groups = {k: np.asarray(v, dtype=np.intp) for k, v in found.items()}
            with self._lock:
                self._groups[key] = groups
        out = np.zeros(len(self.ids), dtype=bool)
        out[groups.get((_kind(value), value), [])] = True
        return out

    def mask(self, where: dict[str, Any] | None) -> np.ndarray:
        """Which records pass ``where`` (Chroma's syntax and semantics)."""
        if not where:
            return np.ones(len(self.ids), dtype=bool)
        try:
            cache_key = json.dumps(where, sort_keys=True)
        except TypeError:
            raise ConfigError(f"bad buffer filter {where!r}: not JSON values") from None
        with self._lock:
            cached = self._masks.get(cache_key)
            if cached is not None:
                self._masks.move_to_end(cache_key)
                return cached
        result = self._evaluate(where, where)
        result.flags.writeable = False
        with self._lock:
            self._masks[cache_key] = result
            while len(self._masks) > _MASKS_KEPT:
                self._masks.popitem(last=False)
        return result

    def _evaluate(self, clause: Any, where: dict[str, Any]) -> np.ndarray:
        if not isinstance(clause, dict) or not clause:
            raise ConfigError(f"bad buffer filter {where!r}: {clause!r} is not a filter")
        if len(clause) > 1:  # several keys: all of them (as the buffer normalises them)
            return self._evaluate({"$and": [{k: v} for k, v in clause.items()]}, where)
        ((key, condition),) = clause.items()
        if key in ("$and", "$or"):
            if not isinstance(condition, list) or not condition:
                raise ConfigError(f"bad buffer filter {where!r}: {key} needs a list of filters")
            masks = [self._evaluate(part, where) for part in condition]
            combine = np.logical_and if key == "$and" else np.logical_or
            return combine.reduce(masks) if len(masks) > 1 else masks[0]
        if key.startswith("$"):
            raise ConfigError(f"bad buffer filter {where!r}: unknown operator {key}")
        if not isinstance(condition, dict):
            condition = {"$eq": condition}
        if len(condition) != 1:
            raise ConfigError(f"bad buffer filter {where!r}: one operator per key ({key})")
        ((op, value),) = condition.items()
        if op not in _OPERATORS:
            raise ConfigError(f"bad buffer filter {where!r}: unknown operator {op} (the memory "
                              f"index reads {', '.join(_OPERATORS)}, $and, $or)")
        column = self._column(key)
        if op in ("$in", "$nin"):
            if not isinstance(value, list) or not value:
                raise ConfigError(f"bad buffer filter {where!r}: {op} needs a non-empty list")
            for item in value:
                _check_value(item, where)
            if len({type(item) for item in value}) > 1:
                raise ConfigError(f"bad buffer filter {where!r}: {op} needs values of one type")
            found = np.logical_or.reduce([self._equal(key, item) for item in value])
            return found if op == "$in" else ~found
        _check_value(value, where)
        if op in ("$eq", "$ne"):
            found = self._equal(key, value)
            return found if op == "$eq" else ~found
        if _kind(value) != "number":
            raise ConfigError(f"bad buffer filter {where!r}: {op} compares numbers")
        compare = _ORDERING[op]
        return np.fromiter((_kind(v) == "number" and compare(v, _met_as(v, value))
                            for v in column), dtype=bool, count=len(column))

    # -- queries ----------------------------------------------------------------------------

    def where(self, where: dict[str, Any] | None) -> list[tuple[str, dict[str, Any]]]:
        """``(id, metadata)`` of every record that passes ``where``, in the collection's order
        (what Chroma's ``get(where=…)`` pages through)."""
        return [(self.ids[i], self.metadatas[i]) for i in np.flatnonzero(self.mask(where))]

    def query(self, embedding: Any, n: int, where: dict[str, Any] | None = None,
              document: str | None = None) -> list[Row]:
        """The ``n`` records nearest to ``embedding`` (cosine distance) that pass ``where``,
        nearest first; at equal distance a record whose document is ``document`` comes first,
        then the collection's order."""
        if not self.ids or n < 1:
            return []
        query = np.asarray(embedding, dtype=np.float32).reshape(-1)
        norm = float(np.linalg.norm(query))
        if query.shape[0] != self.by_dim.shape[0]:
            raise ConfigError(f"query vector of dimension {query.shape[0]} against a buffer of "
                              f"dimension {self.by_dim.shape[0]}")
        query = query / norm if norm > 0 else query
        used = np.flatnonzero(query)
        if len(used) > len(query) // 4:
            used = np.arange(len(query))
        # elementwise, not BLAS: OpenBLAS's worker threads spin after each call, and under a
        # dream's load that burns about a core for nothing
        distances = 1.0 - np.add.reduce(self.by_dim[used] * query[used, None], axis=0)
        allowed = np.flatnonzero(self.mask(where))
        if not len(allowed):
            return []
        dist = distances[allowed]
        if n < len(allowed):  # keep every record tied with the n-th, then order them fully
            bound = np.partition(dist, n - 1)[n - 1]
            keep = dist <= bound
            allowed, dist = allowed[keep], dist[keep]
        same = np.array([self.documents[i] != document for i in allowed], dtype=bool) \
            if document is not None else np.zeros(len(allowed), dtype=bool)
        order = np.lexsort((allowed, same, dist))[:n]
        return [(self.ids[i], self.metadatas[i], float(max(0.0, dist[j])), self.documents[i])
                for j, i in ((j, allowed[j]) for j in order)]


def _met_as(stored: Any, value: Any) -> Any:
    """The filter's number as Chroma compares it with a stored one: a float meets an integer
    as the integer it truncates to."""
    if isinstance(value, float) and isinstance(stored, int) and not isinstance(stored, bool):
        return int(value)
    return value


def _equal(column: np.ndarray, value: Any) -> np.ndarray:
    """Elementwise Chroma equality: the same kind (bool, number, string) and equal."""
    kind = _kind(value)
    same: Callable[[Any], bool] = \
        lambda v: _kind(v) == kind and v == _met_as(v, value)  # noqa: E731
    return np.fromiter((same(v) for v in column), dtype=bool, count=len(column))
