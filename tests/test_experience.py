"""The experience model: prompt, parser, retries and failures, ablation flags, DSPy signature."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dreamgym_agents.adapters.webarena.codec import WebCodec
from dreamgym_agents.errors import ConfigError, ModelError
from dreamgym_agents.experience.model import (
    ExperienceConfig,
    ExperienceModel,
    ExperienceParseError,
    build_signature,
    load_template,
    parse_experience_output,
    render_signature_messages,
)
from dreamgym_agents.gateway.llm import Completion, Gateway, LLMConfig
from dreamgym_agents.types import ModelUsage, Task, Trajectory, Transition

WEB = WebCodec()

HOME = "URL: http://shop/\nTitle: Shop\n[1] link 'Laptops'\n[2] searchbox 'Search'"
LAPTOPS = "URL: http://shop/laptops\nTitle: Laptops\nheading 'Laptops'\nStaticText 'Acme $12.99'"
TASK = Task(task_id="7", family="webarena", intent="What is the price of the Acme laptop?")


def answer(next_state: str, reward: float = 0, done: bool = False, success: bool = False,
           reasoning: str = "the link opens the laptops page") -> str:
    return (f"<reasoning>{reasoning}</reasoning>\n<next_state>\n{next_state}\n</next_state>\n"
            f"<reward>{reward:g}</reward>\n<done>{str(done).lower()}</done>\n"
            f"<success>{str(success).lower()}</success>")


GOOD = answer(LAPTOPS)


CUT = "<<cut>>"
"""Ends a scripted answer that the model stopped at its token limit."""


class ScriptedModel:
    """A ``Gateway`` double (DSPy's DummyLM idea): answers from a list or a function of the
    messages, and records every request."""

    def __init__(self, answers: list[str] | Callable[[list[dict]], str]) -> None:
        self.answers = answers
        self.requests: list[list[dict]] = []

    def complete(self, messages: list[dict], **_: object) -> Completion:
        self.requests.append(messages)
        if callable(self.answers):
            text = self.answers(messages)
        else:
            text = self.answers[min(len(self.requests), len(self.answers)) - 1]
        cut = text.endswith(CUT)  # an answer that stopped at the token limit
        return Completion(text=text.removesuffix(CUT), finish_reason="length" if cut else "stop",
                          usage=ModelUsage(calls=1, prompt_tokens=100, completion_tokens=20))


class FakeBuffer:
    """An in-memory replay buffer: retrieval by shared words, best first; start states by id."""

    def __init__(self, transitions: list[Transition] | None = None,
                 starts: dict[str, str] | None = None) -> None:
        self.transitions = transitions or []
        self.starts = starts or {}
        self.calls: list[dict] = []

    def retrieve(self, state, action, *, k=None, where=None, exclude_episode=None):
        self.calls.append({"state": state, "action": action, "k": k, "where": where,
                           "exclude_episode": exclude_episode})
        words = set((state + " " + action).split())
        pool = [t for t in self.transitions if t.episode_id != exclude_episode]
        pool.sort(key=lambda t: -len(words & set((t.state + " " + t.action).split())))
        return pool[: k or 3]

    def start_state(self, task_id=None, *, start=None, family=None):
        return self.starts.get(task_id)


def demo(episode: str, step: int, state: str, action: str, next_state: str) -> Transition:
    return Transition(episode_id=episode, step=step, task_id="x", state=state, action=action,
                      next_state=next_state, provenance="offline")


BEST = demo("real-1", 0, HOME, "click('1')", LAPTOPS)
SECOND = demo("real-2", 4, "URL: http://shop/cart\nTitle: Cart", "click('9')",
              "URL: http://shop/checkout\nTitle: Checkout")


# -------------------------------------------------------------------------------- parser


def test_parses_a_well_formed_answer():
    out = parse_experience_output(GOOD)
    assert out.next_state == LAPTOPS
    assert out.reasoning == "the link opens the laptops page"
    assert (out.reward, out.done, out.success, out.adjusted) == (0.0, False, False, [])


def test_parser_tolerates_fences_case_yes_no_and_a_missing_last_closing_tag():
    text = ("```xml\n  <REASONING>r</Reasoning>\n<Next_State>\n```\nURL: http://shop/\n"
            "Title: Shop\n```\n</next_state><reward> 1.0 </reward><done>Yes</done>"
            "<success>yes\n```\n")
    out = parse_experience_output(text)
    assert out.next_state == "URL: http://shop/\nTitle: Shop"
    assert (out.reward, out.done, out.success) == (1.0, True, True)


@pytest.mark.parametrize("word,value", [("true", True), ("no", False), ("1", True), ("0", False),
                                        ("False.", False), ("1.0", True)])
def test_parser_reads_booleans(word, value):
    assert parse_experience_output(answer(HOME).replace("<done>false", f"<done>{word}")).done \
        is value


def test_parser_consistency_rules():
    # an outcome reward: reward 1, success and done go together, or the answer is unreadable
    for reward, done, success in [(1, False, False), (1, True, False), (0, True, True),
                                  (0, False, True), (1, False, True)]:
        with pytest.raises(ExperienceParseError, match="contradicts|not <done>"):
            parse_experience_output(answer(HOME, reward=reward, done=done, success=success))
    out = parse_experience_output(answer(HOME, reward=1, done=True, success=True))
    assert (out.reward, out.done, out.success, out.adjusted) == (1.0, True, True, [])
    assert parse_experience_output(answer(HOME, reward=0, done=True, success=False)).done
    out = parse_experience_output(answer(HOME, reward=7, done=True, success=True))
    assert out.reward == 1.0 and out.adjusted == ["reward clamped to [0, 1]"]
    assert parse_experience_output(answer(HOME, reward=-2)).reward == 0.0


def test_missing_success_follows_the_reward_and_missing_reasoning_is_fine():
    text = "I think it opens.\n<next_state>\nURL: a\n</next_state><reward>0</reward><done>no</done>"
    out = parse_experience_output(text)
    assert out.reasoning == "I think it opens." and not out.success and not out.done


@pytest.mark.parametrize("text,named", [
    ("", ["<next_state>", "<reward>", "<done>"]),
    ("I am not sure what happens.", ["<next_state>", "<reward>", "<done>"]),
    ("<reasoning>r</reasoning><next_state>\nURL: a\n</next_state><reward>", ["<reward>", "<done>"]),
    ("<next_state>\n\n</next_state><reward>0</reward><done>false</done>", ["<next_state>"]),
    ("<next_state>URL: a</next_state><reward>high</reward><done>maybe</done>",
     ["<reward>", "<done>"]),
])
def test_partial_or_garbage_answers_raise_naming_the_fields(text, named):
    with pytest.raises(ExperienceParseError) as info:
        parse_experience_output(text)
    for field_name in named:
        assert field_name in str(info.value)


def test_tags_mentioned_inside_the_reasoning_do_not_confuse_the_parser():
    text = answer(LAPTOPS, reasoning="I will write <reward>1</reward> only if <done> is true")
    out = parse_experience_output(text)
    assert out.reward == 0.0 and out.next_state == LAPTOPS


# -------------------------------------------------------------------------------- the model


def test_predict_reads_the_answer_and_names_the_demos_best_first():
    buffer = FakeBuffer([SECOND, BEST])
    model = ExperienceModel(ExperienceConfig(top_k=2), ScriptedModel([GOOD]), buffer, codec=WEB)
    pred = model.predict(TASK, [], HOME, "click('1')", exclude_episode="mine")
    assert pred.ok and pred.output.next_state == LAPTOPS and pred.failure == ""
    assert pred.attempts == 1 and pred.usage.calls == 1
    assert pred.demos == ["real-1:0", "real-2:4"]
    # more candidates than shown: they are re-ranked (rank_step_demos)
    assert buffer.calls[0]["k"] == 16 and buffer.calls[0]["exclude_episode"] == "mine"
    assert buffer.calls[0]["where"] == {"provenance": {"$in": ["offline", "real"]},
                                        "task_id": {"$ne": TASK.task_id}}


def test_demos_appear_in_the_prompt_best_first():
    model = ExperienceModel(ExperienceConfig(), ScriptedModel([GOOD]), FakeBuffer([SECOND, BEST]),
                            codec=WEB)
    user = model.build_messages(TASK, [], HOME, "click('1')",
                                model.retrieve(HOME, "click('1')"))[1]["content"]
    first, second = user.index("### Example 1"), user.index("### Example 2")
    assert first < user.index("URL: http://shop/laptops") < second
    assert second < user.index("URL: http://shop/checkout")


def test_partial_answer_is_retried_with_feedback_then_read():
    scripted = ScriptedModel(["<reasoning>r</reasoning><next_state>\nURL: a", GOOD])
    model = ExperienceModel(ExperienceConfig(), scripted, codec=WEB)
    pred = model.predict(TASK, [], HOME, "click('1')")
    assert pred.ok and pred.attempts == 2 and pred.usage.calls == 2 and pred.failure == ""
    retry = scripted.requests[1]
    assert retry[-2]["role"] == "assistant" and "could not be read" in retry[-1]["content"]
    assert "<reward>" in retry[-1]["content"]
    assert model.metrics["experience/parse_retries"] == 1
    assert model.metrics["experience/failures"] == 0


def test_garbage_becomes_a_counted_failure_after_the_retries():
    model = ExperienceModel(ExperienceConfig(max_parse_retries=2), ScriptedModel(["no idea"]),
                            codec=WEB)
    pred = model.predict(TASK, [], HOME, "click('1')")
    assert pred.output is None and not pred.ok
    assert pred.attempts == 3 and pred.usage.calls == 3
    assert "missing <next_state>" in pred.failure and pred.raw == "no idea"
    assert model.metrics["experience/failures"] == 1
    assert model.metrics["experience/failure_rate"] == 1.0


def test_outcome_before_the_page_is_read_and_a_page_cut_at_the_token_limit_is_not():
    first = ("<reasoning>r</reasoning><reward>1</reward><done>true</done><success>true</success>"
             f"<next_state>\n{LAPTOPS}\n</next_state>")
    out = parse_experience_output(first)
    assert (out.next_state, out.reward, out.done, out.success) == (LAPTOPS, 1.0, True, True)
    cut = first.removesuffix("\n</next_state>")
    model = ExperienceModel(ExperienceConfig(max_parse_retries=1),
                            ScriptedModel([cut + CUT, first]), codec=WEB)
    pred = model.predict(TASK, [], HOME, "click('1')")
    assert pred.ok and pred.attempts == 2 and pred.output.next_state == LAPTOPS
    failed = ExperienceModel(ExperienceConfig(max_parse_retries=0), ScriptedModel([cut + CUT]),
                             codec=WEB)
    assert "cut at the token limit" in failed.predict(TASK, [], HOME, "click('1')").failure
    # Without the limit, a last block missing its closing tag is still read (hosted models).
    assert ExperienceModel(ExperienceConfig(), ScriptedModel([cut]), codec=WEB).predict(
        TASK, [], HOME, "click('1')").ok


def test_through_the_real_gateway_with_a_mock_response():
    good = ExperienceModel(ExperienceConfig(),
                           Gateway(LLMConfig(model="openai/test", mock_response=GOOD)), codec=WEB)
    pred = good.predict(TASK, [], HOME, "click('1')")
    assert pred.ok and pred.output.next_state == LAPTOPS and pred.usage.calls == 1
    gateway = Gateway(LLMConfig(model="openai/test", mock_response="<next_state>oops"))
    bad = ExperienceModel(ExperienceConfig(max_parse_retries=1), gateway, codec=WEB)
    pred = bad.predict(TASK, [], HOME, "click('1')")
    assert not pred.ok and pred.attempts == 2 and gateway.usage.calls == 2


def test_model_errors_propagate():
    class Broken:
        def complete(self, messages):
            raise ModelError("openai/test: down", retryable=True)

    with pytest.raises(ModelError):
        ExperienceModel(ExperienceConfig(), Broken(), codec=WEB).predict(TASK, [], HOME,
                        "click('1')")


# -------------------------------------------------------------------------------- ablations


def _user(cfg: ExperienceConfig, buffer=None, history=None) -> tuple[str, FakeBuffer]:
    buffer = buffer or FakeBuffer([BEST])
    scripted = ScriptedModel([GOOD])
    ExperienceModel(cfg, scripted, buffer, codec=WEB).predict(TASK, history or [], HOME,
                    "click('1')")
    return scripted.requests[0][1]["content"], buffer


def _history(n: int) -> list[Transition]:
    return [Transition(episode_id="e", step=i, task_id="7", state=HOME, action=f"click('{i}')",
                       next_state=f"URL: http://shop/p{i}\nTitle: Page {i}\n[1] link 'x'")
            for i in range(n)]


def test_full_prompt_has_every_section_and_the_last_h_steps_as_url_and_title():
    user, buffer = _user(ExperienceConfig(history_steps=2), history=_history(3))
    for heading in ("## Task", "## Recent steps", "## Retrieved real transitions",
                    "## Current state", "## Agent's action", "reason step by step"):
        assert heading in user
    assert "step 2: click('1') → URL: http://shop/p1 | Title: Page 1" in user
    assert "click('0')" not in user and "link 'x'" not in user  # older steps, state bodies
    assert buffer.calls


def test_history_flag_drops_the_history_section():
    user, _ = _user(ExperienceConfig(use_history=False), history=_history(2))
    assert "## Recent steps" not in user and "Page 1" not in user


def test_retrieval_flag_drops_retrieval_and_its_section():
    user, buffer = _user(ExperienceConfig(use_retrieval=False))
    assert "## Retrieved" not in user and not buffer.calls


def test_reasoning_flag_asks_for_an_empty_reasoning():
    user, _ = _user(ExperienceConfig(use_reasoning=False))
    assert "<reasoning></reasoning>" in user and "step by step" not in user


def test_long_states_are_clipped():
    state = HOME + "".join(f"\nStaticText 'line {i}'" for i in range(50))
    scripted = ScriptedModel([GOOD])
    ExperienceModel(ExperienceConfig(max_state_lines=10), scripted, codec=WEB).predict(TASK, [],
                    state, "x")
    assert "… (44 more lines not shown)" in scripted.requests[0][1]["content"]


@pytest.mark.parametrize("kwargs,hint", [({"history_steps": 0}, "use_history"),
                                         ({"top_k": 0}, "use_retrieval"),
                                         ({"max_parse_retries": -1}, "max_parse_retries"),
                                         ({"retrieval_where": "offline"}, "mapping")])
def test_config_validation_says_how_to_fix(kwargs, hint):
    with pytest.raises(ConfigError, match=hint):
        ExperienceConfig(**kwargs)


# -------------------------------------------------------------------------------- DSPy, replay


def test_dspy_signature_renders_the_same_prompt():
    signature = build_signature()
    assert signature.instructions == load_template()["instruction"].strip()
    assert list(signature.input_fields) == ["task", "history", "retrieved", "state", "action"]
    assert list(signature.output_fields) == ["reasoning", "next_state", "reward", "done",
                                             "success"]
    model = ExperienceModel(ExperienceConfig(), ScriptedModel([GOOD]), FakeBuffer([BEST]),
                            codec=WEB)
    demos = model.retrieve(HOME, "click('1')")
    inputs = model.render_inputs(TASK, _history(1), HOME, "click('1')", demos)
    assert render_signature_messages(signature, inputs) == \
        model.build_messages(TASK, _history(1), HOME, "click('1')", demos)
    changed = signature.with_instructions("Simulate the site.")
    assert render_signature_messages(changed, inputs)[0]["content"] == "Simulate the site."
    from dreamgym_agents.experience.model import ExperienceStep

    assert ExperienceStep is signature


def test_predict_trajectory_replays_with_recorded_history_and_excludes_the_episode():
    steps = [demo("ep", 0, HOME, "click('1')", LAPTOPS),
             demo("ep", 1, LAPTOPS, "garbage", LAPTOPS),
             demo("ep", 2, LAPTOPS, "send_msg_to_user('$12.99')", LAPTOPS)]
    steps[1].valid = False
    buffer = FakeBuffer([BEST])
    scripted = ScriptedModel([GOOD])
    model = ExperienceModel(ExperienceConfig(), scripted, buffer, codec=WEB)
    pairs = model.predict_trajectory(Trajectory(episode_id="ep", task=TASK, transitions=steps))
    assert [t.step for t, _ in pairs] == [0, 2]
    assert all(c["exclude_episode"] == "ep" for c in buffer.calls)
    assert "step 2: garbage" in scripted.requests[1][1]["content"]


def test_signature_runs_in_dspy_predict_with_every_input():
    import dspy
    from dspy.utils import DummyLM

    lm = DummyLM([{"reasoning": "r", "next_state": LAPTOPS, "reward": "1.0", "done": "True",
                   "success": "True"}])
    with dspy.context(lm=lm):
        out = dspy.Predict(build_signature())(
            task=TASK.intent, history="(none)", retrieved="MARKER-42", state=HOME,
            action="click('1')",
        )
    assert out.reward == 1.0 and out.done is True and out.next_state == LAPTOPS
    # Every input reaches the model (an input named "demos" would be taken by dspy.Predict).
    assert "MARKER-42" in str(lm.history[-1]["messages"])


def test_inference_never_retrieves_the_played_tasks_own_records(tmp_path):
    """Training retrieved demonstrations from other tasks only; so does inference: a task of
    the buffer played in the dream is not shown its own recorded steps (its answer)."""
    from dreamgym_agents.buffer.replay import BufferConfig, ReplayBuffer

    own = Transition("own-1", 0, TASK.task_id, HOME, "click('1')", LAPTOPS, provenance="offline")
    other = Transition("other-1", 0, "8", HOME, "click('1')", LAPTOPS, provenance="offline")
    with ReplayBuffer(BufferConfig(path=str(tmp_path / "buf"))) as buffer:
        buffer.add([own, other])
        model = ExperienceModel(ExperienceConfig(top_k=2), ScriptedModel([GOOD]), buffer, codec=WEB)
        prediction = model.predict(TASK, [], HOME, "click('1')")
        assert prediction.demos == ["other-1:0"]
        keep = ExperienceModel(ExperienceConfig(top_k=2, exclude_same_task=False),
                               ScriptedModel([GOOD]), buffer, codec=WEB)
        assert sorted(keep.predict(TASK, [], HOME, "click('1')").demos) == ["other-1:0",
                                                                          "own-1:0"]


def test_a_codec_that_samples_decodes_first_answers_so_and_the_config_overrides_it():
    class Recording(ScriptedModel):
        def complete(self, messages, **overrides):
            self.overrides = [*getattr(self, "overrides", []), overrides]
            return super().complete(messages)

    class Sampling(WebCodec):
        @staticmethod
        def sampling(state: str, action: str) -> dict[str, float]:
            return {"temperature": 1.0, "top_p": 0.9} if action == "click('1')" else {}

    def first_call(cfg: ExperienceConfig, codec) -> dict:
        model = Recording([GOOD])
        assert ExperienceModel(cfg, model, codec=codec).predict(TASK, [], HOME, "click('1')").ok
        return model.overrides[0]

    assert first_call(ExperienceConfig(), WEB) == {}  # the gateway's own setting
    assert first_call(ExperienceConfig(), Sampling()) == {"temperature": 1.0, "top_p": 0.9}
    assert first_call(ExperienceConfig(top_p=0.5), Sampling()) == \
        {"temperature": 1.0, "top_p": 0.5}
    assert first_call(ExperienceConfig(temperature=0), Sampling()) == {"temperature": 0}
    model = Recording([GOOD])  # a step the codec decodes greedily
    ExperienceModel(ExperienceConfig(), model, codec=Sampling()).predict(TASK, [], HOME, "noop()")
    assert model.overrides == [{}]
    with pytest.raises(ConfigError, match="experience.top_p"):
        ExperienceConfig(top_p=0)


def test_a_saved_program_replaces_the_full_prompts_instruction(tmp_path):
    from dreamgym_agents.prompts.programs import PromptProgram, save_program

    program = PromptProgram(target="experience", family="webarena", template=WEB.prompt_file,
                            instruction="Predict the page exactly.")
    path = str(save_program(program, str(tmp_path / "em.json")))
    scripted = ScriptedModel([GOOD])
    model = ExperienceModel(ExperienceConfig(program=path), scripted, codec=WEB)
    assert model.predict(TASK, [], HOME, "click('1')").ok
    assert scripted.requests[0][0] == {"role": "system", "content": "Predict the page exactly."}
    # one call's candidate instruction (an optimiser's) wins over the program's
    model.predict(TASK, [], HOME, "click('1')", instruction="Candidate.")
    assert scripted.requests[1][0]["content"] == "Candidate."
    with pytest.raises(ConfigError, match="compact prompt has none"):
        ExperienceConfig(program=path, prompt_style="compact")
    agent = save_program(PromptProgram(target="agent", family="webarena", template="agent.md",
                                       instruction="x"), str(tmp_path / "agent.json"))
    with pytest.raises(ConfigError, match="prompts the agent"):
        ExperienceModel(ExperienceConfig(program=str(agent)), scripted, codec=WEB)
