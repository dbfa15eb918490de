"""The agent's environment: workdir, tools, the bubblewrap shell and the feedback commands.

Everything runs for real: the shell tests start bubblewrap, and the command tests import torch
inside it (a few seconds each), so they share workdirs. Correct solutions here need no
compiled extension (building one against torch's headers takes minutes on a small machine):
the commands' task is a transpose, which ModelNew may express with views alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from opsynth.config import EvalConfig, TrainerConfig
from opsynth.evaluator.solution import Solution
from opsynth.filters.sandbox import PACKAGE_ROOT, bwrap_available
from opsynth.record import Task
from opsynth.trainer import bash_sandbox
from opsynth.trainer.commands import REPORTS
from opsynth.trainer.tools import READ_BYTES, TOOL_ERRORS, Toolbox, ToolResult, truncate_middle
from opsynth.trainer.workdir import (
    COMMANDS,
    INSTRUCTIONS,
    MODEL,
    collect_solution,
    materialise,
    protected_changes,
    script_name,
)
from tests.evaluator_cases import EXTENSION_MODEL_NEW, HACKS, HONEST, TASK, task

pytestmark = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap is not installed")

TRANSPOSE_TASK = """\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.transpose(0, 1).contiguous() * 1.0


def get_inputs():
    return [torch.randn(8, 16)]


def get_init_inputs():
    return []
"""

TRANSPOSE_NEW = """\
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x.{body}
"""
CORRECT = TRANSPOSE_NEW.format(body="transpose(0, 1).contiguous()")
WRONG = TRANSPOSE_NEW.format(body="reshape(x.shape[1], x.shape[0]).contiguous()")

CFG = TrainerConfig(tool_timeout_s=120, tool_output_chars=2000, file_bytes=4096)


def call(box: Toolbox, name: str, **arguments) -> ToolResult:
    result = box.call(name, json.dumps(arguments))
    assert result.error in ("", *TOOL_ERRORS)
    return result


@pytest.fixture(scope="module")
def box(tmp_path_factory) -> Toolbox:
    """One workdir for the tool tests; each test uses its own file names."""
    return Toolbox(materialise(task(), tmp_path_factory.mktemp("env") / "wd"), CFG)


@pytest.fixture(scope="module")
def transpose_box(tmp_path_factory) -> Toolbox:
    transpose = Task(ops=["torch.transpose"], data_source="torch#1", code=TRANSPOSE_TASK)
    return Toolbox(materialise(transpose, tmp_path_factory.mktemp("env") / "wd"), CFG)


# ------------------------------------------------------------------------------- workdir


def test_materialise_lays_out_the_task_and_protects_it(tmp_path):
    wd = materialise(task(), tmp_path / "wd")
    assert (wd.path / MODEL).read_text() == TASK
    assert wd.task_id == task().id
    assert (wd.path / "kernels").is_dir() and not any((wd.path / "kernels").iterdir())
    guide = (wd.path / INSTRUCTIONS).read_text()
    for needed in ("solution_ext", "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)", "model_new.py"):
        assert needed in guide
    for command in COMMANDS:
        script = wd.path / script_name(command)
        assert os.access(script, os.X_OK) and f"trainer.commands {command}" in script.read_text()
    assert set(wd.protected) == {MODEL, INSTRUCTIONS, *(script_name(c) for c in COMMANDS)}
    assert protected_changes(wd) == []
    with pytest.raises(FileExistsError):
        materialise(task(), wd.path)


def test_protected_changes_name_modified_and_deleted_files(tmp_path):
    wd = materialise(task(), tmp_path / "wd")
    (wd.path / MODEL).write_text(TASK.replace("* self.scale", "* 0"))
    (wd.path / script_name("verify")).unlink()
    (wd.path / INSTRUCTIONS).unlink()
    (wd.path / INSTRUCTIONS).symlink_to(tmp_path / "elsewhere.md")
    assert protected_changes(wd) == [INSTRUCTIONS, MODEL, script_name("verify")]


def test_collect_solution(tmp_path):
    wd = materialise(task(), tmp_path / "wd")
    assert collect_solution(wd) is None
    for rel, text in HONEST.files().items():
        (wd.path / rel).write_text(text)
    got = collect_solution(wd)
    assert isinstance(got, Solution) and got.files() == HONEST.files()
    secret = tmp_path / "secret.cpp"
    secret.write_text("// host file")
    (wd.path / "kernels" / "leak.cpp").symlink_to(secret)
    assert collect_solution(wd) is None, "a link out of the workdir must not be read"
    (wd.path / "kernels" / "leak.cpp").unlink()
    (wd.path / "model_new.py").write_bytes(b"\xff\xfe not text")
    assert collect_solution(wd) is None


# ------------------------------------------------------------------------------ tools


def test_schemas_are_chat_completions_tools(box):
    schemas = box.schemas()
    names = [s["function"]["name"] for s in schemas]
    assert names == ["bash", "read", "write", "edit", "multi_edit", "glob", "grep"]
    for schema in schemas:
        assert schema["type"] == "function"
        params = schema["function"]["parameters"]
        assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])
    json.dumps(schemas)


@pytest.mark.parametrize(
    ("name", "arguments", "error", "says"),
    [
        ("python", "{}", "unknown_tool", "bash, read, write"),
        ("read", '{"path": "model.py"', "bad_arguments", "not valid JSON"),
        ("read", '["model.py"]', "bad_arguments", "JSON object"),
        ("read", "{}", "bad_arguments", "missing path"),
        ("read", '{"path": "model.py", "offset": "2"}', "bad_arguments", "offset"),
        ("read", '{"path": "model.py", "limit": true}', "bad_arguments", "limit"),
        ("read", '{"path": "model.py", "offset": 0}', "bad_arguments", "at least 1"),
        ("read", '{"path": "model.py", "lines": 3}', "bad_arguments", "unknown argument"),
        ("multi_edit", '{"path": "a", "edits": []}', "bad_arguments", "empty"),
        ("multi_edit", '{"path": "a", "edits": [{"old_string": "x"}]}', "bad_arguments", "new_"),
        ("grep", '{"pattern": "("}', "bad_arguments", "regular expression"),
    ],
)
def test_malformed_calls_are_answered_not_raised(box, name, arguments, error, says):
    result = box.call(name, arguments)
    assert result.error == error and says in result.output


def test_read_numbers_lines_and_pages(box):
    whole = call(box, "read", path="model.py")
    assert whole.error == "" and "     1\timport torch" in whole.output
    page = call(box, "read", path="model.py", offset=5, limit=2)
    assert page.output.splitlines()[0].startswith("     5\t")
    assert page.output.splitlines()[-1] == f"[lines 5-6 of {len(TASK.splitlines())}]"
    assert call(box, "read", path="nope.py").error == "not_found"
    assert call(box, "read", path="kernels").error == "bad_arguments"
    os.mkfifo(box.workdir.path / "fifo")
    assert call(box, "read", path="fifo").error == "bad_arguments", "a FIFO would block"
    assert call(box, "write", path="fifo", content="x").error == "bad_arguments"
    with open(box.workdir.path / "sparse.bin", "wb") as fh:
        fh.truncate(READ_BYTES + 1)
    assert call(box, "read", path="sparse.bin").error == "too_large"
    assert box.call("read", '{"path": "\\ud800"}').error == "bad_arguments"


def test_write_creates_files_and_refuses_protected_and_large(box):
    made = call(box, "write", path="notes/sub/a.cu", content="// a\n")
    assert made.error == "" and (box.workdir.path / "notes/sub/a.cu").read_text() == "// a\n"
    assert "overwrote" in call(box, "write", path="notes/sub/a.cu", content="// b\n").output
    for protected in ("model.py", "./kernels/../model.py", INSTRUCTIONS, "verify.sh"):
        assert call(box, "write", path=protected, content="x").error == "protected_file"
    assert call(box, "edit", path="model.py", old_string="x", new_string="y").error == (
        "protected_file"
    )
    big = call(box, "write", path="big.txt", content="x" * (CFG.file_bytes + 1))
    assert big.error == "too_large" and not (box.workdir.path / "big.txt").exists()
    assert protected_changes(box.workdir) == []


def test_paths_cannot_leave_the_workdir(box, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("host secret")
    root = box.workdir.path
    (root / "out_link").symlink_to(outside)
    (root / "model_link.py").symlink_to(root / MODEL)
    for path in ("../x", "kernels/../../x", "/etc/passwd", str(outside / "secret.txt")):
        assert call(box, "read", path=path).error == "path_outside_workdir", path
    assert call(box, "read", path="out_link/secret.txt").error == "path_outside_workdir"
    escape = call(box, "write", path="out_link/new.txt", content="x")
    assert escape.error == "path_outside_workdir" and not (outside / "new.txt").exists()
    assert call(box, "write", path="model_link.py", content="x").error == "protected_file"
    assert call(box, "write", path=str(root / "abs.txt"), content="ok").error == ""
    assert call(box, "glob", pattern="../*").error == "path_outside_workdir"
    assert call(box, "glob", pattern="out_link/*").output.startswith("no paths match")
    assert "host secret" not in call(box, "grep", pattern="secret").output
    assert call(box, "grep", pattern="x", path="/etc").error == "path_outside_workdir"


def test_edit_and_multi_edit(box):
    root = box.workdir.path
    call(box, "write", path="e.py", content="a = 1\nb = 1\nc = 2\n")
    assert call(box, "edit", path="e.py", old_string="c = 2", new_string="c = 3").error == ""
    assert call(box, "edit", path="e.py", old_string="d", new_string="e").error == "edit_no_match"
    ambiguous = call(box, "edit", path="e.py", old_string="= 1", new_string="= 5")
    assert ambiguous.error == "edit_ambiguous" and "2 times" in ambiguous.output
    both = call(box, "edit", path="e.py", old_string="= 1", new_string="= 5", replace_all=True)
    assert both.error == "" and (root / "e.py").read_text() == "a = 5\nb = 5\nc = 3\n"
    assert call(box, "edit", path="absent.py", old_string="a", new_string="b").error == (
        "not_found"
    )
    failing = [
        {"old_string": "a = 5", "new_string": "a = 6"},
        {"old_string": "zzz", "new_string": "y"},
    ]
    failed = call(box, "multi_edit", path="e.py", edits=failing)
    assert failed.error == "edit_no_match" and "edit 2 of 2" in failed.output
    assert (root / "e.py").read_text() == "a = 5\nb = 5\nc = 3\n", "all or nothing"
    edits = [
        {"old_string": "a = 5", "new_string": "a = 6"},
        {"old_string": "a = 6\nb", "new_string": "a = 7\nb"},
    ]
    assert call(box, "multi_edit", path="e.py", edits=edits).error == ""
    assert (root / "e.py").read_text() == "a = 7\nb = 5\nc = 3\n"


def test_glob_and_grep(box):
    call(box, "write", path="notes/g/k.cu", content="__global__ void k() {}\n// k<<<1, 1>>>\n")
    listed = call(box, "glob", pattern="**/*.cu").output.splitlines()
    assert "notes/g/k.cu" in listed
    assert "kernels/" in call(box, "glob", pattern="*").output.splitlines()
    hits = call(box, "grep", pattern=r"__global__\s+void", glob="*.cu")
    assert hits.output.splitlines() == ["notes/g/k.cu:1:__global__ void k() {}"]
    assert call(box, "grep", pattern="relu", path="model.py").output.startswith("model.py:")
    assert call(box, "grep", pattern="q", path="missing").error == "not_found"
    assert call(box, "grep", pattern="no-such-text-anywhere").output.startswith("no matches")


def test_grep_with_a_runaway_pattern_times_out(box):
    """Catastrophic backtracking cannot stall the episode: the search runs in a child that
    is killed at the tool deadline."""
    call(box, "write", path="runaway.txt", content="a" * 40 + "!\n")
    quick = Toolbox(box.workdir, TrainerConfig(tool_timeout_s=2))
    start = time.monotonic()
    result = call(quick, "grep", pattern=r"(a+)+$", path="runaway.txt")
    assert result.error == "timeout" and "simplify the pattern" in result.output
    assert time.monotonic() - start < 15
    found = call(quick, "grep", pattern=r"a+!", path="runaway.txt")
    assert found.output.startswith("runaway.txt:1:")


def test_truncate_middle_keeps_head_and_tail():
    text = "H" * 500 + "M" * 5000 + "T" * 500
    short = truncate_middle(text, 1000)
    assert len(short) <= 1000 and short.startswith("H" * 400) and short.endswith("T" * 400)
    marker = re.search(r"\n\[\.\.\. (\d+) characters dropped \.\.\.\]\n", short)
    assert int(marker.group(1)) == len(text) - (len(short) - len(marker.group(0)))
    assert truncate_middle("small", 1000) == "small"


# ------------------------------------------------------------------------------- bash


def test_bash_runs_in_the_workdir(box):
    result = call(box, "bash", command="pwd && ls")
    assert result.error == "" and result.output.splitlines()[0] == str(box.workdir.path)
    failed = call(box, "bash", command="echo before; exit 3")
    assert failed.error == "nonzero_exit" and failed.output == "before\n\n[exit code 3]"
    blocked = call(box, "bash", command="echo hacked > model.py; rm -f verify.sh")
    assert blocked.error == "nonzero_exit" and "Read-only" in blocked.output
    assert protected_changes(box.workdir) == []
    assert call(box, "bash", command=f"test ! -e {PACKAGE_ROOT}/pyproject.toml").error == ""
    limit = call(box, "bash", command="ulimit -Hf; ulimit -f unlimited")
    assert limit.output.startswith(f"{bash_sandbox.FILE_BYTES >> 10}\n")
    assert limit.error == "nonzero_exit", "the file size limit cannot be raised"


def test_bash_imports_from_the_trainers_python_path(box, monkeypatch):
    """A dependency found through the trainer's PYTHONPATH is importable in the shell, read-only;
    the project root on it stays unbound."""
    tmp_path = Path(tempfile.mkdtemp(prefix="opsynth-deps-"))  # readable by the sandbox uid
    tmp_path.chmod(0o755)
    (tmp_path / "extra_dependency.py").write_text("ANSWER = 42\n")
    (tmp_path / "extra_dependency.py").chmod(0o644)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), PACKAGE_ROOT]))
    found = call(box, "bash", command="python -c 'import extra_dependency as e; print(e.ANSWER)'")
    assert found.error == "" and found.output.strip() == "42", found.output
    blocked = call(box, "bash", command=f"touch {tmp_path}/x")
    assert blocked.error == "nonzero_exit" and "Read-only" in blocked.output
    assert call(box, "bash", command=f"test ! -e {PACKAGE_ROOT}/pyproject.toml").error == ""
    shutil.rmtree(tmp_path)


def test_bash_truncates_big_output(box):
    result = call(box, "bash", command="head -c 1000000 /dev/zero | tr '\\0' x; echo; echo END")
    assert result.error == "" and len(result.output) <= CFG.tool_output_chars
    assert result.output.startswith("xxx") and result.output.rstrip().endswith("END")
    dropped = int(result.output.split("[... ")[1].split(" ")[0])
    assert dropped > 1_000_000 - CFG.tool_output_chars


def test_bash_has_no_network_and_no_secrets(box, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-leak")
    env = call(box, "bash", command="env")
    assert "sk-must-not-leak" not in env.output and "OPENAI_API_KEY" not in env.output
    connect = (
        "import socket; s = socket.socket(); s.settimeout(3); "
        "s.connect(('1.1.1.1', 53)); print('connected')"
    )
    net = call(box, "bash", command=f'python -c "{connect}"')
    assert net.error == "nonzero_exit" and "connected" not in net.output
    assert "OSError" in net.output or "unreachable" in net.output


def test_bash_runs_unprivileged_under_the_seccomp_filter(box):
    """The agent's shell gets what a candidate gets: a host uid that is not root (when the
    trainer is root: the configured sandbox uid), no capabilities, the filter, and a workdir
    it can write."""
    probe = (
        "id -u; grep -E '^(CapEff|Seccomp|NoNewPrivs):' /proc/self/status; "
        "cat /proc/self/uid_map; unshare -U true && echo UNSHARED; "
        "v=$(cat /proc/sys/vm/swappiness); (echo $v > /proc/sys/vm/swappiness) 2>/dev/null "
        "&& echo SYSCTL_WRITTEN; touch made_here && echo WROTE"
    )
    result = call(box, "bash", command=probe)
    lines = result.output.split()
    uid = int(lines[0])
    status = dict(zip(lines[1:7:2], lines[2:7:2], strict=True))
    inside, outside = int(lines[7]), int(lines[8])
    assert outside + uid - inside != 0
    if os.geteuid() == 0:
        assert uid == bash_sandbox.SANDBOX_UID and outside == inside == 0
    assert int(status["CapEff:"], 16) == 0
    assert status["Seccomp:"] == "2" and status["NoNewPrivs:"] == "1"
    assert "UNSHARED" not in lines and "SYSCTL_WRITTEN" not in lines and "WROTE" in lines


def test_bash_timeout_kills_everything(box):
    quick = Toolbox(box.workdir, TrainerConfig(tool_timeout_s=1))
    start = time.monotonic()
    result = call(quick, "bash", command="echo started; sleep 60 & sleep 60")
    assert result.error == "timeout" and result.output.startswith("started")
    assert "timed out after 1 s" in result.output
    assert time.monotonic() - start < 10
    background = call(quick, "bash", command="sleep 60 & echo detached")
    assert background.error == "" and background.output.strip() == "detached"


def test_bash_refuses_to_run_without_bwrap(box, monkeypatch, tmp_path):
    monkeypatch.setattr(bash_sandbox, "_probed", False)
    monkeypatch.setenv("PATH", str(tmp_path))
    result = call(box, "bash", command=f"touch {box.workdir.path}/ran")
    assert result.error == "sandbox_unavailable"
    assert not (box.workdir.path / "ran").exists()


# --------------------------------------------------------------------------- commands


def test_commands_report_static_rejections_without_torch(box):
    hack = HACKS["try_except"][0].model_new
    assert call(box, "write", path="model_new.py", content=hack).error == ""
    result = call(box, "bash", command="python -m opsynth.trainer.commands verify")
    assert result.error == "nonzero_exit" and "hack_try_except" in result.output


def test_verify_blocks_torch_compute(box):
    call(box, "write", path="model_new.py", content=HACKS["torch_ops"][0].model_new)
    result = call(box, "bash", command="./verify.sh")
    assert result.error == "nonzero_exit", result.output
    assert "build: ok" in result.output and "torch_compute" in result.output


def test_verify_and_profile_a_correct_solution(transpose_box):
    assert call(transpose_box, "write", path="model_new.py", content=CORRECT).error == ""
    verify = call(transpose_box, "bash", command="python -m opsynth.trainer.commands verify")
    assert verify.error == "", verify.output
    assert "correctness: ok on cpu" in verify.output
    profile = call(transpose_box, "bash", command="./profile.sh")
    assert profile.error == "", profile.output
    assert "timing: skipped" in profile.output and "reward 1" in profile.output


def test_verify_rejects_a_wrong_solution(transpose_box):
    call(transpose_box, "write", path="model_new.py", content=WRONG)
    result = call(transpose_box, "bash", command="python -m opsynth.trainer.commands verify")
    assert result.error == "nonzero_exit" and "correctness: FAILED (incorrect)" in result.output


def test_compile_prints_the_import_traceback(transpose_box):
    call(transpose_box, "write", path="model_new.py", content=EXTENSION_MODEL_NEW)
    result = call(transpose_box, "bash", command="./compile.sh")
    assert result.error == "nonzero_exit" and "solution_import_error" in result.output
    assert "No module named 'solution_ext'" in result.output and "Traceback" in result.output


@pytest.mark.parametrize(
    ("eager", "compiled", "mine", "expected"),
    [(2.0, 1.0, 0.5, 3), (1.0, 0.5, 0.9, 2), (1.0, 1.0, 0.97, 1), (1.0, 2.0, 1.5, 1)],
)
def test_profile_report_states_the_reward(eager, compiled, mine, expected):
    measures = {
        "timed": True,
        "device_name": "GPU",
        "timed_runs": 50,
        "eager_ms": eager,
        "compile_ms": compiled,
        "solution_ms": mine,
    }
    report = REPORTS["timing"](measures, "cuda", EvalConfig())
    assert f"reward this would earn: {expected} " in report
    assert f"{eager / mine:.3f}x vs eager" in report
