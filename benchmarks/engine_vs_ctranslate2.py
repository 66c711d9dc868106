"""The local engine against CTranslate2 on a shipped experience model (issue 48, item 2).

The same prompts (windows of the bundle's recorded episodes, ``--prompt-tokens`` tokens each,
no two alike: no prefix to share), the same number of new tokens (end-of-text never ends an
answer on either side), greedy: the project's continuous batcher (``gateway/engine.py``, float32)
against CTranslate2's ``Generator.generate_batch`` (float32 and int8), the batch submitted at
once and one request at a time; wall seconds, new tokens a second, and how many greedy answers
agree token for token. CTranslate2 is not a dependency::

    pip install --target /tmp/ct2 --no-deps ctranslate2
    PYTHONPATH=/tmp/ct2 .venv/bin/python benchmarks/engine_vs_ctranslate2.py --task alfworld

Prints a table and writes ``--json`` if asked. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import gzip
import json
import tempfile
import time
from pathlib import Path
from typing import Any


def prompts(task: str, tokenizer: Any, n: int, length: int) -> list[list[int]]:
    from dreamgym_agents.pipeline.bundle import DEMOS_FILE, shipped_bundle

    text = []
    with gzip.open(shipped_bundle(task).root / DEMOS_FILE, "rt") as fh:
        for line in fh:
            for t in json.loads(line)["transitions"]:
                text.append(f"{t['state']} {t['action']}")
            if len(text) > 40 * n:
                break
    ids = tokenizer("\n".join(text))["input_ids"]
    step = max(1, (len(ids) - length) // n)
    return [ids[i * step:i * step + length] for i in range(n)]


def ours(model: Any, batch: list[list[int]], new: int, at_once: bool) -> tuple[float, list]:
    from dreamgym_agents.gateway.engine import ContinuousBatcher
    from dreamgym_agents.gateway.local import GenerationRequest

    engine = ContinuousBatcher(model, 0, len(batch), eos=set())
    engine.submit(GenerationRequest(batch[0], 4, 0.0, None, None))  # warm
    started = time.perf_counter()
    if at_once:
        futures = [engine.enqueue(GenerationRequest(p, new, 0.0, None, None)) for p in batch]
        out = [f.result() for f in futures]
    else:
        out = [engine.submit(GenerationRequest(p, new, 0.0, None, None)) for p in batch]
    return time.perf_counter() - started, out


def theirs(generator: Any, tokenizer: Any, batch: list[list[int]], new: int,
           at_once: bool) -> tuple[float, list]:
    tokens = [tokenizer.convert_ids_to_tokens(p) for p in batch]
    kw = {"max_length": new, "min_length": new, "sampling_topk": 1,
          "include_prompt_in_result": False}
    generator.generate_batch(tokens[:1], max_length=4, include_prompt_in_result=False)  # warm
    started = time.perf_counter()
    if at_once:
        results = generator.generate_batch(tokens, max_batch_size=len(tokens), **kw)
    else:
        results = [generator.generate_batch([t], **kw)[0] for t in tokens]
    wall = time.perf_counter() - started
    return wall, [list(r.sequences_ids[0]) for r in results]


def main() -> None:
    import ctranslate2
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dreamgym_agents.cli.experience import resolve_experience_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="alfworld")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=360)
    parser.add_argument("--new-tokens", type=int, default=73)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir, _ = resolve_experience_model(None, args.task)
    model_dir = model_dir.removeprefix("hf/")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    batch = prompts(args.task, tokenizer, args.batch, args.prompt_tokens)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        out = ctranslate2.converters.TransformersConverter(str(model_dir)).convert(
            str(Path(scratch) / "ct2"), quantization="float32")
        engines = {"ct2 float32": ctranslate2.Generator(out, device="cpu",
                                                        intra_threads=args.threads),
                   "ct2 int8": ctranslate2.Generator(out, device="cpu", compute_type="int8",
                                                     intra_threads=args.threads)}
        for at_once in (True, False):
            wall, reference = ours(model, batch, args.new_tokens, at_once)
            rows.append({"engine": "dg-agents engine (float32)", "batched": at_once,
                         "wall_s": round(wall, 3), "same_greedy": len(batch),
                         "tokens_per_s": round(len(batch) * args.new_tokens / wall, 1)})
            for name, generator in engines.items():
                wall, got = theirs(generator, tokenizer, batch, args.new_tokens, at_once)
                rows.append({"engine": name, "batched": at_once, "wall_s": round(wall, 3),
                             "same_greedy": sum(a == b for a, b in zip(got, reference,
                                                                        strict=True)),
                             "tokens_per_s": round(len(batch) * args.new_tokens / wall, 1)})
    print(f"{args.task} experience model, {args.batch} prompts of {args.prompt_tokens} tokens, "
          f"{args.new_tokens} new tokens each, greedy, {args.threads} thread(s)")
    print("| engine | requests | wall | new tokens/s | greedy answers equal to ours |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['engine']} | {'all at once' if r['batched'] else 'one at a time'} | "
              f"{r['wall_s']} s | {r['tokens_per_s']} | {r['same_greedy']}/{args.batch} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
