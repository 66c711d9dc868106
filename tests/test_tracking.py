"""Runs a user can watch: a tracked run's stage figures and a real trainer's losses, read back
from what each tracker wrote (TensorBoard's own reader, W&B's offline run file, trackio's store)."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import struct
import time
from dataclasses import replace

import pytest
from conftest import CounterEnv, counter_tasks
from test_pipeline import Stubbed
from test_policy import counter_demos, tiny_sft

from dreamgym_agents.episodes.graph import EnvPool
from dreamgym_agents.errors import ConfigError
from dreamgym_agents.pipeline.run import PipelineConfig, preset_config
from dreamgym_agents.policy.model import PolicyConfig
from dreamgym_agents.rl.grpo import GRPOStageConfig, train_grpo


def _scalars(folder) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found = EventAccumulator(str(folder))
    found.Reload()
    return {tag: [e.value for e in found.Scalars(tag)] for tag in found.Tags()["scalars"]}


def _wandb_records(path) -> list[bytes]:
    """The records of a W&B run file (its LevelDB-style log: a 7-byte header, then 32 KiB
    blocks of records, each a checksum, a length and a kind: whole, first, middle or last)."""
    data = path.read_bytes()
    if len(data) < 7:  # not yet written
        return []
    assert data[:4] == b":W&B"
    pos, block, records, pending = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:  # the block's zero padding
            pos += left
            continue
        if pos + 7 + length > len(data):  # a record still being written
            break
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            records.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            records.append(pending + chunk)
    return records


def _logged(kind: str, tracked) -> dict[str, list[float]]:
    """``series/figure → values`` as the tracker of ``kind`` kept them (TensorBoard: a trainer's
    tags under its folder's name)."""
    if kind == "tensorboard":
        return {(tag if folder.name == "pipeline" else f"{folder.name}/{tag}"): values
                for folder in tracked.iterdir() for tag, values in _scalars(folder).items()}
    rows: list[dict[str, float]] = []
    if kind == "wandb":
        from wandb.proto import wandb_internal_pb2

        [path] = tracked.glob("wandb/offline-run-*/run-*.wandb")
        # the file is written by W&B's own service process, which may still be flushing it
        # when ``finish()`` has returned: read it once it holds the run's exit record
        deadline = time.monotonic() + 60
        while True:
            records = [wandb_internal_pb2.Record.FromString(data)
                       for data in _wandb_records(path)]
            kinds = [r.WhichOneof("record_type") for r in records]
            if "exit" in kinds or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert "exit" in kinds, f"the W&B run file has no exit record after 60 s: {kinds}"
        rows = [{i.key or "/".join(i.nested_key): json.loads(i.value_json)
                 for i in r.history.item}
                for r, kind in zip(records, kinds, strict=True) if kind == "history"]
    else:
        [db] = (tracked.parents[1] / "trackio").glob("*.db")
        rows = [json.loads(m) for (m,) in sqlite3.connect(db).execute(
            "SELECT metrics FROM metrics ORDER BY id")]
    logged: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.items():
            if not key.startswith("_"):
                logged.setdefault(key, []).append(value)
    return logged


@pytest.mark.parametrize("kind", ["tensorboard", "wandb", "trackio"])
def test_a_tracked_run_writes_stage_figures_and_a_trainers_losses(tmp_path, monkeypatch, kind,
                                                                   counter_env_factory):
    if importlib.util.find_spec(kind) is None:
        pytest.skip("the 'track' extra is not installed")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    if kind == "trackio":  # its store's place, read when first imported, here in tmp_path
        import trackio.sqlite_storage

        monkeypatch.setattr(trackio.sqlite_storage, "TRACKIO_DIR", tmp_path / "trackio")
    out = tmp_path / "run"
    calls: list[str] = []
    run = Stubbed(replace(preset_config("quick", task="webarena"), tracking=kind), out, calls=calls)
    demos = counter_demos(tmp_path, counter_env_factory, 4)
    policy = tiny_sft(tmp_path, demos, steps=3)

    def dream_rl():  # a real GRPO trainer inside the run: its logs are tracked
        calls.append("dream_rl")
        pool = EnvPool(CounterEnv, 2)
        try:
            result = train_grpo(policy, tmp_path / "grpo", counter_tasks(2), pool,
                                GRPOStageConfig(num_generations=2, tasks_per_step=1,
                                                micro_batch=2, max_steps=2,
                                                max_episode_steps=3, concurrency=2),
                                PolicyConfig(max_action_tokens=16), stage="dream_rl")
        finally:
            pool.close()
        return {"path": result["path"], "real_transitions": 0, "synthetic_transitions": 12,
                "rollout_success": 0.5}

    run.stage_dream_rl = dream_rl
    run.run()
    logged = _logged(kind, out / "tracking")
    assert logged["eval_sft/success"] == [pytest.approx(0.2)]  # float32, as TensorBoard keeps
    assert logged["eval_s2r/success"] == [pytest.approx(0.4)]
    assert logged["dream_rl/synthetic_transitions"] == [12]
    losses = [k for k in logged if k.startswith("dream_rl/") and k.endswith("/loss")]
    assert len(losses) == 1 and len(logged[losses[0]]) == 2  # one per optimisation step
    # what a run shows is not what it computes: it resumes untracked
    config = json.loads((out / "config.json").read_text())
    assert config["tracking"] == kind
    Stubbed(preset_config("quick", task="webarena"), out, calls=calls).run()


def test_an_unknown_tracker_is_refused_in_one_line():
    with pytest.raises(ConfigError,
                       match="tracking must be one of none, tensorboard, wandb, trackio"):
        PipelineConfig(tracking="mlflow")
