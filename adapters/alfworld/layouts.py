"""ALFWorld room layouts and PDDL problems, generated offline from what the ``alfworld`` wheel
ships: the PDDL domain (``alfred.pddl``), ALFRED's object and receptacle tables
(``alfworld.gen.constants``), its goal library and the receptacle poses of the 120 AI2-THOR floor
plans (``alfworld/gen/layouts/FloorPlan*-{openable,objects}.json``).

A *layout* is ``<kind>-<floor plan>``, kind one of kitchen (1-30), livingroom (201-230), bedroom
(301-330) and bathroom (401-430). ALFRED's scene split is kept: floor plans 1-6, 201-206, 301-306
and 401-406 are *unseen* (test) layouts, the others *seen* (train). :func:`build_problem` writes
the PDDL problem of one game, deterministic in (seed, task type, layout): objects of the floor
plan's classes placed in receptacles that can hold them, openable receptacles, object properties
(cleanable, heatable, coolable …), the agent away from every receptacle, and the goal from
ALFRED's goal library. Names follow ALFRED's mangling (``Apple_bar__minus_01_dot_65…``), which
ALFWorld's demangler turns into ``apple 1``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from typing import Any

from dreamgym_agents.errors import MissingExtraError

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
"""ALFWorld's six task types (ALFRED's, without slicing and movable receptacles, as ALFWorld)."""

KIND_TO_SCENE = {
    "kitchen": "Kitchen",
    "livingroom": "LivingRoom",
    "bedroom": "Bedroom",
    "bathroom": "Bathroom",
}
KIND_RANGES = {
    "kitchen": range(1, 31),
    "livingroom": range(201, 231),
    "bedroom": range(301, 331),
    "bathroom": range(401, 431),
}
LAMP_SURFACES = (
    "SideTable",
    "Desk",
    "Dresser",
    "Shelf",
    "CoffeeTable",
    "DiningTable",
    "TVStand",
    "CounterTop",
)
SYNTH_COUNTS = {"StoveBurner": 4, "Drawer": 3, "Shelf": 2}
"""Instances of a receptacle class the floor plan's ``-openable.json`` omits (toilets, stove
burners, coffee machines … are not listed there), added at made-up poses."""
TOOL_RECEP = {
    "pick_clean_then_place_in_recep": "SinkBasin",
    "pick_heat_then_place_in_recep": "Microwave",
    "pick_cool_then_place_in_recep": "Fridge",
}
TOOL_ABILITY = {
    "pick_clean_then_place_in_recep": "Cleanable",
    "pick_heat_then_place_in_recep": "Heatable",
    "pick_cool_then_place_in_recep": "Coolable",
}


def alfred() -> Any:
    """ALFRED's tables (``alfworld.gen.constants``), or the error naming the extra to install."""
    try:
        import alfworld.gen.constants as constants
    except ImportError:
        raise MissingExtraError("alfworld", "alfworld") from None
    return constants


def data_files() -> tuple[str, str, str]:
    """(PDDL domain, text grammar, layout folder) paths inside the ``alfworld`` wheel."""
    import alfworld

    constants = alfred()
    data = os.path.join(os.path.dirname(alfworld.__file__), "data")
    return (
        os.path.join(data, "alfred.pddl"),
        os.path.join(data, "alfred.twl2"),
        os.path.join(os.path.dirname(constants.__file__), "layouts"),
    )


def _classes() -> dict[str, Any]:
    c = alfred()
    fixed = sorted(set(c.RECEPTACLES) - set(c.MOVABLE_RECEPTACLES))
    sliced = {o for o in c.OBJECTS if o.endswith("Sliced")}
    pickupable = sorted(
        (set().union(*c.VAL_RECEPTACLE_OBJECTS.values()) | set(c.MOVABLE_RECEPTACLES)) - sliced
    )
    return {
        "fixed": fixed,
        "pickupable": pickupable,
        "toggleable": sorted(c.VAL_ACTION_OBJECTS["Toggleable"]),
    }


def mangle(name: str) -> str:
    """ALFRED's PlannedGameState.fix_pddl_str_chars for object ids."""
    out = []
    table = {"-": "_minus_", "|": "_bar_", "+": "_plus_", ".": "_dot_", ",": "_comma_"}
    for ch in name:
        out.append(table.get(ch, ch))
    return "".join(out)


def _fmt(v: float) -> str:
    return f"{v:+06.2f}"  # e.g. +00.81 / -01.65 (ALFRED object-id style)


# --------------------------------------------------------------------------- layouts
def list_layouts(kind: str | None = None, split: str | None = None) -> list[str]:
    """All layout names; split in {None, 'train', 'test'} (ALFRED seen/unseen scenes)."""
    C, _K = alfred(), _classes()
    out = []
    for k, rng in KIND_RANGES.items():
        if kind and k != kind:
            continue
        for fp in rng:
            is_test = fp in C.TEST_SCENE_NUMBERS
            if split == "train" and is_test or split == "test" and not is_test:
                continue
            out.append(f"{k}-{fp}")
    return out


def _parse_layout(layout: str) -> tuple[str, int]:
    kind, fp = layout.rsplit("-", 1)
    fp = int(fp)
    if kind not in KIND_RANGES or fp not in KIND_RANGES[kind]:
        raise ValueError(f"unknown layout {layout!r} (expected e.g. 'kitchen-7', 'bathroom-412')")
    return kind, fp


def load_layout(layout: str) -> dict[str, Any]:
    """Receptacles (id, class, loc) + candidate object classes of a floor plan. Deterministic."""
    C, K = alfred(), _classes()
    layout_dir = data_files()[2]
    kind, fp = _parse_layout(layout)
    with open(os.path.join(layout_dir, f"FloorPlan{fp}-openable.json")) as f:
        poses = json.load(f)
    with open(os.path.join(layout_dir, f"FloorPlan{fp}-objects.json")) as f:
        scene_classes = set(json.load(f))
    rng = random.Random(f"layout-{fp}")

    recs, used_locs = [], set()

    def add_loc(loc):
        x, z, r, h = loc
        while (
            x,
            z,
            r,
            h,
        ) in used_locs:  # one receptacle per location (see report: 'go to' grammar)
            h += 15
        used_locs.add((x, z, r, h))
        return (x, z, r, h)

    for rid in sorted(poses):
        parts = rid.split("|")
        cls = parts[-1] if parts[-1] in ("SinkBasin", "BathtubBasin") else parts[0]
        if cls not in K["fixed"]:
            continue
        x, z, rot, hor = poses[rid]
        loc = add_loc(
            (
                int(round(x / C.AGENT_STEP_SIZE)),
                int(round(z / C.AGENT_STEP_SIZE)),
                int(rot) // 90 % 4,
                int(hor),
            )
        )
        recs.append({"id": rid, "cls": cls, "loc": loc})
    present = {r["cls"] for r in recs}
    for cls in sorted(scene_classes):
        if cls in K["fixed"] and cls not in present:
            for _ in range(SYNTH_COUNTS.get(cls, 1)):
                pos = [rng.uniform(-3, 3), rng.uniform(0, 1.5), rng.uniform(-3, 3)]
                rid = f"{cls}|{_fmt(pos[0])}|{_fmt(pos[1])}|{_fmt(pos[2])}"
                if cls in ("SinkBasin", "BathtubBasin"):  # ALFRED's ids: Sink|x|y|z|SinkBasin
                    rid = f"{cls.removesuffix('Basin')}{rid.removeprefix(cls)}|{cls}"
                loc = add_loc(
                    (
                        int(round(pos[0] / C.AGENT_STEP_SIZE)),
                        int(round(pos[2] / C.AGENT_STEP_SIZE)),
                        rng.randrange(4),
                        rng.choice([0, 30, 45, 60]),
                    )
                )
                recs.append({"id": rid, "cls": cls, "loc": loc})
    objects = sorted(c for c in scene_classes if c in K["pickupable"])
    lamps = sorted(c for c in scene_classes if c in K["toggleable"])
    rclasses = {r["cls"] for r in recs}
    # keep only object classes that fit in at least one receptacle of the room
    objects = [
        o for o in objects if any(o in C.VAL_RECEPTACLE_OBJECTS.get(rc, ()) for rc in rclasses)
    ]
    return {
        "name": layout,
        "kind": kind,
        "floorplan": fp,
        "receptacles": recs,
        "object_classes": objects,
        "lamps": lamps,
        "split": "test" if fp in C.TEST_SCENE_NUMBERS else "train",
    }


def _task_candidates(
    lay: dict[str, Any], task_type: str
) -> list[tuple[str, str | None, str | None]]:
    """(object class, receptacle class, toggle class) combinations feasible in this layout."""
    C, _K = alfred(), _classes()
    rclasses = sorted({r["cls"] for r in lay["receptacles"]})
    objs = lay["object_classes"]
    if KIND_TO_SCENE[lay["kind"]] not in C.GOALS_VALID[task_type]:
        return []
    out = []
    if task_type == "look_at_obj_in_light":
        surfaces = [rc for rc in rclasses if rc in LAMP_SURFACES]
        if not surfaces:
            return []
        for t in lay["lamps"]:
            for o in objs:
                if o in C.MOVABLE_RECEPTACLES:
                    continue
                out.append((o, None, t))
        return out
    tool = TOOL_RECEP.get(task_type)
    if tool and tool not in rclasses:
        return []
    for o in objs:
        if task_type in TOOL_ABILITY and o not in C.VAL_ACTION_OBJECTS[TOOL_ABILITY[task_type]]:
            continue
        for rc in rclasses:
            if rc == tool or o not in C.VAL_RECEPTACLE_OBJECTS.get(rc, ()):
                continue
            # the object must also fit somewhere else (it must not start in the target class)
            if not any(
                o in C.VAL_RECEPTACLE_OBJECTS.get(x, ())
                for x in rclasses
                if x != rc and not (task_type == "pick_cool_then_place_in_recep" and x == "Fridge")
            ):
                continue
            out.append((o, rc, None))
    return out


def feasible_task_types(layout: str) -> list[str]:
    lay = load_layout(layout)
    return [t for t in TASK_TYPES if _task_candidates(lay, t)]


# --------------------------------------------------------------------------- problem
def build_problem(seed: int, task_type: str, layout: str) -> tuple[str, dict[str, Any]]:
    """Return (pddl_problem text, task metadata). Deterministic in the arguments."""
    C, K = alfred(), _classes()
    if task_type not in TASK_TYPES:
        raise ValueError(f"unknown task_type {task_type!r}")
    lay = load_layout(layout)
    cands = _task_candidates(lay, task_type)
    if not cands:
        raise ValueError(f"task {task_type} is not feasible in layout {layout}")
    rng = random.Random(f"{seed}|{task_type}|{layout}")
    obj_cls, recep_cls, toggle_cls = rng.choice(cands)

    recs = lay["receptacles"]
    by_cls: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        by_cls.setdefault(r["cls"], []).append(r)
    rclasses = sorted(by_cls)

    # ---- object instances and placement
    objects = []  # dicts: id, cls, recep
    used_ids = set()

    def new_obj(cls, recep):
        while True:
            rx, rz = recep["loc"][0] * C.AGENT_STEP_SIZE, recep["loc"][1] * C.AGENT_STEP_SIZE
            x, y = rx + rng.uniform(-0.6, 0.6), rng.uniform(0.0, 1.6)
            z = rz + rng.uniform(-0.6, 0.6)
            oid = f"{cls}|{_fmt(x)}|{_fmt(y)}|{_fmt(z)}"
            if mangle(oid).lower() not in used_ids:
                used_ids.add(mangle(oid).lower())
                return {"id": oid, "cls": cls, "recep": recep}

    def forbidden(cls, rc):
        if cls != obj_cls:
            return False
        if rc == recep_cls:
            return True  # goal must not hold initially
        if task_type == "pick_cool_then_place_in_recep" and rc == "Fridge":
            return True  # otherwise the object would count as already cool in ALFRED
        return False

    for cls in lay["object_classes"]:
        n = rng.randint(1, C.MAX_NUM_OF_OBJ_INSTANCES)
        if cls == obj_cls:
            n = max(n, 2 if task_type == "pick_two_obj_and_place" else 1)
            if task_type == "pick_two_obj_and_place":
                n = rng.randint(2, C.PICKUP_REPEAT_MAX)
        elif rng.random() < 0.2:  # not every class of the floor plan shows up in every game
            continue
        okr = [
            rc
            for rc in rclasses
            if cls in C.VAL_RECEPTACLE_OBJECTS.get(rc, ()) and not forbidden(cls, rc)
        ]
        if not okr:
            continue
        for _ in range(n):
            rc = rng.choice(okr)  # class first, then instance (kitchens have ~20 cabinets)
            objects.append(new_obj(cls, rng.choice(by_cls[rc])))
    if toggle_cls:
        surf = [rc for rc in rclasses if rc in LAMP_SURFACES]
        objects.append(new_obj(toggle_cls, rng.choice(by_cls[rng.choice(surf)])))

    # ---- agent start location (not at any receptacle => "You are in the middle of a room")
    rec_locs = {r["loc"] for r in recs}
    while True:
        start = (rng.randint(-12, 12), rng.randint(-12, 12), rng.randrange(4), 30)
        if start not in rec_locs:
            break

    def L(loc):
        return mangle("loc|{}|{}|{}|{}".format(*loc))

    # ---- text
    otypes = sorted(set(C.OBJECTS) - set(K["fixed"]) | set(C.MOVABLE_RECEPTACLES))
    rtypes = K["fixed"]
    obj_lines = ["agent1 - agent"]
    obj_lines += [f"{t}Type - otype" for t in otypes]
    obj_lines += [f"{t}Type - rtype" for t in rtypes]
    obj_lines += ["{} - object".format(mangle(o["id"])) for o in objects]
    obj_lines += ["{} - receptacle".format(mangle(r["id"])) for r in recs]
    locs = sorted({r["loc"] for r in recs} | {start})
    obj_lines += [f"{L(loc)} - location" for loc in locs]

    init = []
    present_ot = sorted({o["cls"] for o in objects})
    for rc in rclasses:
        for ot in present_ot:
            if ot in C.VAL_RECEPTACLE_OBJECTS.get(rc, ()):
                init.append(f"(canContain {rc}Type {ot}Type)")
    for r in recs:
        init.append("(receptacleType {} {}Type)".format(mangle(r["id"]), r["cls"]))
    for o in objects:
        init.append("(objectType {} {}Type)".format(mangle(o["id"]), o["cls"]))
    for o in objects:
        m, c = mangle(o["id"]), o["cls"]
        if c in K["toggleable"]:
            init.append(f"(toggleable {m})")
            continue
        init.append(f"(pickupable {m})")
        if c in C.MOVABLE_RECEPTACLES:
            init.append(f"(isReceptacleObject {m})")
        for prop, key in (
            ("cleanable", "Cleanable"),
            ("heatable", "Heatable"),
            ("coolable", "Coolable"),
            ("sliceable", "Sliceable"),
        ):
            if c in C.VAL_ACTION_OBJECTS[key]:
                init.append(f"({prop} {m})")
    for r in recs:
        if r["cls"] in C.OPENABLE_CLASS_SET:
            init.append("(openable {})".format(mangle(r["id"])))
    init.append(f"(atLocation agent1 {L(start)})")
    for o in objects:
        init.append("(inReceptacle {} {})".format(mangle(o["id"]), mangle(o["recep"]["id"])))
    for r in recs:
        init.append("(receptacleAtLocation {} {})".format(mangle(r["id"]), L(r["loc"])))
    for o in objects:
        init.append("(objectAtLocation {} {})".format(mangle(o["id"]), L(o["recep"]["loc"])))

    import alfworld.gen.goal_library as glib

    goal = glib.gdict[task_type]["pddl"].format(
        obj=obj_cls, recep=recep_cls, toggle=toggle_cls, mrecep=None
    )
    goal = goal.replace("#", "-")  # goal_library writes '?x # type' (ALFRED mangles '#' into '-')
    pid = hashlib.md5(f"{seed}|{task_type}|{layout}".encode()).hexdigest()[:12]
    ind = "\n        "
    problem = (
        f"\n(define (problem plan_trial_{pid})\n    (:domain alfred)\n"
        f"    (:objects{ind}{ind.join(obj_lines)}\n        )\n"
        f"    (:init{ind}{ind.join(init)}\n        )\n{goal}"
    )

    meta = {
        "task_type": task_type,
        "layout": layout,
        "room_kind": lay["kind"],
        "floorplan": lay["floorplan"],
        "split": lay["split"],
        "seed": seed,
        "object_target": obj_cls,
        "parent_target": recep_cls or "",
        "toggle_target": toggle_cls or "",
        "mrecep_target": "",
        "object_sliced": False,
        "n_objects": len(objects),
        "n_receptacles": len(recs),
    }
    return problem, meta
