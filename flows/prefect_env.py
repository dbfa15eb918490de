"""Prefect settings for an offline run; must be applied before ``prefect`` is imported.

Without an API URL, Prefect starts its temporary local server (SQLite under ``PREFECT_HOME``).
Analytics (the server's and the client SDK's) and the UI are off so nothing leaves the
machine. A user who runs a Prefect server
sets ``PREFECT_API_URL`` and these defaults step aside.
"""

from __future__ import annotations

import os
from pathlib import Path

OFFLINE_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_UI_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_ENABLED": "true",
    # the temporary server shares two cores with sandboxed workers on small hosts
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_LOGGING_LEVEL": "INFO",
    # the CLI shows progress bars and the funnel; Prefect's own log goes to <out>/prefect.log
    # (and to its database), so a user error stays the one line the CLI prints
    "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "CRITICAL",
    "PREFECT_CLOUD_ENABLE_ORCHESTRATION_TELEMETRY": "false",
    # the client SDK's own usage telemetry (and its first-run notice) honours only this
    "DO_NOT_TRACK": "1",
}


def attach_log_file(path: Path) -> None:
    """Send Prefect's log records to ``path``; call after importing prefect."""
    import logging

    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("prefect").addHandler(handler)


def configure_prefect(home: Path) -> None:
    """Point Prefect at ``home`` and keep it offline, without overriding the user's choices."""
    os.environ.setdefault("PREFECT_HOME", str(home))
    home.mkdir(parents=True, exist_ok=True)
    for key, value in OFFLINE_DEFAULTS.items():
        os.environ.setdefault(key, value)
