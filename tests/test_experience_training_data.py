import pytest

from dreamgym_agents.adapters.webarena.codec import WebCodec
from dreamgym_agents.adapters.webarena.counterfactual import (
    counterfactual_trajectories,
    stop_trajectories,
)
from dreamgym_agents.adapters.webarena.experience_prompt import (
    action_notes,
    action_terms,
    answer_checks,
    answer_kind,
    answer_lines,
    answer_place,
    answer_text,
    asked_kind,
    back_page,
    back_target,
    head,
    kinds_match,
    rank_final_answer_demos,
    rank_step_demos,
    render_compact,
    step_kind,
    tally_line,
    target_context,
    target_line,
    task_params,
    task_terms,
    terms_named,
)
from dreamgym_agents.adapters.webarena.rationale import deterministic_rationale
from dreamgym_agents.adapters.webarena.state_delta import expand_state
from dreamgym_agents.experience.annotate import annotate_deterministic
from dreamgym_agents.experience.data import (
    ExampleConfig,
    build_examples,
    decision_spans,
)
from dreamgym_agents.experience.model import parse_experience_output, retrieve_demos
from dreamgym_agents.types import Task, Trajectory, Transition

WEB = WebCodec()

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
    # The answer's checks are the last line, right before the verdict is written.
    assert text.endswith("\nanswer checks: the page shows it as a whole line; an amount of "
                         "money, as the task asks for an amount of money")
    assert text.index("demos: (none)") < text.index("answer on page") < text.index("answer:")
    ablated = render_compact("Price?", None, LAPTOPS, "click('14')", None)[0]["content"]
    assert "history:" not in ablated and "demo 1" not in ablated and "demos:" not in ablated


def test_examples_use_other_episodes_and_round_trip():
    trajs = [episode("a", "$9.99", True), episode("b", "$1.00", False)]
    annotate_deterministic(trajs, WEB)
    assert trajs[0].transitions[1].info["em_rationale_source"] == "deterministic"
    examples = build_examples(trajs, ListRetriever(trajs), ExampleConfig(top_k=2), WEB)
    assert len(examples) == 4
    first = examples[0]
    prompt = first["messages"][0]["content"]
    assert "demo 1: __SHOPPING__ | click('14') on [14] link 'Laptops'" in prompt
    assert "@demo 1" in first["completion"]  # episode b made the same move: copy its page
    # the derived rationale says which shown page the next one follows, as the prompt writes it
    assert first["completion"].startswith(
        "<reasoning>As in demo 1: the site goes to __SHOPPING__/category/laptops. "
        "The task is not finished.</reasoning>")
    spans = [first["completion"][a:b] for a, b in first["decision_spans"]]
    assert spans[:2] == ["The task is not finished.", "As in demo 1"]
    block = first["completion"].split("<next_state>\n")[1].split("\n</next_state>")[0]
    assert expand_state(block, HOME, [LAPTOPS, LAPTOPS]) == LAPTOPS
    final = examples[1]["completion"]
    assert "<reward>1</reward>" in final and "<success>true</success>" in final
    assert final.index("<success>") < final.index("<next_state>")  # outcome, then the page
    parsed = parse_experience_output(final)
    assert parsed.success and parsed.done and parsed.next_state == "@state"
    assert deterministic_rationale(trajs[0].transitions[1]).startswith(
        "The task is complete. Final answer")
    no_reason = build_examples(trajs, None, ExampleConfig(use_reasoning=False,
                                                           use_retrieval=False), WEB)
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
        "the page shows it as a whole line; an amount of money, as the task asks for an amount "
        "of money")
    assert answer_checks(page, "'$9.99'", price).startswith("the page shows it as a whole line")
    assert answer_checks(page, "done", price) == (
        "the page does not show it; text, but the task asks for an amount of money")
    # an action task's message is not judged: no place, no kind, whatever it says
    assert answer_checks(page, "ok", "Add it to my cart") == "the task asks for an action"
    assert answer_checks(page, "$9.99", "Add it to my cart") == "the task asks for an action"
    assert answer_checks(page, "ok", "Add it to my cart", {"product": "laptop"}) == (
        "the task asks for an action; the page names no task term")
    cart = "URL: __SHOPPING__/cart\nTitle: Cart\n[5] link 'Laptop Pro'\n[6] button 'Checkout'"
    assert answer_checks(cart, "ok", "Add it to my cart", {"product": "Laptop Pro", "qty": "2"}
                         ) == "the task asks for an action; the page names 1 of the 2 task terms"
    product = "URL: __SHOPPING__/product/L1\nTitle: Laptop Pro | Shop\n[9] button 'Add to Cart'"
    assert action_terms(product, {"product": "Laptop Pro"}) == (
        "the page names the task term, the title or URL too")
    assert step_kind(product, "click('9')") == "click on a button 'Add to Cart'"
    assert step_kind(cart, "click('5')") == "click on a link"  # a link's long name left out
    assert step_kind(cart, "go_back()") == "go_back"
    history = [Transition(episode_id="e", step=0, task_id="t", state=product, action="click('9')",
                          next_state=cart)]
    checks = render_compact("Add it to my cart", history, cart, "send_msg_to_user('done')", [],
                            params={"product": "Laptop Pro"})[0]["content"].splitlines()[-1]
    assert checks.endswith("; last step: click on a button 'Add to Cart'")
    last = "click('9') on [9] button 'Add'"
    assert answer_checks(page, "ok", "Add it to my cart", {}, last) == (
        f"the task asks for an action; last step: {last}")
    first = render_compact("Add it to my cart", [], page, "send_msg_to_user('ok')", [])
    assert first[0]["content"].endswith("; last step: none")

    def said(answer, intent, success=False):
        t = Transition(episode_id="e", step=0, task_id="t", state=page, next_state=page,
                       action=f"send_msg_to_user('{answer}')", done=True, success=success,
                       reward=float(success))
        return deterministic_rationale(t, intent)

    # the verdict first, next to the checks it is read from
    assert said("$9.99", price, success=True) == ("The task is complete. Final answer, checked "
                                                  "above.")
    assert said("done", price) == "The episode ends without success. Final answer, checked above."
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
    assert len(variants) == 3  # the page's one other word, the quoted answer, an empty one
    for v in variants:
        last = v.transitions[-1]
        answer = answer_text(last.action)
        assert answer != "$9.99"
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
    # the third variant says nothing, and fails
    said = [answer_text(v.transitions[-1].action) for v in variants]
    assert said[2] == "" and not variants[2].success and said.count("") == 1
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

    annotate_deterministic([traj, other, *variants], WEB)
    examples = build_examples([traj, other, *variants], Spy([traj, other]), ExampleConfig(), WEB,
                              where={"provenance": "offline"})
    assert len(examples) == 4 + 2  # two per recorded episode, one per variant
    assert [e["meta"]["step"] for e in examples[4:]] == [1, 1]
    # A variant never sees its source episode, and no example sees its own task.
    where, excluded = seen[-1]
    assert excluded == "a" and where["task_id"] == {"$ne": "t1"}
    assert where["provenance"] == "offline" and where["done"] is True  # final-answer demos
    assert seen[3][0]["task_id"] == {"$ne": "t2"}  # a final answer retrieves twice


def test_final_answer_demos_are_ranked_by_their_checks_then_their_task():
    def demo(eid: str, intent: str, answer: str, success: bool, similarity: float = 0.5):
        return Transition(eid, 1, eid, LAPTOPS, f"send_msg_to_user('{answer}')", LAPTOPS,
                          reward=float(success), done=True, success=success,
                          info={"intent": intent, "similarity": similarity})

    price = "What is the price of Baz?"
    right = demo("right", "What is the price of Bar?", "$9.99", True)
    wrong_word = demo("word", "What is the price of Foo?", "Laptops", False, similarity=0.9)
    rating = demo("rating", "What is the rating of Foo?", "$9.99", False)
    pool = [wrong_word, rating, right]
    # a right-looking answer: the demo with the same checks (money, as asked) first, then the
    # best of the other outcome
    ranked = rank_final_answer_demos(price, LAPTOPS, "send_msg_to_user('$9.99')", {}, pool, 3)
    assert [d.episode_id for d in ranked] == ["right", "word", "rating"]
    # the tally counts the candidates whose checks read the same (only "right": "rating" asks
    # for a rating, "word" is not money)
    assert ranked.tally == (1, 0)
    also_right = demo("right2", "How much does Qux cost?", "$9.99", True)
    also_wrong = demo("wrong2", "What is the price of Quux?", "$9.99", False)
    ranked = rank_final_answer_demos(price, LAPTOPS, "send_msg_to_user('$9.99')", {},
                                     [*pool, also_right, also_wrong], 2)
    assert len(ranked) == 2 and ranked.tally == (2, 1)
    assert rank_final_answer_demos(price, LAPTOPS, "send_msg_to_user('x y z')", {}, [right],
                                   2).tally == (0, 0)
    text = render_compact(price, [], LAPTOPS, "send_msg_to_user('$9.99')", ranked)[0]["content"]
    # the checks, then last (right before the verdict) the tally and which side has more
    assert text.splitlines()[-2].startswith("answer checks:")
    assert text.splitlines()[-1] == ("recorded answers with the same checks: 2 right, 1 wrong: "
                                     "mostly right")
    assert tally_line((1, 4)).endswith(": mostly wrong")
    assert tally_line((2, 2)).endswith(": as many right as wrong")
    text = render_compact(price, [], LAPTOPS, "send_msg_to_user('$9.99')", None,
                          tally=(0, 0))[0]["content"]
    assert "recorded answers with the same checks: none" in text and "demo 1" not in text
    # a word of the page: the demo that said a word of the page first
    ranked = rank_final_answer_demos(price, LAPTOPS, "send_msg_to_user('Laptops')", {}, pool, 2)
    assert [d.episode_id for d in ranked] == ["word", "right"]
    text = render_compact(price, [], LAPTOPS, "send_msg_to_user('$9.99')", [right])[0]["content"]
    assert ("task: What is the price of Bar? | checks: the page shows it as a whole line; an "
            "amount of money, as the task asks for an amount of money | reward 1" in text)


@pytest.mark.parametrize("answer,kind", [
    ("$546.99", "an amount of money"), ("$2,076.26", "an amount of money"), ("9", "a number"),
    ("3.6", "a decimal number"), ("Dec 13, 2024", "a date"), ("of", "text"),
    ("William Foster", "text"), ("  ", "an empty answer"), ("'12'", "a number"),
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
                                                         final_answer_repeat=3), WEB)
    assert [e["meta"]["step"] for e in examples] == [0, 1, 1, 1]


ORDER = ("URL: __SHOPPING__/account/orders/100044\nTitle: Order #100044 | One Stop Market\n"
         "heading 'Order #100044'\nStaticText 'Status: Complete'\nStaticText 'Brand | Deskwell'\n"
         "StaticText 'The Deskwell desk comes in walnut.'\n[12] link 'Complete'")


@pytest.mark.parametrize("answer,intent,place", [
    ("Complete", "What is the status of my order #100044?",
     "as the value of 'Status', which the task names"),
    ("Deskwell", "What is the status of my order #100044?",
     "as the value of 'Brand', which the task does not name"),
    ("walnut", "What is the color of the desk?", "inside a longer text"),
    ("Order #100044", "Which order?", "as a whole line"),
    ("teak", "What is the color of the desk?", "the page does not show it"),
])
def test_answer_place_says_how_the_page_shows_an_answer(answer, intent, place):
    assert answer_place(ORDER, answer, intent).endswith(place)


def test_task_terms_say_where_the_page_shows_the_task_parameters():
    task = Task("t", "webarena", "Go to page 2 of the Laptops listing.",
                params={"category": "Laptops", "page": 2})
    params = task_params(task)
    assert params == {"category": "Laptops", "page": "2"}
    page = ("URL: __SHOPPING__/category/laptops?page=2\nTitle: Laptops | One Stop Market\n"
            "heading 'Laptops'\nStaticText '$3.25 · Rating: 4.2 out of 5'\n"
            "StaticText 'Page 2 of 3'")
    # "2" is not found inside 3.25, 4.2; the heading (the title again) is not shown as a line
    assert task_terms(page, params) == ("category (URL, title, 1 line), page (URL, 1 line) | "
                                        "'Page 2 of 3'")
    assert task_terms(HOME, params) == "category (1 line), page (none) | 'Laptops'"
    assert task_terms(page, {}) == "" and task_params("a bare intent") == {}
    text = render_compact(task.intent, [], page, "send_msg_to_user('done')", [],
                          params=params)[0]["content"]
    assert "task terms on page: category (URL, title, 1 line)" in text
    assert "task terms" not in render_compact(task.intent, [], page, "click('1')", [],
                                              params=params)[0]["content"]
    # a question's checks say only how many of its terms the page names
    assert terms_named(page, params) == "the page names all 2 task terms"
    assert terms_named(HOME, params) == "the page names 1 of the 2 task terms"
    assert terms_named(HOME, {"page": "2"}) == "the page names no task term"
    assert terms_named(HOME, {}) == ""
    checks = answer_checks(page, "$3.25", "What is the price?", params)
    assert checks.endswith("as the task asks for an amount of money; "
                           "the page names all 2 task terms")


def test_final_answer_demos_are_final_answers_of_both_outcomes():
    def final(eid: str, success: bool, intent: str) -> Transition:
        return Transition(eid, 1, eid, LAPTOPS, "send_msg_to_user('x')", LAPTOPS,
                          reward=float(success), done=True, success=success,
                          info={"intent": intent, "similarity": 0.5})

    wrong = [final(f"w{i}", False, "What is the price of A?") for i in range(4)]
    right = [final("r0", True, "What is the price of B?"),
             final("r1", True, "Who wrote the review of C?")]
    steps = [Transition("n", 0, "n", HOME, "click('14')", LAPTOPS, done=True,
                        info={"truncated": True})]  # cut by the step limit: not an answer
    retriever = ListRetriever([Trajectory("x", Task("x", "webarena", "?"),
                                          transitions=wrong + steps + right)])
    demos = retrieve_demos(retriever, WEB, "What is the price of Z?", LAPTOPS,
                           "send_msg_to_user('$1')", k=3)
    # final answers only (not the step cut by the limit), and both outcomes among the first two
    assert len(demos) == 3 and "n" not in [d.episode_id for d in demos]
    assert demos[0].success != demos[1].success
    # other steps: the most similar transitions, whatever their outcome
    plain = retrieve_demos(retriever, WEB, "What is the price of Z?", HOME, "click('14')", k=2)
    assert [d.episode_id for d in plain] == ["n", "w0"]


def test_decision_spans_mark_the_conclusion_the_outcome_and_the_next_page():
    completion = ("<reasoning>The task is complete. Final answer, checked above.</reasoning>\n"
                  "<reward>1</reward>\n<done>true</done>\n<success>true</success>\n"
                  "<next_state>\n@state\n- [1] link 'a'\n</next_state>")
    spans = [completion[a:b] for a, b in decision_spans(completion, WEB)]
    # a reference comes with the line that says whether and how it changes: its first edit
    assert spans == ["The task is complete.",  # the verdict, wherever it is said
                     "<reward>1</reward>\n<done>true</done>\n<success>true</success>",
                     "@state\n- [1] link 'a'"]
    empty = completion.replace("The task is complete. Final answer, checked above.", "")
    assert [empty[a:b] for a, b in decision_spans(empty, WEB)][1:] == ["@state\n- [1] link 'a'"]
    unchanged = completion.replace("- [1] link 'a'\n", "")
    spans = [unchanged[a:b] for a, b in decision_spans(unchanged, WEB)]
    assert spans[-1] == "@state\n</next_state>"
    full = completion.replace("@state\n- [1] link 'a'", "URL: x\nTitle: y")
    assert [full[a:b] for a, b in decision_spans(full, WEB)][-1] == "URL: x"
    teacher = completion.replace("The task is complete. Final answer, checked above.",
                                 "It opens the cart. So the order is placed.")
    assert [teacher[a:b] for a, b in decision_spans(teacher, WEB)][0] == "So the order is placed."


def url_task(reference_url: str) -> Task:
    config = {"intent": "Open the laptops.", "start_url": "__SHOPPING__",
              "eval": {"eval_types": ["url_match"], "reference_answers": None,
                       "reference_url": reference_url, "program_html": [],
                       "url_note": "GOLD in PRED"}}
    return Task("t9", "webarena", "Open the laptops.", config=config)


def test_stops_at_recorded_states_are_labelled_by_the_evaluator():
    cart = "URL: __SHOPPING__/cart\nTitle: Cart\n[3] link 'Laptops'"
    steps = [Transition("u", 0, "t9", HOME, "click('30')", cart, provenance="offline"),
             Transition("u", 1, "t9", cart, "click('3')", LAPTOPS, provenance="offline"),
             Transition("u", 2, "t9", LAPTOPS, "send_msg_to_user('done')", LAPTOPS,
                        reward=1.0, done=True, success=True, provenance="offline")]
    traj = Trajectory("u", url_task("__SHOPPING__/cart"), transitions=steps, success=True)
    stops = stop_trajectories([traj], per_episode=5, seed=3)
    assert [s.info["train_from_step"] for s in stops] == [0, 1]  # every state before the end
    home, at_cart = stops
    assert not home.success and at_cart.success  # the URL evaluator read the state's URL
    last = at_cart.transitions[-1]
    assert answer_text(last.action) is not None and last.done and last.state == cart
    assert at_cart.transitions[:-1] == steps[:1] and at_cart.agent.endswith("+stop")
    # answer-only tasks: the evaluator reads the word said
    answer = episode("a", "$9.99", True)
    answer.task = answer_task({"exact_match": "$9.99"})
    (stop,) = stop_trajectories([answer], per_episode=2)
    assert stop.info["train_from_step"] == 0 and not stop.success
    # tasks judged by the site's state cannot be labelled offline
    answer.task = answer_task({}, eval_types=("program_html",))
    assert stop_trajectories([answer], per_episode=2) == []


def test_judge_copies_of_final_answers_are_short_and_train_the_verdict_only():
    trajs = [episode("a", "$9.99", True), episode("b", "$1.00", False)]
    examples = build_examples(trajs, ListRetriever(trajs), ExampleConfig(top_k=1,
                                                                         judge_repeat=2), WEB)
    judges = [e for e in examples if e.get("loss") == "decisions"]
    assert len(examples) == 4 + 2 * 2 and len(judges) == 4
    full = next(e for e in examples if e["meta"]["step"] == 1 and "loss" not in e)
    judge = judges[0]
    prompt = judge["messages"][0]["content"]
    assert "demo 1" not in prompt and "answer checks:" in prompt
    # the retrieved tally stays (the other episode's answer is not on its page: not the same)
    assert "recorded answers with the same checks: none" in prompt
    assert len(prompt) < len(full["messages"][0]["content"])
    assert judge["completion"] == full["completion"]
    spans = [judge["completion"][a:b] for a, b in judge["decision_spans"]]
    assert spans[0] == "The task is complete." and spans[1].startswith("<reward>1")
    assert len(spans) == 2  # not the page


def test_previous_is_the_page_go_back_returns_to_in_training_and_at_inference():
    sorted_laptops = LAPTOPS + "\nStaticText 'sorted by price'"
    steps = [(HOME, "click('14')", LAPTOPS), (LAPTOPS, "select_option('9', 'Price')",
                                              sorted_laptops),  # same URL: not a navigation
             (sorted_laptops, "go_back()", HOME)]
    traj = Trajectory("e", Task("t", "webarena", "find it"), transitions=[
        Transition("e", i, "t", s, a, n, provenance="offline") for i, (s, a, n) in
        enumerate(steps)])
    example = build_examples([traj], None, ExampleConfig(use_retrieval=False), WEB)[2]
    # the last step's state is the sorted listing; go_back returns to the home page
    assert "<next_state>\n@previous\n</next_state>" in example["completion"]
    assert expand_state("@previous", sorted_laptops, [], back_page(traj.transitions[:2])) == HOME


def test_go_back_says_where_it_returns_and_a_submit_says_what_was_typed():
    def step(i, state, action, nxt):
        return Transition("e", i, "t", state, action, nxt, provenance="offline")

    product = "URL: __SHOPPING__/product/1\nTitle: Foo\n[12] link 'Home'"
    history = [step(0, HOME, "click('14')", LAPTOPS),
               step(1, LAPTOPS, "click('20')", product),
               step(2, product, "go_back()", LAPTOPS),
               step(3, LAPTOPS, "scroll(0, 200)", LAPTOPS)]  # not a navigation
    assert back_target(history) == head(HOME)
    assert back_target(history[:2]) == head(LAPTOPS)
    assert back_target([]) is None
    assert back_page(history) == HOME and back_page(history[:2]) == LAPTOPS
    text = render_compact("t", history, LAPTOPS, "go_back()", [])[0]["content"]
    assert "action: go_back() | back to: __SHOPPING__ (@previous)\n" in text
    text = render_compact("t", [], HOME, "go_back()", [])[0]["content"]
    assert "back to: a blank page (no earlier page)" in text
    assert "back to" not in render_compact("t", None, HOME, "go_back()", [])[0]["content"]
    filled = HOME + "\n[37] searchbox 'Search' value='usb hub'\n[38] button 'Search'"
    assert action_notes(filled, "keyboard_press('Enter')", []) == "typed: 'usb hub'"
    assert action_notes(filled, "click('38')", []) == "typed: 'usb hub'"
    assert action_notes(filled, "click('14')", []) == ""  # a link sends no form
    assert action_notes(HOME, "keyboard_press('Enter')", []) == ""


def test_step_demos_rank_the_same_action_then_the_result_in_this_pages_context():
    def signed_in(page: str) -> str:
        return page.replace("[14] link 'Laptops'", "[14] link 'Laptops'\n[29] link 'Sign Out'")

    def step(eid: str, state: str, action: str, next_state: str = LAPTOPS) -> Transition:
        return Transition(eid, 0, eid, state, action, next_state, provenance="offline")

    here = signed_in(HOME)
    other_action = step("a", here, "click('30')")  # this very page, another link
    signed_out = step("b", HOME, "click('14')", LAPTOPS)  # the same link from a signed-out home
    elsewhere = step("c", signed_in(LAPTOPS), "click('14')", signed_in(LAPTOPS))
    ranked = rank_step_demos(here, "click('14')", [other_action, signed_out, elsewhere], 2)
    # the same link, and of those the one whose result is signed in like this page
    assert [d.episode_id for d in ranked] == ["c", "b"]
    same_page = step("d", here, "click('14')", signed_in(LAPTOPS).replace("$9.99", "$8"))
    ranked = rank_step_demos(here, "click('14')", [elsewhere, same_page], 2)
    assert [d.episode_id for d in ranked] == ["d", "c"]  # made on this very page: first
    # then the same kind of action before a likelier page: an answer given on this very page
    # is not what a click does
    answer = Transition("e", 1, "e", here, "send_msg_to_user('4')", here, reward=1.0,
                        done=True, success=True, provenance="offline")
    ranked = rank_step_demos(here, "click('7')", [answer, other_action], 2)
    assert [d.episode_id for d in ranked] == ["a", "e"]
    # retrieve_demos re-ranks the retriever's candidates for every step but a final answer
    retriever = ListRetriever([Trajectory("x", Task("x", "webarena", "?"),
                                          transitions=[other_action, signed_out, elsewhere])])
    demos = retrieve_demos(retriever, WEB, "Open the laptops", here, "click('14')", k=1)
    assert [d.episode_id for d in demos] == ["c"]


def test_a_derived_rationale_follows_how_the_next_state_is_written():
    from dreamgym_agents.adapters.webarena.rationale import follows

    step = Transition("e", 0, "t", HOME, "click('30')", HOME.replace("(4)", "(5)"))
    assert follows("@state", step, []) == "The page stays; the target changes."
    assert follows("@state", Transition("e", 0, "t", HOME, "click('1')", HOME), []) == (
        "The page stays as it is.")
    back = Transition("e", 1, "t", LAPTOPS, "go_back()", HOME)
    assert follows("@previous", back, []) == "Back to the page before: __SHOPPING__."
    assert follows("URL: __SHOPPING__", back, []) == "A new page: __SHOPPING__."
    assert follows("@demo 2", back, ["x", "__SHOPPING__/cart"]) == (
        "As in demo 2: the site goes to __SHOPPING__/cart.")
    # a teacher's rationale is kept as written
    teacher = episode("a", "$9.99", True)
    teacher.transitions[0].info.update(em_rationale="It opens the laptops.",
                                       em_rationale_source="teacher:m")
    example = build_examples([teacher], None, ExampleConfig(use_retrieval=False), WEB)[0]
    assert example["completion"].startswith("<reasoning>It opens the laptops.</reasoning>")


def test_a_step_whose_outcome_its_demonstrations_do_not_show_can_weigh_more():
    from dreamgym_agents.experience.data import contrasts

    right, wrong = episode("a", "$9.99", True), episode("b", "$1.00", False)
    rewarded, unrewarded = right.transitions[1], wrong.transitions[1]
    assert contrasts(unrewarded, [rewarded, rewarded, unrewarded])  # most were rewarded
    assert not contrasts(rewarded, [rewarded, rewarded, unrewarded])
    assert contrasts(rewarded, [unrewarded, right.transitions[0]])  # none was
    assert not contrasts(unrewarded, [])

    class Rewarded:  # every step's demonstrations: rewarded answers
        def retrieve(self, state, action, *, k=None, where=None, exclude_episode=None):
            return [rewarded] * (k or 3)

    examples = build_examples([wrong], Rewarded(), ExampleConfig(contrast_repeat=4), WEB)
    steps = [e["meta"]["step"] for e in examples]
    # the first step (no reward, its demos rewarded) and the wrong answer: four times each
    assert steps == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(e["meta"].get("contrast") for e in examples)
    once = build_examples([wrong], Rewarded(), ExampleConfig(), WEB)
    assert [e["meta"]["step"] for e in once] == [0, 1]
