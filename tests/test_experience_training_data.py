import pytest

from dreamgym_agents.experience import parse_experience_output
from dreamgym_agents.experience_compact import (
    answer_checks,
    answer_kind,
    answer_lines,
    answer_text,
    asked_kind,
    kinds_match,
    render_compact,
    rerank_final_answer_demos,
    target_context,
    target_line,
)
from dreamgym_agents.state_delta import expand_state
from dreamgym_agents.training.annotate import annotate_deterministic, deterministic_rationale
from dreamgym_agents.training.counterfactual import counterfactual_trajectories
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
    assert "answer on page (1 lines): StaticText '$9.99'" in text and "demos: (none)" in text
    assert ("answer checks: an amount of money, as the task asks for an amount of money; the "
            "page shows it") in text
    # The answer's checks come last, right before the answer is written.
    assert text.index("demos: (none)") < text.index("answer on page") < text.index("checks:")
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
    assert final.index("<success>") < final.index("<next_state>")  # outcome, then the page
    parsed = parse_experience_output(final)
    assert parsed.success and parsed.done and parsed.next_state == "@state"
    assert deterministic_rationale(trajs[0].transitions[1]).startswith("Final answer")
    no_reason = build_examples(trajs, None, ExampleConfig(use_reasoning=False,
                                                           use_retrieval=False))
    assert no_reason[0]["completion"].startswith("<reasoning></reasoning>")


def test_the_text_below_a_target_is_shown_with_the_action():
    listing = ("URL: u\nTitle: t\n[44] link 'Alpine Bag'\nStaticText '$175.99 · Rating: 2.3'\n"
               "[48] link 'Ridge Tent'\n[52] link 'Last'")
    assert target_context(listing, "click('44')") == "StaticText '$175.99 · Rating: 2.3'"
    assert target_context(listing, "click('48')") == ""  # followed by another element
    assert target_context(listing, "click('52')") == ""  # the last line
    assert target_context(listing, "click('99')") == ""
    assert target_context(listing, "go_back()") == ""
    text = render_compact("Price?", [], listing, "click('44')", [])[0]["content"]
    assert "action: click('44') on [44] link 'Alpine Bag' | below it: StaticText '$175.99" in text


def test_final_answer_checks_are_in_the_prompt_and_the_rationale_does_not_restate_them():
    page = "URL: u\nTitle: t\nStaticText '$9.99'"
    price = "What is the price of the laptop?"
    assert answer_checks(page, "$9.99", price) == (
        "an amount of money, as the task asks for an amount of money; the page shows it")
    assert answer_checks(page, "'$9.99'", price).endswith("; the page shows it")  # quotes
    assert answer_checks(page, "done", price) == (
        "text (1 word), but the task asks for an amount of money; the page does not show it")
    assert "and the task asks for an action" in answer_checks(page, "ok", "Add it to my cart")

    def said(answer, intent, success=False):
        t = Transition(episode_id="e", step=0, task_id="t", state=page, next_state=page,
                       action=f"send_msg_to_user('{answer}')", done=True, success=success,
                       reward=float(success))
        return deterministic_rationale(t, intent)

    assert said("$9.99", price, success=True) == ("Final answer, checked above. "
                                                  "The task is complete.")
    assert said("done", price) == "Final answer, checked above. The episode ends without success."
    assert "the page decides" in said("ok", "Add the laptop to my cart")
    assert kinds_match("4.5", "What is the average customer rating of X?") is True
    assert kinds_match("Ann Lee", "Who wrote the latest review of X?") is True
    assert kinds_match("7", "Who wrote the latest review of X?") is False
    assert kinds_match("ok", "Add X to my cart") is None


def test_answer_lines_match_whole_words_and_put_exact_values_first():
    page = ("URL: u\nTitle: t\nStaticText 'Rating: 3.0 out of 5 (9 reviews)'\n"
            "StaticText 'By Ann on Sep 19, 2024'\nStaticText '9'\nlink 'Outdoor & Camping'")
    assert answer_lines(page, "9") == (["StaticText '9'",
                                        "StaticText 'Rating: 3.0 out of 5 (9 reviews)'"], 2)
    assert answer_lines(page, "Se") == ([], 0)  # only inside "Sep": not a whole word
    assert answer_lines(page, "&")[1] == 1
    assert answer_lines(page, "") == ([], 0)


def answer_task(reference: dict, eval_types=("string_match",)) -> Task:
    config = {"intent": "Price of the laptop?", "start_url": "__SHOPPING__",
              "eval": {"eval_types": list(eval_types), "reference_answers": reference,
                       "reference_url": "", "program_html": []}}
    return Task("t1", "webarena", "Price of the laptop?", config=config)


def test_counterfactual_answers_are_labelled_by_the_evaluator():
    traj = episode("a", "$9.99", True)
    traj.task = answer_task({"must_include": ["$9.99"]})
    variants = counterfactual_trajectories([traj], per_answer=3, seed=1)
    assert len(variants) == 2  # the page's one other word, the quoted answer
    for v in variants:
        last = v.transitions[-1]
        answer = answer_text(last.action)
        assert answer and answer != "$9.99"
        expected = "$9.99" in answer  # must_include: the quoted right value passes
        assert last.success is expected and v.success is expected
        assert last.reward == float(expected) and last.done and last.info["counterfactual"]
        assert v.info == {"counterfactual_of": "a", "train_from_step": 1}
        assert v.transitions[0] is traj.transitions[0]  # history shared, not copied
    assert any(not v.success for v in variants)
    # Page-dependent evaluators cannot be replayed on text: no variants.
    traj.task = answer_task({}, eval_types=("program_html",))
    assert counterfactual_trajectories([traj], per_answer=2) == []
    # Exact match: a quoted answer passes (quotes are cleaned), a page word does not.
    traj.task = answer_task({"exact_match": "$9.99"})
    variants = counterfactual_trajectories([traj], per_answer=4)
    assert any(not v.success for v in variants) and any(v.success for v in variants)
    for v in variants:
        assert v.success is (answer_text(v.transitions[-1].action) == "'$9.99'")
    # Wrong recorded answers are not varied.
    assert counterfactual_trajectories([episode("w", "$1.00", False)], per_answer=2) == []


def test_counterfactual_variants_train_only_their_final_step_without_leaks():
    traj = episode("a", "$9.99", True)
    traj.task = answer_task({"exact_match": "$9.99"})
    other = episode("b", "$1.00", False)
    other.task = Task("t2", "webarena", "Price of the laptop?")
    variants = counterfactual_trajectories([traj], per_answer=2)
    seen = []

    class Spy(ListRetriever):
        def retrieve(self, state, action, *, k=None, where=None, exclude_episode=None):
            seen.append((where, exclude_episode))
            return super().retrieve(state, action, k=k, where=where,
                                    exclude_episode=exclude_episode)

    annotate_deterministic([traj, other, *variants])
    examples = build_examples([traj, other, *variants], Spy([traj, other]), ExampleConfig(),
                              where={"provenance": "offline"})
    assert len(examples) == 4 + 2  # two per recorded episode, one per variant
    assert [e["meta"]["step"] for e in examples[4:]] == [1, 1]
    # A variant never sees its source episode, and no example sees its own task.
    assert seen[-1] == ({"provenance": "offline", "task_id": {"$ne": "t1"}}, "a")
    assert seen[2][0]["task_id"] == {"$ne": "t2"}


def test_final_answer_demos_prefer_the_same_kind_of_question():
    def demo(intent: str, similarity: float) -> Transition:
        return Transition("d", 0, "x", LAPTOPS, "send_msg_to_user('$9.99')", LAPTOPS,
                          reward=1.0, done=True, success=True,
                          info={"intent": intent, "similarity": similarity})

    rating, price = demo("What is the rating of Foo?", 0.9), demo("What is the price of Bar?", 0.5)
    task = "What is the price of Baz?"
    assert rerank_final_answer_demos(task, "send_msg_to_user('1')", [rating, price], 1) == [price]
    assert rerank_final_answer_demos(task, "click('14')", [rating, price], 1) == [rating]
    text = render_compact(task, [], LAPTOPS, "send_msg_to_user('$9.99')", [price])[0]["content"]
    assert ("task: What is the price of Bar? | answer on page: StaticText '$9.99' | reward 1"
            in text)


@pytest.mark.parametrize("answer,kind", [
    ("$546.99", "an amount of money"), ("$2,076.26", "an amount of money"), ("9", "a number"),
    ("3.6", "a decimal number"), ("Dec 13, 2024", "a date"), ("of", "text (1 word)"),
    ("William Foster", "text (2 words)"), ("  ", "an empty answer"), ("'12'", "a number"),
])
def test_answer_kind(answer, kind):
    assert answer_kind(answer) == kind


@pytest.mark.parametrize("intent,kind", [
    ("What is the price of X?", "an amount of money"),
    ("How many customer reviews does X have? Answer with a number.", "a number"),
    ("What is the average customer rating of X?", "a rating"),
    ("On what date did I place order #1?", "a date"),
    ("Who wrote the most recent review of X?", "a name"),
    ("What is the jacket of X?", "a value"),
    ("Sign in as a, then tell me the grand total of my last order.", "an amount of money"),
    ("Open the product page of X.", "an action (then any short reply)"),
])
def test_asked_kind(intent, kind):
    assert asked_kind(intent) == kind


def test_final_answers_can_weigh_more():
    trajs = [episode("a", "$9.99", True)]
    examples = build_examples(trajs, None, ExampleConfig(use_retrieval=False,
                                                         final_answer_repeat=3))
    assert [e["meta"]["step"] for e in examples] == [0, 1, 1, 1]
