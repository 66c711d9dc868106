"""The embedded bundle: the models and data that ``dg-agents`` runs on out of the box.

A bundle is a folder, made by ``dg-agents build-embedded``
(:mod:`dreamgym_agents.pipeline.bundle_build`) and shipped with the package as
``dreamgym_agents/bundles/<family>/`` (``bundles/`` at the top of the repository)::

    manifest.json               what it is (below); written last: a folder without it is no bundle
    experience/                 the experience model: safetensors weights, tokenizer, config and
                                its training manifest (how it must be prompted)
    policy/                     the warm-started policy (a transformers checkpoint)
    episodes/collect.jsonl.gz   the collectors' episodes on the train split, compact (abstract
                                states, actions, outcomes; no browser code, timings or usage):
                                what the experience model was trained on and the replay buffer's
                                seed transitions
    episodes/demos.jsonl.gz     the oracle's demonstrations the warm start imitated
    episodes/warm_start_test.jsonl.gz
                                the warm start's greedy test episodes that its figures count
                                (a run's ``eval_sft`` of the same tasks reuses them); written by
                                the measurement, outside the id's digest

The manifest records the format, the recipe versions, the experience model's
:class:`~dreamgym_agents.pipeline.embedded.EmbeddedRecipe` key and the warm start's key, the
commit that built it, the split it was trained on (train only), the figures measured on it
(fidelity on the test split, the warm start's test success), and each file's size and sha256.

Loading is a matter of seconds: the models load from the folder as they are; the Chroma buffer is
made from the shipped seed episodes on first use and cached (``$DG_CACHE_DIR``). ``DG_BUNDLE``
names another bundle folder (a rebuilt one), ``DG_BUNDLE=none`` turns the shipped one off (every
model is then built here on first use).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from dreamgym_agents.cache import sha256_file
from dreamgym_agents.errors import ConfigError
from dreamgym_agents.types import Trajectory

logger = logging.getLogger(__name__)

BUNDLE_FORMAT = 1
"""Version of the bundle's layout and manifest."""
MANIFEST_FILE = "manifest.json"
EXPERIENCE_DIR = "experience"
POLICY_DIR = "policy"
COLLECT_FILE = "episodes/collect.jsonl.gz"
DEMOS_FILE = "episodes/demos.jsonl.gz"
WARM_START_TEST_FILE = "episodes/warm_start_test.jsonl.gz"
BUNDLE_ENV = "DG_BUNDLE"
TRANSITION_INFO_KEPT = ("truncated", "eval", "em_failure")
"""The ``Transition.info`` keys a compact episode keeps; the browser's action code, the bulk
of a step, and timings go."""


@dataclass(frozen=True)
class Bundle:
    """An embedded bundle folder and its manifest."""

    root: Path
    manifest: dict[str, Any]

    @classmethod
    def open(cls, root: str | Path) -> Bundle:
        """Read a bundle folder.

        Raises:
            ConfigError: No manifest (not a bundle, or a build that did not finish), another
                format, or a manifest that says the build was partial.
        """
        root = Path(root)
        path = root / MANIFEST_FILE
        if not path.is_file():
            raise ConfigError(f"{root} is not an embedded bundle (no {MANIFEST_FILE}): make one "
                              "with dg-agents build-embedded --out DIR (the bundle is DIR/bundle)")
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if manifest.get("format") != BUNDLE_FORMAT:
            raise ConfigError(f"{root}: bundle format {manifest.get('format')} is not "
                              f"{BUNDLE_FORMAT}: rebuild it with this version's "
                              "dg-agents build-embedded")
        if manifest.get("partial"):
            raise ConfigError(f"{root}: a partial build (stopped by a time budget) is not a "
                              "bundle: finish it with dg-agents build-embedded")
        return cls(root, manifest)

    @property
    def family(self) -> str:
        """The task family the bundle was built for; a manifest that names none is the web
        family's."""
        return str(self.manifest.get("family", "webarena"))

    @property
    def id(self) -> str:
        """Names this bundle's content (its caches are kept under it)."""
        return str(self.manifest["id"])

    @property
    def experience_key(self) -> str:
        """The :attr:`~dreamgym_agents.pipeline.embedded.EmbeddedRecipe.key` of its experience
        model."""
        return str(self.manifest["experience"]["key"])

    @property
    def warm_start_key(self) -> str:
        """The key of its warm start (:func:`dreamgym_agents.pipeline.run.warm_start_key`)."""
        return str(self.manifest["warm_start"]["key"])

    @property
    def experience_dir(self) -> Path:
        return self.root / EXPERIENCE_DIR

    @property
    def policy_dir(self) -> Path:
        return self.root / POLICY_DIR

    @property
    def collect_file(self) -> Path:
        return self.root / COLLECT_FILE

    @property
    def demos_file(self) -> Path:
        return self.root / DEMOS_FILE

    def buffer_dir(self) -> Path:
        """Where the replay buffer made from the seed episodes is cached."""
        from dreamgym_agents.cache import cache_root

        return cache_root() / f"bundle-{self.id}" / "buffer"

    def experience_paths(self, *, progress: Callable[[str], None] | None = None,
                         buffer_dir: Path | None = None) -> dict[str, str]:
        """The experience model's ``model`` string, ``checkpoint``, ``buffer`` (made on first
        use) and ``offline`` episodes, as :func:`~dreamgym_agents.pipeline.embedded.
        ensure_embedded_experience_model` returns them, plus the bundle's id."""
        buffer = ensure_buffer(self, buffer_dir or self.buffer_dir(), progress=progress)
        record = json.loads((buffer.parent / "BUFFER_READY").read_text())
        return {"checkpoint": str(self.experience_dir), "model": f"hf/{self.experience_dir}",
                "buffer": str(buffer), "offline": str(self.collect_file), "bundle": self.id,
                "buffer_held_out_rejected": int(record.get("held_out_rejected", 0))}

    def verify(self) -> list[str]:
        """The files whose size or sha256 differ from the manifest's (empty: intact)."""
        bad = []
        for name, meta in sorted(self.manifest.get("files", {}).items()):
            path = self.root / name
            if not path.is_file() or path.stat().st_size != meta["bytes"] or \
                    sha256_file(path) != meta["sha256"]:
                bad.append(name)
        return bad


def shipped_bundle(family: str) -> Bundle | None:
    """The bundle ``dg-agents`` uses for the task ``family``: ``$DG_BUNDLE`` if set (``none``:
    no bundle; a bundle of another family: none for this one), else the family's bundle shipped
    in the package (None when the package holds none)."""
    named = os.environ.get(BUNDLE_ENV, "").strip()
    if named.lower() == "none":
        return None
    if named:
        bundle = Bundle.open(named)
        return bundle if bundle.family == family else None
    root = Path(str(resources.files("dreamgym_agents.bundles"))) / family
    if not (root / MANIFEST_FILE).is_file():
        return None
    return Bundle.open(root)


def ensure_buffer(bundle: Bundle, folder: Path, *,
                  progress: Callable[[str], None] | None = None) -> Path:
    """The Chroma buffer of the bundle's seed episodes in ``folder``, made on first use (the
    same transitions, in the same order, the experience model's training retrieved from);
    an episode of a held-out (validation or test) task is left out and counted."""
    from dreamgym_agents.buffer.replay import BufferConfig, ReplayBuffer
    from dreamgym_agents.cache import build_lock
    from dreamgym_agents.episodes.env import make_family
    from dreamgym_agents.heldout import HeldOut

    ready = folder.parent / "BUFFER_READY"
    if ready.exists():
        return folder
    with build_lock(folder.parent):
        if ready.exists():
            return folder
        say = progress or (lambda msg: logger.info("%s", msg))
        family = make_family(bundle.family)
        try:
            held_out = HeldOut.for_family(family)
            episodes = held_out.keep(read_episodes(bundle.collect_file), "buffer")
            if folder.exists():
                shutil.rmtree(folder)  # an interrupted first use
            with ReplayBuffer(BufferConfig(path=str(folder), family=bundle.family),
                              family) as buffer:
                count = buffer.add_trajectories(episodes, provenance="offline")
        finally:
            family.close()
        ready.write_text(json.dumps({"bundle": bundle.id, "transitions": count,
                                     "held_out_rejected": held_out.rejected["buffer"]}))
        say(f"replay buffer: {count} seed transitions of the bundle {bundle.id} → {folder}")
    return folder


# --------------------------------------------------------------------------------------------
# Compact episodes
# --------------------------------------------------------------------------------------------


def compact(traj: Trajectory, collector: str = "") -> dict[str, Any]:
    """An episode as a bundle keeps it: everything an experience model, a buffer or a warm
    start reads, without the browser's action code, timings and usage; ``collector`` is kept
    in ``info`` (which agent played it)."""
    data = traj.to_dict()
    data["wall_seconds"] = 0.0
    if collector:
        data["info"] = {**data.get("info", {}), "collector": collector}
    for t in data["transitions"]:
        for key in ("usage", "agent_seconds", "env_seconds"):
            t.pop(key, None)
        t["info"] = {k: v for k, v in t.get("info", {}).items() if k in TRANSITION_INFO_KEPT}
    return data


def write_episodes(path: Path, episodes: Iterable[tuple[str, Trajectory]]) -> int:
    """Write ``(collector, episode)`` pairs compactly to a gzipped JSONL file, byte-identical for
    the same episodes (no timestamp in the gzip header); return how many."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    count = 0
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as fh:
        for collector, traj in episodes:
            line = json.dumps(compact(traj, collector), ensure_ascii=False, sort_keys=True)
            fh.write((line + "\n").encode("utf-8"))
            count += 1
    tmp.replace(path)
    return count


def read_episodes(path: str | Path, *, collectors: Iterable[str] | None = None,
                  exclude: Iterable[str] = ()) -> list[Trajectory]:
    """The episodes of a compact file, in file order, as offline data; only those of
    ``collectors`` (None: all) and none of ``exclude``."""
    keep = set(collectors) if collectors is not None else None
    skip = set(exclude)
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            traj = Trajectory.from_dict(json.loads(line))
            who = str(traj.info.get("collector", ""))
            if (keep is not None and who not in keep) or who in skip:
                continue
            traj.provenance = "offline"
            for t in traj.transitions:
                t.provenance = "offline"
            out.append(traj)
    return out


# --------------------------------------------------------------------------------------------
# Making one
# --------------------------------------------------------------------------------------------


def package_model(source: Path, target: Path, dtype: str) -> None:
    """Copy a checkpoint's model (weights cast to ``dtype``: ``bfloat16`` or ``float32``) and
    tokenizer files into ``target``, nothing else (no trainer state)."""
    import torch

    from dreamgym_agents.gateway.local import load_causal_lm

    if dtype not in ("bfloat16", "float32"):
        raise ConfigError(f"weights_dtype must be bfloat16 or float32, got {dtype!r}")
    if target.exists():
        shutil.rmtree(target)
    tokenizer, model = load_causal_lm(source)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(str(target), safe_serialization=True)
    tokenizer.save_pretrained(str(target))
    for name in ("dreamgym_manifest.json",):
        if (source / name).exists():
            shutil.copy2(source / name, target / name)


def file_table(root: Path) -> dict[str, dict[str, Any]]:
    """Size and sha256 of every file under ``root`` but the manifest, by relative path."""
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        name = path.relative_to(root).as_posix()
        if name != MANIFEST_FILE:
            out[name] = {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
    return out


def content_id(family: str, recipe_version: int, warm_start_version: int,
               files: dict[str, dict[str, Any]]) -> str:
    """A bundle's id: its family, versions and a digest of its files."""
    digest = hashlib.sha256(json.dumps({k: v["sha256"] for k, v in files.items()},
                                       sort_keys=True).encode()).hexdigest()[:10]
    return f"{family}-r{recipe_version}-w{warm_start_version}-{digest}"



def write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    tmp = root / (MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(root / MANIFEST_FILE)
