"""Where a dream step's and a policy turn's time goes, by concurrency (issue 48, item 1).

Plays the family's shipped experience model in the dream (in this process, as ``dg-agents
dream`` does) at each concurrency, once with the oracle agent (the dream step alone) and once
with the shipped warm-start policy (its turns), timing each part of a step with wrappers:

- dream step: retrieval (``ExperienceModel.retrieve``), prompt rendering (``build_messages``),
  the gateway's request path (``Gateway.complete`` less the provider's call: LiteLLM, the
  gateway's loop and threads), the provider's own work (chat template, tokenising, decoding
  the answer's text), the engine (its worker's prefill, decoding steps, token choice and
  constraint work, summed over requests), waiting for the engine, parsing (the answer and
  the state's expansion), the rest of the dream step; the episode graph (a step's latency
  less the environment's step and the agent's turn);
- policy turn: rendering the turn (view and tokens), the turn's grammar, the engine (as
  above, the policy's own), decoding and resolving the action.

Figures are milliseconds per step (or turn) of wall time in the thread that does the part,
with the run's steps per second and the process's CPU seconds per step. The physical floor
beside them: the model's floating-point work per step (prompt and answer tokens, attention
over the cache) at this CPU's measured matrix-multiply rate, one thread.

    .venv/bin/python benchmarks/step_breakdown.py --task alfworld --levels 1 8 32
    /tmp/before/.venv/bin/python benchmarks/step_breakdown.py --task webarena
        # the code before issue 48, installed in a venv of its own (benchmarks/dream_speed.py)

Prints a table per family and writes ``--json`` if asked. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import inspect
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


class Meter:
    """Wall seconds and calls by part, summed over threads."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._undo: list[tuple[Any, str, Any]] = []

    def add(self, part: str, seconds: float) -> None:
        with self._lock:
            self.seconds[part] += seconds
            self.calls[part] += 1

    def wrap(self, owner: Any, name: str, part: str) -> None:
        original = getattr(owner, name)
        self._undo.append((owner, name, original))
        if inspect.iscoroutinefunction(original):
            @functools.wraps(original)
            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return await original(*args, **kwargs)
                finally:
                    self.add(part, time.perf_counter() - started)
            setattr(owner, name, timed_async)
            return

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.add(part, time.perf_counter() - started)
        setattr(owner, name, timed)

    def undo(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()


def matmul_gflops(hidden: int) -> float:
    """This CPU's float32 matrix-multiply rate at the model's width, one thread."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(256, hidden), torch.randn(hidden, 2 * hidden)
        for _ in range(20):
            a @ b
        started, n = time.perf_counter(), 300
        for _ in range(n):
            a @ b
        seconds = (time.perf_counter() - started) / n
    finally:
        torch.set_num_threads(threads)
    return 2 * 256 * hidden * 2 * hidden / seconds / 1e9


def floor_ms(checkpoint: str, prompt: float, completion: float) -> tuple[float, float]:
    """``(FLOPs per step, milliseconds at the measured rate)`` of one request of ``prompt``
    and ``completion`` tokens: 2 FLOPs per weight per token (the head only for the answer's
    tokens and the prompt's last), and attention's 4 × layers × width per cached position."""
    cfg = json.loads(Path(checkpoint, "config.json").read_text())
    h, layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    d = h // heads
    per_layer = h * (heads * d + 2 * kv * d) + heads * d * h + 3 * h * cfg["intermediate_size"]
    weights = 2 * layers * per_layer
    head = 2 * h * vocab
    attention = 4 * layers * heads * d  # per (query, cached position) pair
    prefill = prompt * weights + head + attention * prompt * prompt / 2
    decode = completion * (weights + head) + attention * completion * (prompt + completion / 2)
    flops = prefill + decode
    return flops, flops / (matmul_gflops(h) * 1e9) * 1e3


def instrument(meter: Meter) -> None:
    from dreamgym_agents.experience import dream, model
    from dreamgym_agents.gateway import llm, local
    from dreamgym_agents.policy import model as policy

    meter.wrap(model.ExperienceModel, "retrieve", "dream/retrieval")
    meter.wrap(model.ExperienceModel, "build_messages", "dream/render")
    meter.wrap(model.ExperienceModel, "predict", "dream/predict")
    meter.wrap(model, "parse_experience_output", "dream/parse")
    meter.wrap(llm.Gateway, "complete", "dream/gateway")
    meter.wrap(local, "generate_local", "dream/provider")
    meter.wrap(dream.DreamEnv, "step", "dream/env_step")
    meter.wrap(policy.PolicyAgent, "act", "policy/turn")
    meter.wrap(policy.PolicyModel, "segment_ids", "policy/render")
    meter.wrap(policy.PolicyModel, "constraint", "policy/grammar")
    meter.wrap(policy.PolicyModel, "generate_traced", "policy/engine_wait")
    meter.wrap(policy.PolicyModel, "decode", "policy/decode_text")


def instrument_engines(meter: Meter) -> None:
    """Time each submit (a request's wait for its answer) on the engines this code has (an
    older checkout has only transformers' ``generate``: ``local.Batcher``)."""
    from dreamgym_agents.gateway import local

    try:
        from dreamgym_agents.gateway import engine
    except ImportError:
        engine = None
    if engine is not None:
        meter.wrap(engine.ContinuousBatcher, "submit", "engine/submit")
    meter.wrap(local.Batcher, "submit", "engine/submit")
    if hasattr(local, "agenerate_local"):
        meter.wrap(local, "agenerate_local", "dream/provider")


def engines_of(checkpoint: str, runner: Any) -> dict[str, Any]:
    """The experience model's batcher (the provider's, by its checkpoint) and the policy's."""
    from dreamgym_agents.gateway.local import _get_loaded

    found = {"dream": _get_loaded(checkpoint).batcher}
    policy = getattr(runner, "policy", None)
    if policy is not None:
        found["policy"] = policy.batcher
    return found


def engine_split(batcher: Any) -> dict[str, float]:
    stats = getattr(batcher, "stats", None)
    if stats is None:
        return {}
    return stats.snapshot()


def play(task: str, agent: str, concurrency: int, episodes: int, overrides: list[str],
         out: Path, max_steps: int) -> dict[str, Any]:
    """One dream run in this process; its meter's figures."""
    from dreamgym_agents.cli.dream_workers import DreamJob
    from dreamgym_agents.cli.experience import _close_parts, _dream_parts, _play, _resolve
    from dreamgym_agents.cli.output import make_console
    from dreamgym_agents.episodes.env import make_family

    family = make_family(task)
    tasks = (family.load_tasks("test") + family.load_tasks("train"))[:episodes]
    checkpoint, model_buffer = _resolve(None, task, False, False, False, make_console())
    job = DreamJob(experience_model=checkpoint, model_buffer=model_buffer, task=task,
                   agent=agent, program=None, seed=0, buffer_path=None, buffer_url=None,
                   ablations=(False, False, False), config=None, overrides=overrides,
                   max_steps=max_steps, verbose=False)
    job.meta = {"command": "step_breakdown"}
    parts = _dream_parts(job, family, concurrency)
    meter = Meter()
    instrument(meter)
    instrument_engines(meter)
    try:
        _, runner, model, gateway, _ = parts
        # warm: the model loaded, LiteLLM's request path set up, the engine's weights fused
        gateway.prepare()
        warm = tasks[0]
        model.predict(warm, [], family.state_format().initial_state(warm), "noop()")
        engines = engines_of(checkpoint.removeprefix("hf/"), runner)
        before = {name: engine_split(b) for name, b in engines.items()}
        meter.seconds.clear()
        meter.calls.clear()
        cpu0, started = os.times(), time.perf_counter()
        result = asyncio.run(_play(job, parts, family, tasks, out, concurrency))
        wall = time.perf_counter() - started
        cpu1 = os.times()
        split: dict[str, dict[str, float]] = {}
        for name, b in engines.items():
            now, then = engine_split(b), before.get(name, {})
            split[name] = {k: v - then.get(k, 0) for k, v in now.items()}
    finally:
        meter.undo()
        _close_parts(parts)
        family.close()
    steps = result.summary["synthetic_transitions"]
    usage = result.summary["experience_usage"]
    return {"agent": agent, "concurrency": concurrency, "episodes": len(tasks),
            "steps": steps, "wall_s": wall, "steps_per_s": steps / wall,
            "cpu_s_per_step": (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / steps,
            "calls": usage["calls"], "prompt_tokens": usage["prompt_tokens"],
            "completion_tokens": usage["completion_tokens"],
            "seconds": dict(meter.seconds), "counts": dict(meter.calls), "engines": split,
            "success": result.summary["success_rate"]}


def dream_rows(run: dict[str, Any]) -> list[tuple[str, float]]:
    s, steps = run["seconds"], max(run["steps"], 1)
    ms = {k: 1000 * v / steps for k, v in s.items()}
    engine = run["engines"].get("dream", {})
    calls = max(run["calls"], 1)
    rows = [
        ("retrieval", ms.get("dream/retrieval", 0.0)),
        ("prompt rendering", ms.get("dream/render", 0.0)),
        ("gateway request path (LiteLLM, loop, threads)",
         ms.get("dream/gateway", 0.0) - ms.get("dream/provider", 0.0)),
        ("provider: template, tokens, waiting for the engine, text",
         ms.get("dream/provider", 0.0)),
    ]
    for key, label in (("prefill_s", "  engine's own time: prefill"),
                       ("decode_s", "  engine's own time: decoding steps"),
                       ("select_s", "  engine's own time: token choice"),
                       ("constraint_s", "  engine's own time: constraint work")):
        if key in engine:
            rows.append((label, 1000 * engine[key] / steps))
    rows += [
        ("parsing (answer)", ms.get("dream/parse", 0.0)),
        ("rest of the experience model's step", ms.get("dream/predict", 0.0) - sum(
            ms.get(k, 0.0) for k in ("dream/retrieval", "dream/render", "dream/gateway",
                                     "dream/parse"))),
        ("dream env step (all of the above and the env's own)", ms.get("dream/env_step", 0.0)),
    ]
    if engine:
        rows.append((f"engine: tokens a call: prompt {engine['prompt_tokens'] / calls:.0f}, "
                     f"from the prefix cache {engine['prefix_tokens'] / calls:.0f}, new "
                     f"{engine['new_tokens'] / calls:.0f}; rows a decoding step "
                     f"{engine['new_tokens'] / max(engine['decode_steps'], 1):.1f}",
                     float("nan")))
    return rows


def policy_rows(run: dict[str, Any]) -> list[tuple[str, float]]:
    s, turns = run["seconds"], max(run["counts"].get("policy/turn", 0), 1)
    ms = {k: 1000 * v / turns for k, v in s.items()}
    engine = run["engines"].get("policy", {})
    rows = [("rendering the turn (view, tokens)", ms.get("policy/render", 0.0)),
            ("the turn's grammar", ms.get("policy/grammar", 0.0)),
            ("waiting for the engine's action", ms.get("policy/engine_wait", 0.0))]
    for key, label in (("prefill_s", "  engine's own time: prefill"),
                       ("decode_s", "  engine's own time: decoding steps"),
                       ("select_s", "  engine's own time: token choice"),
                       ("constraint_s", "  engine's own time: constraint work")):
        if key in engine:
            rows.append((label, 1000 * engine[key] / turns))
    rows += [("decoding the action's text", ms.get("policy/decode_text", 0.0)),
             ("whole turn (PolicyAgent.act)", ms.get("policy/turn", 0.0))]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="alfworld")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--episodes", type=int, default=0,
                        help="episodes a level (default: max(8, 2 x concurrency))")
    parser.add_argument("--max-steps", type=int, default=15)
    parser.add_argument("--no-policy", action="store_true", help="the oracle's dream only")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args()

    from dreamgym_agents.cli.experience import _resolve
    from dreamgym_agents.cli.output import make_console
    from dreamgym_agents.pipeline.bundle import shipped_bundle
    from dreamgym_agents.policy.model import PolicyConfig, save_policy_settings

    checkpoint, _ = _resolve(None, args.task, False, False, False, make_console())
    checkpoint = checkpoint.removeprefix("hf/")
    scratch = Path(tempfile.mkdtemp(prefix="dg-breakdown-"))
    policy = scratch / "policy"
    shutil.copytree(shipped_bundle(args.task).policy_dir, policy)
    save_policy_settings(policy, PolicyConfig(), "compact")
    from dreamgym_agents.version import code_version, describe

    engine = os.environ.get("DG_LOCAL_ENGINE", "auto")
    code = describe(code_version())
    print(f"{args.task}: code {code} ({Path(__import__('dreamgym_agents').__file__).parent}), "
          f"engine {engine}, overrides {args.overrides or 'none'}")
    runs = []
    try:
        for level in args.levels:
            episodes = args.episodes or max(8, 2 * level)
            agents = ["oracle"] if args.no_policy else ["oracle", f"hf/{policy}"]
            for agent in agents:
                out = scratch / f"{level}-{len(runs)}"
                run = play(args.task, agent, level, episodes, args.overrides, out,
                           args.max_steps)
                run["agent"] = "oracle" if agent == "oracle" else "policy"
                runs.append(run)
                print(f"\nconcurrency {level}, agent {run['agent']}: {run['steps']} dream "
                      f"steps in {run['wall_s']:.1f} s = {run['steps_per_s']:.1f} steps/s, "
                      f"{run['cpu_s_per_step'] * 1000:.0f} ms of CPU a step, "
                      f"{run['prompt_tokens'] / max(run['calls'], 1):.0f} prompt + "
                      f"{run['completion_tokens'] / max(run['calls'], 1):.0f} answer tokens "
                      "a call")
                for label, value in dream_rows(run):
                    print(f"  {label:<58} {value:8.2f} ms" if value == value else f"  {label}")
                if run["agent"] == "policy":
                    print(f"  policy turns: {run['counts'].get('policy/turn', 0)}")
                    for label, value in policy_rows(run):
                        print(f"  {label:<58} {value:8.2f} ms")
        calls = sum(r["calls"] for r in runs if r["agent"] == "oracle")
        prompt = sum(r["prompt_tokens"] for r in runs if r["agent"] == "oracle") / max(calls, 1)
        completion = sum(r["completion_tokens"] for r in runs
                         if r["agent"] == "oracle") / max(calls, 1)
        flops, floor = floor_ms(checkpoint, prompt, completion)
        hidden = json.loads(Path(checkpoint, "config.json").read_text())["hidden_size"]
        print(f"\nphysical floor of a dream step: {flops / 1e9:.2f} GFLOP (a call of "
              f"{prompt:.0f} prompt and {completion:.0f} answer tokens) = {floor:.1f} ms at "
              f"{matmul_gflops(hidden):.0f} GFLOP/s (float32 matrix multiply, one thread)")
        if args.json:
            Path(args.json).write_text(json.dumps({"task": args.task, "engine": engine,
                                                   "code": code,
                                                   "overrides": args.overrides, "runs": runs,
                                                   "floor_ms": floor, "floor_flops": flops},
                                                  indent=2))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
