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


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running(command: list[str], ready_url: str, log: Path, *, timeout_s: float = 60.0,
            env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """Run a server ``command`` (its output to ``log``) until ``ready_url`` answers 200; yield
    the process; stop it on exit (terminate, then kill)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(ready_url, timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{Path(command[0]).name} could not start: {log.read_text()[-2000:]}")
            time.sleep(0.3)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def transformers_serve(checkpoint: str | Path, log: Path | None = None,
                       timeout_s: float = 180.0) -> Iterator[str]:
    """Serve ``checkpoint`` on a free port; yield its base URL; stop it on exit."""
    pytest.importorskip("fastapi", reason="transformers serve needs the serve extra "
                                          "(pip install 'transformers[serving]')")
    port = free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    command = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(checkpoint),
               "--host", "127.0.0.1", "--port", str(port)]
    with running(command, f"{base_url}/models", log or Path(checkpoint).parent / "serve.log",
                 timeout_s=timeout_s,
                 env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}):
        yield base_url
