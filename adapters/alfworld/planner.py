"""A fast expert for generated ALFWorld games, and a cache of textworld's PDDL translations.

ALFWorld's planner expert (``AlfredExpert(expert_type=PLANNER)``) asks textworld's Fast Downward
build for an optimal plan on the *whole* problem at every step, with a blind uniform-cost search:
its cost explodes with the number of closed receptacles and takeable objects, to minutes a step
in a large kitchen (alfworld/alfworld#83). :func:`fast_plan` runs the same planner on a *pruned
copy of the current state*: every location; the objects of the goal's types and what the agent
holds; receptacles that are open, not openable, where the agent stands or that hold a goal
object, and one closed stand-in per goal receptacle class (closed empty ones are
interchangeable). Every plan of the pruned problem runs in the full game (same ids, a subset of
the facts), and in practice its plans are as short as the full planner's.

:func:`enable_pddl_cache` memoises textworld's PDDL-to-SAS translation and grammar parsing: a
textworld.gym reset translates the problem four times, and with the cache a reset of a game
played before skips them.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from typing import Any

from dreamgym_agents.adapters.alfworld.layouts import data_files

_TOOL_FOR = {"isclean": "sinkbasintype", "ishot": "microwavetype", "iscool": "fridgetype"}
_FD: dict[str, Any] = {}
STATS = {"fast_plan_calls": 0, "fast_plan_s": 0.0}


def logic_texts() -> tuple[str, str]:
    """(PDDL domain, text grammar) of the ``alfworld`` wheel, read once."""
    if "texts" not in _FD:
        domain, grammar, _ = data_files()
        with open(domain, encoding="utf-8") as d, open(grammar, encoding="utf-8") as g:
            _FD["texts"] = (d.read(), g.read())
    return _FD["texts"]


def _fd() -> dict[str, Any]:
    if "lib" not in _FD:
        import fast_downward
        from textworld.envs.pddl import logic as pddl_logic

        domain, grammar = logic_texts()
        _FD["lib"] = fast_downward.load_lib()
        _FD["logic"] = pddl_logic.GameLogic(domain=domain, grammar=grammar)
        _FD["PddlState"] = pddl_logic.PddlState
    return _FD


def pruned_problem(facts, pddl_problem: str) -> str:
    low = pddl_problem.lower()
    goal = pddl_problem[low.index("(:goal") :]
    gl = goal.lower()
    type_decl = re.findall(r"(\S+)\s+-\s+(otype|rtype)\b", low)
    otypes = {n for n, t in type_decl if t == "otype"}
    rtypes = {n for n, t in type_decl if t == "rtype"}
    tokens = set(re.findall(r"\b([a-z0-9]+type)\b", gl))
    goal_ot = tokens & otypes
    goal_rt = (tokens & rtypes) | {v for k, v in _TOOL_FOR.items() if "(" + k in gl}

    by = {}
    for f in facts:
        by.setdefault(f.name, []).append([v.name for v in f.arguments])
    otype_of = {a[0]: a[1] for a in by.get("objecttype", [])}
    rtype_of = {a[0]: a[1] for a in by.get("receptacletype", [])}
    openable = {a[0] for a in by.get("openable", [])}
    opened = {a[0] for a in by.get("opened", [])}
    agent_loc = {a[1] for a in by.get("atlocation", [])}
    at_agent = {a[0] for a in by.get("receptacleatlocation", []) if a[1] in agent_loc}
    held = {a[1] for a in by.get("holds", [])}
    keep_o = {o for o, t in otype_of.items() if t in goal_ot} | held
    holders = {a[1] for a in by.get("inreceptacle", []) if a[0] in keep_o}
    keep_r, reps = set(), set()
    for r, t in sorted(rtype_of.items()):
        if r not in openable or r in opened or r in at_agent or r in holders:
            keep_r.add(r)
        elif t in goal_rt and t not in reps:
            reps.add(t)
            keep_r.add(r)
    drop_openable = {
        r for r in keep_r if r in opened and rtype_of[r] not in goal_rt and r not in holders
    }

    def ok(f):
        for v in f.arguments:
            if v.type == "object" and v.name not in keep_o:
                return False
            if v.type == "receptacle" and v.name not in keep_r:
                return False
        return not (f.name == "openable" and f.arguments[0].name in drop_openable)

    kept = [f for f in facts if ok(f) and not f.name.startswith("new-axiom")]
    ents = {}
    for f in kept:
        for v in f.arguments:
            ents[v.name] = v.type
    for n in otypes:
        ents[n] = "otype"
    for n in rtypes:
        ents[n] = "rtype"
    objs = "\n        ".join(f"{n} - {t}" for n, t in sorted(ents.items()))
    init = "\n        ".join(
        "({} {})".format(f.name, " ".join(v.name for v in f.arguments)) for f in kept
    )
    return (
        f"(define (problem pruned)\n    (:domain alfred)\n"
        f"    (:objects\n        {objs}\n        )\n"
        f"    (:init\n        {init}\n        )\n{goal}"
    )


def fast_plan(facts, pddl_problem: str, entity_infos) -> list[str]:
    t0 = time.perf_counter()
    fd = _fd()
    state = fd["PddlState"](fd["lib"], pruned_problem(facts, pddl_problem), fd["logic"])
    plan = state.replan(entity_infos)
    STATS["fast_plan_calls"] += 1
    STATS["fast_plan_s"] += time.perf_counter() - t0
    return plan


def fast_expert_wrapper() -> Any:
    """The textworld wrapper class that sets ``extra.expert_plan`` from :func:`fast_plan` and
    replans only when the agent leaves the plan (textworld is imported here: an optional
    extra)."""
    import textworld.core as twcore

    class AlfredFastPlannerExpert(twcore.Wrapper):
        """Sets ``extra.expert_plan`` from :func:`fast_plan`; replans when the agent deviates."""

        def load(self, gamefile):
            super().load(gamefile)
            with open(gamefile) as f:
                self._problem = json.load(f)["pddl_problem"]

        def _update(self, command=None):
            if self.state["won"]:
                self._plan = []
            elif (
                command is not None
                and self._plan
                and command.strip() == self._plan[0]
                and self.state.get("feedback", "") != "Nothing happens."
            ):
                self._plan = self._plan[1:]
            else:
                self._plan = fast_plan(
                    self.state["_facts"], self._problem, self.state["_entity_infos"]
                )
            self.state["extra.expert_plan"] = list(self._plan)

        def reset(self):
            self.state = super().reset()
            self._plan = []
            self._update()
            return self.state

        def step(self, command):
            self.state, reward, done = super().step(command)
            self._update(command)
            return self.state, reward, done

    return AlfredFastPlannerExpert


_SAS_CACHE: dict[Any, Any] = {}
_LOGIC_CACHE: dict[str, Any] = {}


def enable_pddl_cache(max_entries: int = 64) -> None:
    """Memoise PDDL->SAS translation and grammar parsing inside textworld's PDDL backend.

    textworld.gym's reset() calls PddlEnv.load() *and* PddlEnv.reset(); each builds a PddlState,
    which runs fast_downward.pddl2sas twice (plain + optimised) and load() also re-parses the
    grammar: about four translations per reset.  With the cache, repeated resets of the
    same game only reload the SAS text into the C++ planner.  The translated task objects are
    only read by PddlState, so sharing them is safe.  Idempotent.
    """
    import fast_downward
    from textworld.envs.pddl import logic as pddl_logic

    if getattr(fast_downward.pddl2sas, "_alfproto_cached", False):
        return
    translate = fast_downward.pddl2sas

    def orig(domain, problem, verbose=False, optimize=False):
        # fast_downward's translator sets sys.argv to ["translate.py", "domain", "task"] for its
        # options module and never puts it back: a script reading its arguments after a game
        # loaded wrote its run to ./task (the process's own arguments are restored here)
        argv = sys.argv
        try:
            return translate(domain, problem, verbose=verbose, optimize=optimize)
        finally:
            sys.argv = argv

    def pddl2sas(domain, problem, verbose=False, optimize=False):
        if problem.lstrip().startswith("(define (problem pruned)"):
            return orig(
                domain, problem, verbose=verbose, optimize=optimize
            )  # one-off expert queries
        key = (hashlib.md5((domain + "\0" + problem).encode()).hexdigest(), bool(optimize))
        if key not in _SAS_CACHE:
            if len(_SAS_CACHE) >= max_entries:
                _SAS_CACHE.pop(next(iter(_SAS_CACHE)))
            _SAS_CACHE[key] = orig(domain, problem, verbose=verbose, optimize=optimize)
        return _SAS_CACHE[key]

    pddl2sas._alfproto_cached = True
    fast_downward.pddl2sas = pddl2sas
    orig_logic = pddl_logic.GameLogic

    def game_logic(domain, grammar):
        key = hashlib.md5((domain + "\0" + grammar).encode()).hexdigest()
        if key not in _LOGIC_CACHE:
            if len(_LOGIC_CACHE) >= max_entries:
                _LOGIC_CACHE.pop(next(iter(_LOGIC_CACHE)))
            _LOGIC_CACHE[key] = orig_logic(domain=domain, grammar=grammar)
        return _LOGIC_CACHE[key]

    pddl_logic.GameLogic = game_logic
