"""On-disk reply cache: one JSON file per (prompt, model, params), written atomically.

A reply is stored as soon as it arrives, before it is judged, so a run killed mid-compose or
re-run after a server outage asks again only for what never came back. Failed requests are not
stored: the next run asks again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from synth.llm.prompts import Messages


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
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(record, fh, sort_keys=True)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
