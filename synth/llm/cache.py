"""On-disk reply cache: one JSON file per (prompt, model, params), written atomically.

A reply is stored as soon as it arrives, before it is judged, so a run killed mid-compose or
re-run after a server outage asks again only for what never came back. Failed requests are not
stored: the next run asks again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from opsynth.store import write_text_atomic
from opsynth.synth.llm.prompts import Messages


def request_key(messages: Messages, model: str, params: dict[str, Any]) -> str:
    blob = json.dumps({"messages": messages, "model": model, "params": params}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


class ReplyCache:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored reply, or None (also for an unreadable file, which is then re-asked)."""
        try:
            return json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def put(self, key: str, record: dict[str, Any]) -> None:
        write_text_atomic(self._path(key), json.dumps(record, sort_keys=True))
