"""Installed import names stay inside dreamgym_agents; every package folder is listed."""

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAPPED = {"dreamgym_agents": "dreamgym_agents", "adapters": "dreamgym_agents.adapters",
          "prompts": "dreamgym_agents.prompts", "tasks": "dreamgym_agents.tasks"}


def test_every_package_folder_is_listed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    assert all(name.startswith("dreamgym_agents") for name in listed)
    found = set()
    for top, name in MAPPED.items():
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top).parts
            found.add(".".join((name, *rel)))
    assert found == listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"


def test_package_data_is_importable():
    from importlib import resources

    assert (resources.files("dreamgym_agents.prompts") / "web_agent.md").is_file()
    assert (resources.files("dreamgym_agents.tasks") / "webarena_shopping" / "test.json").is_file()
