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
