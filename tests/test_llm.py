"""Tests of the model gateway (offline: mock responses, a fake litellm, a local HTTP server)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fakes_openai_server import serve_openai_compatible

from dreamgym_agents.errors import ConfigError, ModelError
from dreamgym_agents.gateway.llm import (
    Completion,
    Gateway,
    LLMConfig,
    import_litellm,
    split_reasoning,
)
from dreamgym_agents.types import ModelUsage

REPO = Path(__file__).resolve().parents[1]
SECRET = "sk-test-secret-0123456789"
MESSAGES = [{"role": "user", "content": "Pick an action."}]
THINK_ANSWER = "<think>plan</think><action>click('3')</action>"


@pytest.fixture()
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("DG_FAKE_API_KEY", SECRET)
    return "DG_FAKE_API_KEY"


@pytest.fixture()
def server_factory():
    servers = []

    def start(script):
        server = serve_openai_compatible(script)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def _http_cfg(base_url: str, key_env: str, **kw: Any) -> LLMConfig:
    defaults: dict[str, Any] = {"backoff_initial_s": 0.01, "backoff_max_s": 0.05, "timeout_s": 10}
    defaults.update(kw)
    return LLMConfig(**{"model": "openai/test-model", **defaults}, api_base=base_url,
                     api_key_env=key_env)


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"model": ""}, "llm.model is empty"),
        ({"model": "hf/"}, "checkpoint directory"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"max_retries": -1}, "max_retries"),
        ({"temperature": -0.1}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"top_p": 1.5}, "top_p"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"backoff_initial_s": 5.0, "backoff_max_s": 1.0}, "backoff"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"extra": {"api_key": "x"}}, "api_key_env"),
        ({"extra": {"temperature": 0.3}}, "temperature"),
    ],
)
def test_config_validation_says_what_to_fix(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        LLMConfig(**kwargs)


def test_config_api_key_env_must_be_a_name_and_is_never_echoed() -> None:
    with pytest.raises(ConfigError) as info:
        LLMConfig(api_key_env=SECRET)
    assert SECRET not in str(info.value)
    assert "NAME of an environment variable" in str(info.value)


def test_config_defaults_and_stop_string() -> None:
    cfg = LLMConfig(model="ollama/qwen2.5", stop="</action>")
    assert cfg.stop == ["</action>"]
    assert not cfg.is_local and LLMConfig(model="hf/some/dir").is_local


# ---------------------------------------------------------------- completions


def test_completion_full_text_and_split_reasoning() -> None:
    assert split_reasoning(THINK_ANSWER) == ("plan", "<action>click('3')</action>")
    assert split_reasoning("<action>noop()</action>") == ("", "<action>noop()</action>")
    assert Completion(text="a", reasoning="r").full_text == "<think>r</think>a"
    assert Completion(text="a").full_text == "a"


def test_mock_response_sync_and_async_accumulate_usage() -> None:
    gw = Gateway(LLMConfig(model="openai/gpt-4o-mini", mock_response="<action>noop()</action>"))
    first = gw.complete(MESSAGES)
    second = asyncio.run(gw.acomplete(MESSAGES, mock_response=THINK_ANSWER))
    assert first.text == "<action>noop()</action>" and first.reasoning == ""
    assert not first.cached and first.model == "openai/gpt-4o-mini" and first.latency_s >= 0
    # the mock path does not move <think> out of the content: the gateway does it uniformly
    assert (second.text, second.reasoning) == ("<action>click('3')</action>", "plan")
    assert second.full_text == THINK_ANSWER
    usage = gw.usage
    assert usage.calls == 2
    assert usage.prompt_tokens == first.usage.prompt_tokens + second.usage.prompt_tokens > 0
    assert usage.completion_tokens == first.usage.completion_tokens * 2 > 0
    assert usage.cost_usd == 0.0  # mock answers cost nothing
    assert gw.reset_usage().calls == 2 and gw.usage == ModelUsage()


def test_complete_works_inside_a_running_event_loop() -> None:
    gw = Gateway(LLMConfig(mock_response="inside"))

    async def caller() -> str:
        return gw.complete(MESSAGES).text  # sync call from a coroutine: must not deadlock

    assert asyncio.run(caller()) == "inside"
    assert asyncio.run(caller()) == "inside"  # a second, fresh loop works too


def test_usage_totals_are_thread_safe() -> None:
    gw = Gateway(LLMConfig(mock_response="ok", max_concurrency=8))
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: gw.complete(MESSAGES), range(40)))
    assert gw.usage.calls == 40


def _fake_response(text: str = "ok") -> Any:
    from litellm.types.utils import ModelResponse

    return ModelResponse(
        model="fake",
        choices=[
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
        ],
        usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    )


class _InFlight:
    """A fake ``litellm.acompletion`` that records how many calls overlap."""

    def __init__(self, delay_s: float = 0.02) -> None:
        self.delay_s = delay_s
        self.now = 0
        self.peak = 0
        self.calls = 0
        self.lock = threading.Lock()

    async def __call__(self, **kwargs: Any) -> Any:
        with self.lock:
            self.now += 1
            self.calls += 1
            self.peak = max(self.peak, self.now)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            with self.lock:
                self.now -= 1
        return _fake_response()


def test_concurrency_bound_holds_for_async_callers(monkeypatch: pytest.MonkeyPatch) -> None:
    litellm = import_litellm()
    fake = _InFlight()
    monkeypatch.setattr(litellm, "acompletion", fake)
    gw = Gateway(LLMConfig(model="openai/fake", max_concurrency=3))

    async def run_all() -> list[Completion]:
        return await asyncio.gather(*(gw.acomplete(MESSAGES) for _ in range(12)))

    answers = asyncio.run(run_all())
    assert [a.text for a in answers] == ["ok"] * 12
    assert fake.calls == 12 and fake.peak == 3
    assert gw.usage.prompt_tokens == 36 and gw.usage.cost_usd == 0.0  # unknown price → 0


def test_concurrency_bound_holds_across_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    litellm = import_litellm()
    fake = _InFlight(delay_s=0.05)
    monkeypatch.setattr(litellm, "acompletion", fake)
    gw = Gateway(LLMConfig(model="openai/fake", max_concurrency=2))
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda _: gw.complete(MESSAGES), range(12)))
    assert fake.calls == 12 and fake.peak == 2


def test_a_bug_is_not_turned_into_a_model_error(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(**kwargs: Any) -> Any:
        raise KeyError("bug in the caller's code")

    monkeypatch.setattr(import_litellm(), "acompletion", broken)
    with pytest.raises(KeyError):
        Gateway(LLMConfig(model="openai/fake")).complete(MESSAGES)


# ---------------------------------------------------------------- HTTP: retries and errors


def test_retries_rate_limits_and_5xx_then_succeeds(server_factory, api_key: str) -> None:
    server = server_factory([(429, "slow down"), (500, "boom"), (503, "busy"), (200, "done")])
    gw = Gateway(_http_cfg(server.base_url, api_key))
    answer = gw.complete(MESSAGES)
    assert answer.text == "done"
    assert len(server.requests) == 4
    assert gw.usage.calls == 1  # failed attempts are not billed calls
    assert server.headers[-1]["authorization"] == f"Bearer {SECRET}"  # key read from the env


def test_retry_honours_retry_after_but_caps_it(
    server_factory, api_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = server_factory([(429, "slow", {"Retry-After": "100"}), (200, "done")])
    gw = Gateway(_http_cfg(server.base_url, api_key, backoff_max_s=0.25))
    caplog.set_level(logging.WARNING, logger="dreamgym_agents.gateway.llm")
    assert gw.complete(MESSAGES).text == "done"
    assert "retry 1/4 in 0.25s" in caplog.text  # Retry-After: 100 capped at backoff_max_s


def test_retries_exhausted_raise_a_retryable_model_error(server_factory, api_key: str) -> None:
    server = server_factory([(502, "bad gateway")])
    gw = Gateway(_http_cfg(server.base_url, api_key, max_retries=2))
    with pytest.raises(ModelError) as info:
        gw.complete(MESSAGES)
    assert info.value.retryable
    assert len(server.requests) == 3
    message = str(info.value)
    assert "openai/test-model" in message and "502" in message and "\n" not in message


def test_timeout_is_retried(server_factory, api_key: str) -> None:
    def slow(body: dict) -> tuple[int, str]:
        time.sleep(1.0)
        return (200, "late")

    server = server_factory(slow)
    gw = Gateway(_http_cfg(server.base_url, api_key, timeout_s=0.3, max_retries=1))
    with pytest.raises(ModelError) as info:
        gw.complete(MESSAGES)
    assert info.value.retryable and "Timeout" in str(info.value)
    assert len(server.requests) == 2


def test_auth_failure_fails_fast_and_never_shows_the_key(
    server_factory, api_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = server_factory([(401, f"Incorrect API key provided: {SECRET}")])
    gw = Gateway(_http_cfg(server.base_url, api_key))
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ModelError) as info:
        gw.complete(MESSAGES)
    err = info.value
    assert not err.retryable
    assert len(server.requests) == 1
    assert "openai/test-model" in str(err) and "AuthenticationError" in str(err)
    shown = [str(err), repr(err)]
    cause: BaseException | None = err
    while cause is not None:  # a traceback would print the whole chain
        shown.append(str(cause))
        cause = cause.__cause__ if cause.__suppress_context__ else cause.__context__
    assert all(SECRET not in text for text in shown)
    assert SECRET not in caplog.text
    assert SECRET not in repr(gw) and SECRET not in repr(gw.cfg)


def test_bad_request_is_not_retried(server_factory, api_key: str) -> None:
    server = server_factory([(400, "context too long")])
    with pytest.raises(ModelError) as info:
        Gateway(_http_cfg(server.base_url, api_key)).complete(MESSAGES)
    assert not info.value.retryable and len(server.requests) == 1


def test_unset_key_variable_is_a_config_error(server_factory) -> None:
    server = server_factory([(200, "never")])
    gw = Gateway(_http_cfg(server.base_url, "DG_SURELY_UNSET_KEY_VAR"))
    with pytest.raises(ConfigError, match="DG_SURELY_UNSET_KEY_VAR"):
        gw.complete(MESSAGES)
    assert server.requests == []


def test_sampling_params_and_overrides_reach_the_server(server_factory, api_key: str) -> None:
    server = server_factory([(200, "ok")])
    cfg = _http_cfg(server.base_url, api_key, max_tokens=64, stop=["</action>"], top_p=0.9)
    gw = Gateway(cfg)
    gw.complete(MESSAGES)
    gw.complete(MESSAGES, max_tokens=7, top_p=None, seed=3)
    first, second = server.requests
    assert first["max_tokens"] == 64 and first["stop"] == ["</action>"] and first["top_p"] == 0.9
    assert first["messages"] == MESSAGES and first["temperature"] == 0.0
    assert second["max_tokens"] == 7 and "top_p" not in second and second["seed"] == 3
    with pytest.raises(ValueError, match="api_key"):
        gw.complete(MESSAGES, api_key="nope")


def test_bad_words_reach_a_served_model_in_its_servers_field(server_factory, api_key: str) -> None:
    """A local model masks a call's ``bad_words`` itself; vLLM takes them as ``bad_words``,
    ``transformers serve`` as the token ids of a ``generation_config``; a hosted API gets none
    (it would refuse the unknown field)."""
    from dreamgym_agents.gateway.local import bad_word_ids

    AutoTokenizer = pytest.importorskip("transformers").AutoTokenizer
    checkpoint = str(Path(__file__).parents[1] / "bundles" / "alfworld" / "experience")
    words = ["@1", "@seen"]
    server = server_factory([(200, "ok")])
    for model, setting in (("hosted_vllm/m", "auto"), (f"openai/{checkpoint}", "transformers"),
                           ("openai/m", "auto"), ("hosted_vllm/m", "off"),
                           (f"openai/{checkpoint}", "vllm")):
        Gateway(_http_cfg(server.base_url, api_key, model=model, server_bad_words=setting)
                ).complete(MESSAGES, bad_words=words)
    vllm, served, hosted, off, vllm_by_path = server.requests
    assert vllm["bad_words"] == words and "generation_config" not in vllm
    ids = bad_word_ids(AutoTokenizer.from_pretrained(checkpoint), words)
    assert json.loads(served["generation_config"]) == {"bad_words_ids": ids} and len(ids) == 4
    assert "bad_words" not in served
    for body in (hosted, off):
        assert "bad_words" not in body and "generation_config" not in body
    assert vllm_by_path["bad_words"] == words


@pytest.mark.parametrize(("model", "setting", "needle"), [
    ("openai/m", "sometimes", "must be one of auto, vllm, transformers, off"),
    ("openai/gpt-4o-mini", "transformers", "must name its directory"),
])
def test_server_bad_words_setting_is_checked(model: str, setting: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        LLMConfig(model=model, server_bad_words=setting)


def test_think_block_is_returned_as_reasoning(server_factory, api_key: str) -> None:
    server = server_factory([(200, THINK_ANSWER)])
    answer = Gateway(_http_cfg(server.base_url, api_key)).complete(MESSAGES)
    assert answer.text == "<action>click('3')</action>"
    assert answer.reasoning == "plan"
    assert answer.full_text == THINK_ANSWER


# ---------------------------------------------------------------- disk cache


def test_disk_cache_hit_makes_no_request(server_factory, api_key: str, tmp_path: Path) -> None:
    server = server_factory([(200, THINK_ANSWER)])
    cfg = _http_cfg(server.base_url, api_key, cache_dir=str(tmp_path / "cache"))
    gw = Gateway(cfg)
    first = gw.complete(MESSAGES)
    second = gw.complete(MESSAGES)
    assert not first.cached and second.cached
    assert (second.text, second.reasoning, second.full_text) == (
        first.text,
        first.reasoning,
        first.full_text,
    )
    assert len(server.requests) == 1
    assert second.usage == ModelUsage(cache_hits=1)
    assert gw.usage.calls == 1 and gw.usage.cache_hits == 1
    # the cache outlives the gateway (reproducible reruns) ...
    gw.close()
    again = Gateway(cfg).complete(MESSAGES)
    assert again.cached and len(server.requests) == 1
    # ... and is keyed by the request: other messages or other sampling params miss
    Gateway(cfg).complete([{"role": "user", "content": "Something else."}])
    Gateway(cfg).complete(MESSAGES, max_tokens=5)
    assert len(server.requests) == 3


def test_disk_cache_skips_sampled_answers_unless_asked(
    server_factory, api_key: str, tmp_path: Path
) -> None:
    server = server_factory([(200, "sampled")])
    cfg = _http_cfg(server.base_url, api_key, cache_dir=str(tmp_path), temperature=0.7)
    gw = Gateway(cfg)
    gw.complete(MESSAGES)
    assert not gw.complete(MESSAGES).cached
    assert len(server.requests) == 2
    sampled = Gateway(
        _http_cfg(
            server.base_url, api_key, cache_dir=str(tmp_path), temperature=0.7, cache_sampled=True
        )
    )
    sampled.complete(MESSAGES)
    assert sampled.complete(MESSAGES).cached and len(server.requests) == 3


def test_unwritable_cache_dir_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match="cache_dir"):
        Gateway(LLMConfig(cache_dir=str(blocker / "cache")))


# ---------------------------------------------------------------- import is offline and cheap

NO_NETWORK = textwrap.dedent(
    """
    import socket
    attempts = []  # every connection the script tries (each refused)
    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network disabled in this test")
    socket.socket.connect = refuse
    socket.socket.connect_ex = refuse
    socket.create_connection = refuse
    socket.getaddrinfo = refuse
    """
)
"""The preamble of a script that must run offline: it records and refuses any connection."""



def test_import_touches_no_network(tmp_path: Path) -> None:
    script = NO_NETWORK + textwrap.dedent(
        """
        import sys
        import dreamgym_agents.gateway.llm as llm
        assert "litellm" not in sys.modules, "litellm must be imported lazily"
        llm.import_litellm()
        gw = llm.Gateway(llm.LLMConfig(model="openai/gpt-4o-mini", mock_response="offline"))
        assert gw.complete([{"role": "user", "content": "hi"}]).text == "offline"
        assert attempts == [], attempts
        print("OK")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "LITELLM_LOCAL_MODEL_COST_MAP"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("OK")


def test_prepare_does_the_first_request_set_up_once_and_offline(tmp_path: Path) -> None:
    """``Gateway.prepare`` (what the CLI does before a run) sends nothing; a mocked or local
    model needs no set-up; after it, a process's first requests skip the set-up step."""
    script = NO_NETWORK + textwrap.dedent(
        """
        import dreamgym_agents.gateway.llm as llm
        from dreamgym_agents.gateway.litellm_setup import request_path_ready
        llm.Gateway(llm.LLMConfig(model="openai/gpt-4o-mini", mock_response="x")).prepare()
        assert not request_path_ready(), "a mocked model needs no set-up"
        gw = llm.Gateway(llm.LLMConfig(model="openai/gpt-4o-mini",
                                       api_base="http://127.0.0.1:9/v1"))
        gw.prepare()
        assert request_path_ready()
        gw.prepare()  # once per process: a second call does nothing
        assert attempts == [], attempts
        assert gw.usage.calls == 0
        print("OK")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("OK")


def test_a_set_up_litellm_refuses_is_not_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """The set-up ahead is an optimisation: should LiteLLM refuse its mocked call, ``prepare``
    raises nothing and the first requests do the set-up themselves."""
    from dreamgym_agents.gateway import litellm_setup

    litellm = import_litellm()

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("this LiteLLM release refuses the mocked call")

    monkeypatch.setattr(litellm_setup, "_REQUEST_PATH_READY", False)
    monkeypatch.setattr(litellm, "completion", refuse)
    Gateway(LLMConfig(model="openai/gpt-4o-mini")).prepare()
    assert litellm_setup.request_path_ready()


def test_a_priced_models_answers_are_counted_at_its_price(server_factory, api_key) -> None:
    """A model LiteLLM knows the price of: each answer's cost at that price (LiteLLM's own
    figure for the answer, not priced twice); an unpriced model's answers count 0."""
    litellm = import_litellm()
    server = server_factory([(200, "one two three four")])
    gw = Gateway(LLMConfig(model="openai/gpt-4o-mini", api_base=server.base_url,
                           api_key_env=api_key))
    first = gw.complete(MESSAGES)
    second = gw.complete(MESSAGES)
    prompt, completion = litellm.cost_per_token(
        model="gpt-4o-mini", prompt_tokens=first.usage.prompt_tokens,
        completion_tokens=first.usage.completion_tokens)
    assert first.usage.cost_usd == pytest.approx(prompt + completion) and first.usage.cost_usd > 0
    assert gw.usage.cost_usd == pytest.approx(first.usage.cost_usd + second.usage.cost_usd)
    unpriced = Gateway(_http_cfg(server.base_url, api_key))  # openai/test-model
    assert unpriced.complete(MESSAGES).usage.cost_usd == 0.0
    assert unpriced.complete(MESSAGES).usage.cost_usd == 0.0
