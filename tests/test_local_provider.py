"""Tests of the in-process ``hf/<path>`` provider and the tiny-checkpoint helper."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the 'train' extra is not installed")

from dreamgym_agents.errors import MissingExtraError, ModelError  # noqa: E402
from dreamgym_agents.gateway.llm import Gateway, LLMConfig, import_litellm  # noqa: E402
from dreamgym_agents.gateway.local import (  # noqa: E402
    LOCAL_PROVIDER,
    ROLE_CHAT_TEMPLATE,
    format_prompt,
    generate_local,
    get_local_provider,
    load_local_model,
    make_tiny_checkpoint,
    register_local_provider,
)

MESSAGES = [
    {"role": "system", "content": "You act in a web page."},
    {"role": "user", "content": "Click the buy button."},
]
CHAT_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt")


def test_make_tiny_checkpoint_is_loadable(checkpoint: str) -> None:
    files = {p.name for p in Path(checkpoint).iterdir()}
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= files
    config = json.loads((Path(checkpoint) / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == 64
    tokenizer, model = load_local_model(checkpoint)
    text = "<think>plan</think><action>click('3')</action> Ünïcode"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text  # byte-level: lossless
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.pad_token == "<|pad|>"
    assert model.config.vocab_size == len(tokenizer)
    assert load_local_model(checkpoint)[1] is model  # loaded once per path


def greedy_text(checkpoint: str, messages: list[dict], max_tokens: int) -> str:
    """What the model writes greedily after the prompt, computed with transformers directly."""
    import torch

    tokenizer, model = load_local_model(checkpoint)
    prompt, templated = format_prompt(tokenizer, messages)
    ids = tokenizer(prompt, add_special_tokens=not templated, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=max_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def test_gateway_runs_a_local_checkpoint(checkpoint: str) -> None:
    gw = Gateway(LLMConfig(model=f"hf/{checkpoint}", max_tokens=8))
    answer = gw.complete(MESSAGES)
    # the model's own greedy continuation of the formatted prompt, through LiteLLM
    assert answer.text == greedy_text(checkpoint, MESSAGES, 8)
    assert answer.usage.calls == 1 and answer.usage.prompt_tokens > 0
    assert 1 <= answer.usage.completion_tokens <= 8
    assert answer.usage.cost_usd == 0.0 and answer.finish_reason in ("stop", "length")
    again = asyncio.run(gw.acomplete(MESSAGES))
    assert again.text == answer.text  # greedy at temperature 0
    assert gw.usage.calls == 2


def test_sampling_and_overrides(checkpoint: str) -> None:
    gw = Gateway(LLMConfig(model=f"hf/{checkpoint}", max_tokens=4, temperature=1.0, top_p=0.9))
    answer = gw.complete(MESSAGES, max_tokens=3)
    assert answer.usage.completion_tokens <= 3
    seeded = [gw.complete(MESSAGES, max_tokens=12, seed=7).text for _ in range(2)]
    assert seeded[0] == seeded[1]  # a seed makes sampling reproducible


def test_stop_strings_cut_the_text(checkpoint: str) -> None:
    # a random model may end a continuation at once: take the first of several prompts it
    # continues for at least 3 characters (one of them always is)
    prompts = [[{"role": "user", "content": text}] for text in (
        "Click the buy button.", "Open the cart page", "price of the lamp?",
        "Search for usb cables", "Sign in, then check my orders", "zzz qqq www")]
    full, messages = next(((r, m) for m in prompts
                           if len((r := generate_local(checkpoint, m, max_tokens=12)).text) >= 3),
                          (None, None))
    assert full is not None, "no prompt gave a continuation of 3 characters"
    stop = full.text[1:3]
    cut = generate_local(checkpoint, messages, max_tokens=12, stop=[stop])
    assert cut.text == full.text[: full.text.find(stop)]
    assert cut.finish_reason == "stop"


def test_prompt_format_plain_and_chat_template(checkpoint: str, tmp_path: Path) -> None:
    plain = "<|system|>\nYou act in a web page.\n<|user|>\nClick the buy button.\n<|assistant|>\n"
    tokenizer, _ = load_local_model(checkpoint)
    # a checkpoint made here carries its plain layout as its chat template: the same prompt
    assert tokenizer.chat_template == ROLE_CHAT_TEMPLATE
    assert format_prompt(tokenizer, MESSAGES) == (plain, True)
    tokenizer.chat_template = None  # one made before it did: the provider's plain layout
    try:
        assert format_prompt(tokenizer, MESSAGES) == (plain, False)
    finally:
        tokenizer.chat_template = ROLE_CHAT_TEMPLATE  # the loaded model is shared
    templated_ckpt = make_tiny_checkpoint(tmp_path / "tpl", chat_template=CHAT_TEMPLATE)
    tokenizer, _ = load_local_model(templated_ckpt)
    prompt, templated = format_prompt(tokenizer, MESSAGES)
    assert templated
    assert prompt == ("[system] You act in a web page.\n[user] Click the buy button.\n[assistant] ")
    answer = Gateway(LLMConfig(model=f"hf/{templated_ckpt}", max_tokens=4)).complete(MESSAGES)
    # the templated prompt is what the model continued (its token count and its text)
    assert answer.usage.prompt_tokens == len(tokenizer(prompt, add_special_tokens=False)
                                              ["input_ids"])
    assert answer.text == greedy_text(templated_ckpt, MESSAGES, 4)


def test_missing_checkpoint_is_a_non_retryable_model_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-checkpoint"
    gw = Gateway(LLMConfig(model=f"hf/{missing}", backoff_initial_s=5.0))
    with pytest.raises(ModelError) as info:
        gw.complete(MESSAGES)  # a retry would sleep 5 s; the error must come at once
    assert not info.value.retryable
    assert str(missing) in str(info.value) and "save_pretrained" in str(info.value)


def test_directory_without_checkpoint_is_a_model_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="could not be loaded"):
        generate_local(tmp_path / "empty", MESSAGES, max_tokens=2)


def test_prompt_longer_than_the_context_is_a_model_error(checkpoint: str) -> None:
    long = [{"role": "user", "content": "word " * 20_000}]
    with pytest.raises(ModelError, match="context") as info:
        Gateway(LLMConfig(model=f"hf/{checkpoint}", max_tokens=4)).complete(long)
    assert not info.value.retryable


def test_max_tokens_is_capped_by_the_context(checkpoint: str) -> None:
    reply = Gateway(LLMConfig(model=f"hf/{checkpoint}", max_tokens=10_000)).complete(MESSAGES)
    assert 0 < reply.usage.completion_tokens


def test_missing_transformers_names_the_extra(
    checkpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(MissingExtraError, match="train"):
        generate_local(checkpoint, MESSAGES)
    with pytest.raises(MissingExtraError, match="train"):  # also through LiteLLM and the gateway
        Gateway(LLMConfig(model=f"hf/{checkpoint}", max_tokens=2)).complete(MESSAGES)


def test_registration_is_idempotent_and_keeps_other_providers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    litellm = import_litellm()
    other = {"provider": "someone-else", "custom_handler": object()}
    stale = {"provider": LOCAL_PROVIDER, "custom_handler": object()}
    monkeypatch.setattr(litellm, "custom_provider_map", [other, stale])
    register_local_provider()
    register_local_provider()
    entries = litellm.custom_provider_map
    assert other in entries
    ours = [e for e in entries if e["provider"] == LOCAL_PROVIDER]
    assert len(ours) == 1 and ours[0]["custom_handler"] is get_local_provider()
    assert isinstance(get_local_provider(), litellm.CustomLLM)


def test_concurrent_requests_share_batches_and_answer_as_alone(
    checkpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from dreamgym_agents.gateway.local import Batcher, _get_loaded

    prompts = [[{"role": "user", "content": f"Page {i}: click the item {'x' * i}."}]
               for i in range(6)]
    alone = [generate_local(checkpoint, p, max_tokens=10 + i) for i, p in enumerate(prompts)]
    loaded = _get_loaded(checkpoint)
    # the reference path (transformers' generate); the fast path's batching: test_engine
    monkeypatch.setattr(loaded, "batcher", Batcher(loaded.model, 1, 16))
    batcher, generate = loaded.batcher, loaded.model.generate
    first = threading.Event()

    def gated(*args, **kwargs):
        # the first batch waits until the other five requests are queued behind it
        if not first.is_set():
            first.set()
            deadline = time.monotonic() + 10
            while len(batcher._queue) < 5 and time.monotonic() < deadline:
                time.sleep(0.005)
        return generate(*args, **kwargs)

    monkeypatch.setattr(loaded.model, "generate", gated)
    before = (batcher.batches, batcher.rows)
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(lambda ip: generate_local(checkpoint, ip[1],
                                                           max_tokens=10 + ip[0]),
                                 enumerate(prompts)))
    assert [g.text for g in together] == [g.text for g in alone]
    assert [g.completion_tokens for g in together] == [g.completion_tokens for g in alone]
    assert [g.finish_reason for g in together] == [g.finish_reason for g in alone]
    batches, rows = batcher.batches - before[0], batcher.rows - before[1]
    # one alone, then the five that queued behind it; on a loaded machine all six may queue
    # before the first batch starts (one batch): either way they shared, never six batches
    assert rows == 6 and batches in (1, 2)


def test_max_batch_setting_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    from dreamgym_agents.gateway.local import _max_batch

    monkeypatch.setenv("DG_LOCAL_MAX_BATCH", "many")
    with pytest.raises(ModelError, match="DG_LOCAL_MAX_BATCH"):
        _max_batch()
    monkeypatch.setenv("DG_LOCAL_MAX_BATCH", "1")
    assert _max_batch() == 1



def test_a_banned_sequence_masks_its_last_token_after_its_head() -> None:
    import torch

    from dreamgym_agents.gateway.local import GenerationRequest, _constrained

    request = GenerationRequest([1, 2], 4, 0.0, None, None, banned=[[5, 7], [9]])
    processor = _constrained([request], width=2)[0]
    after_head = processor(torch.tensor([[1, 2, 5]]), torch.zeros(1, 12))
    assert after_head[0, 7] == float("-inf") and after_head[0, 9] == float("-inf")
    assert torch.isfinite(after_head[0, [0, 5, 8]]).all()
    elsewhere = processor(torch.tensor([[1, 2, 6]]), torch.zeros(1, 12))
    assert torch.isfinite(elsewhere[0, 7]) and elsewhere[0, 9] == float("-inf")
    # the prompt is not the answer: a head that ends the prompt does not count
    first = processor(torch.tensor([[1, 5]]), torch.zeros(1, 12))
    assert torch.isfinite(first[0, 7])


def test_bad_words_are_never_written_and_reach_the_provider_through_the_gateway(
    checkpoint: str,
) -> None:
    import torch

    from dreamgym_agents.gateway.local import bad_word_ids

    tokenizer, model = load_local_model(checkpoint)
    messages = [{"role": "user", "content": "Open the cart page"}]
    prompt, templated = format_prompt(tokenizer, messages)
    ids = tokenizer(prompt, add_special_tokens=not templated, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        first = int(model(input_ids=ids).logits[0, -1].argmax())
    word = tokenizer.decode([first])  # the greedy answer's first token, as a word to ban
    assert [first] in bad_word_ids(tokenizer, [word])
    free = generate_local(checkpoint, messages, max_tokens=8)
    masked = generate_local(checkpoint, messages, max_tokens=8, bad_words=[word])
    assert free.text.startswith(word) and not masked.text.startswith(word)
    # LiteLLM hands the option to the provider; a hosted model's gateway drops it
    gw = Gateway(LLMConfig(model=f"hf/{checkpoint}", max_tokens=8))
    assert gw.complete(messages).text == free.text
    assert gw.complete(messages, bad_words=[word]).text == masked.text
    hosted = Gateway(LLMConfig(model="openai/gpt-4o-mini", mock_response="ok"))
    assert hosted.complete(messages, bad_words=[word]).text == "ok"


def test_an_interrupt_stops_local_generation_until_resumed(checkpoint: str) -> None:
    from dreamgym_agents.gateway.local import (
        interrupt_local_generation,
        resume_local_generation,
    )

    interrupt_local_generation()
    try:
        with pytest.raises(ModelError, match="interrupted") as caught:
            generate_local(checkpoint, MESSAGES, max_tokens=64)
        assert not caught.value.retryable
    finally:
        resume_local_generation()
    assert generate_local(checkpoint, MESSAGES, max_tokens=4).completion_tokens >= 1


def test_a_running_generation_stops_at_its_next_token_when_interrupted(
    checkpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dreamgym_agents.gateway.local import (
        Batcher,
        _get_loaded,
        interrupt_local_generation,
        resume_local_generation,
    )

    loaded = _get_loaded(checkpoint)
    # the reference path (transformers' generate); the fast path's: test_engine
    monkeypatch.setattr(loaded, "batcher", Batcher(loaded.model, 1, 16))
    generate, steps = loaded.model.generate, []

    def counting(*args, **kwargs):
        stop = kwargs["stopping_criteria"]

        class Interrupting:  # interrupts after the third token, as Ctrl-C would
            def __call__(self, input_ids, scores, **kw):
                steps.append(1)
                if len(steps) == 3:
                    interrupt_local_generation()
                return stop[0](input_ids, scores, **kw)

        kwargs["stopping_criteria"] = [Interrupting()]
        kwargs.update(min_new_tokens=200)  # no early end of sequence
        return generate(*args, **kwargs)

    monkeypatch.setattr(loaded.model, "generate", counting)
    try:
        with pytest.raises(ModelError, match="interrupted"):
            generate_local(checkpoint, MESSAGES, max_tokens=200)
    finally:
        resume_local_generation()
    assert len(steps) == 3  # it stopped at once, not 200 tokens later


def test_torch_threads_leave_the_cores_other_processes_keep_busy(monkeypatch):
    from dreamgym_agents.errors import ConfigError
    from dreamgym_agents.gateway import local

    monkeypatch.delenv("DG_TORCH_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(local.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(local.os, "getloadavg", lambda: (1.2, 1.0, 1.0))
    assert local.torch_threads() == 3  # one core busy elsewhere
    monkeypatch.setattr(local.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    assert local.torch_threads() == 1  # at least one
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert local.torch_threads() == 2  # the user's setting
    monkeypatch.setenv("DG_TORCH_THREADS", "4")
    assert local.torch_threads() == 4
    monkeypatch.setenv("DG_TORCH_THREADS", "many")
    with pytest.raises(ConfigError, match="DG_TORCH_THREADS='many'"):
        local.torch_threads()
