"""The embedded recipe's seam: shared fields and each family's own options, set by name, checked
against the family, and keys that only change with what is trained."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from dreamgym_agents.errors import ConfigError
from dreamgym_agents.pipeline.embedded import (
    EmbeddedRecipe,
    NoRecipeOptions,
    family_recipe,
    recipe_for,
)
from dreamgym_agents.pipeline.run import PipelineConfig


def test_a_familys_options_are_its_own_and_set_by_name():
    web = family_recipe("webarena", explorer_tasks=5, judge_repeat=2)
    assert web.options.explorer_tasks == 5 and web.judge_repeat == 2
    assert web.fields()["explorer_tasks"] == 5 and "options" not in web.fields()
    assert family_recipe("alfworld").options.decoy_tasks == 240
    assert family_recipe("tau2", meddler_tasks=3).options.meddler_tasks == 3
    # a web option is no ALFWorld one: refused, with what ALFWorld has
    with pytest.raises(ConfigError, match=r"unknown experience_recipe key\(s\) explorer_tasks; "
                                          r"valid: .*decoy_tasks"):
        family_recipe("alfworld", explorer_tasks=3)
    # a value is checked against its field, the family's own included
    assert family_recipe("tau2", learning_rate="1e-3").learning_rate == 1e-3
    with pytest.raises(ConfigError, match="experience_recipe.meddler_tasks' expects int"):
        family_recipe("tau2", meddler_tasks="many")


def test_the_shared_defaults_ask_nothing_of_a_family():
    """A family without defaults of its own gets no web settings (relabelled endings, verdict
    copies) and no options."""
    from stranger_family import TallyFamily

    made = TallyFamily()
    recipe = recipe_for(made)
    assert recipe == EmbeddedRecipe()
    assert (recipe.judge_repeat, recipe.counterfactual_answers, recipe.counterfactual_stops,
            recipe.final_answer_repeat) == (0, 0, 0, 1)
    assert isinstance(recipe.options, NoRecipeOptions)
    with pytest.raises(ConfigError, match="unknown experience_recipe key"):
        recipe_for(made, quitter_tasks=3)


def test_an_option_changes_the_collection_a_training_field_only_the_model():
    @dataclass(frozen=True)
    class Counts(NoRecipeOptions):
        helper_tasks: int = 0

    class Helped:
        recipe_options = Counts

        @staticmethod
        def embedded_recipe_defaults():
            return {}

    base, more = recipe_for(Helped()), recipe_for(Helped(), helper_tasks=5)
    assert more.collect_key != base.collect_key and more.key != base.key
    trained = recipe_for(Helped(), sft_steps=7)
    assert trained.collect_key == base.collect_key and trained.key != base.key
    # the family's collectors read their counts from its options
    from dreamgym_agents.episodes.family_base import FamilyBase

    class Family(FamilyBase):
        collectors = ("oracle", "helper")
        recipe_options = Counts

        def offline_agents(self, seed=0, noise=0.3):
            return {"oracle": "o", "helper": "h"}

    tasks = list(range(10))
    plan = Family().collection_plan(recipe_for(Family(), helper_tasks=2, oracle_tasks=3), tasks)
    assert [(name, len(chosen)) for name, _, chosen, _ in plan] == [("oracle", 3), ("helper", 2)]


def test_a_run_checks_its_recipe_against_its_family():
    with pytest.raises(ConfigError, match="unknown experience_recipe key"):
        PipelineConfig(task="alfworld", experience_recipe={"quitter_tasks": 3})
    assert PipelineConfig(task="webarena",
                          experience_recipe={"quitter_tasks": 3}).experience_recipe == {
        "quitter_tasks": 3}
    with pytest.raises(ConfigError, match="use_retrieval"):
        PipelineConfig(task="webarena", experience_recipe={"use_retrieval": False})
