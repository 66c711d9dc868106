"""Bad input: one clear error line on stderr, a non-zero exit, never a traceback."""

import json
import os
import subprocess
import sys

import pytest

GOOD_CONFIG = {
    "sites": ["shopping"], "task_id": 1, "require_login": False, "storage_state": None,
    "start_url": "__SHOPPING__", "geolocation": None, "intent_template": "Say hi",
    "instantiation_dict": {}, "intent": "Say hi", "require_reset": False,
    "eval": {"eval_types": ["string_match"], "reference_answers": {"exact_match": "hi"},
             "reference_url": "", "program_html": []},
}


def dg(*args, env=None):
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("SHOPPING", "WA_SHOPPING", "WEBARENA_TASKS_FILE")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "dreamgym_agents.cli.main", *args],
                          capture_output=True, text=True, env=full_env, timeout=120)


def assert_one_line_error(proc, *needles):
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("args,needle", [
    (["--split", "dev"], "dev"),
    (["--limit", "0"], "--limit"),
    (["--concurrency", "many"], "--concurrency"),
    (["--task", "alfworld-in-space"], "unknown task family"),
    (["--set", "bogus.key=1"], "bogus.key"),
    (["--set", "env.max_stepz=3"], "max_stepz"),
    (["--set", "env.action_timeout_s=0"], "env.action_timeout_s must be positive"),
    (["--task", "alfworld", "--set", "env.headless=false"], "env.headless"),
    (["--set", "env.max_steps=0"], "max_steps"),
    (["--agent", "notaprovider/xyz"], "notaprovider"),
    (["--config", "/nonexistent/dg.yaml"], "config file not found"),
])
def test_bad_cli_values(tmp_path, args, needle):
    assert_one_line_error(dg("eval", "--out", str(tmp_path / "o"), *args), needle)


def test_missing_out_is_one_line():
    assert_one_line_error(dg("eval"), "--out")


def test_malformed_task_json(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('[{"task_id": 1, "intent": ')
    assert_one_line_error(dg("eval", "--tasks", str(bad), "--out", str(tmp_path / "o")),
                          "not valid JSON")
    incomplete = tmp_path / "incomplete.json"
    incomplete.write_text(json.dumps({"task_id": 3, "intent": "x"}))
    assert_one_line_error(dg("eval", "--tasks", str(incomplete), "--out", str(tmp_path / "o")),
                          "task 3")
    assert_one_line_error(dg("eval", "--tasks", str(tmp_path / "nope.json"), "--out",
                             str(tmp_path / "o")), "not found")


@pytest.mark.browser
def test_unreachable_site(tmp_path):
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps(GOOD_CONFIG))
    proc = dg("eval", "--out", str(tmp_path / "o"),
              env={"SHOPPING": "http://127.0.0.1:9", "WEBARENA_TASKS_FILE": str(tasks)})
    assert_one_line_error(proc, "unreachable", "SHOPPING")


def test_real_sites_without_task_file(tmp_path):
    proc = dg("eval", "--out", str(tmp_path / "o"), env={"WA_SHOPPING": "http://127.0.0.1:9"})
    assert_one_line_error(proc, "WEBARENA_TASKS_FILE")


def test_doctor_reports_keys_without_values():
    proc = dg("doctor", env={"OPENAI_API_KEY": "sk-secret-value-123", "COLUMNS": "200"})
    assert "sk-secret-value-123" not in proc.stdout + proc.stderr
    assert "OPENAI_API_KEY" in proc.stdout and "chromium" in proc.stdout


def test_no_arguments_prints_help_without_error():
    proc = dg()
    assert proc.returncode == 0 and "Usage" in proc.stdout and "error" not in proc.stderr


def test_string_settings_are_verbatim():
    from dreamgym_agents.config import load_config
    from dreamgym_agents.gateway.llm import LLMConfig

    cfg = load_config(LLMConfig(model="openai/x"), None,
                      ["mock_response=URL: x", "temperature=0.5", "stop=[a, b]"])
    assert cfg.mock_response == "URL: x" and cfg.temperature == 0.5 and cfg.stop == ["a", "b"]


def test_float_settings_take_exponents():
    """YAML 1.1 reads ``1e-3`` as a string; a float field still takes it."""
    from dreamgym_agents.config import load_config
    from dreamgym_agents.errors import ConfigError
    from dreamgym_agents.rl.grpo import GRPOStageConfig

    assert load_config(GRPOStageConfig(), None, ["learning_rate=1e-3"]).learning_rate == 1e-3
    with pytest.raises(ConfigError, match="expects float"):
        load_config(GRPOStageConfig(), None, ["learning_rate=fast"])


def test_doctor_says_what_to_install_without_a_browser(monkeypatch, capsys):
    import dreamgym_agents.adapters.webarena.chromium as chromium
    from dreamgym_agents.cli.doctor import run_doctor

    monkeypatch.setattr(chromium, "find_chromium", lambda: None)
    monkeypatch.setenv("COLUMNS", "250")
    assert run_doctor() == 1
    out = capsys.readouterr().out
    assert "apt-get install chromium" in out and "DG_CHROMIUM" in out


def test_config_file_then_flags_then_set(tmp_path):
    """A config file's env.max_steps holds unless --max-steps or --set overrides it."""
    import yaml

    from dreamgym_agents.cli.common import Sections
    from dreamgym_agents.episodes.env import EnvConfig

    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(yaml.safe_dump({"env": {"max_steps": 7, "seed": 3}}))
    assert Sections(cfg_file, None, ("env",)).configure(EnvConfig(), "env", {}).max_steps == 7
    flagged = Sections(cfg_file, None, ("env",)).configure(EnvConfig(), "env", {"max_steps": 9})
    assert flagged.max_steps == 9 and flagged.seed == 3
    overridden = Sections(cfg_file, ["env.max_steps=11"], ("env",)).configure(
        EnvConfig(), "env", {"max_steps": 9})
    assert overridden.max_steps == 11


def test_a_familys_own_env_settings_are_its_own(tmp_path):
    """The core's EnvConfig holds the settings every family shares; any other ``env`` key is
    the family's, read as its ``env_options`` (a browser's for the web family, the expert for
    ALFWorld) and refused, naming the valid keys, by a family that does not take it."""
    import dataclasses

    import yaml

    from dreamgym_agents.cli.common import Sections
    from dreamgym_agents.episodes.env import EnvConfig, env_options, make_family
    from dreamgym_agents.errors import ConfigError

    assert {f.name for f in dataclasses.fields(EnvConfig)} == {
        "max_steps", "seed", "judge_model", "options"}
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(yaml.safe_dump({"env": {"max_steps": 7, "key_settle_s": 0.5}}))
    cfg = Sections(cfg_file, ["env.headless=false", "env.site_reset=http://h:80/reset?a=b"],
                   ("env",)).configure(EnvConfig(), "env", {})
    assert cfg.max_steps == 7
    web = env_options(make_family("webarena"), cfg)
    assert (web.headless, web.key_settle_s, web.site_reset) == (False, 0.5,
                                                                "http://h:80/reset?a=b")
    assert web.action_timeout_s == 2.0  # the rest: the family's defaults
    with pytest.raises(ConfigError, match=r"unknown config key 'env\.(key_settle_s|headless)'"
                       r".*valid keys: env\.expert, env\.processes, env\.game_timeout_s, "
                       r"env\.max_steps"):
        env_options(make_family("alfworld"), cfg)
    assert env_options(make_family("alfworld"), EnvConfig(options={"expert": False})).expert \
        is False

    class Plain:
        name = "plain"

    assert env_options(Plain(), EnvConfig()) is None
    with pytest.raises(ConfigError, match="env.headless.*takes none"):
        env_options(Plain(), cfg)


def test_a_gateways_requests_in_flight_follow_the_runs_concurrency_unless_set(tmp_path):
    import yaml

    from dreamgym_agents.cli.common import Sections

    def limit(config=None, overrides=None, concurrency=None):
        gateway = Sections(config, overrides, ("llm",)).gateway("openai/m", "llm", concurrency)
        try:
            return gateway.cfg.max_concurrency
        finally:
            gateway.close()

    assert limit() == 4  # no run to follow: the gateway's own default
    assert limit(concurrency=64) == 64
    assert limit(overrides=["llm.max_concurrency=8"], concurrency=64) == 8
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(yaml.safe_dump({"llm": {"max_concurrency": 2}}))
    assert limit(config=cfg_file, concurrency=64) == 2


def test_set_adds_to_a_mapping_setting_of_the_config_file(tmp_path):
    """``--set policy_llm.temperature=…`` keeps the file's ``policy_llm.api_base``."""
    from dreamgym_agents.config import load_config
    from dreamgym_agents.pipeline.run import PipelineConfig

    path = tmp_path / "run.yaml"
    path.write_text("policy_llm:\n  api_base: http://127.0.0.1:8000/v1\n  temperature: 1.0\n")
    cfg = load_config(PipelineConfig(), path, ["policy_llm.temperature=0.2"])
    assert cfg.policy_llm == {"api_base": "http://127.0.0.1:8000/v1", "temperature": 0.2}


def test_set_overrides_are_checked_together():
    """Fields checked jointly (micro_batch divides tasks × generations) see every --set, so
    their order on the command line does not matter."""
    from dreamgym_agents.config import load_config
    from dreamgym_agents.errors import ConfigError
    from dreamgym_agents.rl.grpo import GRPOStageConfig

    cfg = load_config(GRPOStageConfig(), None, ["tasks_per_step=1", "num_generations=2",
                                                 "micro_batch=2"])
    assert (cfg.tasks_per_step, cfg.num_generations, cfg.micro_batch) == (1, 2, 2)
    with pytest.raises(ConfigError, match="micro_batch"):
        load_config(GRPOStageConfig(), None, ["tasks_per_step=1", "num_generations=2",
                                              "micro_batch=3"])


def test_a_family_adds_its_own_commands(capsys):
    """The web family's ``site`` command comes from its ``dreamgym_agents.commands`` entry
    point, not from the core CLI; it serves and stops the bundled shop."""
    import importlib.metadata
    import socket

    from dreamgym_agents.cli.main import main

    names = {ep.name for ep in importlib.metadata.entry_points(group="dreamgym_agents.commands")}
    assert "webarena" in names
    with socket.socket() as s:  # a port taken: one clear line, exit 1
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["site", "--port", str(port)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot serve on 127.0.0.1:{port}" in err[0]


def test_ctrl_c_interrupts_local_generation_and_the_handler_is_restored():
    import signal

    from dreamgym_agents.cli import main as cli_main
    from dreamgym_agents.gateway import local

    before = signal.getsignal(signal.SIGINT)
    seen = []
    original = cli_main._main

    def spy(argv):
        seen.append(signal.getsignal(signal.SIGINT))
        return 0

    cli_main._main = spy
    try:
        assert cli_main.main(["--help"]) == 0
    finally:
        cli_main._main = original
    assert seen == [cli_main._on_sigint] and signal.getsignal(signal.SIGINT) is before
    try:
        with pytest.raises(KeyboardInterrupt):
            cli_main._on_sigint(signal.SIGINT, None)
        assert local.interrupted()
    finally:
        local.resume_local_generation()
    # the next command in this process is not taken for one that signal stopped (a stale
    # flag once made every later command of a test worker exit 130)
    import typer

    quiet = typer.Typer()
    quiet.command()(lambda: None)
    quiet.command("other")(lambda: None)
    original_app = cli_main.app
    cli_main.app = quiet
    try:
        assert cli_main.main(["<lambda>"]) == 0
    finally:
        cli_main.app = original_app


@pytest.mark.parametrize("signame, status, line", [
    ("SIGTERM", 143, "terminated (SIGTERM): rerun the same command to resume"),
    ("SIGINT", 130, "interrupted: rerun the same command to resume")])
def test_a_signal_ends_a_command_with_one_line_saying_so(signame, status, line):
    """``kill`` (SIGTERM) and Ctrl-C (SIGINT) end a command with one line saying what happened
    and how to go on (typer alone would exit 130 without a word)."""
    import signal
    import subprocess
    import sys

    code = ("import sys, time, typer\n"
            "import dreamgym_agents.cli.main as m\n"
            "app = typer.Typer()\n"
            "@app.command()\n"
            "def slow():\n"
            "    print('ready', flush=True)\n"
            "    time.sleep(60)\n"
            "@app.command()\n"
            "def other():\n"
            "    pass\n"
            "m.app = app\n"
            "sys.exit(m.main(['slow']))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(getattr(signal, signame))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == status
    assert err.strip().splitlines()[-1] == line
