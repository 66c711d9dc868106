"""The fast path of local generation (continuous batching, KV cache, prefix cache) against the
reference path (transformers' ``generate``): same greedy answers, same constraints, the
log-probabilities a trainer scores with, requests joining a running batch."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the 'train' extra is not installed")

from dreamgym_agents.errors import ModelError  # noqa: E402
from dreamgym_agents.gateway.engine import (  # noqa: E402
    ContinuousBatcher,
    fast_path_refusal,
)
from dreamgym_agents.gateway.local import (  # noqa: E402
    Batcher,
    GenerationRequest,
    interrupt_local_generation,
    load_causal_lm,
    make_batcher,
    make_tiny_checkpoint,
    resume_local_generation,
)

TIE = 1e-3
"""Two candidates closer than this in logit are a floating-point tie: either path may pick
either (a batch's rows are summed in another order than a lone row)."""


@pytest.fixture(scope="module")
def decisive(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny checkpoint whose weights are drawn wide (std 0.2, embeddings 1.0): its greedy
    answers vary with the prompt and are seldom decided by a tie (a default initialisation
    repeats one token whatever the prompt, which would pass any broken attention)."""
    import torch

    path = make_tiny_checkpoint(tmp_path_factory.mktemp("engine") / "ckpt", num_layers=3,
                                seed=3)
    tokenizer, model = load_causal_lm(path)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                std = 1.0 if "embed" in name else 0.2
                param.copy_(torch.randn(param.shape, generator=generator) * std)
    model.save_pretrained(path)
    return path


@pytest.fixture()
def model(decisive: str):
    tokenizer, model = load_causal_lm(decisive)
    model.eval()
    return tokenizer, model


def prompts(tokenizer, n: int = 6) -> list[list[int]]:
    texts = [f"<|user|>\nPage {i}: click the item {'x' * (3 * i)} then buy it.\n<|assistant|>\n"
             for i in range(n)]
    return [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]


def logits_after(model, ids: list[int]):
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1].float()


def assert_same_or_tie(model, prompt: list[int], got: list[int], want: list[int]) -> None:
    """``got`` equals ``want``, or they part where the reference's two best tokens tie."""
    if got == want:
        return
    common = next(i for i, (a, b) in enumerate(zip(got + [-1], want + [-2], strict=False))
                  if a != b)
    top = logits_after(model, prompt + want[:common]).topk(2).values
    assert float(top[0] - top[1]) < TIE, (
        f"the paths part at token {common} without a tie: {got} vs {want}")


def run_all(batcher, requests: list[GenerationRequest], callers: int) -> list[list[int]]:
    with ThreadPoolExecutor(callers) as pool:
        return list(pool.map(batcher.submit, requests))


def test_the_fast_path_takes_the_llama_family_and_refuses_others(model, tmp_path: Path):
    import transformers

    _, qwen = model
    assert fast_path_refusal(qwen) is None
    assert isinstance(make_batcher(qwen, 1, 8), ContinuousBatcher)
    assert isinstance(make_batcher(qwen, 1, 8, kind="reference"), Batcher)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=32))
    assert "gpt2" in fast_path_refusal(gpt2)
    assert isinstance(make_batcher(gpt2, 0, 8), Batcher)  # auto: the reference path
    with pytest.raises(ModelError, match="fast path cannot run"):
        make_batcher(gpt2, 0, 8, kind="fast")


def test_greedy_answers_equal_the_reference_path_alone_and_batched(model):
    tokenizer, lm = model
    asks = prompts(tokenizer)
    reference = Batcher(lm, 1, 16)
    fast = ContinuousBatcher(lm, 1, 16)
    alone = [reference.submit(GenerationRequest(p, 12 + i, 0.0, None, None))
             for i, p in enumerate(asks)]
    for callers in (1, 6):
        got = run_all(fast, [GenerationRequest(p, 12 + i, 0.0, None, None)
                             for i, p in enumerate(asks)], callers)
        for p, g, w in zip(asks, got, alone, strict=True):
            assert len(g) <= 12 + len(w)
            assert_same_or_tie(lm, p, g, w)
    assert fast.stats.new_tokens > 0 and fast.stats.decode_steps > 0


def test_a_request_that_joins_a_running_batch_gets_the_tokens_it_would_alone(model):
    tokenizer, lm = model
    asks = prompts(tokenizer, 4)
    fast = ContinuousBatcher(lm, 1, 16, eos=set())  # no early end: the first runs long
    alone = [ContinuousBatcher(lm, 1, 16, eos=set(), prefix_cache=False).submit(
        GenerationRequest(p, 30, 0.0, None, None)) for p in asks]
    decode, steps = fast.runner.decode, []
    joined = threading.Event()

    def counting(cache, tokens, lengths):
        steps.append(len(tokens))
        if len(steps) == 5:  # the first request is five tokens in: the others arrive
            joined.set()
            deadline = time.monotonic() + 10
            while len(fast._queue) < 3 and time.monotonic() < deadline:
                time.sleep(0.002)
        return decode(cache, tokens, lengths)

    fast.runner.decode = counting
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(fast.submit, GenerationRequest(asks[0], 30, 0.0, None, None))
        assert joined.wait(10)
        rest = [pool.submit(fast.submit, GenerationRequest(p, 30, 0.0, None, None))
                for p in asks[1:]]
        got = [first.result()] + [r.result() for r in rest]
    assert steps[0] == 1 and max(steps) == 4  # it ran alone, then four rows decoded at once
    for p, g, w in zip(asks, got, alone, strict=True):
        assert_same_or_tie(lm, p, g, w)


def test_seeded_samples_do_not_depend_on_the_batch_they_share(model):
    tokenizer, lm = model
    asks = prompts(tokenizer, 5)
    fast = ContinuousBatcher(lm, 1, 16)
    once = fast.submit(GenerationRequest(asks[0], 16, 3.0, None, 7))
    with_company = run_all(fast, [GenerationRequest(asks[0], 16, 3.0, None, 7)] + [
        GenerationRequest(p, 16, 3.0, 0.9, None) for p in asks[1:]], 5)
    assert with_company[0] == once
    other_seed = fast.submit(GenerationRequest(asks[0], 16, 3.0, None, 8))
    assert other_seed != once  # a sample, not the greedy answer


def test_traced_log_probabilities_are_those_of_the_distribution_sampled_from(model):
    """What GRPO scores a sampled action with: the fast path's per-token log-probabilities
    equal the model's own (teacher-forced, under the same constraint and temperature), as the
    reference path's traces do."""
    import torch

    from dreamgym_agents.policy.grammar import ChoiceGrammar, Constraint, Vocabulary

    tokenizer, lm = model
    vocab = Vocabulary(tokenizer)
    options = ["click the buy button", "go back", "click the cart", "scroll down"]
    eos = {tokenizer.eos_token_id}
    fast = ContinuousBatcher(lm, 1, 16)
    reference = Batcher(lm, 1, 16)
    for temperature, engine in ((0.0, fast), (0.7, fast), (0.0, reference)):
        for p in prompts(tokenizer, 3):
            request = GenerationRequest(p, 24, temperature, None, 11, trace=True,
                                        constraint=Constraint(ChoiceGrammar(options), vocab,
                                                              eos))
            new = engine.submit(request)
            assert tokenizer.decode(new, skip_special_tokens=True) in options
            assert len(request.logps) == len(new) == len(request.allowed)
            with torch.no_grad():
                logits = lm(input_ids=torch.tensor([p + new])).logits[0, len(p) - 1:-1].float()
            for k, token in enumerate(new):
                row = logits[k]
                allowed = request.allowed[k]
                if allowed is not None:
                    keep = torch.zeros_like(row, dtype=torch.bool)
                    keep[torch.tensor(allowed)] = True
                    row = row.masked_fill(~keep, float("-inf"))
                if temperature > 0:
                    row = row / temperature
                want = float(torch.log_softmax(row, -1)[token])
                assert request.logps[k] == pytest.approx(want, abs=1e-4)


def test_constraints_and_banned_words_hold_on_the_fast_path(model):
    from dreamgym_agents.gateway.local import bad_word_ids
    from dreamgym_agents.policy.grammar import ChoiceGrammar, Constraint, Vocabulary

    tokenizer, lm = model
    vocab, eos = Vocabulary(tokenizer), {tokenizer.eos_token_id}
    options = ["go to drawer 1", "go to drawer 10", "open drawer 1", "look"]
    fast, reference = ContinuousBatcher(lm, 1, 16), Batcher(lm, 1, 16)
    for p in prompts(tokenizer, 4):
        got = fast.submit(GenerationRequest(
            p, 20, 0.0, None, None, constraint=Constraint(ChoiceGrammar(options), vocab, eos)))
        want = reference.submit(GenerationRequest(
            p, 20, 0.0, None, None, constraint=Constraint(ChoiceGrammar(options), vocab, eos)))
        assert tokenizer.decode(got, skip_special_tokens=True) in options
        assert got == want
    p = prompts(tokenizer, 1)[0]
    free = fast.submit(GenerationRequest(p, 8, 0.0, None, None))
    word = tokenizer.decode(free[:1])
    banned = bad_word_ids(tokenizer, [word])
    masked = fast.submit(GenerationRequest(p, 8, 0.0, None, None, banned=banned))
    assert masked[:1] != free[:1]
    assert masked == reference.submit(GenerationRequest(p, 8, 0.0, None, None, banned=banned))


def test_the_prefix_cache_serves_a_repeated_prompt_and_forgets_changed_weights(model):
    import torch

    tokenizer, lm = model
    p = prompts(tokenizer, 1)[0]
    fast = ContinuousBatcher(lm, 1, 16)
    first = fast.submit(GenerationRequest(p, 10, 0.0, None, None))
    again = fast.submit(GenerationRequest(p, 10, 0.0, None, None))
    longer = fast.submit(GenerationRequest(p + first, 10, 0.0, None, None))
    assert again == first
    assert fast.stats.prefix_tokens >= 2 * (len(p) - 1)  # both reused the cached prompt
    alone = ContinuousBatcher(lm, 1, 16, prefix_cache=False)
    assert_same_or_tie(lm, p + first, longer,
                       alone.submit(GenerationRequest(p + first, 10, 0.0, None, None)))
    with torch.no_grad():  # an optimiser's step: the weights change in place
        for param in lm.model.layers[0].parameters():
            param.add_(torch.randn_like(param) * 0.5)
    taken = fast.stats.prefix_tokens
    after = fast.submit(GenerationRequest(p, 10, 0.0, None, None))
    assert fast.stats.prefix_tokens == taken  # the stale keys and values were dropped
    assert_same_or_tie(lm, p, after, Batcher(lm, 1, 16).submit(
        GenerationRequest(p, 10, 0.0, None, None)))


def test_lora_adapters_apply_on_the_fast_path(model):
    import torch

    from dreamgym_agents.policy.sft import with_lora

    tokenizer, lm = model
    adapted = with_lora(lm, 4)
    with torch.no_grad():  # adapters that change the answer (LoRA's B starts at zero)
        for name, param in adapted.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    assert fast_path_refusal(adapted) is None
    fast = ContinuousBatcher(adapted, 1, 16)
    assert not fast.runner.plain
    reference = Batcher(adapted, 1, 16)
    for p in prompts(tokenizer, 3):
        got = fast.submit(GenerationRequest(p, 10, 0.0, None, None))
        assert_same_or_tie(adapted, p, got,
                           reference.submit(GenerationRequest(p, 10, 0.0, None, None)))


def test_an_interrupt_stops_a_running_generation_and_later_requests(model):
    tokenizer, lm = model
    p = prompts(tokenizer, 1)[0]
    fast = ContinuousBatcher(lm, 1, 16, eos=set())
    decode, steps = fast.runner.decode, []

    def counting(*args):
        steps.append(1)
        if len(steps) == 3:
            interrupt_local_generation()
        return decode(*args)

    fast.runner.decode = counting
    try:
        with pytest.raises(ModelError, match="interrupted") as caught:
            fast.submit(GenerationRequest(p, 200, 0.0, None, None))
        assert not caught.value.retryable
        assert len(steps) == 3  # it stopped at once, not 200 tokens later
        with pytest.raises(ModelError, match="interrupted"):
            fast.submit(GenerationRequest(p, 5, 0.0, None, None))
    finally:
        resume_local_generation()
    assert len(fast.submit(GenerationRequest(p, 5, 0.0, None, None))) == 5


def test_a_failure_reaches_every_caller_of_the_batch_and_the_engine_goes_on(model):
    tokenizer, lm = model
    asks = prompts(tokenizer, 3)
    fast = ContinuousBatcher(lm, 1, 16)
    decode, calls = fast.runner.decode, []

    def failing(*args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("out of memory")
        return decode(*args)

    fast.runner.decode = failing
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(fast.submit, GenerationRequest(p, 20, 0.0, None, None))
                   for p in asks]
        errors = []
        for f in futures:
            try:
                f.result()
            except RuntimeError as exc:
                errors.append(str(exc))
    assert errors and all(e == "out of memory" for e in errors)
    assert fast.submit(GenerationRequest(asks[0], 4, 0.0, None, None))


def test_requests_through_the_gateway_all_join_the_running_batch(decisive):
    """LiteLLM awaits the provider on the gateway's loop: no thread waits for an answer, so
    more requests than asyncio's default pool has threads (cores + 4) share one batch."""
    import asyncio

    from dreamgym_agents.gateway.llm import Gateway, LLMConfig
    from dreamgym_agents.gateway.local import _get_loaded

    gateway = Gateway(LLMConfig(model=f"hf/{decisive}", max_tokens=24, max_concurrency=16))
    batcher = _get_loaded(decisive).batcher
    assert isinstance(batcher, ContinuousBatcher)
    decode, widths = batcher.runner.decode, []

    def recording(cache, tokens, lengths):
        widths.append(len(tokens))
        return decode(cache, tokens, lengths)

    batcher.runner.decode = recording
    messages = [[{"role": "user", "content": f"click item {i} then buy it"}] for i in range(16)]

    async def everything():
        return await asyncio.gather(*(gateway.acomplete(m) for m in messages))

    try:
        answers = asyncio.run(everything())
    finally:
        batcher.runner.decode = decode
        gateway.close()
    assert len(answers) == 16 and all(a.usage.completion_tokens >= 1 for a in answers)
    assert max(widths) > 10  # beyond the 6 threads of a 2-core machine's default pool
