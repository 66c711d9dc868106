"""The web family's experience codec: pages shown through what differs from the demonstrations,
the next page written as a reference plus edits (:mod:`.state_delta`), answers checked against
the task (:mod:`.experience_prompt`), rationales saying which page follows (:mod:`.rationale`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dreamgym_agents.adapters.webarena import experience_prompt, rationale, state_delta
from dreamgym_agents.types import Task, Transition


class WebCodec:
    """:class:`~dreamgym_agents.experience.codec.ExperienceCodec` for web pages."""

    verdicts = rationale.VERDICTS
    follows = rationale.FOLLOWS
    prompt_file = "experience_model.md"

    def for_task(self, task: Task | None) -> WebCodec:
        del task  # a page shows everything the model is told of the site
        return self

    @staticmethod
    def sampling(state: str, action: str) -> dict[str, Any]:
        return {}  # a page follows from the site: the gateway's setting (greedy by default)

    @staticmethod
    def describe() -> str:
        return "a website"

    @staticmethod
    def head(state: str) -> str:
        """The ``URL:``/``Title:`` lines of a state, joined with `` | `` (the full prompt's
        history; the compact prompt names pages its own way)."""
        head = [s.strip() for s in state.splitlines()[:3]
                if s.strip().startswith(("URL:", "Title:"))]
        return " | ".join(head) or "(no URL or title)"

    @staticmethod
    def answer_text(action: str) -> str | None:
        return experience_prompt.answer_text(action)

    @staticmethod
    def render(intent: str, history: list[Transition] | None, state: str, action: str,
               demos: list[Transition] | None, *, history_steps: int, use_reasoning: bool,
               params: dict[str, str] | None = None,
               tally: tuple[int, int] | None = None) -> list[dict[str, str]]:
        return experience_prompt.render_compact(
            intent, history, state, action, demos, history_steps=history_steps,
            use_reasoning=use_reasoning, params=params, tally=tally)

    @staticmethod
    def rank_step_demos(state: str, action: str, candidates: list[Transition],
                        k: int) -> list[Transition]:
        return experience_prompt.rank_step_demos(state, action, candidates, k)

    @staticmethod
    def rank_final_answer_demos(intent: str, state: str, action: str, params: dict[str, str],
                                candidates: list[Transition], k: int) -> list[Transition]:
        return experience_prompt.rank_final_answer_demos(intent, state, action, params,
                                                         candidates, k)

    @staticmethod
    def demo_pages(demos: Sequence[Any], state: str, action: str) -> list[str]:
        return state_delta.demo_pages(list(demos), state, action)

    @staticmethod
    def back_page(history: list[Transition]) -> str | None:
        return experience_prompt.back_page(history)

    @staticmethod
    def encode_state(target: str, state: str, pages: list[str], previous: str | None,
                     action: str) -> str:
        return state_delta.encode_state(target, state, pages, previous, action)

    @staticmethod
    def expand_state(text: str, state: str, pages: list[str], previous: str | None,
                     action: str) -> str:
        return state_delta.expand_state(text, state, pages, previous, action)

    @staticmethod
    def rationale(t: Transition, intent: str = "", *, written_as: str | None = None,
                  pages: list[str] | None = None) -> str:
        # the compact prompt names a demonstration's page by its URL (its head's first part)
        urls = ([experience_prompt.head(p).split(" | ")[0] for p in pages]
                if pages is not None else None)
        return rationale.deterministic_rationale(t, intent, written_as=written_as,
                                                 demo_urls=urls)
