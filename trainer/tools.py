"""The agent's tools: a sandboxed shell and file tools confined to the workdir.

Every call answers with a ``ToolResult`` and never raises: a model's malformed call is an
observation it can learn from, not a crash of the episode. File tools run in the trainer's
process, so every path is resolved (links included) and refused when it leaves the workdir;
the shell runs in bubblewrap (``trainer.bash_sandbox``).
"""

from __future__ import annotations

import copy
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from opsynth.config import TrainerConfig
from opsynth.trainer.bash_sandbox import run_bash
from opsynth.trainer.grep_search import GrepTimeout, run_search
from opsynth.trainer.workdir import Workdir

TOOL_ERRORS = (
    "unknown_tool",
    "bad_arguments",
    "path_outside_workdir",
    "protected_file",
    "not_found",
    "edit_no_match",
    "edit_ambiguous",
    "too_large",
    "io_error",
    "internal_error",
    "timeout",
    "nonzero_exit",
    "sandbox_unavailable",
)
READ_LINES = 2000
READ_BYTES = 64 << 20  # larger files are for head/grep in the shell, not a whole-file read
LINE_CHARS = 2000
GLOB_RESULTS = 1000
GREP_MATCHES = 500
GREP_LINE_CHARS = 300
GREP_BYTES = 8 << 20


@dataclass(frozen=True)
class ToolResult:
    output: str
    error: str = ""  # "" on success, else one of TOOL_ERRORS


class _Fail(Exception):
    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error, self.message = error, message


def _string(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


def _integer(description: str) -> dict[str, Any]:
    return {"type": "integer", "minimum": 1, "description": description}


def _boolean(description: str) -> dict[str, Any]:
    return {"type": "boolean", "description": description}


EDIT_PAIR = {
    "type": "object",
    "properties": {
        "old_string": _string("exact text to replace"),
        "new_string": _string("its replacement"),
        "replace_all": _boolean("replace every occurrence (default false)"),
    },
    "required": ["old_string", "new_string"],
    "additionalProperties": False,
}

# name -> (description, properties, required)
SPECS: dict[str, tuple[str, dict[str, Any], tuple[str, ...]]] = {
    "bash": (
        "Run a bash command in the workdir (sandboxed: no network, files outside the workdir "
        "read-only). Use it for ./compile.sh, ./verify.sh, ./profile.sh, nvcc, python. "
        "Output is stdout and stderr together; long output is cut in the middle.",
        {"command": _string("the bash command line")},
        ("command",),
    ),
    "read": (
        "Read a text file of the workdir, with line numbers.",
        {
            "path": _string("path relative to the workdir"),
            "offset": _integer("first line to show, 1-based (default 1)"),
            "limit": _integer(f"lines to show (default {READ_LINES})"),
        },
        ("path",),
    ),
    "write": (
        "Create or overwrite a file of the workdir (parent directories are created).",
        {"path": _string("path relative to the workdir"), "content": _string("the full text")},
        ("path", "content"),
    ),
    "edit": (
        "Replace old_string by new_string in a file. old_string must match exactly once "
        "(whitespace included) unless replace_all is true.",
        {
            "path": _string("path relative to the workdir"),
            "old_string": _string("exact text to replace"),
            "new_string": _string("its replacement"),
            "replace_all": _boolean("replace every occurrence (default false)"),
        },
        ("path", "old_string", "new_string"),
    ),
    "multi_edit": (
        "Several edits of one file, applied in order; if any fails, none is applied.",
        {
            "path": _string("path relative to the workdir"),
            "edits": {"type": "array", "minItems": 1, "items": EDIT_PAIR},
        },
        ("path", "edits"),
    ),
    "glob": (
        "List workdir paths matching a glob pattern such as '**/*.cu' (directories end in /).",
        {"pattern": _string("glob pattern relative to the workdir")},
        ("pattern",),
    ),
    "grep": (
        "Search file contents with a Python regular expression; prints path:line:text.",
        {
            "pattern": _string("regular expression"),
            "path": _string("file or directory to search, relative to the workdir (default .)"),
            "glob": _string("only files whose path matches this glob, e.g. '*.cu'"),
        },
        ("pattern",),
    ),
}
MARKER = "\n[... {} characters dropped ...]\n"
JSON_TYPES = {"string": str, "integer": int, "boolean": bool, "array": list, "object": dict}


def truncate_middle(text: str, limit: int) -> str:
    """At most ``limit`` characters: head and tail kept, a marker in between."""
    return cut(text[: len(text) // 2], text[len(text) // 2 :], 0, limit)


def cut(head: str, tail: str, dropped: int, limit: int) -> str:
    """``head`` and ``tail``, with ``dropped`` characters already discarded between them, cut
    to at most ``limit`` characters around one marker that counts everything dropped."""
    if not dropped and len(head) + len(tail) <= limit:
        return head + tail
    total = len(head) + len(tail) + dropped
    room = max(0, limit - len(MARKER.format(total)))
    t = min(len(tail), room // 2)
    h = min(len(head), room - t)
    t = min(len(tail), room - h)
    return head[:h] + MARKER.format(total - h - t) + tail[len(tail) - t :]


class Toolbox:
    def __init__(
        self, workdir: Workdir, cfg: TrainerConfig, *, cuda_visible_devices: str | None = None
    ) -> None:
        self.workdir = workdir
        self.cfg = cfg
        self.root = workdir.path.resolve()
        self.cuda_visible_devices = cuda_visible_devices

    def schemas(self) -> list[dict[str, Any]]:
        """The ``tools`` parameter of a chat-completions request."""
        return copy.deepcopy(
            [
                {
                    "type": "function",
                    "function": {
                        "name": name,
                        "description": description,
                        "parameters": {
                            "type": "object",
                            "properties": properties,
                            "required": list(required),
                            "additionalProperties": False,
                        },
                    },
                }
                for name, (description, properties, required) in SPECS.items()
            ]
        )

    def call(self, name: str, arguments: str) -> ToolResult:
        if name not in SPECS:
            return ToolResult(f"unknown tool {name!r}; tools: {', '.join(SPECS)}", "unknown_tool")
        try:
            args = _arguments(name, arguments)
            result = getattr(self, f"_{name}")(**args)
        except _Fail as fail:
            result = ToolResult(fail.message, fail.error)
        except OSError as exc:
            result = ToolResult(f"{name}: {exc.strerror or exc}", "io_error")
        except Exception as exc:  # a bug here must not end the episode
            result = ToolResult(f"{name}: {type(exc).__name__}: {exc}", "internal_error")
        return ToolResult(truncate_middle(result.output, self.cfg.tool_output_chars), result.error)

    # ------------------------------------------------------------------------------ tools

    def _bash(self, command: str) -> ToolResult:
        if "\0" in command:
            raise _Fail("bad_arguments", "command contains a NUL character")
        limit = self.cfg.tool_output_chars
        out = run_bash(
            command, self.workdir, self.cfg.tool_timeout_s, limit, self.cuda_visible_devices
        )
        if out.unavailable:
            return ToolResult(
                f"the sandbox is unavailable, nothing was run: {out.unavailable}",
                "sandbox_unavailable",
            )
        if out.returncode is None:
            note = f"[timed out after {self.cfg.tool_timeout_s:g} s; the command was killed]"
            error = "timeout"
        elif out.returncode < 0:
            note, error = f"[killed by signal {-out.returncode}]", "nonzero_exit"
        elif out.returncode:
            note, error = f"[exit code {out.returncode}]", "nonzero_exit"
        else:
            note, error = "", ""
        text = cut(out.head, out.tail, out.dropped, limit - len(note) - 1)
        if note:
            text = f"{text}\n{note}" if text else note
        return ToolResult(text or "(no output)", error)

    def _read(self, path: str, offset: int = 1, limit: int = READ_LINES) -> ToolResult:
        target, rel = self._resolve(path)
        self._regular(target, rel)
        size = target.stat().st_size
        if size > READ_BYTES:
            raise _Fail(
                "too_large", f"{rel} has {size} bytes; read it in parts with head, tail or grep"
            )
        shown, total = [], 0
        with open(target, encoding="utf-8", errors="replace", newline="") as fh:
            for total, line in enumerate(fh, 1):
                if offset <= total < offset + limit:
                    shown.append(f"{total:6}\t{line.rstrip(chr(10)).rstrip(chr(13))[:LINE_CHARS]}")
        if not total:
            return ToolResult(f"{rel} is empty")
        if not shown:
            raise _Fail("bad_arguments", f"offset {offset} is past the end ({total} lines)")
        last = offset + len(shown) - 1
        if offset > 1 or last < total:
            shown.append(f"[lines {offset}-{last} of {total}]")
        return ToolResult("\n".join(shown))

    def _write(self, path: str, content: str) -> ToolResult:
        target, rel = self._writable(path)
        data = content.encode()
        self._fits(data, rel)
        existed = target.exists()
        if existed:
            self._regular(target, rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        _store(target, data)
        return ToolResult(f"{'overwrote' if existed else 'created'} {rel} ({len(data)} bytes)")

    def _edit(
        self, path: str, old_string: str, new_string: str, replace_all: bool = False
    ) -> ToolResult:
        return self._multi_edit(
            path, [{"old_string": old_string, "new_string": new_string, "replace_all": replace_all}]
        )

    def _multi_edit(self, path: str, edits: list[dict[str, Any]]) -> ToolResult:
        target, rel = self._writable(path)
        self._regular(target, rel)
        text = target.read_text(encoding="utf-8", errors="surrogateescape")
        replaced = 0
        for i, edit in enumerate(edits, 1):
            where = f"edit {i} of {len(edits)}: " if len(edits) > 1 else ""
            old, new = edit["old_string"], edit["new_string"]
            if not old:
                raise _Fail("bad_arguments", f"{where}old_string is empty")
            if old == new:
                raise _Fail("bad_arguments", f"{where}old_string and new_string are the same")
            count = text.count(old)
            if not count:
                raise _Fail(
                    "edit_no_match", f"{where}old_string not found in {rel}; nothing changed"
                )
            if count > 1 and not edit.get("replace_all", False):
                raise _Fail(
                    "edit_ambiguous",
                    f"{where}old_string occurs {count} times in {rel}; add context to make it "
                    "unique or set replace_all; nothing changed",
                )
            text = text.replace(old, new)
            replaced += count
        data = text.encode(errors="surrogateescape")
        self._fits(data, rel)
        _store(target, data)
        return ToolResult(f"edited {rel}: {replaced} replacement(s)")

    def _glob(self, pattern: str) -> ToolResult:
        if not pattern:
            raise _Fail("bad_arguments", "pattern is empty")
        if pattern.startswith("/") or ".." in PurePosixPath(pattern).parts:
            raise _Fail(
                "path_outside_workdir",
                f"glob patterns are relative to the workdir and stay inside it: {pattern!r}",
            )
        try:
            found = sorted(self.root.glob(pattern))
        except (ValueError, NotImplementedError) as exc:
            raise _Fail("bad_arguments", f"bad glob pattern {pattern!r}: {exc}") from exc
        lines = []
        for path in found:
            if self._inside(path) and path != self.root:
                rel = path.relative_to(self.root).as_posix()
                lines.append(rel + "/" if path.is_dir() else rel)
        if not lines:
            return ToolResult(f"no paths match {pattern!r}")
        more = len(lines) - GLOB_RESULTS
        return ToolResult(
            "\n".join(lines[:GLOB_RESULTS] + ([f"[{more} more]"] if more > 0 else []))
        )

    def _grep(self, pattern: str, path: str = ".", glob: str | None = None) -> ToolResult:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise _Fail("bad_arguments", f"bad regular expression: {exc}") from exc
        start, _ = self._resolve(path)
        if not start.exists():
            raise _Fail("not_found", f"{path} does not exist")
        files = []
        for file in self._files(start):
            rel = file.relative_to(self.root).as_posix()
            if not glob or PurePosixPath(rel).match(glob):
                files.append([str(file), rel])
        request = {
            "pattern": pattern,
            "files": files,
            "max_matches": GREP_MATCHES,
            "line_chars": GREP_LINE_CHARS,
            "max_bytes": GREP_BYTES,
        }
        try:
            matches = run_search(request, self.cfg.tool_timeout_s)
        except GrepTimeout as exc:
            raise _Fail("timeout", f"grep {pattern!r}: {exc}; simplify the pattern") from exc
        return ToolResult("\n".join(matches) if matches else f"no matches for {pattern!r}")

    # ---------------------------------------------------------------------------- helpers

    def _resolve(self, raw: str) -> tuple[Path, str]:
        """(resolved path, its posix path relative to the workdir)."""
        if not raw or "\0" in raw:
            raise _Fail("bad_arguments", "path is empty or contains a NUL character")
        try:
            target = (self.root / raw).resolve()
        except (OSError, RuntimeError) as exc:
            raise _Fail("not_found", f"{raw}: cannot resolve ({exc})") from exc
        if not target.is_relative_to(self.root):
            raise _Fail("path_outside_workdir", f"{raw} is outside the workdir")
        return target, target.relative_to(self.root).as_posix()

    def _writable(self, raw: str) -> tuple[Path, str]:
        target, rel = self._resolve(raw)
        if rel in self.workdir.protected:
            raise _Fail("protected_file", f"{rel} is protected and cannot be changed")
        if target.is_dir():
            raise _Fail("bad_arguments", f"{rel} is a directory")
        return target, rel

    def _regular(self, target: Path, rel: str) -> None:
        """Only regular files are opened: a FIFO or device the shell made would block or
        flood the trainer's process."""
        try:
            mode = target.stat().st_mode
        except FileNotFoundError as exc:
            raise _Fail("not_found", f"{rel} does not exist") from exc
        if stat.S_ISDIR(mode):
            raise _Fail("bad_arguments", f"{rel} is a directory; use glob to list it")
        if not stat.S_ISREG(mode):
            raise _Fail("bad_arguments", f"{rel} is not a regular file")

    def _fits(self, data: bytes, rel: str) -> None:
        if len(data) > self.cfg.file_bytes:
            raise _Fail(
                "too_large", f"{rel} would be {len(data)} bytes; the limit is {self.cfg.file_bytes}"
            )

    def _inside(self, path: Path) -> bool:
        try:
            return path.resolve().is_relative_to(self.root)
        except (OSError, RuntimeError):
            return False

    def _files(self, start: Path):
        if start.is_file():
            yield start
            return
        for folder, dirs, files in os.walk(start):
            dirs.sort()
            for name in sorted(files):
                path = Path(folder, name)
                if not path.is_symlink() and stat.S_ISREG(path.lstat().st_mode):
                    yield path


def _arguments(name: str, raw: str) -> dict[str, Any]:
    """The parsed arguments, checked against the tool's schema; one-line reasons."""
    _, properties, required = SPECS[name]
    try:
        args = json.loads(raw or "{}")
    except (json.JSONDecodeError, TypeError) as exc:
        raise _Fail("bad_arguments", f"arguments are not valid JSON: {exc}") from exc
    if not isinstance(args, dict):
        raise _Fail("bad_arguments", "arguments must be a JSON object")
    _check(args, properties, required, name)
    return args


def _check(args: dict, properties: dict, required: tuple | list, where: str) -> None:
    missing = [key for key in required if key not in args]
    if missing:
        raise _Fail("bad_arguments", f"{where}: missing {', '.join(missing)}")
    unknown = sorted(set(args) - set(properties))
    if unknown:
        raise _Fail(
            "bad_arguments",
            f"{where}: unknown argument(s) {', '.join(unknown)}; expected {', '.join(properties)}",
        )
    for key, value in args.items():
        spec = properties[key]
        kind = JSON_TYPES[spec["type"]]
        if isinstance(value, str) and not _encodable(value):
            raise _Fail("bad_arguments", f"{where}: {key} is not valid UTF-8 text")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise _Fail(
                "bad_arguments",
                f"{where}: {key} must be of type {spec['type']}",
            )
        if kind is int and value < spec.get("minimum", value):
            raise _Fail("bad_arguments", f"{where}: {key} must be at least {spec['minimum']}")
        if kind is list:
            if len(value) < spec.get("minItems", 0):
                raise _Fail("bad_arguments", f"{where}: {key} is empty")
            item = spec["items"]
            for i, element in enumerate(value):
                if not isinstance(element, dict):
                    raise _Fail("bad_arguments", f"{where}: {key}[{i}] must be an object")
                _check(element, item["properties"], item["required"], f"{where}: {key}[{i}]")


def _encodable(text: str) -> bool:
    """JSON can carry lone surrogates, which no file name or file content can hold."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _store(target: Path, data: bytes) -> None:
    """Written in place without following a link swapped in after the path was resolved."""
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
