"""The dream environment: the shared environment contract, its own failure rules, and a dream
episode through the real episode graph and runner.

The experience model here is scripted (a tiny deterministic shop "world" answering from the
prompt), so everything runs offline without an LLM.
"""

from __future__ import annotations

import asyncio
import re

import pytest
from test_env_contract import test_contract  # noqa: F401 - collected here with the dream cases
from test_experience import HOME, LAPTOPS, FakeBuffer, ScriptedModel, answer

from dreamgym_agents.adapters.webarena.actions import WebActionSet
from dreamgym_agents.adapters.webarena.codec import WebCodec
from dreamgym_agents.adapters.webarena.family import WebArenaFamily
from dreamgym_agents.episodes.agent import Decision
from dreamgym_agents.episodes.env import Environment
from dreamgym_agents.episodes.graph import RunConfig, run_episodes
from dreamgym_agents.errors import EnvError
from dreamgym_agents.experience.dream import DreamConfig, DreamEnv
from dreamgym_agents.experience.model import ExperienceConfig, ExperienceModel
from dreamgym_agents.types import Task, read_trajectories

WEB = WebCodec()

EXPECTED = {"Say hi": "hi", "What is the price of the Acme laptop?": "$12.99"}
PRICE = Task(task_id="price", family="webarena", intent="What is the price of the Acme laptop?",
             split="train", config={"start_url": "http://shop/"})
SAY_HI = Task(task_id="hi", family="webarena", intent="Say hi", config={"start_url": "http://s/"})
ACTIONS = WebActionSet()
WEB_FAMILY = WebArenaFamily()


def section(prompt: str, heading: str) -> str:
    match = re.search(rf"^## {re.escape(heading)}[^\n]*\n(.*?)(?=\n## |\Z)", prompt, re.S | re.M)
    return match.group(1).strip() if match else ""


def world(messages: list[dict]) -> str:
    """A deterministic shop: link 1 opens the laptops page; the right answer wins."""
    prompt = messages[1]["content"]
    task, state = section(prompt, "Task"), section(prompt, "Current state")
    action = ACTIONS.parse_one(section(prompt, "Agent's action"))
    if action.is_terminal:
        ok = action.answer == EXPECTED[task]
        return answer(state, reward=float(ok), done=True, success=ok, reasoning="judged answer")
    if action.name == "click" and action.args == ("1",) and "[1] link 'Laptops'" in state:
        return answer(LAPTOPS)
    return answer(state, reasoning="nothing happens")


def make_env(answers=world, buffer=None, **cfg) -> tuple[DreamEnv, ScriptedModel]:
    scripted = ScriptedModel(answers)
    model = ExperienceModel(ExperienceConfig(), scripted, buffer, codec=WEB)
    return DreamEnv(DreamConfig(**cfg), model, buffer, WEB_FAMILY), scripted


@pytest.fixture(params=["dream"])
def env_case(request):
    """The shared contract (tests/test_env_contract.py) run on the dream. The contract expects
    an invalid step not to end the episode: that is the dream's real-environment mode."""
    env, _ = make_env(invalid_action_ends_episode=False)
    yield env, SAY_HI, "dance [wildly]", "stop [hi]", "stop [bye]"
    env.close()


def test_dream_is_an_environment_with_synthetic_provenance():
    env, _ = make_env()
    assert isinstance(env, Environment) and env.provenance == "synthetic"


def test_invalid_action_moves_the_episode_to_a_failure_state():
    env, scripted = make_env()
    obs = env.reset(PRICE)
    bad = env.step("dance [wildly]")
    assert not bad.valid and bad.done and not bad.success and bad.reward == 0.0 and bad.error
    assert bad.observation.state == obs.state and bad.info["failure_state"]
    assert not scripted.requests  # the model is not asked about an unparseable action
    with pytest.raises(RuntimeError, match="reset"):
        env.step("click [1]")


def test_reset_from_a_recorded_start_state():
    env, _ = make_env(buffer=FakeBuffer(starts={"price": HOME}))
    obs = env.reset(PRICE)
    assert obs.state == HOME and obs.url == "http://shop/"
    assert obs.info["start_state"] == "recorded"


def test_reset_synthesises_a_start_state_when_none_is_recorded():
    env, _ = make_env(buffer=FakeBuffer())
    obs = env.reset(PRICE)
    assert obs.state == "URL: http://shop/\nTitle: " and obs.info["start_state"] == "synthesised"
    strict, _ = make_env(buffer=FakeBuffer(), synthesise_start=False)
    with pytest.raises(EnvError, match="synthesise_start"):
        strict.reset(PRICE)


def test_steps_follow_the_model_and_carry_the_history():
    env, scripted = make_env(buffer=FakeBuffer(starts={"price": HOME}))
    env.reset(PRICE)
    first = env.step("click [1]")
    assert first.valid and not first.done and first.observation.state == LAPTOPS
    assert first.observation.url == "http://shop/laptops"
    assert first.info["reasoning"] == "the link opens the laptops page"
    assert first.info["em_failure"] is False and first.info["demos"] == []
    win = env.step("send_msg_to_user('$12.99')")
    assert win.done and win.success and win.reward == 1.0
    assert "step 1: click [1] → URL: http://shop/laptops | Title: Laptops" in \
        scripted.requests[1][1]["content"]
    assert [t.provenance for t in env.history] == ["synthetic", "synthetic"]
    assert env.history[0].info["reasoning"] == "the link opens the laptops page"


def test_experience_model_failure_ends_the_episode_without_reward():
    env, scripted = make_env(answers=["I cannot tell."])
    obs = env.reset(PRICE)
    result = env.step("click [1]")
    assert result.done and result.reward == 0.0 and not result.success and result.valid
    assert result.info["em_failure"] is True and result.info["em_attempts"] == 3
    assert result.error.startswith("experience model failure: missing <next_state>")
    assert result.observation.state == obs.state and len(scripted.requests) == 3
    # The recorded step keeps the info, so replays read from env.history count the failure.
    assert env.history[-1].info["em_failure"] is True and env.history[-1].error


def test_terminal_action_judged_not_done_still_ends_the_episode():
    env, _ = make_env(answers=[answer(HOME, reward=0, done=False)])
    env.reset(PRICE)
    result = env.step("stop [$12.99]")
    assert result.done and result.reward == 0.0 and not result.success
    assert result.info["forced_done"]


def test_model_done_ends_the_episode_on_a_non_terminal_action():
    env, _ = make_env(answers=[answer(LAPTOPS, reward=1, done=True, success=True)])
    env.reset(PRICE)
    result = env.step("click [1]")
    assert result.done and result.success and result.reward == 1.0


class ShopAgent:
    """Clicks into the laptops page, then answers the price it reads there."""

    name = "shop-agent"

    async def act(self, task, observation, history, episode_id):
        price = re.search(r"\$\d+\.\d\d", observation.state)
        action = f"send_msg_to_user('{price.group()}')" if price else "click('1')"
        return Decision(action=action, reasoning="scripted")


def test_dream_episodes_through_the_episode_graph_and_runner(tmp_path):
    buffer = FakeBuffer(starts={"price": HOME})
    model = ExperienceModel(ExperienceConfig(), ScriptedModel(world), buffer, codec=WEB)
    tasks = [PRICE, Task(task_id="price2", family="webarena", intent=PRICE.intent, split="train",
                         config={"start_url": "http://shop/"})]
    cfg = RunConfig(out_dir=tmp_path, concurrency=2, max_steps=5, meta={"agent": "shop-agent"})
    result = asyncio.run(run_episodes(
        tasks, lambda: DreamEnv(DreamConfig(), model, buffer, WEB_FAMILY), ShopAgent(), cfg))
    summary = result.summary
    assert summary["synthetic_transitions"] > 0 and summary["real_transitions"] == 0
    assert summary["episodes"] == 2 and summary["success_rate"] == 0.5  # price2: no start state
    trajs = {t.task.task_id: t for t in read_trajectories(tmp_path / "trajectories.jsonl")}
    recorded = trajs["price"]
    assert recorded.provenance == "synthetic" and recorded.success
    assert all(t.provenance == "synthetic" for t in recorded.transitions)
    assert [t.action for t in recorded.transitions] == ["click('1')", "send_msg_to_user('$12.99')"]
    assert recorded.transitions[-1].reward == 1.0
    assert recorded.transitions[0].info["reasoning"] == "the link opens the laptops page"
    # The synthesised start page has no laptops link: clicking leads nowhere until max_steps.
    assert trajs["price2"].termination == "max_steps" and not trajs["price2"].success
    assert model.metrics["experience/failures"] == 0


def test_a_synthetic_task_starts_where_its_seed_starts():
    buffer = FakeBuffer(starts={"price": HOME})
    env, _ = make_env(buffer=buffer)
    variant = Task(task_id="price~v1", family="webarena", intent="What is the price of X?",
                   split="synthetic", config={"start_url": "http://shop/",
                                              "synthetic_of": "price"})
    obs = env.reset(variant)
    assert obs.state == HOME and obs.info["start_state"] == "recorded"


def referenced(task_id: str, eval_types: list[str], **ev) -> Task:
    config = {"start_url": "http://shop/", "intent": "What is the price of the Acme laptop?",
              "eval": {"eval_types": eval_types, "reference_answers": {}, "reference_url": "",
                       "program_html": [], **ev}}
    return Task(task_id=task_id, family="webarena", intent=config["intent"], split="train",
                config=config)


def yes_man(messages: list[dict]) -> str:
    """An experience model that calls every step a success."""
    return answer(LAPTOPS, reward=1, done=True, success=True, reasoning="looks right")


def test_the_tasks_own_evaluator_judges_a_stop_where_it_reads_only_the_answer_or_url():
    price = referenced("p", ["string_match"], reference_answers={"exact_match": "$12.99"})
    env, _ = make_env(yes_man)
    env.reset(price)
    wrong = env.step("send_msg_to_user('$13.00')")
    assert (wrong.reward, wrong.success, wrong.done) == (0.0, False, True)
    assert wrong.info["verdict"] == "task" and wrong.info["model_reward"]["success"] is True
    env.reset(price)
    right = env.step("send_msg_to_user('$12.99')")
    assert (right.reward, right.success, right.done) == (1.0, True, True)
    # a step that does not stop completes nothing: the episode goes on
    env.reset(price)
    click = env.step("click('1')")
    assert (click.reward, click.success, click.done) == (0.0, False, False)
    assert click.info["model_reward"]["done"] is True
    # the page's URL, for a url_match task (the stop's own page: the state it stops on)
    laptops = referenced("u", ["url_match"], reference_url="http://shop/laptops")
    env.reset(laptops)
    assert env.step("send_msg_to_user('done')").success is False  # it stopped on the home page
    # where the task has no such check (the site's hidden state), the model's verdict stands
    edit = referenced("e", ["program_html"], program_html=[{"url": "last", "locator": "",
                                                            "required_contents": {}}])
    env.reset(edit)
    assert env.step("send_msg_to_user('done')").success is True
    assert env.history[-1].info.get("verdict") is None
    off, _ = make_env(yes_man, verdicts=False)  # the model's verdicts alone, as before
    off.reset(price)
    assert off.step("send_msg_to_user('$13.00')").success is True


def test_a_dream_reads_its_tasks_openings_ahead_where_the_family_can():
    from dreamgym_agents.experience.dream import read_openings_ahead

    class Ahead(WebArenaFamily):
        asked: list = []

        def read_openings(self, tasks):
            self.asked.append([t.task_id for t in tasks])
            return len(tasks)

    tasks = [SAY_HI]
    assert read_openings_ahead(WebArenaFamily(), tasks) == 0  # no hook: read when asked
    ahead = Ahead()
    assert read_openings_ahead(ahead, tasks) == 1 and ahead.asked == [[SAY_HI.task_id]]
    assert read_openings_ahead(ahead, []) == 0 and len(ahead.asked) == 1
