"""The experience model expands next states written as references (state_delta)."""

from dreamgym_agents.adapters.webarena.codec import WebCodec
from dreamgym_agents.experience.model import ExperienceConfig, ExperienceModel
from dreamgym_agents.gateway.llm import Gateway, LLMConfig
from dreamgym_agents.types import Task

WEB = WebCodec()

STATE = "URL: __SHOPPING__\nTitle: Home\n[37] searchbox 'Search'"


def answer(next_state: str) -> str:
    return (f"<reasoning>fill</reasoning><next_state>\n{next_state}\n</next_state>"
            "<reward>0</reward><done>false</done><success>false</success>")


def model(mock: str, style: str = "full") -> ExperienceModel:
    gateway = Gateway(LLMConfig(model="openai/test", mock_response=mock))
    return ExperienceModel(ExperienceConfig(prompt_style=style, max_parse_retries=0), gateway,
                           codec=WEB)


def test_reference_is_expanded():
    edits = "@state\n- [37] searchbox 'Search'\n+ [37] searchbox 'Search' value='usb'"
    prediction = model(answer(edits)).predict(Task("t", "w", "find usb"), [], STATE,
                                              "fill('37', 'usb')")
    assert prediction.ok
    assert prediction.output.next_state.endswith("[37] searchbox 'Search' value='usb'")


def test_reference_to_a_missing_demo_is_a_failure():
    prediction = model(answer("@demo 2")).predict(Task("t", "w", "x"), [], STATE, "click('1')")
    assert not prediction.ok and "demo" in prediction.failure


def test_compact_prompt_style():
    m = model(answer("@state"), style="compact")
    messages = m.build_messages(Task("t", "w", "find usb"), [], STATE, "fill('37', 'usb')", [])
    assert len(messages) == 1 and "action: fill('37', 'usb') on [37] searchbox" in (
        messages[0]["content"])
    assert m.predict(Task("t", "w", "x"), [], STATE, "click('1')").output.next_state == STATE


def test_prompt_too_long_for_the_model_is_a_failed_step():
    from dreamgym_agents.errors import ContextLengthError

    class Tight:
        def complete(self, messages):
            raise ContextLengthError("prompt of 900 tokens does not fit its context of 768")

    m = ExperienceModel(ExperienceConfig(), Tight(), codec=WEB)
    prediction = m.predict(Task("t", "w", "x"), [], STATE, "click('1')")
    assert not prediction.ok and "does not fit" in prediction.failure
    assert m.metrics["experience/failures"] == 1


def test_compact_retry_resamples_instead_of_appending_feedback():
    calls = []

    class Flaky:
        def complete(self, messages, **overrides):
            from dreamgym_agents.gateway.llm import Completion
            from dreamgym_agents.types import ModelUsage

            calls.append((len(messages), overrides))
            text = "garbage" if len(calls) == 1 else answer("@state")
            return Completion(text=text, usage=ModelUsage(calls=1))

    m = ExperienceModel(ExperienceConfig(prompt_style="compact", max_parse_retries=1), Flaky(),
                        codec=WEB)
    prediction = m.predict(Task("t", "w", "x"), [], STATE, "click('1')")
    assert prediction.ok and prediction.attempts == 2
    assert calls[0] == (1, {}) and calls[1][0] == 1 and calls[1][1]["temperature"] > 0
