"""A scripted OpenAI-compatible chat server on 127.0.0.1, for offline tests of model calls.

Usage::

    from fakes_openai_server import serve_openai_compatible

    server = serve_openai_compatible([(429, "slow down"), (200, "<action>click('3')</action>")])
    base_url, stop = server            # unpacks like a (base_url, stop) pair
    cfg = LLMConfig(model="openai/test-model", api_base=base_url, api_key_env="FAKE_KEY")
    ...
    assert len(server.requests) == 2   # every request body received, in order
    stop()

or as a context manager: ``with serve_openai_compatible(...) as server: ...``.

The server answers ``POST /v1/chat/completions`` (and ``/chat/completions``). Each answer is
taken from the script:

- ``(status, content)`` or ``(status, content, headers)``: a 2xx status returns a
  ``chat.completion`` whose message content is ``content``; any other status returns an OpenAI
  error body whose message is ``content`` (``headers`` are sent as well, e.g. ``Retry-After``).
- a ``dict``: sent verbatim as the JSON body with status 200.
- a callable ``(request_body: dict) -> answer`` (any of the forms above): called for every request;
  it may sleep, count in-flight requests, or inspect the body.

A list is consumed in order; once exhausted its last answer repeats.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = tuple[int, str] | tuple[int, str, dict[str, str]] | dict[str, Any]
Script = list[Answer] | Callable[[dict[str, Any]], Answer]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_api_key",
    403: "permission_denied",
    404: "not_found_error",
    429: "rate_limit_exceeded",
}


def chat_completion_body(content: str, *, model: str = "test-model", prompt_text: str = "") -> dict:
    """A minimal valid ``chat.completion`` JSON body whose message content is ``content``."""
    prompt_tokens = max(1, len(prompt_text.split()))
    completion_tokens = max(1, len(content.split()))
    return {
        "id": f"chatcmpl-fake-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


class FakeOpenAIServer:
    """A running scripted server. Unpacks as ``(base_url, stop)``.

    Attributes:
        base_url: ``http://127.0.0.1:<port>/v1``, to pass as ``api_base``.
        requests: JSON bodies of the chat requests received, in arrival order.
        headers: The HTTP headers of those requests (same order, lower-case names), to check
            authentication.
    """

    def __init__(self, script: Script) -> None:
        self._script = script
        self._index = 0
        self._lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._make_handler())
        self._httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Shut the server down (idempotent)."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(timeout=5)

    def __iter__(self) -> Iterator[Any]:
        yield self.base_url
        yield self.stop

    def __enter__(self) -> FakeOpenAIServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _next_answer(self, body: dict[str, Any]) -> Answer:
        with self._lock:
            self.requests.append(body)
            if callable(self._script):
                script: Any = self._script
            else:
                if not self._script:
                    return (500, "fake server: empty script")
                answer = self._script[min(self._index, len(self._script) - 1)]
                self._index += 1
                return answer
        return script(body)

    def _make_handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
                return  # keep test output quiet

            def do_POST(self) -> None:  # noqa: N802 - stdlib name
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b"{}"
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}}, {})
                    return
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {"_raw": raw.decode("utf-8", "replace")}
                with server._lock:
                    server.headers.append({k.lower(): v for k, v in self.headers.items()})
                answer = server._next_answer(body)
                status, payload, extra_headers = _render(answer, body)
                self._send(status, payload, extra_headers)

            def _send(self, status: int, payload: dict, extra_headers: dict[str, str]) -> None:
                data = json.dumps(payload).encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in extra_headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

        return Handler


def _render(answer: Answer, body: dict[str, Any]) -> tuple[int, dict, dict[str, str]]:
    if isinstance(answer, dict):
        return 200, answer, {}
    status, content = answer[0], answer[1]
    headers = dict(answer[2]) if len(answer) > 2 else {}  # type: ignore[misc]
    if 200 <= status < 300:
        prompt_text = " ".join(
            str(m.get("content", "")) for m in body.get("messages", []) if isinstance(m, dict)
        )
        model = str(body.get("model", "test-model"))
        return status, chat_completion_body(content, model=model, prompt_text=prompt_text), headers
    error = {
        "error": {
            "message": content,
            "type": _ERROR_TYPES.get(status, "server_error"),
            "param": None,
            "code": _ERROR_TYPES.get(status, str(status)),
        }
    }
    return status, error, headers


def serve_openai_compatible(responses: Script) -> FakeOpenAIServer:
    """Start a scripted OpenAI-compatible server on 127.0.0.1 in a daemon thread.

    Args:
        responses: A list of answers consumed in order (the last one repeats), or a callable
            that receives each request's JSON body and returns an answer. See the module
            docstring for the answer forms.

    Returns:
        The running server; ``base_url, stop = serve_openai_compatible(...)`` also works.
    """
    return FakeOpenAIServer(responses)
