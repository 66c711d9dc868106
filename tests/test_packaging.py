"""Installed import names stay inside dreamgym_agents; every package folder is listed."""

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAPPED = {"dreamgym_agents": "dreamgym_agents", "adapters": "dreamgym_agents.adapters",
          "prompts": "dreamgym_agents.prompts", "tasks": "dreamgym_agents.tasks",
          "bundles": "dreamgym_agents.bundles"}


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


def test_the_bundle_ships_in_a_wheel(tmp_path):
    """A wheel (not only an editable install) carries every file of the shipped bundle."""
    import subprocess
    import sys
    import zipfile

    shipped = sorted(p.relative_to(ROOT / "bundles").as_posix()
                     for p in (ROOT / "bundles" / "webarena").rglob("*") if p.is_file())
    assert "webarena/manifest.json" in shipped
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("dreamgym_agents-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in shipped if f"dreamgym_agents/bundles/{name}" not in names]
    assert not missing, f"package-data misses {missing}"
