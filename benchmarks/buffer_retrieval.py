"""Replay-buffer latency on a synthetic web-shop buffer: add throughput and retrieval latency.

Prints figures (nothing is asserted). Offline: the default ``hash`` embedding, an embedded
Chroma database in a temporary directory.

    .venv/bin/python benchmarks/buffer_retrieval.py [--transitions 5000] [--queries 200]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable

from dreamgym_agents.buffer.replay import BufferConfig, ReplayBuffer
from dreamgym_agents.types import Transition

CATEGORIES = ["laptops", "phones", "tablets", "cameras", "audio", "monitors", "printers",
              "storage", "networking", "gaming", "wearables", "accessories"]
BRANDS = ["Acme", "Zen", "Nova", "Orbit", "Pixel", "Vertex", "Lumen", "Quark"]
NOUNS = ["Pro", "Air", "Max", "Mini", "Ultra", "Lite", "Plus", "Classic"]


def make_state(rng: random.Random) -> tuple[str, list[int]]:
    """A category page of the bundled-shop kind, with its clickable bids."""
    category = rng.choice(CATEGORIES)
    lines = [f"URL: __SHOPPING__/category/{category}?page={rng.randint(1, 5)}",
             f"Title: {category.title()} - Acme Shop", "[5] link 'Home'", "[6] link 'Cart'",
             "[7] textbox 'Search' value=''",
             "[8] combobox 'Sort by' value='Name' options='Name|Price: Low to High'",
             f"heading '{category.title()}'"]
    bids = [5, 6]
    bid = rng.randint(10, 40)
    for _ in range(rng.randint(6, 14)):
        name = (f"{rng.choice(BRANDS)} {category[:-1].title()} {rng.choice(NOUNS)} "
                f"{rng.randint(1, 99)}")
        lines += [f"[{bid}] link '{name}'", f"StaticText 'Price: ${rng.randint(5, 2500)}.99'",
                  f"[{bid + 1}] button 'Add to Cart'"]
        bids += [bid, bid + 1]
        bid += 2
    return "\n".join(lines), bids


def make_transitions(n: int, rng: random.Random) -> list[Transition]:
    out: list[Transition] = []
    episode, step = 0, 0
    for _ in range(n):
        state, bids = make_state(rng)
        action = (f"click('{rng.choice(bids)}')" if rng.random() < 0.8
                  else f"fill('7', '{rng.choice(BRANDS).lower()} {rng.choice(NOUNS).lower()}')")
        provenance = rng.choice(["real", "offline", "synthetic"])
        out.append(Transition(episode_id=f"ep{episode}", step=step, task_id=f"task{episode % 97}",
                              state=state, action=action, next_state=state,
                              provenance=provenance))
        step += 1
        if rng.random() < 0.15:
            episode, step = episode + 1, 0
    return out


def timed(fn: Callable[[], object], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return times


def report(label: str, ms: list[float]) -> None:
    ms = sorted(ms)
    p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))]
    print(f"{label:<40} p50 {statistics.median(ms):7.2f} ms   p95 {p95:7.2f} ms   "
          f"mean {statistics.fmean(ms):7.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transitions", type=int, default=5000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    transitions = make_transitions(args.transitions, rng)
    queries = [make_state(rng) for _ in range(args.queries)]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = BufferConfig(path=tmp)
        with ReplayBuffer(cfg) as buf:
            start = time.perf_counter()
            buf.add(transitions, family="webarena")
            add_s = time.perf_counter() - start
            print(f"added {buf.count()} transitions in {add_s:.2f} s "
                  f"({len(transitions) / add_s:.0f}/s, embedding + upsert)")
            it = iter(queries * 4)

            def query(**kw: object) -> Callable[[], object]:
                def run() -> object:
                    state, bids = next(it)
                    return buf.retrieve(state, f"click('{bids[-1]}')", **kw)
                return run

            report("retrieve k=3", timed(query(), args.queries))
            report("retrieve k=3, provenance in offline/real",
                   timed(query(where={"provenance": {"$in": ["offline", "real"]}}),
                         args.queries))
            report("retrieve k=8, exclude_episode", timed(query(k=8, exclude_episode="ep3"),
                                                          args.queries))
            report("start_state(task_id)", timed(lambda: buf.start_state("task5"), 20))
            report("stats()", timed(buf.stats, 3))
        start = time.perf_counter()
        with ReplayBuffer(cfg) as buf:
            buf.retrieve(*queries[0][0:1], "click('5')")
        print(f"reopen + first retrieve: {(time.perf_counter() - start) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
