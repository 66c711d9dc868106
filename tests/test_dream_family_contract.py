"""The dream of every registered family honours the environment contract.

The experience model is scripted (it answers the state unchanged, as ``@state``, or a step that
ends the episode), so what is checked is the family's side of the dream: its action set, its
state format (start state, location) and its experience codec (reading the answer back).
"""

from __future__ import annotations

import pytest
from test_experience import ScriptedModel
from test_family_contract import CASES, _params

from dreamgym_agents.episodes.env import Environment, make_family
from dreamgym_agents.errors import ConfigError
from dreamgym_agents.experience.dream import DreamConfig, DreamEnv
from dreamgym_agents.experience.model import ExperienceConfig, ExperienceModel

UNCHANGED = ("<reasoning>nothing happens</reasoning>\n<reward>0</reward>\n<done>false</done>\n"
             "<success>false</success>\n<next_state>\n@state\n</next_state>")
WON = UNCHANGED.replace("<reward>0", "<reward>1").replace("<done>false", "<done>true").replace(
    "<success>false", "<success>true")


@pytest.fixture(params=_params(real=False))
def dream(request):
    name = request.param
    family = make_family(name)
    task = family.load_tasks("test")[0]
    model = ScriptedModel([UNCHANGED, UNCHANGED, WON])
    experience = ExperienceModel(ExperienceConfig(prompt_style="compact", max_parse_retries=0),
                                 model, None, codec=family.experience_codec())
    # the model's own word on each step: a family's verdicts (the web's task check, which
    # overrules a success claimed for a click) are tested in test_dream_contract
    env = DreamEnv(DreamConfig(invalid_action_ends_episode=False, verdicts=False), experience,
                   None, family)
    yield name, family, task, env, model
    env.close()
    family.close()


def test_the_dream_plays_a_family_like_its_real_environment(dream):
    name, family, task, env, model = dream
    assert isinstance(env, Environment) and env.provenance == "synthetic"
    fmt = family.state_format()
    start = env.reset(task)
    # no buffer: the family's real opening when it reads one (a game's first observation),
    # else the state it synthesises
    opening = family.opening(task) if hasattr(family, "opening") else None
    assert start.state == (opening or fmt.initial_state(task))
    assert start.info["start_state"] == ("opening" if opening else "synthesised")
    assert start.url == fmt.location(start.state)
    # an action the family cannot parse: a recorded invalid step, the model not asked
    bad = env.step(CASES[name].garbage)
    assert not bad.valid and bad.reward == 0 and not bad.done and model.requests == []
    # a valid one: the model's "@state" is read back by the family's codec as the same state
    same = env.step(CASES[name].valid)
    assert same.valid and not same.done and same.observation.state == start.state
    assert len(model.requests) == 1
    history = env.history
    assert [t.valid for t in history] == [False, True] and history[1].provenance == "synthetic"
    # the model ends the episode with a success
    env.step(CASES[name].valid)
    won = env.step(CASES[name].valid)
    assert won.done and won.success and won.reward == 1.0


def test_a_terminal_action_ends_the_dream_episode_whatever_the_model_says(dream):
    name, _, task, env, _ = dream
    if CASES[name].terminal is None:
        pytest.skip(f"{name} has no action that ends an episode by its type")
    env.reset(task)
    result = env.step(CASES[name].terminal)
    assert result.done and not result.success and result.reward == 0
    assert result.info["forced_done"]


@pytest.mark.parametrize("name", _params(real=False))
def test_state_rewards_come_from_the_familys_check_of_the_predicted_state(name):
    family = make_family(name)
    task = family.load_tasks("test")[0]
    model = ScriptedModel([WON, UNCHANGED, WON])
    experience = ExperienceModel(ExperienceConfig(prompt_style="compact", max_parse_retries=0),
                                 model, None, codec=family.experience_codec())
    cfg = DreamConfig(invalid_action_ends_episode=False, reward="state")
    try:
        if getattr(family, "state_success", None) is None:
            with pytest.raises(ConfigError, match="state_success"):
                DreamEnv(cfg, experience, None, family)
            return
        env = DreamEnv(cfg, experience, None, family)
        start = env.reset(task)
        assert family.state_success(task, start.state) is False
        # the model claims a win on a state that does not meet the goal: no reward, no end
        claimed = env.step(CASES[name].valid)
        assert (claimed.reward, claimed.done, claimed.success) == (0.0, False, False)
        assert claimed.info["model_reward"] == {"reward": 1.0, "done": True, "success": True}
        assert env.history[-1].reward == 0.0
        # a state the check accepts is a win whatever the model says
        family.state_success = lambda task, state: True
        env = DreamEnv(cfg, experience, None, family)
        env.reset(task)
        met = env.step(CASES[name].valid)
        assert (met.reward, met.done, met.success) == (1.0, True, True)
        assert met.info["model_reward"]["reward"] == 0.0
    finally:
        family.close()


def test_an_unknown_dream_reward_source_is_refused():
    with pytest.raises(ConfigError, match="choose from model, state"):
        DreamConfig(reward="oracle")
