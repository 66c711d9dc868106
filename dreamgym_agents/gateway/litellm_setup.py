"""LiteLLM, imported and configured once for the whole process (offline price list, no
telemetry, no debug banner). Its own module so that the gateway (``llm``) and the in-process
local provider (``local_provider``) share it without importing each other."""

from __future__ import annotations

import logging
import os
import threading
from types import ModuleType

_LITELLM: ModuleType | None = None
_LITELLM_LOCK = threading.Lock()
_REQUEST_PATH_READY = False
_REQUEST_PATH_LOCK = threading.Lock()


def import_litellm() -> ModuleType:
    """Import and configure LiteLLM once (offline price list, no telemetry, no debug banner)."""
    global _LITELLM
    if _LITELLM is None:
        with _LITELLM_LOCK:
            if _LITELLM is None:
                os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
                import litellm

                litellm.telemetry = False
                litellm.suppress_debug_info = True
                # LiteLLM logs two INFO lines per call: keep them out of INFO-level application
                # logs unless LITELLM_LOG asks for them.
                for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
                    lite_logger = logging.getLogger(name)
                    if "LITELLM_LOG" not in os.environ:
                        lite_logger.setLevel(logging.WARNING)
                _LITELLM = litellm
    return _LITELLM


def request_path_ready() -> bool:
    """Whether :func:`prepare_request_path` has run in this process."""
    return _REQUEST_PATH_READY


def prepare_request_path() -> None:
    """Do once, now, what LiteLLM does on a process's first request: import the rest of its
    request path (its request pre-processing's modules, the OpenAI SDK's API resources), about a
    second of imports and pydantic model building.

    Done inside the first requests instead, the requests of a run that start together (a dream
    of many episodes) all run into those imports at once and each waits on them, so the first
    step of every episode is delayed.
    Public API only (a mocked completion, an OpenAI client that sends nothing); no network.
    Thread-safe; later calls return at once. Best effort: should a LiteLLM release refuse one of
    these calls, the first requests do the set-up themselves.
    """
    global _REQUEST_PATH_READY
    if _REQUEST_PATH_READY:
        return
    with _REQUEST_PATH_LOCK:
        if _REQUEST_PATH_READY:
            return
        litellm = import_litellm()
        try:
            # LiteLLM's own request pipeline (pre-processing, response building, logging)
            litellm.completion(model="openai/prepare", mock_response=".", api_key="unused",
                               messages=[{"role": "user", "content": "."}])
            import openai

            # what LiteLLM's OpenAI-compatible providers send through (imported on first use)
            client = openai.AsyncOpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1")
            _ = client.chat.completions  # the property imports the SDK's API resources
        except Exception as exc:  # an optimisation only: never the reason a call fails
            logging.getLogger(__name__).debug("LiteLLM's request set-up not done ahead: %s", exc)
        _REQUEST_PATH_READY = True
