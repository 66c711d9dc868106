"""The buffer's memory index (buffer.index: memory): Chroma's filters and answers, exactly, from
a snapshot that follows the collection. (Every retrieval test of test_buffer.py also runs on it.)"""

from __future__ import annotations

import chromadb
import numpy as np
import pytest

import dreamgym_agents.buffer.replay as replay
from dreamgym_agents.buffer.memory_index import MemoryIndex
from dreamgym_agents.buffer.replay import BufferConfig, ReplayBuffer
from dreamgym_agents.errors import ConfigError
from dreamgym_agents.types import Transition

METAS = [
    {"x": "u", "n": 1, "b": True, "p": "real"},
    {"x": "v", "n": 2, "p": "offline"},
    {"n": 3, "b": False, "p": "synthetic"},
    {"x": "u", "n": 1.5, "b": 1, "p": "real"},
    {"x": "w", "n": -2, "b": False, "p": "real"},
    {"n": -1, "p": "offline"},
    {"n": -1.5, "x": "1"},
    {"n": 1.0, "b": True},
]
FILTERS = [
    {"x": "u"}, {"x": {"$eq": "u"}}, {"x": {"$ne": "u"}}, {"x": {"$nin": ["u", "w"]}},
    {"x": {"$in": ["u", "v"]}}, {"b": True}, {"b": 1}, {"b": {"$ne": False}}, {"n": 1},
    {"n": 1.0}, {"n": {"$gt": 1}}, {"n": {"$gte": 1}}, {"n": {"$lt": 1.5}},
    {"n": {"$lte": -2}}, {"n": {"$in": [1, 3]}}, {"n": 1.5}, {"n": -1.5},
    {"n": {"$gt": -1.5}}, {"n": {"$lt": -1.5}}, {"n": {"$ne": -1.5}}, {"n": {"$nin": [1.5]}},
    {"n": {"$gte": 0.5}}, {"x": "1"}, {"x": {"$in": ["1", "u"]}}, {"$or": [{"x": "v"}, {"n": 3}]},
    {"$and": [{"p": {"$in": ["offline", "real"]}}, {"x": {"$ne": "w"}}]},
    {"$and": [{"$or": [{"b": True}, {"b": False}]}, {"p": "real"}]},
]


@pytest.fixture
def collection():
    client = chromadb.EphemeralClient(settings=chromadb.Settings(anonymized_telemetry=False))
    col = client.get_or_create_collection("memory-index-test", embedding_function=None,
                                          configuration={"hnsw": {"space": "cosine"}})
    col.add(ids=[f"r{i}" for i in range(len(METAS))], metadatas=METAS,
            embeddings=[[1.0, float(i), 0.5] for i in range(len(METAS))],
            documents=[f"doc {i}" for i in range(len(METAS))])
    yield col
    client.delete_collection("memory-index-test")


@pytest.mark.parametrize("where", FILTERS, ids=[str(f) for f in FILTERS])
def test_filters_pass_what_chromas_pass(collection, where):
    index = MemoryIndex.load(collection)
    mine = [rid for rid, passed in zip(index.ids, index.mask(where), strict=True) if passed]
    assert mine == sorted(collection.get(where=where)["ids"])


def test_distances_are_chromas_cosine_distances(collection):
    index = MemoryIndex.load(collection)
    query = [0.3, 1.0, -0.2]
    theirs = collection.query(query_embeddings=[query], n_results=5,
                              include=["distances"])
    mine = index.query(query, 5)
    assert [row[0] for row in mine] == theirs["ids"][0]
    assert [row[2] for row in mine] == pytest.approx(theirs["distances"][0], abs=1e-5)
    assert [row[0] for row in index.query(query, 2, {"p": "real"})] == \
        collection.query(query_embeddings=[query], n_results=2, where={"p": "real"})["ids"][0]


def test_equally_near_records_come_exact_copy_first_then_in_order():
    index = MemoryIndex(["a", "b", "c", "d"], [[1, 0], [1, 0], [2, 0], [0, 1]],
                        [{}, {}, {}, {}], ["x", "y", "x", "z"])
    assert [row[0] for row in index.query([3, 0], 4, document="y")] == ["b", "a", "c", "d"]
    assert [row[0] for row in index.query([3, 0], 2, document="x")] == ["a", "c"]
    assert [row[0] for row in index.query([3, 0], 2)] == ["a", "b"]
    assert index.query([3, 0], 3, {"k": "none"}) == []


@pytest.mark.parametrize("where", [{"x": {"$bogus": 1}}, {"$not": [{"x": 1}]},
                                   {"x": {"$in": "u"}}, {"n": {"$gt": "a"}},
                                   {"x": {"$eq": [1]}}, {"$and": []},
                                   {"n": {"$in": [1, 2.5]}}, {"x": {"$eq": 1, "$ne": 2}}])
def test_a_bad_filter_is_a_config_error(collection, where):
    with pytest.raises(ConfigError, match="bad buffer filter"):
        MemoryIndex.load(collection).mask(where)


def test_an_unknown_index_is_refused_and_auto_picks_by_where_the_buffer_lives(tmp_path):
    with pytest.raises(ConfigError,
                       match="buffer.index 'faiss': choose from auto, chroma, memory"):
        BufferConfig(path=str(tmp_path), index="faiss")
    assert BufferConfig(path=str(tmp_path)).search == "memory"  # a folder: the snapshot
    assert BufferConfig(url="http://127.0.0.1:8000").search == "chroma"  # a shared server
    assert BufferConfig(url="http://127.0.0.1:8000", index="memory").search == "memory"


def step(episode: str, i: int, task: str = "t") -> Transition:
    return Transition(episode_id=episode, step=i, task_id=task, state=f"room {i} holds {i % 7}",
                      action=f"go to place {i}", next_state=f"room {i + 1}", provenance="real")


def test_answers_as_chroma_does_where_chromas_graph_reaches(tmp_path):
    """Chroma's HNSW graph is approximate (and built in an order that varies between runs): it
    may miss a near record, never add a nearer one. The exact search finds at least as near a
    record at every rank, and every record Chroma found nearer than the exact search's last
    one."""
    cfg = BufferConfig(path=str(tmp_path / "b"))
    with ReplayBuffer(cfg) as chroma:
        chroma.add([step(f"e{i % 9}", i, task=f"t{i % 5}") for i in range(120)])
    with ReplayBuffer(cfg) as chroma, \
            ReplayBuffer(BufferConfig(path=cfg.path, index="memory")) as memory:
        for i in range(0, 120, 7):
            for where in (None, {"task_id": {"$ne": f"t{i % 5}"}}):
                ask = (f"room {i} holds {i % 3}", f"go to place {i + 1}")
                theirs = chroma.retrieve(*ask, k=6, where=where)
                mine = memory.retrieve(*ask, k=6, where=where)
                sims = [t.info["similarity"] for t in mine]
                assert len(mine) == len(theirs) == 6 and sims == sorted(sims, reverse=True)
                assert all(m >= t - 1e-5 for m, t in
                           zip(sims, (t.info["similarity"] for t in theirs), strict=True))
                found = {(t.episode_id, t.step) for t in mine}
                assert all((t.episode_id, t.step) in found for t in theirs
                           if t.info["similarity"] > sims[-1] + 1e-5)
                if where is not None:
                    assert all(t.task_id != f"t{i % 5}" for t in mine)


def test_the_snapshot_follows_its_own_and_other_writers(tmp_path, monkeypatch):
    cfg = BufferConfig(path=str(tmp_path / "b"), index="memory")
    with ReplayBuffer(cfg) as memory, ReplayBuffer(BufferConfig(path=cfg.path)) as other:
        memory.add([step("a", i) for i in range(10)])
        assert memory.retrieve("room 3 holds 3", "go to place 3", k=1)[0].step == 3
        memory.add([step("b", 50)])  # its own write: read again at once
        assert memory.retrieve("room 50 holds 1", "go to place 50", k=1)[0].episode_id == "b"
        other.add([step("c", 60)])  # another writer: seen once the size is looked at again
        monkeypatch.setattr(replay, "_INDEX_RECHECK_S", 0.0)
        assert memory.retrieve("room 60 holds 4", "go to place 60", k=1)[0].episode_id == "c"
        other.prune(provenance="real", max_size=3)
        assert memory.count() == 3 and len(memory.retrieve("room 1", "go", k=10)) == 3
        memory.clear()
        assert memory.retrieve("room 1", "go", k=10) == []


def test_a_sparse_query_reads_only_its_dimensions():
    rng = np.random.default_rng(0)
    vectors = rng.random((50, 64)).astype(np.float32)
    index = MemoryIndex([str(i) for i in range(50)], vectors, [{}] * 50, [""] * 50)
    query = np.zeros(64, dtype=np.float32)
    query[[3, 17]] = [0.5, 2.0]  # sparse: the dimensions' rows only
    dense = 1 - (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)) @ \
        (query / np.linalg.norm(query))
    rows = index.query(query, 50)
    assert [row[0] for row in rows] == [str(i) for i in np.argsort(dense, kind="stable")]
    assert [row[2] for row in rows] == pytest.approx(np.sort(dense), abs=1e-6)
