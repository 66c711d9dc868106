"""CPU time of one hosted model call, by layer: what a dream step pays before the model answers.

Starts the latency server of ``dream_concurrency.py`` (an OpenAI-compatible chat server on
127.0.0.1, in its own process) and sends the same chat request (~2,300 prompt words) through
each layer at each concurrency, timing this process's CPU seconds per call (the server's are
not counted)::

    python benchmarks/request_path.py --levels 8 64 --calls 400

Rows: ``aiohttp`` (a bare HTTP client, the floor), ``httpx`` (the OpenAI SDK's transport),
``openai-sdk`` (``AsyncOpenAI.chat.completions.create``), ``litellm openai/`` (LiteLLM's
``acompletion`` on the route a hosted model takes, the gateway's path), ``litellm
aiohttp_openai/`` (LiteLLM's aiohttp route) and ``gateway`` (the project's
:class:`~dreamgym_agents.gateway.llm.Gateway`, called from threads as a dream's episodes call
it). Read the ratios: on a loaded machine every figure is inflated alike.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import multiprocessing
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dream_concurrency import serve  # noqa: E402

MESSAGES = [{"role": "system", "content": "x " * 1500}, {"role": "user", "content": "y " * 800}]


async def _timed(one, concurrency: int, calls: int) -> tuple[float, float]:
    """(CPU ms per call, calls per second) of ``calls`` calls of ``one``, ``concurrency`` at a
    time, after a warm-up round."""
    gate = asyncio.Semaphore(concurrency)

    async def bounded() -> None:
        async with gate:
            await one()

    await asyncio.gather(*(bounded() for _ in range(concurrency)))
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(bounded() for _ in range(calls)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu / calls * 1000, calls / wall


def _gateway_timed(base: str, concurrency: int, calls: int) -> tuple[float, float]:
    from dreamgym_agents.gateway.llm import Gateway, LLMConfig

    gateway = Gateway(LLMConfig(model="openai/latency-stub", api_base=base,
                                api_key_env="STUB_API_KEY", max_retries=0))
    gateway.prepare()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda _: gateway.complete(MESSAGES), range(concurrency)))
        cpu, wall = time.process_time(), time.perf_counter()
        list(pool.map(lambda _: gateway.complete(MESSAGES), range(calls)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu / calls * 1000, calls / wall


async def _layers(base: str, concurrency: int, calls: int) -> list[tuple[str, float, float]]:
    import aiohttp
    import httpx
    import openai

    from dreamgym_agents.gateway.litellm_setup import import_litellm, prepare_request_path

    litellm = import_litellm()
    prepare_request_path()
    url = f"{base}/chat/completions"
    body = {"model": "latency-stub", "messages": MESSAGES}
    rows = []
    async with aiohttp.ClientSession() as session:
        async def bare() -> None:
            async with session.post(url, json=body) as answer:
                await answer.json()

        rows.append(("aiohttp", *await _timed(bare, concurrency, calls)))
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=1000)) as client:
        async def plain() -> None:
            (await client.post(url, json=body)).json()

        rows.append(("httpx", *await _timed(plain, concurrency, calls)))
    sdk = openai.AsyncOpenAI(api_key="unused", base_url=base)
    rows.append(("openai-sdk", *await _timed(
        lambda: sdk.chat.completions.create(model="latency-stub", messages=MESSAGES),
        concurrency, calls)))
    for route in ("openai", "aiohttp_openai"):
        rows.append((f"litellm {route}/", *await _timed(
            lambda route=route: litellm.acompletion(
                model=f"{route}/latency-stub", messages=MESSAGES, api_base=base,
                api_key="unused", max_retries=0, num_retries=0, timeout=60),
            concurrency, calls)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--latency", type=float, default=0.05,
                        help="the server's seconds per answer")
    args = parser.parse_args()
    os.environ.setdefault("STUB_API_KEY", "unused")
    ports: multiprocessing.Queue = multiprocessing.Queue()
    server = multiprocessing.Process(target=serve, args=(args.latency, ports), daemon=True)
    server.start()
    base = f"http://127.0.0.1:{ports.get(timeout=60)}/v1"
    print(f"request path: {args.calls} calls per row, server latency {args.latency}s, {base}")
    print("| layer | concurrency | CPU ms per call | calls/s |\n|---|---|---|---|")
    async def every_level() -> list[list[tuple[str, float, float]]]:
        # one event loop for all: LiteLLM keeps its HTTP clients on the loop that made them
        return [await _layers(base, level, args.calls) for level in args.levels]

    try:
        for level, rows in zip(args.levels, asyncio.run(every_level()), strict=True):
            rows.append(("gateway (threads)", *_gateway_timed(base, level, args.calls)))
            for name, cpu_ms, rate in rows:
                print(f"| {name} | {level} | {cpu_ms:.2f} | {rate:.1f} |", flush=True)
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
