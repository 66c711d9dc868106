"""``dg-agents run``'s pipeline: stages recorded as they finish, a killed run resuming at the
stage it was in, a rerun with other settings refused, the report and its plot."""

from __future__ import annotations

import json
import os
import time

import pytest

from dreamgym_agents.episodes.env import make_family
from dreamgym_agents.errors import BenchError, ConfigError
from dreamgym_agents.pipeline.prompt_run import make_pipeline
from dreamgym_agents.pipeline.report import rollout_curves, summarize_run, write_report
from dreamgym_agents.pipeline.run import (
    STAGES,
    Pipeline,
    PipelineConfig,
    dream_tasks,
    preset_config,
)
from dreamgym_agents.policy.sft import PolicySFTConfig
from dreamgym_agents.types import Task


class Killed(BaseException):
    """Stands for the process being killed (not an error any stage handles)."""


class Stubbed(Pipeline):
    """The pipeline with every stage replaced by a recorder; ``kill_at`` dies there."""

    def __init__(self, *args, calls, kill_at=None, **kw):
        super().__init__(*args, **kw)
        self.calls, self.kill_at = calls, kill_at
        for stage in STAGES:
            if stage != "report":
                setattr(self, f"stage_{stage}", self._stub(stage))

    def _stub(self, stage):
        def run():
            self.calls.append(stage)
            if stage == self.kill_at:
                if stage in ("dream_rl", "s2r"):
                    self._stage_dir(stage)  # a training stage had started writing
                raise Killed
            if stage in ("dream_rl", "s2r"):
                self._stage_dir(stage)
                return {"path": f"/x/{stage}", "real_transitions": 40 if stage == "s2r" else 0,
                        "synthetic_transitions": 0 if stage == "s2r" else 300,
                        "rollout_success": 0.5}
            if stage.startswith("eval_"):
                return {"success": {"eval_sft": 0.2, "eval_dream": 0.3, "eval_s2r": 0.4}[stage],
                        "episodes": 10, "eval_real_transitions": 50}
            return {"path": f"/x/{stage}"}
        return run


def _quick() -> PipelineConfig:
    """The quick preset of the web family (the runs these tests stub)."""
    return preset_config("quick", task="webarena")


def test_a_killed_run_resumes_at_the_stage_it_was_in(tmp_path):
    cfg = _quick()
    calls: list[str] = []
    with pytest.raises(Killed):
        Stubbed(cfg, tmp_path, calls=calls, kill_at="dream_rl").run()
    assert calls == ["experience", "sft", "eval_sft", "dream_rl"]
    state = json.loads((tmp_path / "state.json").read_text())
    assert sorted(state["done"]) == ["eval_sft", "experience", "sft"]

    calls.clear()
    summary = Stubbed(cfg, tmp_path, calls=calls).run()
    assert calls == ["dream_rl", "eval_dream", "s2r", "eval_s2r"]  # finished stages skipped
    assert (tmp_path / "stages" / "dream_rl.interrupted-1").is_dir()  # nothing recorded lost
    assert summary["sft_success"] == 0.2 and summary["dream_success"] == 0.3
    assert summary["s2r_success"] == 0.4 and summary["real_transitions_used"] == 40
    assert summary["synthetic_transitions"] == 300
    assert (tmp_path / "report.md").exists() and (tmp_path / "success_vs_real.png").exists()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["stage"] for x in lines if x.get("event") == "done"][-1] == "report"

    calls.clear()
    Stubbed(cfg, tmp_path, calls=calls).run()  # everything done: nothing runs again
    assert calls == []


def test_a_rerun_with_other_settings_is_refused(tmp_path):
    with pytest.raises(Killed):
        Stubbed(_quick(), tmp_path, calls=[], kill_at="sft").run()
    other = _quick()
    other.dream.max_steps = 99
    with pytest.raises(ConfigError, match=r"other settings \(dream.max_steps: 16 → 99\)"):
        Stubbed(other, tmp_path, calls=[]).run()


def test_a_run_resumes_across_a_setting_added_since_at_its_default(tmp_path):
    with pytest.raises(Killed):
        Stubbed(_quick(), tmp_path, calls=[], kill_at="sft").run()
    config = json.loads((tmp_path / "config.json").read_text())
    del config["dream_reward"]  # the run began before this setting existed
    (tmp_path / "config.json").write_text(json.dumps(config))
    calls: list[str] = []
    with pytest.raises(Killed):
        Stubbed(_quick(), tmp_path, calls=calls, kill_at="eval_sft").run()
    assert calls == ["sft", "eval_sft"]  # resumed where it stopped
    assert json.loads((tmp_path / "config.json").read_text())["dream_reward"] == "model"
    other = _quick()
    other.dream_reward = "state"  # a new setting away from its default is another run
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"other settings \(dream_reward: \(none\) → 'state'\)"):
        Stubbed(other, tmp_path, calls=[]).run()


def test_without_sim_to_real_the_stages_skip_it(tmp_path):
    cfg = _quick()
    cfg.sim_to_real = False
    calls: list[str] = []
    summary = Stubbed(cfg, tmp_path, calls=calls).run()
    assert "s2r" not in calls and summary["s2r_success"] is None


def test_a_run_can_stop_after_a_stage_and_go_on_later(tmp_path):
    calls: list[str] = []
    with pytest.raises(ConfigError, match="until='s2r': not a stage of this run"):
        Stubbed(_no_s2r(), tmp_path, calls=calls).run(until="s2r")
    assert Stubbed(_quick(), tmp_path / "r", calls=calls).run(until="sft") is None
    assert calls == ["experience", "sft"]
    summary = Stubbed(_quick(), tmp_path / "r", calls=calls).run()
    assert calls[2:] == ["eval_sft", "dream_rl", "eval_dream", "s2r", "eval_s2r"]
    assert summary["sft_success"] == 0.2


def _no_s2r():
    cfg = _quick()
    cfg.sim_to_real = False
    return cfg


def test_config_validation_says_what_to_fix():
    with pytest.raises(ConfigError, match="unknown preset 'fast': use quick or full"):
        preset_config("fast")
    with pytest.raises(ConfigError, match="eval_limit"):
        PipelineConfig(eval_limit=0)
    hosted = PipelineConfig(task="webarena", policy="openai/gpt-4o-mini")
    with pytest.raises(ConfigError, match="for local policies"):
        Pipeline(hosted, "x")  # make_pipeline picks
    assert type(make_pipeline(hosted, "x")).__name__ == "PromptPipeline"
    with pytest.raises(ConfigError, match="a run needs its task family"):
        Pipeline(PipelineConfig(), "x")  # no family is the core's default
    with pytest.raises(ConfigError, match="dream_eval_types must list some of"):
        PipelineConfig(task="webarena", dream_eval_types=["string_match", "html"])
    # LoRA adapts a checkpoint: --policy hf/… (which fills sft.base_model only later), the
    # experience model's weights, or sft.base_model; never a policy trained from scratch
    lora = PolicySFTConfig(lora_r=8)
    with pytest.raises(ConfigError, match="sft.lora_r needs a checkpoint"):
        PipelineConfig(policy_init="scratch", sft=lora)
    assert PipelineConfig(policy="hf/some/checkpoint", policy_init="scratch", sft=lora)
    assert PipelineConfig(sft=lora).policy_init == "experience"


def test_the_dream_trains_on_the_task_kinds_it_can_judge():
    def task(tid, *types):
        return Task(task_id=tid, family="webarena", intent="x",
                    config={"eval": {"eval_types": list(types)}} if types else {})

    tasks = [task("q", "string_match"), task("u", "url_match"), task("h", "program_html"),
             task("qh", "string_match", "program_html"), task("none")]
    family = make_family("webarena")
    kept = dream_tasks(tasks, family, PipelineConfig().dream_eval_types)
    assert [t.task_id for t in kept] == ["q", "u", "none"]
    assert dream_tasks(tasks, family, None) == tasks
    assert [t.task_id for t in dream_tasks(tasks, family, ["program_html"])] == ["h", "none"]


def test_report_of_a_partial_run(tmp_path):
    state = {"done": {"eval_sft": {"success": 0.1, "episodes": 5}}, "wall_seconds": 3.0}
    summary = write_report(tmp_path, _quick(), state)
    assert summary["sft_success"] == 0.1 and summary["dream_success"] is None
    assert summarize_run(state)["real_transitions_used"] == 0
    assert "| SFT warm start | 0 | 0 | 0.100 |" in (tmp_path / "report.md").read_text()


def test_report_shows_each_training_stage_rollout_curve(tmp_path):
    rows = [{"stage": "dream_rl", "batch": 1, "rollout/success": 0.9},  # an interrupted attempt
            *({"stage": "dream_rl", "batch": b, "rollout/success": r}
              for b, r in enumerate([0.0, 0.25, 0.5, 0.75], 1)),
            {"stage": "dream_rl", "step": 4, "grpo/loss": 0.1},
            {"stage": "s2r", "batch": 1, "rollout/success": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n{cut")
    assert rollout_curves(tmp_path / "metrics.jsonl") == {"dream_rl": [0.0, 0.25, 0.5, 0.75],
                                                          "s2r": [0.5]}
    state = {"done": {"eval_sft": {"success": 0.1, "episodes": 5}}, "wall_seconds": 3.0}
    write_report(tmp_path, _quick(), state)
    report = (tmp_path / "report.md").read_text()
    assert "| dream_rl | 4 | 0.000 → 0.750 |" in report and "| s2r | 1 | 0.500 → 0.500 |" in report
    assert (tmp_path / "rollout_success.png").exists()


def test_bench_runs_the_ablations_asked_for_each_changing_one_thing():
    import dreamgym_agents.pipeline.bench as bench

    base = _quick()
    runs = bench.variants(base, bench.BenchConfig(ablations=("no_task_generation",)), seed=1)
    assert sorted(runs) == ["dreamgym", "grpo_real", "no_task_generation"]
    ablated = runs["no_task_generation"]
    assert not ablated.curriculum.enabled and not ablated.sim_to_real and ablated.seed == 1
    assert ablated.use_retrieval and ablated.use_reasoning and runs["dreamgym"].curriculum.enabled
    every = bench.variants(base, bench.BenchConfig(), seed=0)
    assert not every["no_retrieval"].use_retrieval and every["no_retrieval"].use_reasoning
    assert not every["no_reasoning"].use_reasoning and every["no_reasoning"].curriculum.enabled
    assert "state_reward" not in every  # a declared variant runs only when asked for
    asked = bench.variants(base, bench.BenchConfig(ablations=(), variants=("state_reward",)),
                           seed=2)
    assert sorted(asked) == ["dreamgym", "grpo_real", "state_reward"]
    assert asked["state_reward"].dream_reward == "state" and not asked["state_reward"].sim_to_real
    assert asked["dreamgym"].dream_reward == "model"
    with pytest.raises(ConfigError, match="unknown variant 'x': choose from state_reward"):
        bench.BenchConfig(variants=("x",))


def test_bench_gives_ppo_its_rows_beside_grpos_on_the_same_seeds():
    import dreamgym_agents.pipeline.bench as bench

    base = _quick()
    both = bench.variants(base, bench.BenchConfig(ablations=(), algorithms=("grpo", "ppo")),
                          seed=3)
    assert sorted(both) == ["dreamgym", "dreamgym_ppo", "grpo_real", "ppo_real"]
    ppo, real = both["dreamgym_ppo"], both["ppo_real"]
    assert ppo.dream.algorithm == ppo.s2r.algorithm == "ppo" and ppo.sim_to_real
    assert real.dream.algorithm == "ppo" and real.real_rl and not real.sim_to_real
    assert real.dream.real_transition_budget == both["grpo_real"].dream.real_transition_budget
    assert both["dreamgym"].dream.algorithm == "grpo" and {r.seed for r in both.values()} == {3}
    only = bench.variants(base, bench.BenchConfig(ablations=(), algorithms=("ppo",)), seed=0)
    assert sorted(only) == ["dreamgym", "dreamgym_ppo", "ppo_real"]  # SFT's row stays
    labels = [row[0] for row in bench.ROWS]
    assert {"PPO-real(N)", "DreamGym (PPO)", "DreamGym-S2R (PPO)"} <= set(labels)
    with pytest.raises(ConfigError, match="--algorithm takes grpo or ppo"):
        bench.BenchConfig(algorithms=("a2c",))


def test_a_record_of_a_run_before_a_setting_was_added_is_the_same_run():
    """Settings added to the code since a run was recorded, at their defaults, do not make it
    another run (a bench resumed at a later commit takes its recorded runs); any other
    difference does."""
    from dataclasses import asdict

    from dreamgym_agents.pipeline.run import added_at_defaults

    now = json.loads(json.dumps(asdict(_quick())))
    older = json.loads(json.dumps(now))
    del older["train_split"], older["dream"]["algorithm"], older["dream"]["ppo"]
    assert added_at_defaults(older, now) is not None
    assert "dream.algorithm" in added_at_defaults(older, now)
    other = json.loads(json.dumps(older))
    other["dream"]["max_steps"] += 1
    assert added_at_defaults(other, now) is None
    changed = json.loads(json.dumps(now))
    changed["dream"]["algorithm"] = "ppo"
    assert added_at_defaults(changed, now) is None and added_at_defaults(now, now) == {}


def test_a_record_made_when_the_web_view_settings_were_fields_is_the_same_run():
    """``element_refs``, ``mark_task_terms`` and ``extractive_answers`` moved from the policy
    view's fields into the web family's ``view_options``: a record written before compares
    as the same run, at their values or with them changed."""
    from dataclasses import asdict

    from dreamgym_agents.pipeline.run import added_at_defaults

    now = json.loads(json.dumps(asdict(_quick())))
    assert now["policy_view"]["options"] == {}
    older = json.loads(json.dumps(now))
    del older["policy_view"]["options"]
    older["policy_view"].update(element_refs="name", mark_task_terms=True,
                                extractive_answers=True)
    assert added_at_defaults(older, now) == {}
    older["policy_view"]["element_refs"] = "bid"
    assert added_at_defaults(older, now) is None
    bids = json.loads(json.dumps(now))
    bids["policy_view"]["options"] = {"element_refs": "bid"}
    assert added_at_defaults(older, bids) == {}


def test_a_family_checks_its_own_policy_view_settings():
    """The web family takes its view settings by name and types them; a family without
    ``view_options`` refuses them, but for the values every older record carries."""
    from dreamgym_agents.config import load_config
    from dreamgym_agents.pipeline.run import preset_config
    from dreamgym_agents.policy.model import PolicyConfig, typed_view_options, view_record

    cfg = load_config(preset_config("quick", task="webarena"), None,
                      ["policy_view.element_refs=bid", "policy_view.mark_task_terms=false"])
    cfg.__post_init__()
    assert cfg.policy_view.options == {"element_refs": "bid", "mark_task_terms": False}
    assert view_record(cfg.policy_view)["element_refs"] == "bid"
    cfg.policy_view.options = {"element_refs": "number"}
    with pytest.raises(ConfigError, match="element_refs must be name or bid"):
        cfg.__post_init__()
    cfg.policy_view.options = {"elements": "bid"}
    with pytest.raises(ConfigError, match="unknown config key 'policy_view.elements'"):
        cfg.__post_init__()
    assert typed_view_options(None, PolicyConfig(options={"element_refs": "name"})) == {}
    with pytest.raises(ConfigError, match="policy.element_refs: this family's policy view"):
        typed_view_options(None, PolicyConfig(options={"element_refs": "bid"}))


def test_bench_seeds_share_the_warm_start_and_make_the_table(tmp_path, monkeypatch):
    import dreamgym_agents.pipeline.bench as bench

    calls: dict[str, list[str]] = {}

    def stubbed(cfg, out, reporter=None, adopt=None, rerun_from=None):
        return Stubbed(cfg, out, reporter, adopt=adopt, rerun_from=rerun_from,
                       calls=calls.setdefault(f"{out.parent.name}/{out.name}", []))

    monkeypatch.setattr(bench, "Pipeline", stubbed)
    table = bench.run_bench(_quick(), bench.BenchConfig(seeds=2, ablations=()),
                            tmp_path)
    assert calls["seed0/dreamgym"][:3] == ["experience", "sft", "eval_sft"]
    assert calls["seed1/dreamgym"] == ["dream_rl", "eval_dream", "s2r", "eval_s2r"]
    assert "sft" not in calls["seed0/grpo_real"] and "dream_rl" in calls["seed0/grpo_real"]
    rows = {row["row"]: row for row in table["rows"]}
    assert rows["SFT"]["success"] == [0.2, 0.2] and rows["SFT"]["success_std"] == 0.0
    assert rows["DreamGym-S2R"]["real_transitions"] == [40, 40]
    assert rows["DreamGym"]["real_transitions"] == [0, 0]
    assert (tmp_path / "table.md").read_text().count("| DreamGym") == 2


class Recorded(Stubbed):
    """:class:`Stubbed` as a bench's pipeline factory, importable by its worker processes: each
    stage's result says which process ran it, with how many torch threads; ``fail`` (a run's
    folder, ``seed1/grpo_real``) fails its RL stage."""

    fail: str | None = None

    def __init__(self, *args, **kw):
        super().__init__(*args, calls=[], **kw)

    def _stub(self, stage):
        run = super()._stub(stage)

        def recorded():
            if stage == "dream_rl" and self.fail == f"{self.out.parent.name}/{self.out.name}":
                raise RuntimeError("the machine ran out of memory")
            return {**run(), "pid": os.getpid(), "threads": os.environ.get("DG_TORCH_THREADS")}
        return recorded


class FailingOne(Recorded):
    fail = "seed1/grpo_real"


class HangingOne(Recorded):
    """Seed 0's DreamGym run hangs in its RL stage (its pid in ``hanging.pid``)."""

    def _stub(self, stage):
        run = super()._stub(stage)

        def hang():
            if stage == "dream_rl" and self.out.parent.name == "seed0" \
                    and self.out.name == "dreamgym":
                (self.out / "hanging.pid").write_text(str(os.getpid()))
                time.sleep(600)
            return run()
        return hang


def _rows(table):
    return [(r["row"], r["success"], r["real_transitions"]) for r in table["rows"]]


def test_a_bench_runs_side_by_side_in_worker_processes(tmp_path, monkeypatch):
    import dreamgym_agents.pipeline.bench as bench

    monkeypatch.delenv("DG_TORCH_THREADS", raising=False)
    monkeypatch.setattr(bench, "torch_threads", lambda: 4)
    base = _quick()
    asked = bench.BenchConfig(seeds=2, ablations=("no_reasoning",), jobs=2)
    with pytest.raises(BenchError, match=r"1 of 6 bench run\(s\) failed: seed1/grpo_real "
                                         r"\(RuntimeError: the machine ran out of memory\)"):
        bench.run_bench(base, asked, tmp_path / "side", pipeline=FailingOne)
    assert "out of memory" in (tmp_path / "side/seed1/grpo_real/bench-error.txt").read_text()
    partial = json.loads((tmp_path / "side" / bench.TABLE_JSON).read_text())
    grpo_real = [r for r in partial["rows"] if r["row"] == "GRPO-real(N)"]
    assert grpo_real[0]["seeds"] == 1  # the finished runs are in the table

    table = bench.run_bench(base, asked, tmp_path / "side", pipeline=Recorded)  # resumes
    states = {f"{p.parent.name}/{p.name}": json.loads((p / "state.json").read_text())["done"]
              for p in (tmp_path / "side").glob("seed*/*")}
    assert sorted(states) == [f"seed{s}/{n}" for s in (0, 1)
                              for n in ("dreamgym", "grpo_real", "no_reasoning")]
    assert states["seed0/dreamgym"]["sft"]["pid"] == os.getpid()  # the warm start: here, once
    for name, done in states.items():
        assert done["dream_rl"]["pid"] != os.getpid(), name  # the runs: in the workers
        assert done["dream_rl"]["threads"] == "2", name  # 4 threads shared by 2 at a time
        if name != "seed0/dreamgym":
            assert done["sft"]["adopted"] and done["sft"]["pid"] == os.getpid(), name
    assert "adopted" not in states["seed1/no_reasoning"]["experience"]  # builds its own
    assert states["seed1/dreamgym"]["experience"]["adopted"]

    progress = (tmp_path / "side/seed1/grpo_real" / bench.PROGRESS_FILE).read_text()
    assert "stage 4/6: dream_rl" in progress and "stage 1/6" not in progress  # adopted
    assert "failed: RuntimeError: the machine ran out of memory" in progress  # the first try
    assert progress.index("failed") < progress.rindex("stage 6/6: report")

    one_by_one = bench.run_bench(base, bench.BenchConfig(seeds=2, ablations=("no_reasoning",)),
                                 tmp_path / "sequential", pipeline=Recorded)
    assert _rows(table) == _rows(one_by_one) and len(table["rows"]) == 5
    other = _quick()
    other.dream.learning_rate *= 2  # a finished bench is not taken for one with other settings
    with pytest.raises(ConfigError, match="holds a run with other settings"):
        bench.run_bench(other, asked, tmp_path / "side", pipeline=Recorded)
    with pytest.raises(ConfigError, match="--jobs must be at least 1"):
        bench.BenchConfig(jobs=0)


class Evaluated(Recorded):
    """:class:`Recorded` whose evaluations play tasks: ``trajectories.jsonl`` in their folder
    (task ``i`` of 6 solved when ``i`` < success × 6)."""

    def _stub(self, stage):
        run = super()._stub(stage)
        if not stage.startswith("eval_"):
            return run

        def evaluated():
            result = run()
            folder = self.out / "eval" / stage
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / "trajectories.jsonl", "w") as fh:
                for i in range(6):
                    fh.write(json.dumps({"task": {"task_id": str(i)},
                                         "success": i < result["success"] * 6}) + "\n")
            return {**result, "folder": str(folder)}
        return evaluated


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_bench_goes_on_from_its_records_when_the_run_folders_are_gone(tmp_path, jobs):
    import shutil

    import dreamgym_agents.pipeline.bench as bench

    base = _quick()
    records = tmp_path / "kept"  # a folder a user commits
    asked = bench.BenchConfig(seeds=2, ablations=(), jobs=jobs, records=str(records))
    first = bench.run_bench(base, asked, tmp_path / "one", pipeline=Evaluated)
    assert sorted(p.name for p in records.iterdir()) == [
        f"seed{s}-{n}.json" for s in (0, 1) for n in ("dreamgym", "grpo_real")]
    kept = json.loads((records / "seed1-dreamgym.json").read_text())
    assert kept["state"]["done"]["eval_dream"]["outcomes"] == {
        str(i): float(i < 2) for i in range(6)}  # 0.3 of 6 tasks: 0 and 1

    shutil.rmtree(tmp_path / "one")  # another machine: only the records are left
    (records / "seed1-grpo_real.json").unlink()  # and one run never finished
    again = bench.run_bench(base, asked, tmp_path / "two", pipeline=Evaluated)
    assert _rows(again) == _rows(first)
    assert again["rows"][1]["paired"] == first["rows"][1]["paired"]  # per-task outcomes kept
    played = sorted(f"{p.parent.name}/{p.name}" for p in (tmp_path / "two").glob("seed*/*")
                    if (p / "state.json").exists())
    assert played == ["seed0/dreamgym", "seed1/grpo_real"]  # the missing run, and its warm start
    warm = json.loads((tmp_path / "two/seed0/dreamgym/state.json").read_text())["done"]
    assert sorted(warm) == ["eval_sft", "experience", "sft"]  # played to the warm start only
    redone = json.loads((tmp_path / "two/seed1/grpo_real/state.json").read_text())["done"]
    assert redone["sft"]["adopted"] and "dream_rl" in redone
    assert (records / "seed1-grpo_real.json").exists()

    other = _quick()
    other.dream.learning_rate *= 2  # a record of other settings is not taken for this run
    assert bench.Records(records).read(0, "dreamgym", bench.variants(other, asked, 0)[
        "dreamgym"]) is None
    (records / "seed0-dreamgym.json").write_text("{cut")
    with pytest.raises(BenchError, match="seed0-dreamgym.json: not a bench record"):
        bench.run_bench(base, asked, tmp_path / "three", pipeline=Evaluated)


def test_a_file_reporter_writes_stages_tenths_of_bars_and_messages(tmp_path):
    from dreamgym_agents.pipeline.run import FileReporter

    report = FileReporter(tmp_path / "run" / "progress.log")
    report.stage("dream_rl", 4, 8)
    tick = report.bar("dream_rl batches", 20)
    for batch in range(20):
        tick(1, {"rollout/success": batch / 20})
    report.say("done")
    lines = [line.split(" ", 1)[1] for line in
             (tmp_path / "run" / "progress.log").read_text().splitlines()]
    assert lines[0] == "stage 4/8: dream_rl" and lines[-1] == "done"
    assert lines[1:-1] == [f"dream_rl batches: {n}/20, rollout success {(n - 1) / 20:.2f}"
                           for n in range(2, 21, 2)]


def test_stopping_a_bench_stops_its_worker_processes(tmp_path):
    import dreamgym_agents.pipeline.bench as bench

    class Interrupting:  # Ctrl-C while the parent waits, as soon as a run has finished
        def stage(self, *args):
            pass

        def bar(self, *args):
            return lambda *a, **k: None

        def say(self, message):
            if "finished" in message:
                raise KeyboardInterrupt

    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        bench.run_bench(_quick(), bench.BenchConfig(seeds=2, ablations=(), jobs=2),
                        tmp_path, Interrupting(), pipeline=HangingOne)
    assert time.monotonic() - began < 300
    pid = int((tmp_path / "seed0/dreamgym/hanging.pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # terminated and reaped, not left running


def test_a_run_records_its_code_version_and_reruns_chosen_stages(tmp_path):
    from dreamgym_agents.version import code_version

    cfg = _quick()
    calls: list[str] = []
    Stubbed(cfg, tmp_path, calls=calls).run()
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["code"] == [code_version()] and state["code"][0]["commit"]
    assert all(result["code"] == code_version() for result in state["done"].values())
    assert json.loads((tmp_path / "config.json").read_text())["dream"]["max_steps"] == 16

    calls.clear()
    Stubbed(cfg, tmp_path, calls=calls, rerun_from="s2r").run()
    assert calls == ["s2r", "eval_s2r"]  # the earlier stages are kept
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["reruns"][0]["from"] == "s2r"
    assert set(state["reruns"][0]["previous"]) == {"s2r", "eval_s2r", "report"}
    assert (tmp_path / "stages" / "s2r.before-rerun-1").is_dir()  # nothing recorded lost
    with pytest.raises(ConfigError, match="not a stage of this run"):
        Stubbed(cfg, tmp_path, calls=calls, rerun_from="warmup")


def test_a_bench_table_says_when_its_rows_come_from_different_code():
    from dreamgym_agents.pipeline.bench import BenchConfig, make_table, render_table

    def run(commit: str, dirty: bool = False) -> dict:
        code = {"commit": commit, "dirty": dirty, "package": "0.1.0"}
        return {"done": {"sft": {"success": 0.1, "code": code},
                         "eval_sft": {"success": 0.1, "code": code},
                         "dream_rl": {"real_transitions": 0, "code": code},
                         "eval_dream": {"success": 0.2, "code": code},
                         "s2r": {"real_transitions": 10, "code": code},
                         "eval_s2r": {"success": 0.3, "code": code}}}

    cfg, base = BenchConfig(seeds=1, ablations=()), _quick()
    same = make_table({(0, "dreamgym"): run("a" * 40)}, cfg, base)
    assert not same["mixed_code"] and "Every row: code aaaaaaa." in render_table(same)
    mixed_run = run("a" * 40)
    mixed_run["done"]["s2r"]["code"] = {"commit": "b" * 40, "dirty": True}
    mixed = make_table({(0, "dreamgym"): mixed_run}, cfg, base)
    assert mixed["mixed_code"] and mixed["code"] == ["aaaaaaa", "bbbbbbb+dirty"]
    rows = {r["row"]: r for r in mixed["rows"]}
    assert rows["DreamGym"]["code"] == ["aaaaaaa"]
    assert rows["DreamGym-S2R"]["code"] == ["aaaaaaa", "bbbbbbb+dirty"]
    assert "different code versions" in render_table(mixed)
    assert "validation transitions" not in render_table(same)  # no stop rule: no column


def test_a_bench_table_counts_the_real_episodes_a_stop_rule_played():
    from dreamgym_agents.pipeline.bench import BenchConfig, make_table, render_table

    done = {"sft": {"success": 0.1}, "eval_sft": {"success": 0.1},
            "dream_rl": {"real_transitions": 0, "validation": {"real_transitions": 412}},
            "eval_dream": {"success": 0.2},
            "s2r": {"real_transitions": 64}, "eval_s2r": {"success": 0.3}}
    table = make_table({(0, "dreamgym"): {"done": done}}, BenchConfig(seeds=1, ablations=()),
                       _quick())
    rows = {r["row"]: r for r in table["rows"]}
    assert (rows["DreamGym"]["real_transitions"], rows["DreamGym"]["validation_transitions"]) \
        == ([0], [412])
    assert rows["DreamGym-S2R"]["validation_transitions"] == [412]  # it starts from that stage
    assert rows["SFT"]["validation_transitions"] == [0]
    assert "| DreamGym | 0 | 412 | 0.200 ± 0.000 | 0.200 |" in render_table(table)


def test_evaluations_read_the_test_split_unless_tuning_on_validation(tmp_path):
    with pytest.raises(ConfigError, match="eval_split must be validation"):
        PipelineConfig(eval_split="train")
    for split in ("test", "validation"):
        cfg = _quick()
        cfg.eval_split = split
        pipe = Pipeline(cfg, tmp_path / split)
        try:
            tasks = pipe.test_tasks()
        finally:
            pipe.close()
        assert len(tasks) == 31 if split == "test" else len(tasks) >= 24
        assert {t.split for t in tasks} == {split}


@pytest.mark.slow
def test_a_stage_validates_on_real_validation_games(tmp_path):
    """``dream.validate_every``: the stage's validation plays a checkpoint greedily on the
    family's validation split (never the reported test split), episodes kept per step."""
    pytest.importorskip("alfworld")
    from pathlib import Path

    warm_start = Path(__file__).parents[1] / "bundles" / "alfworld" / "policy"
    cfg = preset_config("quick", task="alfworld")
    cfg.task = "alfworld"
    cfg.dream.validate_every, cfg.dream.validate_limit = 2, 2
    cfg.eval_max_steps = 3
    pipe = Pipeline(cfg, tmp_path / "run")
    try:
        folder = tmp_path / "stage"
        validate = pipe._validation("dream_rl", folder, cfg.dream)
        figures = validate(warm_start, 0)
        cfg.s2r.validate_every = 0
        assert pipe._validation("s2r", folder, cfg.s2r) is None  # not asked for
    finally:
        pipe.close()
    assert figures["episodes"] == 2 and figures["eval_real_transitions"] > 0
    summary = json.loads((folder / "validation_episodes" / "step-0" / "summary.json").read_text())
    assert summary["split"] == "validation" and summary["stage"] == "dream_rl_validation"
    played = [json.loads(line)["task"] for line in
              (folder / "validation_episodes" / "step-0" / "trajectories.jsonl").open()]
    assert {t["split"] for t in played} == {"validation"}


def test_a_bench_table_gives_each_row_its_paired_difference_to_sft_and_grpo_real(tmp_path):
    from dreamgym_agents.pipeline.bench import BenchConfig, make_table, render_table

    def folder(name: str, solved: set[int]) -> str:
        path = tmp_path / name
        path.mkdir()
        lines = [json.dumps({"task": {"task_id": str(i)}, "success": i in solved})
                 for i in range(10)]
        (path / "trajectories.jsonl").write_text("\n".join(lines))
        return str(path)

    sft = folder("sft", {0, 1})
    states = {}
    for seed in range(2):
        states[(seed, "dreamgym")] = {"done": {
            "sft": {}, "eval_sft": {"success": 0.2, "folder": sft},
            "dream_rl": {"real_transitions": 0},
            "eval_dream": {"success": 0.5, "folder": folder(f"d{seed}", {0, 1, 2, 3, 4})},
            "s2r": {"real_transitions": 6},
            "eval_s2r": {"success": 0.1, "folder": folder(f"s{seed}", {0})}}}
        states[(seed, "grpo_real")] = {"done": {
            "sft": {}, "eval_sft": {"success": 0.2, "folder": sft},
            "dream_rl": {"real_transitions": 60},
            "eval_dream": {"success": 0.3, "folder": folder(f"g{seed}", {0, 1, 2})}}}
    table = make_table(states, BenchConfig(seeds=2, ablations=()), _quick())
    rows = {r["row"]: r for r in table["rows"]}
    assert table["tasks"] == 10 and rows["DreamGym"]["tasks"] == 10
    dream = rows["DreamGym"]["paired"]
    assert dream["SFT"]["diff"] == 0.3 and dream["SFT"]["pairs"] == 20
    assert dream["SFT"]["wins"] == 6 and dream["SFT"]["losses"] == 0
    assert dream["SFT"]["low"] > 0  # six wins of twenty pairs, no loss
    assert dream["GRPO-real(N)"]["diff"] == 0.2
    assert rows["DreamGym-S2R"]["paired"]["SFT"]["diff"] == -0.1
    assert "SFT" not in rows["SFT"].get("paired", {})  # not compared with itself
    text = render_table(table)
    assert "− SFT, paired [95 % CI]" in text and "| DreamGym | 0 |" in text
    assert "+0.300 [" in text and "10 test tasks" in text


def test_the_presets_use_validation_as_every_rl_stages_stop_rule():
    for preset in ("quick", "full"):
        cfg = preset_config(preset)
        for stage in (cfg.dream, cfg.s2r):
            assert stage.validate_every and stage.validate_limit == cfg.calibrate_limit == 31
    quick = _quick()
    assert quick.dream.max_steps == 2 * quick.dream.validate_every == 16  # start, middle, end


def test_an_rl_stage_that_kept_its_start_is_evaluated_by_its_starts_episodes(tmp_path,
                                                                              monkeypatch):
    tasks = [Task(task_id=str(i), family="webarena", intent="x", split="test")
             for i in range(3)]
    pipe = Pipeline(_quick(), tmp_path / "run")
    pipe._open_folder()
    monkeypatch.setattr(pipe, "test_tasks", lambda *a, **k: tasks)
    before = tmp_path / "run" / "eval" / "eval_sft"
    before.mkdir(parents=True)
    (before / "trajectories.jsonl").write_text("".join(
        json.dumps({"task": {"task_id": t.task_id}, "success": t.task_id == "1"}) + "\n"
        for t in tasks))
    (before / "summary.json").write_text(json.dumps(
        {"stage": "eval_sft", "success_rate": 1 / 3, "episodes": 3, "successes": 1,
         "real_transitions": 12, "invalid_actions": 0, "mean_steps": 4.0}))
    done = pipe.state["done"]
    done["eval_sft"] = {"success": 1 / 3, "folder": str(before)}
    done["dream_rl"] = {"path": "/ckpt/dream_rl", "validation": {"selected_step": 0}}

    reused = pipe.stage_eval_dream()
    assert reused["same_policy_as"] == "eval_sft" and reused["successes"] == 1
    assert reused["eval_real_transitions"] == 0  # no real episode played for it
    folder = tmp_path / "run" / "eval" / "eval_dream"
    assert reused["folder"] == str(folder)
    assert (folder / "trajectories.jsonl").read_text() == \
        (before / "trajectories.jsonl").read_text()
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["stage"] == "eval_dream" and summary["checkpoint"] == "/ckpt/dream_rl"

    played: list[str] = []
    monkeypatch.setattr(pipe, "evaluate", lambda stage, ckpt, **kw: played.append(stage) or {})
    done["dream_rl"]["validation"]["selected_step"] = 8  # it handed on a trained policy
    pipe.stage_eval_dream()
    done["dream_rl"]["validation"]["selected_step"] = 0
    monkeypatch.setattr(pipe, "test_tasks", lambda *a, **k: tasks[:2])  # other tasks
    pipe.stage_eval_dream()
    monkeypatch.setattr(pipe, "test_tasks", lambda *a, **k: tasks)
    pipe.cfg.reuse_same_policy_eval = False
    pipe.stage_eval_dream()
    assert played == ["eval_dream"] * 3


def test_a_refused_resume_names_each_setting_that_differs():
    from dreamgym_agents.pipeline.run import _diff

    assert _diff({"seed": 0, "dream": {"learning_rate": 1e-4}},
                 {"seed": 1, "dream": {"learning_rate": 1e-4}}) == "seed: 0 → 1"
    assert _diff({"extra": {}, "old": 3}, {"extra": {"x": 1}}) == \
        "extra: {} → (none), extra.x: (none) → 1, old: 3 → (none)"


@pytest.mark.parametrize(("selected", "played"), [(0, ["dream_rl-start"]),
                                                 (8, ["dream_rl-start", "dream_rl-final"])])
def test_a_stage_that_kept_its_start_is_calibrated_once(tmp_path, monkeypatch, selected,
                                                        played):
    pipe = Pipeline(_quick(), tmp_path / "run")
    pipe._open_folder()
    calls: list[str] = []
    monkeypatch.setattr(pipe, "_calibrate", lambda name, policy, folder, real=None:
                        calls.append(name) or {"policy": str(policy)})
    result = {"validation": {"selected_step": selected}}
    out = pipe._stage_calibration("dream_rl", "/ckpt/sft", tmp_path / "final", tmp_path / "s",
                                  result)
    assert calls == played
    assert (out["final"] == out["start"]) == (selected == 0)
    assert pipe.state["calibrations"][str(tmp_path / "final")] == out["final"]


def test_a_dream_stage_goes_on_in_its_folder_where_it_left_a_resume_point(tmp_path):
    from dreamgym_agents.rl.grpo import RESUME_STATE

    pipe = Pipeline(_quick(), tmp_path)
    folder = pipe._stage_dir("dream_rl", resumable=True)
    half = folder / "trainer" / "checkpoint-4"
    half.mkdir(parents=True)  # a checkpoint whose resume state was never written
    (folder / "rollouts.jsonl").write_text("{}\n")
    again = pipe._stage_dir("dream_rl", resumable=True)
    assert again == folder and not (again / "rollouts.jsonl").exists()  # a fresh start
    assert (tmp_path / "stages" / "dream_rl.interrupted-1" / "rollouts.jsonl").is_file()
    point = again / "trainer" / "checkpoint-4"
    point.mkdir(parents=True)
    (point / RESUME_STATE).write_text("{}")
    (again / "rollouts.jsonl").write_text("{}\n")
    assert pipe._stage_dir("dream_rl", resumable=True) == folder
    assert (folder / "rollouts.jsonl").is_file()  # kept: the stage goes on from it
    assert pipe._stage_dir("dream_rl") == folder and not (folder / "rollouts.jsonl").exists()


def test_the_report_names_the_algorithm_that_trained_the_dream_row(tmp_path):
    state = {"done": {"eval_sft": {"success": 0.1, "episodes": 5},
                      "dream_rl": {"real_transitions": 0, "synthetic_transitions": 40},
                      "eval_dream": {"success": 0.2, "episodes": 5}}, "wall_seconds": 3.0}
    cfg = _quick()
    write_report(tmp_path, cfg, state)
    assert "| DreamGym (dream GRPO) | 0 | 40 | 0.200 |" in (tmp_path / "report.md").read_text()
    cfg.dream.algorithm = "ppo"
    write_report(tmp_path, cfg, state)
    assert "| DreamGym (dream PPO) | 0 | 40 | 0.200 |" in (tmp_path / "report.md").read_text()
