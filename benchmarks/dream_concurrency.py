"""Dream (or eval) throughput against a hosted model, by concurrency.

Starts an OpenAI-compatible server on 127.0.0.1 that answers every chat request after a fixed
latency (a stand-in for a hosted API: the answer leaves the state unchanged, reward 0, not done),
then plays ``dg-agents dream --agent random --experience-model openai/…`` at each concurrency and
prints the dream steps per second against the ideal, concurrency ÷ latency::

    python benchmarks/dream_concurrency.py --task alfworld --latency 0.5
    python benchmarks/dream_concurrency.py --task webarena --latency 2 --levels 1 8 32 64

``--mode eval`` measures ``dg-agents eval --agent openai/…`` instead: a hosted agent (the
server answers ``look``) on real environments, real steps per second.

``--set`` passes overrides to every run (``--set llm.max_concurrency=4`` replays the gateway's old
fixed default; ``--set buffer.index=chroma`` retrieves through Chroma's filtered query instead
of the buffer's in-memory index, the default); ``--workers N`` plays each dream with
``dg-agents dream --workers N``. Each level plays ``max(4, 2 × concurrency)`` episodes of
``--max-steps`` steps; steps per second come from the run's own summary (its wall time, not
the process start); ``command s`` is the whole command's, set-up included (the model's load,
the openings a family reads ahead of the dream).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ANSWER = ("<reasoning>nothing changes</reasoning>\n<reward>0</reward>\n<done>false</done>\n"
          "<success>false</success>\n<next_state>\n@state\n</next_state>")
AGENT_ANSWER = "<think>look around</think><action>look</action>"


def serve(latency: float, port_out: multiprocessing.Queue, answer: str = ANSWER) -> None:
    """An aiohttp OpenAI-compatible chat server that waits ``latency`` seconds per answer."""
    from aiohttp import web

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        await asyncio.sleep(latency)
        prompt = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        return web.json_response({
            "id": f"chatcmpl-{time.monotonic_ns()}", "object": "chat.completion",
            "created": int(time.time()), "model": body.get("model", "latency-stub"),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": answer}}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": 20,
                      "total_tokens": prompt + 20},
        })

    async def main() -> None:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        port_out.put(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(main())


def run_level(args: argparse.Namespace, base_url: str, concurrency: int, out: Path) -> dict:
    episodes = max(4, 2 * concurrency)
    hosted = ["--set", f"llm.api_base={base_url}", "--set", "llm.api_key_env=STUB_API_KEY",
              "--set", "llm.max_retries=0"]
    if args.mode == "eval":
        command = [sys.executable, "-m", "dreamgym_agents.cli.main", "eval", "--task",
                   args.task, "--agent", "openai/latency-stub", "--split", "train",
                   "--limit", str(episodes), "--concurrency", str(concurrency),
                   "--max-steps", str(args.max_steps), "--out", str(out), *hosted]
    else:
        command = [sys.executable, "-m", "dreamgym_agents.cli.main", "dream", "--task",
                   args.task, "--agent", "random", "--experience-model", "openai/latency-stub",
                   "--limit", str(episodes), "--concurrency", str(concurrency),
                   "--max-steps", str(args.max_steps), "--out", str(out), *hosted,
                   "--buffer-path", str(args.buffer)]
    if args.workers > 1 and args.mode == "dream":
        command += ["--workers", str(args.workers)]
    for item in args.set or []:
        command += ["--set", item]
    env = {**os.environ, "STUB_API_KEY": "stub-key"}
    before, started = os.times(), time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    after, command_s = os.times(), time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"concurrency {concurrency}: dg-agents dream failed:\n"
                         f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    steps = int(summary["real_transitions" if args.mode == "eval" else "synthetic_transitions"])
    calls = (summary["usage"] if args.mode == "eval" else summary["experience_usage"])["calls"]
    wall = float(summary["wall_seconds"])
    cpu = (after.children_user - before.children_user) + \
        (after.children_system - before.children_system)
    return {"concurrency": concurrency, "episodes": episodes, "steps": steps, "wall_s": wall,
            "steps_per_s": steps / wall, "ideal": concurrency / args.latency,
            "em_calls": calls,
            "em_failures": summary.get("em_failures", 0), "process_cpu_s": cpu,
            "command_s": command_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="alfworld")
    parser.add_argument("--mode", choices=("dream", "eval"), default="dream",
                        help="dream: a hosted experience model; eval: a hosted agent.")
    parser.add_argument("--latency", type=float, default=0.5, help="Seconds per answer.")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--max-steps", type=int, default=10)
    parser.add_argument("--set", action="append", help="An override for every run.")
    parser.add_argument("--workers", type=int, default=1,
                        help="dg-agents dream --workers: processes that play the episodes.")
    parser.add_argument("--buffer", default="embedded",
                        help="The dream's buffer (its recorded start states): a path, or "
                             "'embedded', the task's embedded bundle's.")
    parser.add_argument("--out", type=Path, default=None, help="Keep the runs here.")
    parser.add_argument("--json", type=Path, default=None, help="Write the curve here.")
    args = parser.parse_args()

    if args.buffer == "embedded" and args.mode == "dream":
        from dreamgym_agents.cli.experience import resolve_experience_model

        args.buffer = resolve_experience_model(None, args.task)[1]
    ports: multiprocessing.Queue = multiprocessing.Queue()
    answer = AGENT_ANSWER if args.mode == "eval" else ANSWER
    server = multiprocessing.Process(target=serve, args=(args.latency, ports, answer),
                                     daemon=True)
    server.start()
    base_url = f"http://127.0.0.1:{ports.get(timeout=30)}/v1"
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = args.out or Path(tmp)
            print(f"{args.mode}: task {args.task}, latency {args.latency}s, server {base_url}, "
                  f"buffer {args.buffer}, overrides {args.set or []}, workers {args.workers}")
            print("| concurrency | steps | wall s | steps/s | ideal | % of ideal | "
                  "model calls | EM failures | process CPU s | command s |")
            print("|---|---|---|---|---|---|---|---|---|---|")
            for level in args.levels:
                row = run_level(args, base_url, level, root / f"c{level}")
                rows.append(row)
                print(f"| {level} | {row['steps']} | {row['wall_s']:.1f} | "
                      f"{row['steps_per_s']:.1f} | {row['ideal']:.1f} | "
                      f"{100 * row['steps_per_s'] / row['ideal']:.0f} % | {row['em_calls']} | "
                      f"{row['em_failures']} | {row['process_cpu_s']:.1f} | "
                      f"{row['command_s']:.1f} |", flush=True)
    finally:
        server.terminate()
    if args.json:
        args.json.write_text(json.dumps({"mode": args.mode, "task": args.task,
                                         "latency": args.latency, "workers": args.workers,
                                         "overrides": args.set or [], "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
