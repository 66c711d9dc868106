"""WebArena's own evaluator code, loaded from its PyPI release for the tests to compare against.

``libwebarena`` 0.0.5 is WebArena's code as BrowserGym's WebArena tasks run it (``make standins``
downloads the wheel; it is read from the wheel, never installed: its pins clash with ours). Its
``evaluation_harness/evaluators.py`` and ``helper_functions.py`` run as written; only what they
import for other purposes is stood in for here:

- ``beartype`` (a runtime type checker): the identity decorator;
- ``browser_env.actions`` / ``browser_env.utils`` (the browser environment, gymnasium, PIL):
  ``Action`` and ``StateInfo`` are plain dicts in a trajectory;
- ``llms.providers.openai_utils``: ``generate_from_openai_chat_completion`` records the messages
  WebArena's judges would send and answers with :attr:`Reference.reply`;
- NLTK's ``word_tokenize``: WebArena calls NLTK's with its Punkt model, a download this machine
  does not have; the module is given ours (NLTK's same tokenizer with untrained Punkt when the
  model is absent: ``evaluation.word_tokenize``), so tokenisation is the one thing these
  comparisons do not check independently.
"""

from __future__ import annotations

import json
import os
import sys
import types
import zipfile
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[1]
WHEEL = ROOT / ".cache" / "standins" / "libwebarena-0.0.5-py3-none-any.whl"
PREFIX = "_webarena_reference"
SITE_ENV = {"REDDIT": "http://forum.test:9999", "SHOPPING": "http://shop.test:7770",
            "SHOPPING_ADMIN": "http://admin.test:7780/admin", "GITLAB": "http://git.test:8023",
            "WIKIPEDIA": "http://wiki.test:8888", "MAP": "http://map.test:3000",
            "HOMEPAGE": "http://home.test:4399"}
"""Where WebArena's sites are, for both sides of a comparison."""


class Reference:
    """WebArena's ``StringEvaluator``, ``URLEvaluator`` and judges, loaded from :data:`WHEEL`."""

    def __init__(self, wheel: Path = WHEEL) -> None:
        if not wheel.exists():
            pytest.skip(f"{wheel.name} is not downloaded: run `make standins` (make test does)")
        self.reply = "correct"
        self.sent: list[list[dict[str, Any]]] = []
        self._zip = zipfile.ZipFile(wheel)
        self._stubs()
        self.helpers = self._load("evaluation_harness.helper_functions")
        self.evaluators = self._load("evaluation_harness.evaluators")
        from dreamgym_agents.adapters.webarena.evaluation import word_tokenize

        self.evaluators.word_tokenize = word_tokenize

    @staticmethod
    def _package(name: str, **attrs: Any) -> types.ModuleType:
        module = types.ModuleType(name)
        module.__path__ = []  # a package, so that relative imports below it resolve
        module.__dict__.update(attrs)
        sys.modules[name] = module
        return module

    def _stubs(self) -> None:
        def generate(messages: list[dict[str, Any]], **_: Any) -> str:
            self.sent.append(messages)
            return self.reply

        for package in ("", ".browser_env", ".llms", ".llms.providers", ".evaluation_harness"):
            self._package(PREFIX + package)
        self._package(f"{PREFIX}.browser_env.actions", Action=dict)
        self._package(f"{PREFIX}.browser_env.utils", StateInfo=dict)
        self._package(f"{PREFIX}.llms.providers.openai_utils",
                      generate_from_openai_chat_completion=generate)
        if "beartype" not in sys.modules:
            try:
                import beartype  # noqa: F401
            except ImportError:
                sys.modules["beartype"] = types.ModuleType("beartype")
                sys.modules["beartype"].beartype = lambda f: f  # type: ignore[attr-defined]
        with mock.patch.dict(os.environ, SITE_ENV):  # its module asserts that all are set
            self._load("browser_env.env_config")

    def _load(self, dotted: str) -> types.ModuleType:
        source = self._zip.read("webarena/" + dotted.replace(".", "/") + ".py").decode()
        name = f"{PREFIX}.{dotted}"
        module = types.ModuleType(name)
        module.__package__ = name.rpartition(".")[0]
        module.__file__ = f"{WHEEL.name}/webarena/{dotted.replace('.', '/')}.py"
        sys.modules[name] = module
        exec(compile(source, module.__file__, "exec"), module.__dict__)
        return module

    def string_score(self, config: dict[str, Any], answer: str, tmp: Path) -> float:
        """WebArena's ``StringEvaluator`` on ``answer`` (the last action's answer)."""
        path = tmp / "config.json"
        path.write_text(json.dumps(config), encoding="utf-8")
        return float(self.evaluators.StringEvaluator()([{}, {"answer": answer}], path))

    def url_score(self, config: dict[str, Any], url: str, tmp: Path) -> float:
        """WebArena's ``URLEvaluator`` with the episode ending on ``url``."""
        path = tmp / "config.json"
        path.write_text(json.dumps(config), encoding="utf-8")
        page = types.SimpleNamespace(url=url)
        return float(self.evaluators.URLEvaluator()([{}, {"answer": ""}], path, page))

    def html_score(self, config: dict[str, Any], page: Any, tmp: Path) -> float:
        """WebArena's ``HTMLContentEvaluator`` on a Playwright ``page``."""
        path = tmp / "config.json"
        path.write_text(json.dumps(config), encoding="utf-8")
        return float(self.evaluators.HTMLContentEvaluator()([{}, {"answer": ""}], path, page))
