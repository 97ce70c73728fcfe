"""Whether the Hugging Face Hub can be reached, asked once per process, quickly.

With no network, ``transformers`` and ``datasets`` retry the Hub with backoff for tens of seconds before they fall
back to their caches or fail; with ``HF_HUB_OFFLINE=1`` they read the cache at once. So before the first load by
name, one TCP connection to the Hub's endpoint (``HF_ENDPOINT``, else huggingface.co) is tried for a few seconds;
when it fails, the process goes offline as if the user had set ``HF_HUB_OFFLINE=1``: a cached tokenizer or dataset
still loads, a missing one is refused at once, and the refusal says why the Hub was not asked.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import threading
from urllib.parse import urlsplit

PROBE_SECONDS = 3.0
TRUE = ("1", "true", "yes", "on")


def offline() -> str | None:
    """None when the Hub may be asked; else why not (the user's ``HF_HUB_OFFLINE``, or the failed probe), after
    putting this process in Hugging Face's offline mode."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in TRUE:
        return "HF_HUB_OFFLINE is set"
    why = unreachable(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    if why is not None:
        _go_offline()
    return why


@functools.cache
def unreachable(endpoint: str) -> str | None:
    """Why ``endpoint``'s host cannot be reached (one TCP connection, at most a few seconds, asked once per process),
    or None: a download's precondition, checked by the checks and the run alike (enwik8)."""
    parts = urlsplit(endpoint)
    host, port = parts.hostname or endpoint, parts.port or (80 if parts.scheme == "http" else 443)
    answer: list[str | None] = []

    def probe() -> None:  # in a thread: a name lookup has no timeout of its own
        try:
            socket.create_connection((host, port), timeout=PROBE_SECONDS).close()
            answer.append(None)
        except OSError as e:
            answer.append(f"{endpoint} cannot be reached: {' '.join(str(e).split()) or type(e).__name__}")

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(PROBE_SECONDS + 1)
    return answer[0] if answer else f"{endpoint} did not answer within {PROBE_SECONDS:g} s"


def _go_offline() -> None:
    """``HF_HUB_OFFLINE=1`` for this process: the environment, read by the libraries when they are imported, and
    the constants of those already imported (they copied the variable at import)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    for name in ("huggingface_hub.constants", "datasets.config"):  # transformers asks huggingface_hub's
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "HF_HUB_OFFLINE"):
            vars(module)["HF_HUB_OFFLINE"] = True
