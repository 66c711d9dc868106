import json

import pytest

from dreamgym_agents.adapters.webarena.family import (
    WebArenaFamily,
    _sites_used,
    configured_sites,
    load_config_file,
    resolve_url,
)
from dreamgym_agents.episodes.env import make_family
from dreamgym_agents.errors import ConfigError, TaskError

CONFIG = {
    "sites": ["shopping"], "task_id": 7, "require_login": False, "storage_state": None,
    "start_url": "__SHOPPING__/category/laptops |AND| __REDDIT__", "geolocation": None,
    "intent_template": "x", "instantiation_dict": {}, "intent": "What?", "require_reset": False,
    "eval": {"eval_types": ["string_match"], "reference_answers": {"must_include": ["a"]},
             "reference_url": "", "program_html": []},
}


def test_site_variables_and_wa_prefix():
    sites = configured_sites({"SHOPPING": "http://s:1/", "WA_REDDIT": "http://r:2", "X": "y"})
    assert sites == {"SHOPPING": "http://s:1", "REDDIT": "http://r:2"}
    assert resolve_url("__SHOPPING__/a", {"__SHOPPING__": "http://s:1"}) == "http://s:1/a"


def test_bundled_split_is_fixed_and_disjoint():
    family = WebArenaFamily(environ={})
    train, test = family.load_tasks("train"), family.load_tasks("test")
    assert len(test) >= 60 and len(train) + len(test) >= 300
    assert not {t.task_id for t in train} & {t.task_id for t in test}
    assert all(t.oracle and t.family == "webarena" for t in train + test)
    assert {t.split for t in test} == {"test"}
    with pytest.raises(ConfigError, match="split"):
        family.load_tasks("dev")


def test_real_mode_needs_a_task_file(tmp_path):
    with pytest.raises(ConfigError, match="WEBARENA_TASKS_FILE"):
        WebArenaFamily(environ={"SHOPPING": "http://127.0.0.1:7770"}).load_tasks("test")
    path = tmp_path / "test.raw.json"
    path.write_text(json.dumps([CONFIG]))
    family = WebArenaFamily(environ={"WA_SHOPPING": "http://h", "WEBARENA_TASKS_FILE": str(path)})
    assert family.uses_real_sites
    (task,) = family.load_tasks("test")
    assert task.task_id == "7" and task.intent == "What?"
    with pytest.raises(ConfigError, match="--split test"):
        family.load_tasks("train")


def test_task_file_one_config_or_list(tmp_path):
    one = tmp_path / "one.json"
    one.write_text(json.dumps(CONFIG))
    assert len(load_config_file(one)) == 1
    dup = tmp_path / "dup.json"
    dup.write_text(json.dumps([CONFIG, CONFIG]))
    with pytest.raises(TaskError, match="unique"):
        load_config_file(dup)
    assert _sites_used(load_config_file(one)) == {"SHOPPING", "REDDIT"}


def test_family_registry():
    assert make_family("webarena").name == "webarena"
    assert make_family("webarena.shopping").name == "webarena"


def test_evaluator_deviations_are_opt_in():
    from dreamgym_agents.episodes.env import EnvConfig

    real = WebArenaFamily(environ={"SHOPPING": "http://127.0.0.1:7770"})
    bundled = WebArenaFamily(environ={})
    # real WebArena: WebArena's verdicts; the bundled shop skips the 3 s waits (no verdict moves)
    assert real.eval_deviations(EnvConfig()) == frozenset()
    assert bundled.eval_deviations(EnvConfig()) == {"load_wait"}
    chosen = EnvConfig(options={"eval_deviations": ["url_slash", "page_text"]})
    assert real.eval_deviations(chosen) == {"url_slash", "page_text"}
    assert bundled.eval_deviations(EnvConfig(options={"eval_deviations": []})) == frozenset()
    with pytest.raises(ConfigError, match="unknown evaluator deviation"):
        real.make_env(EnvConfig(options={"eval_deviations": "slash"}))
