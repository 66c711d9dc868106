"""Built-in agents: oracle program resolution, noisy oracle, quitter, random, explorer, answer
parsing."""

import asyncio

from dreamgym_agents.adapters.webarena.agents import (
    ORDER_ITEMS,
    ORDERS_ROUTE,
    ExplorerAgent,
    NoisyOracleAgent,
    OracleAgent,
    QuitterAgent,
    RandomAgent,
)
from dreamgym_agents.episodes.agent import parse_answer
from dreamgym_agents.episodes.env import Observation
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


def test_explorer_opens_every_item_of_its_listing_page_and_goes_back():
    home = ("URL: s\nTitle: Home\n[14] link 'Laptops'\n[45] link 'Laptops (25 products)'\n"
            "[47] link 'Headphones (25 products)'")
    page = ("URL: s/c?p={p}\nTitle: Headphones\n[12] link 'Home'\n[52] link 'A{p}'\n"
            "StaticText '$1'\n[56] link 'B{p}'\nStaticText '$2'\n[100] link 'Previous page'\n"
            "StaticText 'Page {p} of 3'\n[101] link 'Next page'")
    item = "URL: s/item\nTitle: Item\n[12] link 'Home'\n[48] button 'Add to Cart'"
    tasks = [Task(str(i), "webarena", "anything") for i in range(4)]
    agent = ExplorerAgent(pages=2)
    agent.assign(tasks)
    assert agent.items(page.format(p=1)) == ["52", "56"]  # not the paging links

    def walk(task, pages):
        history, state, actions = [], home, []
        screens = iter(pages)
        while len(actions) < 10:
            decision = asyncio.run(agent.act(task, Observation(state), history, "e"))
            actions.append(decision.action)
            if decision.action.startswith("send_msg_to_user"):
                break
            history.append(Transition(episode_id="e", step=len(history), task_id=task.task_id,
                                      state=state, action=decision.action, next_state=state,
                                      reasoning=decision.reasoning))
            state = next(screens)
        return actions

    # Slot 3: the second section, its second listing page.
    listing = page.format(p=2)
    assert walk(tasks[3], [page.format(p=1), listing, item, listing, item, listing]) == [
        "click('47')", "click('101')", "click('52')", "go_back()", "click('56')", "go_back()",
        "send_msg_to_user('done')"]
    # Slot 0: the first section, first page; a page with no listing after a non-item step ends.
    assert walk(tasks[0], [page.format(p=1), item, item]) == [
        "click('45')", "click('52')", "go_back()", "send_msg_to_user('done')"]


def test_explorer_follows_a_route_and_opens_the_items_it_names():
    home = "URL: s\nTitle: Home\n[30] link 'My Cart (2)'\n[32] link 'My Account'"
    account = "URL: s/account\nTitle: My Account\n[32] link 'My Account'\n[52] link 'My Orders'"
    orders = ("URL: s/account/orders\nTitle: My Orders\nStaticText '100098 | Sep 28, 2026'\n"
              "[58] link 'View Order #100098'\nStaticText '100097 | Sep 21, 2026'\n"
              "[65] link 'View Order #100097'\n[123] link 'Previous page'")
    order = "URL: s/account/orders/100098\nTitle: Order\n[89] link 'Back to My Orders'"
    agent = ExplorerAgent(pages=1, route=ORDERS_ROUTE, item_pattern=ORDER_ITEMS)
    task = Task("0", "webarena", "anything")
    agent.assign([task])
    # The rows' text is above the links and the last link has none under it: the pattern decides.
    assert agent.items(orders) == ["58", "65"] and agent.items(order) == []
    history, actions = [], []
    for state in (home, account, orders, order, orders, order, orders):
        decision = asyncio.run(agent.act(task, Observation(state), history, "e"))
        actions.append(decision.action)
        history.append(Transition(episode_id="e", step=len(history), task_id="0", state=state,
                                  action=decision.action, next_state=state,
                                  reasoning=decision.reasoning))
    assert actions == ["click('32')", "click('52')", "click('58')", "go_back()", "click('65')",
                       "go_back()", "send_msg_to_user('done')"]
    # A route link the page lacks ends the episode.
    lost = asyncio.run(agent.act(task, Observation(account.replace("My Orders", "Wishlist")),
                                 history[:1], "e"))
    assert lost.action == "send_msg_to_user('done')"


def test_an_llm_agent_is_prompted_in_its_family_terms():
    """The web family's LLM agent reads a browser page; another family's gets the generic
    prompt, with the commands its environment accepts now listed (ALFWorld's admissible ones)."""
    import pytest

    from dreamgym_agents.cli.common import Sections, build_agent
    from dreamgym_agents.episodes.env import make_family
    from dreamgym_agents.errors import ConfigError
    from dreamgym_agents.prompts import load_prompt, prompt_blocks

    sections = Sections(None, None, ("llm",))
    web = build_agent("openai/gpt-4o-mini", seed=0, family=make_family("webarena"),
                      sections=sections)
    page = web.messages(TASK, Observation(state=STATE), [])[0]["content"]
    assert "web browser" in page and "[37] searchbox 'Search'" in page
    assert "Actions you can take now" not in page

    alfworld = make_family("alfworld")
    agent = build_agent("openai/gpt-4o-mini", seed=0, family=alfworld, sections=sections)
    task = Task("a", "alfworld", "put a mug in cabinet")
    seen = Observation(state="Task: put a mug in cabinet.\nAt: the middle of the room",
                       info={"admissible": ["go to cabinet 1", "look"]})
    text = agent.messages(task, seen, [])[0]["content"]
    assert "web browser" not in text and "[bid]" not in text
    assert "# Actions you can take now\ngo to cabinet 1\nlook\n" in text
    assert "exactly as listed under 'Actions you can take now'" in text  # the action set's words
    assert "{options}" not in agent.messages(task, Observation(state="x"), [])[0]["content"]

    assert load_prompt("dreamgym_agents.prompts:agent.md") == load_prompt("agent.md")
    with pytest.raises(ConfigError, match="no prompt template"):
        load_prompt("missing.md")
    with pytest.raises(ConfigError, match="no prompt template"):
        load_prompt("no_such_package:agent.md")
    with pytest.raises(ConfigError, match="lacks the blocks"):
        prompt_blocks("agent.md", ("instruction",))


def test_one_agent_factory_for_the_cli_and_the_library():
    import pytest

    from dreamgym_agents.episodes.agent import LLMAgent, make_agent
    from dreamgym_agents.episodes.env import make_family
    from dreamgym_agents.errors import ConfigError

    family = make_family("alfworld")
    assert make_agent("oracle", family).name == family.offline_agents()["oracle"].name
    agent = make_agent("openai/gpt-4o-mini", family)
    assert isinstance(agent, LLMAgent) and "web browser" not in agent.template
    with pytest.raises(ConfigError):
        make_agent("not a model", family)
