"""The grep tool's matching, run as a child process with a deadline.

A regular expression can backtrack for ever (``(a+)+$`` against a long line of ``a``), and
Python's ``re`` cannot be interrupted, so a pathological pattern would stall the episode's
thread for good. The toolbox picks the files (confined to the workdir) in its own process and
hands them here; the child is killed at the deadline. Standard library only.

    stdin: {"pattern", "files": [[path, rel]], "max_matches", "line_chars", "max_bytes"}
    stdout: a JSON list of lines (``run_search`` starts it isolated, ``python -I``)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys


class GrepTimeout(Exception):
    """The search outlived its deadline."""


def search(request: dict) -> list[str]:
    regex = re.compile(request["pattern"])
    limit, width = int(request["max_matches"]), int(request["line_chars"])
    matches: list[str] = []
    for path, rel in request["files"]:
        try:
            if os.stat(path).st_size > int(request["max_bytes"]):
                continue
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        if b"\0" in data[:8192]:  # binary: objects, libraries
            continue
        for n, line in enumerate(data.decode(errors="replace").splitlines(), 1):
            if regex.search(line):
                matches.append(f"{rel}:{n}:{line[:width]}")
                if len(matches) > limit:
                    matches[-1] = f"[stopped after {limit} matches]"
                    return matches
    return matches


def run_search(request: dict, timeout_s: float) -> list[str]:
    """``search`` in a child process; GrepTimeout when it does not finish in ``timeout_s``."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-I",
                "-c",
                f"import sys; sys.path.insert(0, {package_root!r}); "
                "from opsynth.trainer.grep_search import main; main()",
            ],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired as exc:
        raise GrepTimeout(f"no result within {timeout_s:g} s") from exc
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "")
    return json.loads(done.stdout)


def main() -> None:
    json.dump(search(json.load(sys.stdin)), sys.stdout)


if __name__ == "__main__":
    main()
