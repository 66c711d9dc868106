"""The web family's offline agents: they need no model, and read the page's abstract state.

``oracle`` plays a task's oracle program, resolving each step's element by role and name on the
current page; ``random`` is uniform over the page's elements (the floor every result is compared
with); ``noisy`` (the oracle with random detours), ``quitter`` (wrong and early answers) and
``explorer`` (every listing's items; ``orders``: the signed-in customer's orders) make the
offline data the buffer and the experience model start from.
"""

from __future__ import annotations

import random
import re
from typing import Any

from dreamgym_agents.adapters.webarena.actions import WebAction
from dreamgym_agents.adapters.webarena.state import parse_state
from dreamgym_agents.episodes.agent import EXPLORATION, Decision
from dreamgym_agents.episodes.env import Observation, every_nth
from dreamgym_agents.errors import ConfigError
from dreamgym_agents.types import Task, Transition


def call(name: str, *args: str) -> str:
    """The BrowserGym call text of action ``name`` with ``args``."""
    return WebAction(name, tuple(args)).to_browsergym()


class OracleAgent:
    """Plays ``task.oracle``: step *i* of the program at step *i* of the episode.

    Steps: ``click``/``fill``/``press``/``select`` name an element by ``role`` and ``name``
    (``"match": "contains"`` for a substring match) and are resolved to the element's bid on the
    current page; ``goto`` opens a URL (WebArena placeholders resolved); ``stop`` answers.
    """

    name = "oracle"

    async def act(
        self, task: Task, observation: Observation, history: list[Transition], episode_id: str
    ) -> Decision:
        return self.step_at(task, observation, len(history))

    def step_at(self, task: Task, observation: Observation, index: int) -> Decision:
        """The decision for step ``index`` of the task's oracle program."""
        if not task.oracle:
            raise ConfigError(f"task {task.task_id} has no oracle program: use another agent")
        if index >= len(task.oracle):
            return Decision(action="noop()", reasoning="oracle program exhausted")
        step = task.oracle[index]
        return Decision(action=self._resolve(step, observation),
                        reasoning=f"oracle step {index + 1}/{len(task.oracle)}: {step['op']}")

    @staticmethod
    def _resolve(step: dict[str, Any], observation: Observation) -> str:
        op = step["op"]
        if op == "stop":
            return call("send_msg_to_user", str(step.get("answer", "")))
        if op == "goto":
            url = step["url"]
            for key, value in observation.info.get("site_urls", {}).items():
                url = url.replace(key, value)
            return call("goto", url)
        state = parse_state(observation.state)
        element = state.find(step["role"], step["name"], match=step.get("match", "exact"))
        if element is None or element.bid is None:
            # Recorded as an invalid step by the environment, like any impossible action.
            return f"missing element: {step['role']} {step['name']!r}"
        if op == "click":
            return call("click", element.bid)
        if op == "fill":
            return call("fill", element.bid, str(step["text"]))
        if op == "press":
            # WebArena's action subset has no element-level press; the key goes to the focused
            # element, which is this one after the preceding fill.
            return call("keyboard_press", str(step["key"]))
        if op == "select":
            return call("select_option", element.bid, str(step["option"]))
        raise ConfigError(
            f"unknown oracle op {op!r} (expected click, fill, press, select, goto, stop)"
        )


class RandomAgent:
    """Uniformly random over the page's actionable elements; the baseline floor.

    Deterministic given ``seed``, the episode id and the step, so a resumed run repeats itself.
    """

    name = "random"

    def __init__(self, seed: int = 0, stop_prob: float = 0.05) -> None:
        self.seed = seed
        self.stop_prob = stop_prob

    async def act(
        self, task: Task, observation: Observation, history: list[Transition], episode_id: str
    ) -> Decision:
        rng = random.Random(f"{self.seed}|{episode_id}|{len(history)}")
        state = parse_state(observation.state)
        elements = state.elements
        words = [w for line in state.lines for w in line.name.split() if w]
        roll = rng.random()
        if roll < self.stop_prob or not elements:
            answer = rng.choice(words) if words else ""
            return Decision(action=call("send_msg_to_user", answer), reasoning="random stop")
        element = rng.choice(elements)
        if element.role in ("textbox", "searchbox", "combobox") and rng.random() < 0.5:
            text = rng.choice(words) if words else "test"
            if element.role == "combobox":
                return Decision(action=call("click", element.bid), reasoning="random click")
            return Decision(action=call("fill", element.bid, text), reasoning="random fill")
        if roll > 0.95:
            return Decision(action=call("go_back"), reasoning="random back")
        return Decision(action=call("click", element.bid), reasoning="random click")


class NoisyOracleAgent:
    """The oracle with ε-exploration, for offline data (the paper's "oracle + random" sets).

    At each step, with probability ``noise``, a random action replaces the next oracle step; the
    program then resumes where it was. Episodes mix successful paths, detours that still succeed
    and failures, which an experience model must all learn to predict.
    """

    name = "noisy-oracle"

    def __init__(self, seed: int = 0, noise: float = 0.3) -> None:
        if not 0.0 <= noise <= 1.0:
            raise ConfigError(f"noise must be in [0, 1], got {noise}")
        self.seed = seed
        self.noise = noise
        self.oracle = OracleAgent()
        self.random = RandomAgent(seed=seed, stop_prob=0.0)

    async def act(
        self, task: Task, observation: Observation, history: list[Transition], episode_id: str
    ) -> Decision:
        rng = random.Random(f"noise|{self.seed}|{episode_id}|{len(history)}")
        if rng.random() < self.noise:
            decision = await self.random.act(task, observation, history, episode_id)
            decision.reasoning = f"{EXPLORATION} ({decision.reasoning})"
            return decision
        followed = sum(t.reasoning.startswith("oracle step") for t in history)
        return self.oracle.step_at(task, observation, followed)


class QuitterAgent:
    """Follows the oracle for a few steps, then gives up with a wrong or premature answer.

    Offline data needs final answers that fail as much as ones that succeed, or an experience
    model learns that every answer is right. The quitter stops after a random prefix of the
    oracle program (never the whole of it) with a word from the page or a bare "done"; the real
    environment's evaluator decides the reward, so the labels stay real.
    """

    name = "quitter"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.oracle = OracleAgent()

    async def act(
        self, task: Task, observation: Observation, history: list[Transition], episode_id: str
    ) -> Decision:
        rng = random.Random(f"quit|{self.seed}|{episode_id}")
        program = len(task.oracle or [])
        quit_at = rng.randrange(max(program - 1, 1))  # before the oracle's own final step
        if len(history) < quit_at:
            return self.oracle.step_at(task, observation, len(history))
        words = [w for line in parse_state(observation.state).lines for w in line.name.split()]
        answer = rng.choice(words) if words and rng.random() < 0.7 else "done"
        return Decision(action=call("send_msg_to_user", answer), reasoning="quitter stop")


SECTIONS_ROUTE = (r"\(\d+ products?\)$",)
"""The explorer's default route: one click on a section link of the start page (the bundled
shop's "Laptops (25 products)" links)."""

ORDERS_ROUTE = (r"^My Account$", r"^My Orders$")
ORDER_ITEMS = r"^View Order #"
"""The order explorer's route (start page → My Account → My Orders) and its listing items."""


class ExplorerAgent:
    """Walks a site's listings for offline data: every item page, reached from its listing.

    Episode *i* of the tasks it was :meth:`assign`-ed follows ``route`` from its start page: for
    each pattern in turn, it clicks a link whose name matches, by default one click on a section
    link such as "Laptops (25 products)". The last step picks section ``i // pages`` of the
    links that match. It then turns ``i % pages`` listing pages ("Next page") and opens each
    item of that listing page, going back after each: by default a link with a line of text
    under it (name, then price and rating), or with ``item_pattern`` a link whose name matches
    (``ORDERS_ROUTE`` with ``ORDER_ITEMS`` walks the signed-in customer's orders). So
    ``sections × pages`` episodes visit every item once, and the buffer holds the real page
    behind every listing link: what the experience model should copy rather than invent when an
    agent clicks it. It never answers the task; it says "done" when the listing is exhausted
    (the evaluator labels that like any answer).
    """

    name = "explorer"
    min_steps = 27
    """Steps an episode needs (it opens and leaves each item of a listing page)."""

    def __init__(self, pages: int = 3, route: tuple[str, ...] = SECTIONS_ROUTE,
                 item_pattern: str | None = None, next_name: str = "Next page",
                 previous_name: str = "Previous page") -> None:
        if pages < 1:
            raise ConfigError(f"pages must be at least 1, got {pages}")
        if not route:
            raise ConfigError("an explorer's route needs at least one link pattern")
        self.pages = pages
        self.route = [re.compile(p) for p in route]
        self.item = re.compile(item_pattern) if item_pattern else None
        self.next_name = next_name
        self.paging = {next_name, previous_name}
        self._slots: dict[str, int] = {}

    def assign(self, tasks: list[Task]) -> None:
        """Give each task its slot (section, listing page), in order."""
        self._slots = {t.task_id: i for i, t in enumerate(tasks)}

    def items(self, state_text: str) -> list[str]:
        """Bids of the listing's items: links matching ``item_pattern``, or by default links
        with a text line right under them (the paging links, followed by "Page 2 of 3", are
        not items)."""
        lines = parse_state(state_text).lines
        if self.item is not None:
            return [e.bid for e in lines
                    if e.role == "link" and e.bid and self.item.search(e.name)]
        return [e.bid for e, nxt in zip(lines, lines[1:], strict=False)
                if e.role == "link" and e.bid and e.name not in self.paging
                and nxt.bid is None and nxt.role == "StaticText"]

    async def act(
        self, task: Task, observation: Observation, history: list[Transition], episode_id: str
    ) -> Decision:
        section, page = divmod(self._slots.get(task.task_id, 0), self.pages)
        state = parse_state(observation.state)
        done = [t.reasoning.split(" ", 2)[1] for t in history if t.reasoning.startswith("explore:")]
        taken = done.count("section")
        if taken < len(self.route):
            links = [e for e in state.elements
                     if e.role == "link" and e.bid and self.route[taken].search(e.name)]
            if not links:
                return Decision(action=call("send_msg_to_user", "done"),
                                reasoning="explore: nothing to open")
            return Decision(action=call("click", links[section % len(links)].bid),
                            reasoning="explore: section")
        listing = self.items(observation.state)
        if not listing:
            if history[-1].reasoning.startswith("explore: item"):
                return Decision(action=call("go_back"), reasoning="explore: back")
            return Decision(action=call("send_msg_to_user", "done"),
                            reasoning="explore: lost the listing")
        turned = done.count("page")
        following = state.find("link", self.next_name)
        if turned < page and following is not None and following.bid:
            return Decision(action=call("click", following.bid), reasoning="explore: page")
        opened = done.count("item")
        if opened < len(listing):
            return Decision(action=call("click", listing[opened]),
                            reasoning=f"explore: item {opened + 1}/{len(listing)}")
        return Decision(action=call("send_msg_to_user", "done"), reasoning="explore: finished")


def offline_agents(seed: int = 0, noise: float = 0.3) -> dict[str, Any]:
    """The web family's offline agents by name (``--agent oracle``, ``collect --agents …``)."""
    return {"oracle": OracleAgent(), "noisy": NoisyOracleAgent(seed=seed, noise=noise),
            "quitter": QuitterAgent(seed=seed), "random": RandomAgent(seed=seed),
            "explorer": ExplorerAgent(),
            "orders": ExplorerAgent(route=ORDERS_ROUTE, item_pattern=ORDER_ITEMS)}


def collection_plan(recipe: Any, tasks: list[Task]) -> list[tuple[str, Any, list, int]]:
    """(collector, agent, its train tasks, step limit) for every collector of the embedded
    ``recipe``, each spread over the whole split (every template), deterministically."""
    # The explorers start from the home page, where the section links are (the order explorer
    # signed in: tasks that require a login start so).
    at_root = [t for t in tasks if starts_at_root(t)]
    own = recipe.options  # the web's own options (:class:`.options.WebRecipeOptions`)
    plan = [("oracle", OracleAgent(), recipe.oracle_tasks, tasks, recipe.max_steps),
            ("noisy", NoisyOracleAgent(seed=recipe.seed, noise=recipe.noise), recipe.noisy_tasks,
             tasks, recipe.max_steps),
            ("quitter", QuitterAgent(seed=recipe.seed), own.quitter_tasks, tasks,
             recipe.max_steps),
            ("random", RandomAgent(seed=recipe.seed), recipe.random_tasks, tasks,
             recipe.max_steps),
            ("explorer", ExplorerAgent(pages=own.explorer_pages), own.explorer_tasks,
             at_root, own.explorer_steps),
            ("orders", ExplorerAgent(pages=own.explorer_pages, route=ORDERS_ROUTE,
                                     item_pattern=ORDER_ITEMS),
             own.order_explorer_tasks,
             [t for t in at_root if t.config.get("require_login")], own.explorer_steps)]
    out = []
    for name, agent, count, pool, max_steps in plan:
        chosen = every_nth(pool, count)
        if hasattr(agent, "assign"):  # the explorer: one slot per task
            agent.assign(chosen)
        out.append((name, agent, chosen, max_steps))
    return out


def starts_at_root(task: Task) -> bool:
    """True for a task that starts on the site's home page (no path after the host)."""
    url = str(task.config.get("start_url", ""))
    rest = url.split("://", 1)[-1]
    return bool(url) and rest.rstrip("/").count("/") == 0
