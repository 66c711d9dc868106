"""WebArena's LLM judges (``fuzzy_match`` and the unachievable-task check) over the gateway.

The prompts are WebArena's own ``llm_fuzzy_match`` and ``llm_ua_match``, word for word, as its
current release has them in ``evaluation_harness/helper_functions.py`` (``libwebarena`` 0.0.5 on
PyPI), so scores stay comparable with published WebArena numbers. WebArena asks
``gpt-4-1106-preview`` at temperature 0; ``--judge MODEL`` picks ours. One difference: a reply
with no verdict scores 0 with a warning, where WebArena's ``assert`` stops the run.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dreamgym_agents.adapters.webarena.evaluation import Judge
    from dreamgym_agents.gateway.llm import Gateway

logger = logging.getLogger(__name__)


def fuzzy_match_messages(intent: str, reference: str, prediction: str) -> list[dict[str, str]]:
    """WebArena's ``llm_fuzzy_match`` prompt."""
    message = (
        "Help a teacher to grade the answer of a student given a question. Keep in mind that the "
        "student may use different phrasing or wording to answer the question. The goal is to "
        "evaluate whether the answer is semantically equivalent to the reference answer.\n"
        f"question: {intent}\n"
        f"reference answer: {reference}\n"
        "all the string 'N/A' that you see is a special sequence that means 'not achievable'\n"
        f"student answer: {prediction}\n"
        "Conclude the judgement by correct/incorrect/partially correct."
    )
    return [
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": message},
    ]


def unachievable_messages(intent: str, reason: str, prediction: str) -> list[dict[str, str]]:
    """WebArena's ``llm_ua_match`` prompt, as its current release words it: ``libwebarena``
    0.0.4/0.0.5 on PyPI, the package BrowserGym's WebArena tasks run, not the first release's
    ``Task_1``/``Reason_1``/``Report_1`` wording."""
    message = (
        f"task: {intent}\n"
        f"actual unachievable reason: {reason}\n"
        f"reported unachievable reason: {prediction}\n"
        "The task described above is inherently unachievable due to the reason specified under "
        "'actual unachievable reason'. An individual previously attempted this task and was "
        "unable to complete it. They provided a reason for their failure, which is listed under "
        "'reported unachievable reason'. Your role is to review both the actual and reported "
        "reasons. Determine if the reported reason aligns with the actual reason, even if "
        "implicitly. If the stated reason is in line with the actual reason, respond with "
        "'same'. Otherwise, respond with 'different'."
    )
    return [
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": message},
    ]


def parse_fuzzy_verdict(text: str) -> float:
    """1.0 for "correct", 0.0 for "incorrect"/"partially correct" (or no verdict)."""
    low = text.lower()
    if "partially correct" in low or "incorrect" in low:
        return 0.0
    if "correct" in low:
        return 1.0
    logger.warning("LLM judge gave no verdict (scored 0): %.200s", text)
    return 0.0


def parse_unachievable_verdict(text: str) -> float:
    """1.0 for "same", 0.0 for "different" (or no verdict)."""
    low = text.lower()
    if "different" in low:
        return 0.0
    if "same" in low:
        return 1.0
    logger.warning("LLM judge gave no verdict (scored 0): %.200s", text)
    return 0.0


class LLMJudge:
    """WebArena's two LLM judges over a gateway (see :data:`Judge`).

    Args:
        gateway: Anything with ``complete(messages) -> object with .text``.
    """

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def __call__(self, intent: str, reference: str, prediction: str) -> float:
        reply = self.gateway.complete(fuzzy_match_messages(intent, reference, prediction))
        return parse_fuzzy_verdict(str(reply.text or ""))

    def unachievable(self, intent: str, reason: str, prediction: str) -> float:
        """Does the agent's report refer to the reason the task cannot be done?"""
        reply = self.gateway.complete(unachievable_messages(intent, reason, prediction))
        return parse_unachievable_verdict(str(reply.text or ""))


def make_llm_judge(gateway: Gateway) -> Judge:
    """Build WebArena's fuzzy-match judge (with its unachievable-task judge) over a gateway."""
    return LLMJudge(gateway)
