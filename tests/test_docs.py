"""The first page and the docs stay true: every command README's table names exists, every
internal link of the docs resolves, and README's headline figures are the committed tables'."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")),
         *sorted((ROOT / "docs").glob("*/README.md")),
         *sorted((ROOT / "adapters").glob("*/README.md"))]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _table_rows(text: str, heading: str) -> list[list[str]]:
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("|")]
    return rows[2:]  # past the header and its rule


def test_readme_is_a_first_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= 160
    assert lines[3].startswith("make run") and lines[4].startswith("make test")


@pytest.mark.parametrize("command", sorted({re.search(r"`dg-agents (\S+)`", r[0]).group(1)
                                            for r in _table_rows(README.read_text(), "Commands")}))
def test_every_command_in_the_readme_exists(command, capsys):
    from dreamgym_agents.cli.main import main

    assert main([command, "--help"]) == 0
    assert "Usage" in capsys.readouterr().out


def test_every_internal_link_resolves():
    broken = []
    for page in PAGES:
        for target in _LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a web address or an anchor of the page itself
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)} → {target}")
    assert not broken, broken


def test_the_readmes_results_are_the_committed_tables():
    rows = _table_rows(README.read_text(), "Results")
    files = {"webarena": "table1_web_k5", "alfworld": "table1_alfworld_k5",
             "tau2": "table1_tau2_k5"}
    assert {r[0].split(" ", 1)[0] for r in rows} == set(files)
    for row in rows:
        table = json.loads((ROOT / "docs" / files[row[0].split(" ", 1)[0]] / "table.json")
                           .read_text())
        by = {r["row"]: r for r in table["rows"]}
        assert f"{table['tasks']} " in row[0]

        def shown(r: dict) -> str:
            return (f"{r['success_mean']:.3f}" if r["row"] == "SFT"
                    else f"{r['success_mean']:.3f} ± {r['success_std']:.3f}")

        assert row[1:4] == [shown(by["SFT"]), shown(by["GRPO-real(N)"]), shown(by["DreamGym"])]
        assert row[5] == shown(by["DreamGym-S2R"])
        paired = by["DreamGym"]["paired"]["SFT"]
        expected = f"{paired['diff']:+.3f} [{paired['low']:+.3f}, {paired['high']:+.3f}]"
        assert row[4] == expected.replace("-", "−")


@pytest.mark.slow
def test_the_readmes_python_example_runs(tmp_path):
    """README's example, as printed there: one stage of dream GRPO from the shipped warm start,
    its policy saved and its figures printed."""
    import subprocess
    import sys

    section = README.read_text().split("## From Python", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(code.strip().splitlines()) <= 15
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    success, transitions, path = done.stdout.split()[-3:]
    assert 0.0 <= float(success) <= 1.0 and int(transitions) > 0
    assert (tmp_path / path / "model.safetensors").is_file()


def _option_tables() -> list[tuple[Path, str, set[str]]]:
    found = []
    for page in PAGES:
        for block in page.read_text().split("\n### `dg-agents ")[1:]:
            command, _, body = block.partition("`")
            rows = [ln for ln in body.split("\n### ", 1)[0].splitlines() if ln.startswith("| `")]
            found.append((page, command, {ln.split("`")[1] for ln in rows}))
    return found


def test_every_options_table_lists_its_commands_options():
    import typer

    from dreamgym_agents.cli.main import app

    tables = _option_tables()
    assert {command for _, command, _ in tables} >= {"bench", "eval", "dream", "calibrate"}
    root = typer.main.get_command(app)
    for page, command, listed in tables:
        cmd = root
        for part in command.split():
            cmd = cmd.commands[part]
        options = {p.opts[0] for p in cmd.params if p.name != "help"}
        assert listed == options, f"{page.name}: dg-agents {command}: {listed ^ options}"


@pytest.mark.parametrize("family", ["webarena", "alfworld", "tau2"])
def test_each_familys_readme_lists_its_settings(family):
    import dataclasses

    from dreamgym_agents.episodes.env import make_family

    made = make_family(family)
    try:
        fields = {f"env.{f.name}" for f in dataclasses.fields(made.env_options)}
    finally:
        made.close()
    section = (ROOT / "adapters" / family / "README.md").read_text().split("## Settings", 1)[1]
    listed = {ln.split("`")[1] for ln in section.splitlines() if ln.startswith("| `env.")}
    assert listed == fields, listed ^ fields
