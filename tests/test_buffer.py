"""The replay buffer on Chroma: retrieval order, filters, start states, maintenance, durability."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from served import free_port, running

from dreamgym_agents.buffer.embedding import HashEmbeddingFunction, split_key_text
from dreamgym_agents.buffer.replay import BufferConfig, ReplayBuffer, transition_key_text
from dreamgym_agents.errors import ConfigError, EnvError, MissingExtraError
from dreamgym_agents.types import Task, Trajectory, Transition, write_trajectories

NAV = ["[5] link 'Home'", "[6] link 'Laptops'", "[7] link 'Phones'", "[8] link 'Cart'",
       "[9] textbox 'Search' value=''"]
LAPTOPS = [("Acme Laptop 14", "899.00"), ("Zen Book Pro", "1299.99"), ("Budget Laptop", "12.99")]
PHONES = [("Pixel Phone", "499.00"), ("Galaxy Phone", "799.00"), ("Nokia Classic", "59.99")]


def page(category: str, items: list[tuple[str, str]], *, bid0: int = 20) -> str:
    """An abstract web state (see dreamgym_agents.adapters.webarena.state)."""
    lines = [f"URL: __SHOPPING__/category/{category}",
             f"Title: {category.title()} - Acme Shop", *NAV, f"heading '{category.title()}'"]
    for i, (name, price) in enumerate(items):
        lines += [f"[{bid0 + 2 * i}] link '{name}'", f"StaticText 'Price: ${price}'",
                  f"[{bid0 + 2 * i + 1}] button 'Add to Cart'"]
    return "\n".join(lines)


def product(name: str, price: str) -> str:
    slug = name.lower().replace(" ", "-")
    return "\n".join([f"URL: __SHOPPING__/product/{slug}", f"Title: {name} - Acme Shop", *NAV,
                      f"heading '{name}'", f"StaticText 'Price: ${price}'",
                      "[30] spinbutton 'Qty' value='1'", "[31] button 'Add to Cart'"])


def tr(episode: str, step: int, state: str, action: str, *, task: str = "t0",
       provenance: str = "real", next_state: str = "", done: bool = False) -> Transition:
    return Transition(episode_id=episode, step=step, task_id=task, state=state, action=action,
                      next_state=next_state or f"after {action}", provenance=provenance,
                      done=done, success=done, reward=float(done))


@pytest.fixture
def cfg(tmp_path: Path) -> BufferConfig:
    return BufferConfig(path=str(tmp_path / "buffer"), family="webarena")  # web pages


@pytest.fixture(params=["chroma", "memory"])
def buffer(cfg: BufferConfig, request):
    """A buffer searched by Chroma, and one searched by its memory index (buffer.index): every
    test on this fixture holds for both."""
    from dreamgym_agents.adapters.webarena.family import WebArenaFamily

    cfg.index = request.param
    with ReplayBuffer(cfg, WebArenaFamily()) as buf:
        yield buf


def corpus() -> list[Transition]:
    laptops, phones = page("laptops", LAPTOPS), page("phones", PHONES)
    return [
        tr("e1", 0, laptops, "click('20')"),  # Acme Laptop 14
        tr("e1", 1, product(*LAPTOPS[0]), "click('31')"),
        tr("e2", 0, laptops, "click('24')"),  # Budget Laptop
        tr("e3", 0, phones, "click('20')"),  # Pixel Phone
        tr("e3", 1, product(*PHONES[0]), "fill('30', '2')"),
        tr("e4", 0, phones, "click('6')"),  # the Laptops link
        tr("e5", 0, product(*PHONES[1]), "click('8')"),
    ]


def test_identical_transition_ranks_first_and_near_page_other_element_below(buffer):
    buffer.add(corpus(), family="webarena")
    laptops = page("laptops", LAPTOPS)
    # The same page with one price changed, where another element was clicked.
    near = page("laptops", [LAPTOPS[0], ("Zen Book Pro", "1199.99"), LAPTOPS[2]])
    buffer.add([tr("e6", 0, near, "click('22')")], family="webarena")

    found = buffer.retrieve(laptops, "click('20')", k=8)
    # Same page, other element (e2), then near page, other element (e6), then other pages.
    assert [(t.episode_id, t.step) for t in found[:3]] == [("e1", 0), ("e2", 0), ("e6", 0)]
    sims = [t.info["similarity"] for t in found]
    assert sims[0] == pytest.approx(1.0, abs=1e-4)
    assert sims[1] < sims[0] - 0.05 and sims[2] < sims[1]
    assert len(found) == 8
    assert sims == sorted(sims, reverse=True)
    assert found[0].state == laptops and found[0].action == "click('20')"
    assert found[0].next_state == "after click('20')"


def test_bids_are_resolved_to_elements(buffer):
    """The same element on a re-rendered page (other bids) beats another element, same bids."""
    laptops, shifted = page("laptops", LAPTOPS), page("laptops", LAPTOPS, bid0=120)
    buffer.add([tr("same-element", 0, shifted, "click('120')"),
                tr("other-element", 0, laptops, "click('22')")])
    found = buffer.retrieve(laptops, "click('20')", k=2)
    assert [t.episode_id for t in found] == ["same-element", "other-element"]


def test_metadata_filters(buffer):
    laptops = page("laptops", LAPTOPS)
    buffer.add([tr("r", 0, laptops, "click('20')", provenance="real")], family="webarena")
    buffer.add([tr("o", 0, laptops, "click('20')", provenance="offline")], family="webarena")
    buffer.add([tr("s", 0, laptops, "click('20')", provenance="synthetic")], family="webarena")
    buffer.add([tr("a", 0, laptops, "click('20')", provenance="real")], family="alfworld")

    def eps(**kw) -> set[str]:
        return {t.episode_id for t in buffer.retrieve(laptops, "click('20')", k=10, **kw)}

    assert eps() == {"r", "o", "s", "a"}
    assert eps(where={"provenance": {"$in": ["offline", "real"]}}) == {"r", "o", "a"}
    assert eps(where={"family": "webarena"}) == {"r", "o", "s"}
    assert eps(where={"family": "webarena", "provenance": "real"}) == {"r"}  # several keys
    assert eps(where={"provenance": "synthetic"}, exclude_episode="s") == set()
    with pytest.raises(ConfigError, match="filter"):
        buffer.retrieve(laptops, "click('20')", where={"family": {"$bogus": 1}})


def test_exclude_episode_never_retrieves_itself(buffer):
    buffer.add(corpus())
    laptops = page("laptops", LAPTOPS)
    found = buffer.retrieve(laptops, "click('20')", k=10, exclude_episode="e1")
    assert found and all(t.episode_id != "e1" for t in found)
    assert len(found) == len(corpus()) - 2
    assert len(buffer.retrieve(laptops, "click('20')")) == buffer.cfg.top_k


def test_empty_buffer_and_bad_k(buffer):
    assert buffer.retrieve("URL: x", "click('1')") == []
    with pytest.raises(ConfigError, match="k must be"):
        buffer.retrieve("URL: x", "click('1')", k=0)


def make_traj(episode: str, task_id: str, start: str, *, config: dict | None = None,
              provenance: str = "real", family: str = "webarena") -> Trajectory:
    task = Task(task_id=task_id, family=family, intent=f"buy something ({task_id})",
                config=config or {})
    steps = [tr(episode, 0, start, "click('20')", task=task_id, provenance=provenance),
             tr(episode, 1, "StaticText 'done'", "stop('ok')", task=task_id,
                provenance=provenance, done=True)]
    return Trajectory(episode_id=episode, task=task, transitions=steps, success=True,
                      provenance=provenance)


def test_start_state(buffer):
    home = page("laptops", LAPTOPS)
    buffer.add_trajectories([
        make_traj("e1", "shop.1", home, config={"start_url": "__SHOPPING__/category/laptops"}),
        make_traj("e2", "shop.2", "dreamed page", provenance="synthetic",
                  config={"start_url": "__SHOPPING__/dream"}),
    ])
    assert buffer.start_state("shop.1") == home
    # No episode of shop.9 yet, but a task with the same start page was recorded.
    assert buffer.start_state("shop.9", start="__SHOPPING__/category/laptops") == home
    assert buffer.start_state("shop.1", family="alfworld") is None
    assert buffer.start_state("shop.2") is None  # synthetic states are not real start pages
    assert buffer.start_state("shop.9", start="__SHOPPING__/dream") is None
    assert buffer.start_state(None) is None
    # a start recorded after a lookup missed it is found (the lookups are cached meanwhile)
    buffer.add_trajectories([make_traj("e3", "shop.9", "shop 9 home")])
    assert buffer.start_state("shop.9", start="__SHOPPING__/category/laptops") == "shop 9 home"
    meta = buffer._collection.get(ids=["e1:0"], include=["metadatas"])["metadatas"][0]
    assert meta["intent"] == "buy something (shop.1)" and meta["family"] == "webarena"


def test_add_is_idempotent_batched_and_relabels(buffer):
    buffer._batch = 7  # exercise several upsert batches
    items = [tr(f"e{i // 5}", i % 5, page("laptops", LAPTOPS), f"click('{i}')")
             for i in range(40)]
    assert buffer.add(items) == 40
    assert buffer.add(items[:10] + items[:3]) == 10  # same ids replace, within a call too
    assert buffer.count() == 40
    n = buffer.add_trajectories([make_traj("x", "t", "s")], provenance="offline")
    assert n == 2 and buffer.stats()["by_provenance"] == {"real": 40, "offline": 2}
    with pytest.raises(ConfigError, match="provenance"):
        buffer.add_trajectories([make_traj("y", "t", "s")], provenance="imagined")


def test_seed_from_jsonl(buffer, tmp_path):
    path = tmp_path / "trajectories.jsonl"
    write_trajectories(path, [make_traj("e1", "t1", "s1"), make_traj("e2", "t2", "s2")])
    assert buffer.seed_from_jsonl(path) == 4
    assert buffer.stats()["by_provenance"] == {"offline": 4}
    with pytest.raises(ConfigError, match="dg-agents eval"):
        buffer.seed_from_jsonl(tmp_path / "missing.jsonl")


def test_stats_prune_export_import_round_trip(buffer, tmp_path):
    buffer.add(corpus(), family="webarena")
    buffer.add([tr(f"s{i}", 0, f"dream {i}", "click('1')", provenance="synthetic")
                for i in range(5)], family="webarena")
    game = {"layout": "kitchen-1", "seed": 3, "task_type": "pick_and_place_simple"}
    buffer.add_trajectories([make_traj("a1", "al.1", "You are in a kitchen.",
                                       family="alfworld", config={"game": game})],
                            stage="s2r")
    stats = buffer.stats()
    assert stats == {"total": 14, "by_provenance": {"real": 9, "synthetic": 5},
                     "by_family": {"webarena": 12, "alfworld": 2}, "by_stage": {"s2r": 2},
                     "episodes": 11, "tasks": 2}
    staged = buffer.transitions({"stage": "s2r"})
    assert [t.episode_id for t in staged] == ["a1", "a1"]
    assert all(t.info["buffer_stage"] == "s2r" for t in staged)
    assert len(buffer.transitions()) == 14

    out = tmp_path / "export.jsonl"
    assert buffer.export(out) == 14
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["episode_id"] == "e1" and lines[0]["family"] == "webarena"
    assert lines[-1]["intent"] == "buy something (al.1)"

    assert buffer.prune(provenance="synthetic", max_size=2) == 3
    assert {t.episode_id for t in buffer.retrieve("dream", "click('1')", k=10,
                                                  where={"provenance": "synthetic"})} == {"s3",
                                                                                          "s4"}
    assert buffer.prune(max_size=10, keep="oldest") == 1  # the newest (alfworld step 1) goes
    assert buffer.stats()["by_family"] == {"webarena": 9, "alfworld": 1}
    assert buffer.prune(provenance="synthetic") == 2
    with pytest.raises(ConfigError, match="clear"):
        buffer.prune()

    buffer.clear()
    assert buffer.count() == 0
    assert buffer.import_(out) == 14
    assert buffer.stats() == stats
    assert buffer.start_state("al.1") == "You are in a kitchen."
    # another task of the same game starts where it started (the family's start key)
    assert buffer.start_state("x", start=json.dumps(game, sort_keys=True)) == \
        "You are in a kitchen."
    assert buffer.start_state("x", start="kitchen") is None


def test_reopen_keeps_counts_and_checks_embedding(cfg):
    with ReplayBuffer(cfg) as buf:
        buf.add(corpus())
    with ReplayBuffer(cfg) as buf:
        assert buf.count() == len(corpus())
        assert buf.retrieve(page("laptops", LAPTOPS), "click('20')", k=1)[0].episode_id == "e1"
    other = BufferConfig(path=cfg.path, hash_dim=256)
    with pytest.raises(ConfigError, match="hash_dim"):
        ReplayBuffer(other)


def test_a_buffer_keeps_the_action_weight_it_was_made_with(cfg, monkeypatch):
    import dreamgym_agents.buffer.replay as buffer_module

    made = buffer_module.make_embedding_function
    monkeypatch.setattr(buffer_module, "make_embedding_function",
                        lambda *a, **kw: HashEmbeddingFunction(dim=cfg.hash_dim,
                                                               action_weight=0.35,
                                                               family="webarena"))
    with ReplayBuffer(cfg) as buf:  # an older default weighting
        buf.add(corpus())
        before = buf.retrieve(page("laptops", LAPTOPS), "click('24')", k=3)
    monkeypatch.setattr(buffer_module, "make_embedding_function", made)
    with ReplayBuffer(cfg) as buf:  # reopened with today's default: no error, same answers
        assert buf._ef.action_weight == 0.35
        after = buf.retrieve(page("laptops", LAPTOPS), "click('24')", k=3)
    assert [(t.episode_id, t.step) for t in after] == [(t.episode_id, t.step) for t in before]
    assert [t.info["similarity"] for t in after] == pytest.approx(
        [t.info["similarity"] for t in before])


def home(query: str) -> str:
    """A home page whose search field holds ``query``."""
    return "\n".join(["URL: __SHOPPING__/", "Title: Home - Acme Shop", *NAV[:4],
                      f"[9] textbox 'Search' value='{query}'", "[10] button 'Search'",
                      "heading 'Welcome'"])


def test_a_search_retrieves_searches_of_the_same_kind_of_query(buffer):
    """A whole product name sent by the button finds product-name searches sent by Enter
    before keyword searches sent by the button: what the results page shows depends on the
    query's kind, not on how it was sent."""
    buffer.add([
        tr("keyword-button", 0, home("laptop"), "click('10')"),
        tr("keyword-button-2", 0, home("phone"), "click('10')"),
        tr("name-enter", 0, home("Zen Book Pro, 14 inch, Silver"), "keyboard_press('Enter')"),
        tr("name-enter-2", 0, home("Galaxy Phone, 128GB, Black"), "keyboard_press('Enter')"),
    ])
    found = buffer.retrieve(home("Acme Laptop 14, 16GB RAM, Gray"), "click('10')", k=4)
    assert {t.episode_id for t in found[:2]} == {"name-enter", "name-enter-2"}
    found = buffer.retrieve(home("tablet"), "keyboard_press('Enter')", k=4)
    assert {t.episode_id for t in found[:2]} == {"keyword-button", "keyword-button-2"}


def test_submit_shape_features_only_on_submits():
    from dreamgym_agents.adapters.webarena.retrieval import action_features, typed_texts

    typed = typed_texts(home("Zen Book Pro, 14 inch"))
    assert typed == ["Zen Book Pro, 14 inch"]
    elements = {"10": ("button", "search"), "5": ("link", "home")}
    sent = action_features("click('10')", elements, typed)
    assert sent["asubmit"] and sent["atyped:n4"] and sent["atyped:comma"]
    assert not action_features("click('5')", elements, typed)["asubmit"]  # a link sends nothing
    assert action_features("keyboard_press('Enter')", elements, typed)["atyped:n4"]
    assert not action_features("keyboard_press('Tab')", elements, typed)["asubmit"]
    assert not action_features("click('10')", elements, [])["asubmit"]  # empty field


def test_a_buffer_keeps_the_feature_version_it_was_made_with(cfg, monkeypatch):
    import dreamgym_agents.buffer.replay as buffer_module

    made = buffer_module.make_embedding_function
    monkeypatch.setattr(buffer_module, "make_embedding_function",
                        lambda *a, **kw: HashEmbeddingFunction(dim=cfg.hash_dim, features=1,
                                                               family="webarena"))
    with ReplayBuffer(cfg) as buf:  # made before the submit features
        buf.add([tr("k", 0, home("laptop"), "click('10')"),
                 tr("n", 0, home("Zen Book Pro, 14 inch"), "keyboard_press('Enter')")])
        before = buf.retrieve(home("Acme Laptop 14, 16GB"), "click('10')", k=2)
    monkeypatch.setattr(buffer_module, "make_embedding_function", made)
    with ReplayBuffer(cfg) as buf:
        assert buf._ef.features == 1
        after = buf.retrieve(home("Acme Laptop 14, 16GB"), "click('10')", k=2)
    assert [t.info["similarity"] for t in after] == pytest.approx(
        [t.info["similarity"] for t in before])
    # a configuration saved before feature versions (and families' features) existed reads as
    # version 1 of the web features: every buffer held web pages then
    legacy = HashEmbeddingFunction.build_from_config({"dim": 64})
    assert (legacy.features, legacy.family) == (1, "webarena")
    with pytest.raises(ConfigError, match="features"):  # said when it first embeds
        HashEmbeddingFunction(features=3, family="webarena").embed_text("x")
    with pytest.raises(ConfigError, match="features"):
        HashEmbeddingFunction(features=0)


def test_a_buffer_keeps_the_family_features_it_was_made_with(cfg):
    """A web buffer reopened by code that does not say its family still embeds queries with
    the web features (its stored vectors were made with them); a new buffer without a family
    embeds plain text."""
    with ReplayBuffer(cfg) as buf:
        buf.add(corpus())
        before = buf.retrieve(page("laptops", LAPTOPS), "click('20')", k=4)
    with ReplayBuffer(BufferConfig(path=cfg.path)) as buf:
        assert buf._ef.family == "webarena"
        after = buf.retrieve(page("laptops", LAPTOPS), "click('20')", k=4)
    assert [t.info["similarity"] for t in after] == pytest.approx(
        [t.info["similarity"] for t in before])
    with ReplayBuffer(BufferConfig(path=cfg.path, collection="text")) as buf:
        assert buf._ef.family == "" and buf._ef.get_config()["family"] == ""


def test_text_features_are_the_words_of_each_line_and_of_the_action():
    from dreamgym_agents.buffer.embedding import TextFeatures, family_hash_features

    feats, _ = TextFeatures().state("You see a apple 1.\nOn the shelf 2, you see nothing.")
    assert feats["w:apple"] == 1 and feats["b:shelf_2"] == 1 and not feats["b:1_on"]  # per line
    action = TextFeatures().action("take apple 1 from countertop 2", "", None)
    assert action["aw:take"] == 1 and action["ab:from_countertop"] == 1
    assert isinstance(family_hash_features("alfworld", 2), TextFeatures)  # no hook: plain text
    with pytest.raises(ConfigError, match="unknown task family"):
        family_hash_features("no-such-family", 2)


def test_config_validation():
    with pytest.raises(ConfigError, match="'hash'.*st:.*litellm:"):
        BufferConfig(embedding="word2vec")
    with pytest.raises(ConfigError, match="st:"):
        BufferConfig(embedding="st:")
    with pytest.raises(ConfigError, match="http://HOST:PORT"):
        BufferConfig(url="127.0.0.1:8000")
    with pytest.raises(ConfigError, match="Chroma name"):
        BufferConfig(collection="a")
    with pytest.raises(ConfigError, match="top_k"):
        BufferConfig(top_k=0)
    with pytest.raises(ConfigError, match="hash_dim"):
        BufferConfig(hash_dim=4)
    assert BufferConfig(url="http://127.0.0.1:9001").server_address == ("127.0.0.1", 9001, False)
    assert BufferConfig(url="https://chroma.example").server_address == ("chroma.example", 443,
                                                                         True)


def test_key_text_round_trip():
    text = transition_key_text("URL: x\n[1] link 'A'", "click('1')")
    assert split_key_text(text) == ("URL: x\n[1] link 'A'", "click('1')")
    ef = HashEmbeddingFunction(dim=64)
    assert HashEmbeddingFunction.build_from_config(ef.get_config()).get_config() == ef.get_config()
    a, b = ef([text, text])
    assert a.tolist() == b.tolist() and abs(float((a * a).sum()) - 1.0) < 1e-5


def test_never_runs_chroma_default_embedding(tmp_path, monkeypatch):
    """No socket is opened and Chroma's ONNX default is never called, even by a bare client."""
    import chromadb
    from chromadb.utils.embedding_functions.onnx_mini_lm_l6_v2 import ONNXMiniLM_L6_V2

    def no_network(self, *args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    def no_onnx(self, *args, **kwargs):
        raise AssertionError("Chroma's default ONNX embedding was called")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)
    monkeypatch.setattr(ONNXMiniLM_L6_V2, "__call__", no_onnx)
    monkeypatch.setattr(ONNXMiniLM_L6_V2, "_download_model_if_not_exists", no_onnx)
    cfg = BufferConfig(path=str(tmp_path / "b"))
    with ReplayBuffer(cfg) as buf:
        buf.add(corpus())
        assert buf.retrieve(page("laptops", LAPTOPS), "click('20')", k=1)[0].episode_id == "e1"
    with ReplayBuffer(cfg) as buf:
        assert buf.count() == len(corpus())
    client = chromadb.PersistentClient(path=cfg.path,
                                       settings=chromadb.Settings(anonymized_telemetry=False))
    try:
        collection = client.get_collection(cfg.collection)  # no embedding function given
        key = transition_key_text(page("laptops", LAPTOPS), "click('20')")
        hit = collection.query(query_texts=[key], n_results=1)
        assert hit["ids"][0] == ["e1:0"]
        assert hit["distances"][0][0] == pytest.approx(0.0, abs=1e-4)
        # Control: the guards do catch Chroma's default embedding path.
        bare = client.create_collection("control-default-embedding")
        with pytest.raises(AssertionError, match="ONNX|network"):
            bare.add(ids=["1"], documents=["x"])
    finally:
        client.close()


def test_sentence_transformers_local_only_and_cached(tmp_path, monkeypatch):
    import dreamgym_agents.buffer.embedding as embedding

    monkeypatch.setattr(embedding, "_ST_MODELS", {})
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # not installed
    with pytest.raises(MissingExtraError, match="sentence-transformers"):
        ReplayBuffer(BufferConfig(path=str(tmp_path / "st0"), embedding="st:all-MiniLM-L6-v2"))

    loads: list[tuple[str, dict]] = []

    class FakeSentenceTransformer:
        def __init__(self, name: str, **kwargs) -> None:
            loads.append((name, kwargs))
            if name == "missing-model":
                raise OSError("We couldn't connect to 'https://huggingface.co'")
            self.ef = HashEmbeddingFunction(dim=48)

        def encode(self, texts, **kwargs):
            return [self.ef.embed_text(t) for t in texts]

    fake = type(sys)("sentence_transformers")
    fake.SentenceTransformer = FakeSentenceTransformer
    monkeypatch.setitem(sys.modules, "sentence_transformers", fake)
    with pytest.raises(ConfigError, match="not found in local files"):
        ReplayBuffer(BufferConfig(path=str(tmp_path / "st1"), embedding="st:missing-model"))
    cfg = BufferConfig(path=str(tmp_path / "st2"), embedding="st:all-MiniLM-L6-v2")
    with ReplayBuffer(cfg) as buf:
        buf.add(corpus())
    with ReplayBuffer(cfg) as buf:
        assert buf.retrieve(page("laptops", LAPTOPS), "click('20')", k=1)[0].episode_id == "e1"
    assert [name for name, _ in loads] == ["missing-model", "all-MiniLM-L6-v2"]  # cached
    assert all(kwargs["local_files_only"] is True for _, kwargs in loads)


def test_litellm_embedding(tmp_path, monkeypatch):

    calls: list[dict] = []

    class FakeLiteLLM:
        @staticmethod
        def embedding(**kwargs):
            calls.append(kwargs)
            ef = HashEmbeddingFunction(dim=32)
            return type("R", (), {"data": [{"index": i, "embedding": ef.embed_text(t).tolist()}
                                           for i, t in enumerate(kwargs["input"])]})

    import dreamgym_agents.gateway.llm as llm

    monkeypatch.setattr(llm, "import_litellm", lambda: FakeLiteLLM)
    cfg = BufferConfig(path=str(tmp_path / "lite"), embedding="litellm:openai/text-embed",
                       embedding_api_base="http://127.0.0.1:1/v1")
    with ReplayBuffer(cfg) as buf:
        buf.add(corpus())
        assert buf.retrieve(page("laptops", LAPTOPS), "click('20')", k=1)[0].episode_id == "e1"
    assert calls[0]["model"] == "openai/text-embed"
    assert calls[0]["api_base"] == "http://127.0.0.1:1/v1"


def test_concurrent_adds_and_retrievals(buffer):
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(10):
                buffer.add([tr(f"w{n}", i, page("laptops", LAPTOPS), f"click('{20 + i % 3}')")])
                assert buffer.retrieve(page("laptops", LAPTOPS), "click('20')", k=2)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and buffer.count() == 40


SIGKILL_CHILD = """
import sys, time
from dreamgym_agents.buffer.replay import BufferConfig, ReplayBuffer
from dreamgym_agents.types import Transition
buf = ReplayBuffer(BufferConfig(path=sys.argv[1]))
n = 0
for batch in range(3):
    n += buf.add(Transition(episode_id=f"e{batch}", step=i, task_id="t", state=f"page {i}",
                            action=f"click('{i}')", next_state="") for i in range(50))
print("ADDED", n, flush=True)
time.sleep(600)
"""


def test_adds_survive_sigkill(tmp_path):
    path = str(tmp_path / "buffer")
    child = subprocess.Popen([sys.executable, "-c", SIGKILL_CHILD, path],
                             stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line.startswith("ADDED"), f"child failed: {line!r}"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    with ReplayBuffer(BufferConfig(path=path)) as buf:
        assert buf.count() == int(line.split()[1]) == 150
        assert buf.retrieve("page 7", "click('7')", k=1)[0].step == 7


def test_exact_copies_are_found_where_the_vector_index_misses_them(cfg):
    """Short, similar states are about equally far apart, and Chroma's HNSW graph leaves some of
    them unreachable (test_adds_survive_sigkill once found "page 25" for "page 7"): no vector query
    returns those. A retrieval finds the stored copies of its (state, action) all the same."""
    with ReplayBuffer(cfg) as buf:
        buf.add(tr("e", i, f"page {i}", f"click('{i}')") for i in range(200))
    with ReplayBuffer(cfg) as buf:  # reopened: the index is rebuilt from Chroma's log
        found = {i: buf.retrieve(f"page {i}", f"click('{i}')", k=2) for i in range(200)}
    assert [i for i, ts in found.items() if ts[0].step != i] == []
    assert all(ts[0].info["similarity"] == 1.0 and ts[1].step != i for i, ts in found.items())


def test_a_buffer_made_before_key_digests_opens_and_retrieves(cfg, monkeypatch):
    made = ReplayBuffer._record

    def undigested(self, *args, **kwargs):
        rid, doc, meta = made(self, *args, **kwargs)
        return rid, doc, {key: value for key, value in meta.items() if key != "key_hash"}

    monkeypatch.setattr(ReplayBuffer, "_record", undigested)
    with ReplayBuffer(cfg) as buf:
        buf.add(corpus())
    monkeypatch.undo()
    laptops = page("laptops", LAPTOPS)
    with ReplayBuffer(cfg) as buf:
        assert buf.count() == len(corpus())
        assert buf.retrieve(laptops, "click('20')", k=1)[0].episode_id == "e1"  # by its vector
        buf.add([tr("new", 0, laptops, "click('20')")])
        assert {t.episode_id for t in buf.retrieve(laptops, "click('20')", k=2)} == {"e1", "new"}


def test_where_the_index_finds_the_copies_a_retrieval_is_the_vector_search(cfg):
    """The exact lookup only adds what the vector search missed: the experience models were
    trained on the vector search's demonstrations, in its order."""
    with ReplayBuffer(cfg) as buf:
        buf.add(corpus())
        state, action = page("laptops", LAPTOPS), "click('20')"
        vector = buf._query(buf._ef([transition_key_text(state, action)]), 3, None)
        assert [t.episode_id for t in buf.retrieve(state, action, k=3)] == \
            [meta["episode_id"] for _, meta, _, _ in vector]


def test_unreachable_server_is_an_env_error():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EnvError, match=re.escape(url)) as info:
        ReplayBuffer(BufferConfig(url=url))
    assert "\n" not in str(info.value)


@pytest.fixture
def chroma_server(tmp_path):
    chroma = Path(sys.executable).with_name("chroma")
    # chromadb (the buffer extra) installs its CLI: its absence is a broken install, not a skip
    assert chroma.exists(), f"no chroma CLI next to {sys.executable}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running([str(chroma), "run", "--path", str(tmp_path / "server"), "--host", "127.0.0.1",
                  "--port", str(port)], f"{url}/api/v2/heartbeat",
                 tmp_path / "chroma.log") as proc:
        yield url, proc


@pytest.mark.slow
def test_http_client_shares_one_buffer(chroma_server):
    url, server = chroma_server
    cfg = BufferConfig(url=url, collection="shared-transitions")
    with ReplayBuffer(cfg) as writer, ReplayBuffer(cfg) as reader:  # two "machines"
        writer.add(corpus(), family="webarena")
        assert reader.count() == len(corpus())
        found = reader.retrieve(page("laptops", LAPTOPS), "click('20')", k=50,
                                where={"family": "webarena"})
        assert len(found) == len(corpus()) and found[0].episode_id == "e1"
        assert found[0].info["similarity"] == pytest.approx(1.0, abs=1e-4)
        assert reader.stats()["total"] == len(corpus())
        reader.clear()
        assert writer.count() == 0
        server.terminate()
        server.wait(timeout=20)
        with pytest.raises(EnvError, match=re.escape(url)):
            writer.count()


def test_a_buffer_given_its_family_keys_starts_by_it_and_embeds_as_the_named_family_does(
        tmp_path, monkeypatch):
    """The run hands its resolved family to the buffer: its state format keys the starts and
    its features embed exactly as the family's name would have (a task of another family, in
    a buffer shared by families, is keyed by its family's name)."""
    from dreamgym_agents.adapters.webarena.family import WebArenaFamily

    family = WebArenaFamily()
    home = page("laptops", LAPTOPS)
    episode = make_traj("e1", "shop.1", home, config={"start_url": "__SHOPPING__/laptops"})
    found, starts = [], []
    for name, handed in (("named", None), ("given", family)):
        if handed is not None:  # given its family, the buffer (and Chroma) look none up by name
            def no_lookup(*args, **kwargs):
                raise AssertionError("a family looked up by name")
            monkeypatch.setattr("dreamgym_agents.buffer.replay.family_part", no_lookup)
            monkeypatch.setattr("dreamgym_agents.buffer.embedding.family_hash_features",
                                no_lookup)
        with ReplayBuffer(BufferConfig(path=str(tmp_path / name), family="webarena"),
                          handed) as buf:
            assert type(buf._ef._features) is type(family.hash_features(2))
            buf.add(corpus())
            buf.add_trajectories([episode])
            starts.append(buf.start_state("shop.9", start="__SHOPPING__/laptops"))
            found.append([(t.action, round(t.info["similarity"], 6))
                          for t in buf.retrieve(page("laptops", LAPTOPS), "click('20')", k=4)])
    assert found[0] == found[1] and starts == [home, home]
    with pytest.raises(ConfigError, match="opened with the 'webarena' family"):
        ReplayBuffer(BufferConfig(path=str(tmp_path / "x"), family="alfworld"), family)
