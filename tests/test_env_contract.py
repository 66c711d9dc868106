"""The contract every environment honours (real browser here; the dream joins later).

- ``reset(task)`` gives an observation with a non-empty abstract state;
- an unparseable action is an invalid step: recorded error, reward 0, not done, state unchanged;
- a terminal action ends the episode with a reward in [0, 1] and ``success`` iff reward is 1;
- ``close()`` releases the environment.
"""

import pytest
from conftest import CounterEnv, counter_tasks

from dreamgym_agents.episodes.env import EnvConfig, Environment, Observation, StepResult
from dreamgym_agents.types import Task

SAY_HI = {
    "sites": ["shopping"], "task_id": 1, "require_login": True, "storage_state": None,
    "start_url": "__SHOPPING__", "geolocation": None, "intent_template": "Say hi",
    "instantiation_dict": {}, "intent": "Say hi", "require_reset": False,
    "eval": {"eval_types": ["string_match"], "reference_answers": {"exact_match": "hi"},
             "reference_url": "", "program_html": []},
}


@pytest.fixture(params=["counter", pytest.param("browser", marks=pytest.mark.browser)])
def env_case(request):
    if request.param == "counter":
        env = CounterEnv()
        yield env, counter_tasks(1)[0], "garbage!", "stop [0]", "stop [5]"
        env.close()
        return
    from dreamgym_agents.adapters.webarena.family import WebArenaFamily

    family = WebArenaFamily(environ={})
    cfg = EnvConfig()
    family.prepare(cfg)
    env = family.make_env(cfg)
    task = Task(task_id="1", family="webarena", intent="Say hi", config=SAY_HI)
    yield env, task, "dance [wildly]", "stop [hi]", "stop [bye]"
    env.close()
    family.close()


def test_contract(env_case):
    env, task, garbage, winning, losing = env_case
    assert isinstance(env, Environment)
    obs = env.reset(task)
    assert isinstance(obs, Observation) and obs.state.strip()
    bad = env.step(garbage)
    assert isinstance(bad, StepResult)
    assert not bad.valid and bad.error and bad.reward == 0.0 and not bad.done
    assert bad.observation.state == obs.state
    win = env.step(winning)
    assert win.done and win.success and win.reward == 1.0 and win.valid
    env.reset(task)
    lose = env.step(losing)
    assert lose.done and not lose.success and lose.reward == 0.0
