"""The first program run inside every sandbox: become the sandbox uid, keep only the
descriptors the command needs, then exec the command.

``python -m opsynth.filters.sandbox_entry UID GID KEEP_FDS CWD -- COMMAND...``. UID/GID ``-`` keeps
the current ids (bwrap started unprivileged already maps us to one). KEEP_FDS is a comma list
(may be empty). CWD (``-``: stay) is entered after the drop: a directory handed to the
sandbox uid may be closed to root without capabilities. It exits 126 with one line on stderr
when it cannot do what it was asked: running the command as root by mistake is worse than not
running it.

Why a separate step: bubblewrap started by root, without a user namespace, runs its command
as host root with the capabilities it was told to keep (only CAP_SETUID/CAP_SETGID here);
this step uses them once to leave uid 0 for good, which clears every capability. It also
closes what bwrap leaves open (the descriptor its option list came from names host paths).

Standard library only: it runs before anything else in the sandbox.
"""

from __future__ import annotations

import contextlib
import os
import sys

EXIT_REFUSED = 126


def drop_to(uid: int, gid: int) -> None:
    """Become ``uid``/``gid`` (real, effective and saved) with no supplementary groups, and
    check that uid 0 cannot be regained."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        raise PermissionError("the ids did not change")
    if uid != 0:
        try:
            os.setuid(0)
        except PermissionError:
            return
        raise PermissionError("uid 0 could be regained")


def close_except(keep: set[int]) -> None:
    """Close every inherited descriptor above stderr that is not in ``keep``."""
    fds = sorted(int(name) for name in os.listdir("/proc/self/fd") if name.isdigit())
    for fd in fds:
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def main(argv: list[str]) -> int:
    try:
        split = argv.index("--")
        uid, gid, keep, cwd = argv[:split]
        command = argv[split + 1 :]
        if not command:
            raise ValueError("no command")
        if uid != "-":
            drop_to(int(uid), int(gid))
        close_except({int(fd) for fd in keep.split(",") if fd})
        if cwd != "-":
            os.chdir(cwd)
        os.execvp(command[0], command)
    except (ValueError, OSError) as exc:
        sys.stderr.write(f"sandbox entry refused: {exc}\n")
    return EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
