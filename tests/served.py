"""A real OpenAI-compatible server on 127.0.0.1 for tests: ``transformers serve`` (from the
``transformers[serving]`` extra) loading a local checkpoint, the stand-in for a hosted API or a
vLLM server. It names the model by the path it loaded, so the gateway's model string is
``openai/<checkpoint path>``.

Usage::

    with transformers_serve(checkpoint) as base_url:
        ... LLMConfig(model=f"openai/{checkpoint}", api_base=base_url, api_key_env=...) ...
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def transformers_serve(checkpoint: str | Path, log: Path | None = None,
                       timeout_s: float = 180.0) -> Iterator[str]:
    """Serve ``checkpoint`` on a free port; yield its base URL; stop it on exit."""
    pytest.importorskip("fastapi", reason="transformers serve needs the serve extra "
                                          "(pip install 'transformers[serving]')")
    port = _free_port()
    log = log or Path(checkpoint).parent / f"serve-{port}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "transformers.cli.transformers", "serve", str(checkpoint),
             "--host", "127.0.0.1", "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"transformers serve exited: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{base_url}/models", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"transformers serve did not start: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield base_url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
