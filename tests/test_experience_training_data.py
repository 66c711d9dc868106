from dreamgym_agents.experience_compact import answer_text, render_compact, target_line
from dreamgym_agents.state_delta import expand_state
from dreamgym_agents.training.annotate import annotate_deterministic, deterministic_rationale
from dreamgym_agents.training.experience_data import ExampleConfig, build_examples
from dreamgym_agents.types import Task, Trajectory, Transition

HOME = "URL: __SHOPPING__\nTitle: Home\n[14] link 'Laptops'\n[30] link 'My Cart (4)'"
LAPTOPS = ("URL: __SHOPPING__/category/laptops\nTitle: Laptops\n[14] link 'Laptops'\n"
           "StaticText '$9.99'")


def episode(eid: str, answer: str, success: bool) -> Trajectory:
    steps = [
        Transition(episode_id=eid, step=0, task_id="t", state=HOME, action="click('14')",
                   next_state=LAPTOPS, provenance="offline"),
        Transition(episode_id=eid, step=1, task_id="t", state=LAPTOPS,
                   action=f"send_msg_to_user('{answer}')", next_state=LAPTOPS,
                   reward=float(success), done=True, success=success, provenance="offline"),
    ]
    return Trajectory(episode_id=eid, task=Task("t", "webarena", "Price of the laptop?"),
                      transitions=steps, success=success)


class ListRetriever:
    def __init__(self, trajs):
        self.items = [t for tr in trajs for t in tr.transitions]

    def retrieve(self, state, action, *, k=None, where=None, exclude_episode=None):
        same = [t for t in self.items if t.episode_id != exclude_episode and t.state == state
                and t.action == action]
        rest = [t for t in self.items if t.episode_id != exclude_episode and t not in same]
        return (same + rest)[:k]


def test_prompt_pieces():
    assert target_line(HOME, "click('14')") == "[14] link 'Laptops'"
    assert target_line(HOME, "click [30]") == "[30] link 'My Cart (4)'"
    assert answer_text("send_msg_to_user('$9.99')") == "$9.99"
    assert answer_text("stop [N/A]") == "N/A" and answer_text("click('1')") is None
    text = render_compact("Price?", [], LAPTOPS, "send_msg_to_user('$9.99')", [])[0]["content"]
    assert "answer on page: StaticText '$9.99'" in text and "demos: (none)" in text
    ablated = render_compact("Price?", None, LAPTOPS, "click('14')", None)[0]["content"]
    assert "history:" not in ablated and "demo 1" not in ablated and "demos:" not in ablated


def test_examples_use_other_episodes_and_round_trip():
    trajs = [episode("a", "$9.99", True), episode("b", "$1.00", False)]
    annotate_deterministic(trajs)
    assert trajs[0].transitions[1].info["em_rationale_source"] == "deterministic"
    examples = build_examples(trajs, ListRetriever(trajs), ExampleConfig(top_k=2))
    assert len(examples) == 4
    first = examples[0]
    prompt = first["messages"][0]["content"]
    assert "demo 1: __SHOPPING__ | click('14') on [14] link 'Laptops'" in prompt
    assert "@demo 1" in first["completion"]  # episode b made the same move: copy its page
    block = first["completion"].split("<next_state>\n")[1].split("\n</next_state>")[0]
    assert expand_state(block, HOME, [LAPTOPS, LAPTOPS]) == LAPTOPS
    final = examples[1]["completion"]
    assert "<reward>1</reward>" in final and "<success>true</success>" in final
    assert "final answer" in deterministic_rationale(trajs[0].transitions[1])
    no_reason = build_examples(trajs, None, ExampleConfig(use_reasoning=False,
                                                           use_retrieval=False))
    assert no_reason[0]["completion"].startswith("<reasoning></reasoning>")
