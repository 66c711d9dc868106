"""The embedded default's build, end to end on a tiny recipe: collect on the bundled site (the
explorer included), add counterfactual answers, seed the buffer, train, mark READY; a recipe that
differs only in training (an ablation) reuses the collected episodes instead of playing them
again."""

from __future__ import annotations

import json

import pytest

from dreamgym_agents.experience.training import read_manifest
from dreamgym_agents.pipeline.embedded import (
    collect_dir,
    embedded_dir,
    ensure_embedded_experience_model,
    family_recipe,
    is_ready,
)
from dreamgym_agents.types import read_trajectories

pytestmark = [pytest.mark.browser, pytest.mark.slow]

W = "webarena"

TINY = dict(oracle_tasks=3, noisy_tasks=1, quitter_tasks=2, random_tasks=1, max_steps=4,
            explorer_tasks=1, explorer_pages=1, explorer_steps=5, order_explorer_tasks=1,
            hidden_size=32, num_layers=1, vocab_size=500, sft_steps=10, batch_size=4,
            counterfactual_answers=1)


def test_tiny_build_then_an_ablation_reuses_the_collection(tmp_path, monkeypatch):
    monkeypatch.setenv("DG_CACHE_DIR", str(tmp_path))
    recipe = family_recipe(W, **TINY)
    said: list[str] = []
    paths = ensure_embedded_experience_model(W, recipe, progress=said.append)
    assert is_ready(recipe, W) and paths["model"] == f"hf/{embedded_dir(recipe, W) / 'model'}"
    assert (collect_dir(recipe, W) / "COMPLETE").exists()
    ready = json.loads((embedded_dir(recipe, W) / "READY").read_text())
    assert ready["timings"]["total_s"] >= ready["timings"]["collect_s"] > 0
    manifest = read_manifest(paths["checkpoint"])
    assert manifest["episodes"] == 3 + 1 + 2 + 1 + 1 + 1
    # The explorer opened a section, then items of its listing, going back after each.
    explored = read_trajectories(collect_dir(recipe, W) / "explorer" / "trajectories.jsonl")
    actions = [t.action for t in explored[0].transitions]
    assert len(actions) == 5 and actions[2] == actions[4] == "go_back()"
    assert "/category/" in explored[0].transitions[0].next_state.splitlines()[0]
    assert "/product/" in explored[0].transitions[1].next_state.splitlines()[0]
    assert explored[0].transitions[2].next_state == explored[0].transitions[1].state
    # The order explorer went to My Account, My Orders, then opened an order and came back.
    orders = read_trajectories(collect_dir(recipe, W) / "orders" / "trajectories.jsonl")
    urls = [t.next_state.splitlines()[0] for t in orders[0].transitions]
    assert urls[0].endswith("/account") and urls[1].endswith("/account/orders")
    assert "/account/orders/1" in urls[2] and urls[3] == urls[1]
    assert manifest["counterfactual_answers"]["per_answer"] == 1
    assert manifest["counterfactual_answers"]["variants"] >= 1  # oracle answers were varied
    assert any("train tasks' episodes (bundled shopping site" in line for line in said)

    ablation = family_recipe(W, **TINY, use_history=False)
    assert ablation.collect_key == recipe.collect_key and ablation.key != recipe.key
    said.clear()
    ensure_embedded_experience_model(W, ablation, progress=said.append)
    assert is_ready(ablation, W)
    assert any("reusing the episodes" in line for line in said)
    assert not any("train tasks' episodes" in line for line in said)
    trained = read_manifest(embedded_dir(ablation, W) / "model")["example_config"]
    assert trained["use_history"] is False


def test_renamed_copies_need_a_family_that_renames():
    """entity_swaps > 0 with a family that cannot rename its episodes is one clear error; 0
    asks nothing of the family and leaves the recipe's key as it was."""
    from dreamgym_agents.errors import ConfigError
    from dreamgym_agents.pipeline.embedded import EmbeddedRecipe, renamed_copies

    assert renamed_copies("webarena", [], 0, 0) == []
    with pytest.raises(ConfigError, match="cannot rename its episodes"):
        renamed_copies("webarena", [], 2, 0)
    assert EmbeddedRecipe(entity_swaps=0).key == EmbeddedRecipe().key != \
        EmbeddedRecipe(entity_swaps=1).key
    assert EmbeddedRecipe(entity_swaps=1).collect_key == EmbeddedRecipe().collect_key
