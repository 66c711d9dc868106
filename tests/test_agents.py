"""Built-in agents: oracle program resolution, noisy oracle, quitter, random, answer parsing."""

import asyncio

from dreamgym_agents.agent import (
    NoisyOracleAgent,
    OracleAgent,
    QuitterAgent,
    RandomAgent,
    parse_answer,
)
from dreamgym_agents.env import Observation
from dreamgym_agents.types import Task, Transition

STATE = "URL: __SHOPPING__\nTitle: Home\n[14] link 'Laptops'\n[37] searchbox 'Search'"
TASK = Task("1", "webarena", "Find laptops", oracle=[
    {"op": "click", "role": "link", "name": "Laptops"},
    {"op": "fill", "role": "searchbox", "name": "Search", "text": "usb"},
    {"op": "press", "role": "searchbox", "name": "Search", "key": "Enter"},
    {"op": "stop", "answer": "$9.99"},
])


def act(agent, history_len=0, episode="e"):
    history = [Transition(episode_id=episode, step=i, task_id="1", state=STATE, action="x",
                          next_state=STATE, reasoning="oracle step") for i in range(history_len)]
    return asyncio.run(agent.act(TASK, Observation(STATE), history, episode))


def test_oracle_resolves_role_and_name():
    assert act(OracleAgent()).action == "click('14')"
    assert act(OracleAgent(), 1).action == "fill('37', 'usb')"
    assert act(OracleAgent(), 2).action == "keyboard_press('Enter')"
    assert act(OracleAgent(), 3).action == "send_msg_to_user('$9.99')"


def test_quitter_answers_before_the_oracle_would():
    for episode in ("a", "b", "c", "d", "e"):
        steps = [act(QuitterAgent(), i, episode).action for i in range(4)]
        first_answer = next(i for i, a in enumerate(steps) if a.startswith("send_msg_to_user"))
        assert first_answer < 3 and steps[first_answer] != "send_msg_to_user('$9.99')"


def test_noisy_and_random_are_deterministic():
    assert act(NoisyOracleAgent(noise=0.5), 0, "x").action == act(
        NoisyOracleAgent(noise=0.5), 0, "x").action
    assert act(RandomAgent(seed=1), 2, "y").action == act(RandomAgent(seed=1), 2, "y").action
    assert act(NoisyOracleAgent(noise=0.0)).action == "click('14')"


def test_parse_answer():
    assert parse_answer("<think>go</think><action>click('3')</action>") == ("go", "click('3')")
    assert parse_answer("<think>go</think> click [3]") == ("go", "click [3]")
    assert parse_answer("stop [x]") == ("", "stop [x]")
