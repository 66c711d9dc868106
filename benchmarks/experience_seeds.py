"""A build's spread across training seeds: its experience model retrained with other seeds (the
same recipe, episodes and examples; only initialisation and data order change), each packaged
into a copy of the build's bundle and measured as ``build-embedded`` measures a bundle, beside
the build's own figures.

    .venv/bin/python benchmarks/experience_seeds.py runs/bundle --seeds 1,2,3 --out runs/seeds

``runs/bundle`` is a finished ``dg-agents build-embedded --out`` folder (its collection, its
bundle and its measured real test runs, which every seed is measured against). SFT runs on a
visible GPU (about a minute per seed for the web recipe on an H200) or on the CPU (about ten
minutes on 2 idle cores); the measurement takes 10-25 minutes per seed on 2 cores. A rerun
keeps finished seeds (and resumes a seed's training from its last checkpoint).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path

from dreamgym_agents.cli.output import progress_reporter
from dreamgym_agents.config import apply_mapping
from dreamgym_agents.pipeline.bundle import (
    COLLECT_FILE,
    EXPERIENCE_DIR,
    MANIFEST_FILE,
    Bundle,
    file_table,
    package_model,
    read_episodes,
    write_manifest,
)
from dreamgym_agents.pipeline.bundle_build import BUILD_FILE, BuildConfig, measure_fidelity
from dreamgym_agents.pipeline.embedded import family_recipe, train_embedded

COLUMNS = ("reward_accuracy", "done_accuracy", "state_f1", "oracle_dream_success",
           "random_dream_success")


def seed_figures(build: Path, cfg: BuildConfig, family: str, recipe, episodes: list,
                 seed: int, out: Path, reporter) -> dict:
    """Retrain, package and measure one seed (kept in ``out``: a rerun reads it back)."""
    done = out / "figures.json"
    if done.exists():
        return json.loads(done.read_text())
    tick = reporter.bar(f"seed {seed}: SFT steps", recipe.sft_steps)
    training = train_embedded(recipe, episodes, out / "experience", family, say=reporter.say,
                              on_step=tick, sft_seed=seed)
    bundle_dir = out / "bundle"
    if bundle_dir.exists():
        shutil.rmtree(bundle_dir)
    shutil.copytree(build / "bundle", bundle_dir)
    package_model(out / "experience" / "model", bundle_dir / EXPERIENCE_DIR, cfg.weights_dtype)
    manifest = json.loads((bundle_dir / MANIFEST_FILE).read_text())
    manifest["files"] = file_table(bundle_dir)
    manifest["figures"] = {}
    manifest["experience"]["training"] = {k: training.get(k) for k in
                                          ("steps", "first_loss", "last_loss", "device")}
    manifest["experience"]["sft_seed"] = seed
    write_manifest(bundle_dir, manifest)
    runs = [build / "measure" / "test-oracle", build / "measure" / "test-random"]
    figures = measure_fidelity(Bundle.open(bundle_dir), cfg, runs, out / "measure", family,
                               reporter)
    figures["sft_seed"] = seed
    figures["training"] = manifest["experience"]["training"]
    done.write_text(json.dumps(figures, indent=1, sort_keys=True))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build", type=Path, help="a finished dg-agents build-embedded --out folder")
    parser.add_argument("--seeds", default="1,2,3", help="training seeds, comma-separated")
    parser.add_argument("--out", type=Path, required=True, help="folder of the seeds' models")
    args = parser.parse_args()
    record_file = args.build / BUILD_FILE
    if not record_file.exists() or not (args.build / "bundle" / MANIFEST_FILE).exists():
        parser.exit(2, f"error: {args.build} is not a finished build-embedded folder\n")
    record = json.loads(record_file.read_text())
    cfg = BuildConfig()
    apply_mapping(cfg, record["config"])
    family = record["family"]
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.exit(2, f"error: --seeds takes integers separated by commas, got {args.seeds!r}\n")
    own = Bundle.open(args.build / "bundle").manifest.get("figures", {}).get("fidelity") or {}
    rows = [("build", own)]
    recipe = family_recipe(family, **cfg.experience_recipe)
    episodes = read_episodes(args.build / COLLECT_FILE)  # read once, for every seed
    with progress_reporter() as reporter:
        for seed in seeds:
            rows.append((f"seed {seed}", seed_figures(args.build, cfg, family, recipe, episodes,
                                                      seed, args.out / f"seed{seed}", reporter)))
    print("| model | " + " | ".join(COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for name, figures in rows:
        cells = [f"{figures[c]:.3f}" if isinstance(figures.get(c), float | int) else "-"
                 for c in COLUMNS]
        print(f"| {name} | " + " | ".join(cells) + " |")
    rates = [f["oracle_dream_success"] for _, f in rows
             if isinstance(f.get("oracle_dream_success"), float | int)]
    if len(rates) > 1:
        print(f"oracle in the dream over {len(rates)} models: mean {statistics.mean(rates):.3f}, "
              f"sd {statistics.stdev(rates):.3f}, {min(rates):.3f}-{max(rates):.3f}")


if __name__ == "__main__":
    main()
