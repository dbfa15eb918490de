"""The offline Prefect settings: applied without overriding the user's own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import os, sys
from pathlib import Path
from opsynth.flows.prefect_env import configure_prefect
configure_prefect(Path(sys.argv[1]))
from prefect._internal.analytics.enabled import is_telemetry_enabled
print(is_telemetry_enabled(), os.environ["PREFECT_HOME"], os.environ["PREFECT_LOGGING_LEVEL"])
"""


def test_offline_defaults_turn_every_telemetry_off_but_keep_the_users_settings(
    tmp_path: Path,
) -> None:
    # a fresh interpreter: prefect reads its settings when first imported
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    for key in ("DO_NOT_TRACK", "CI", "GITHUB_ACTIONS", "GITLAB_CI", "BUILDKITE", "JENKINS_URL"):
        env.pop(key, None)
    env["PREFECT_LOGGING_LEVEL"] = "DEBUG"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "home")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    enabled, home, level = done.stdout.split()
    assert enabled == "False", "the client SDK's telemetry (and its first-run notice) is off"
    assert home == str(tmp_path / "home")
    assert level == "DEBUG", "a user's own setting stays"
