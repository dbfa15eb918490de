"""Static guards on a solution's sources, before anything of it runs.

The runtime guards in ``evaluator.harness`` catch what executes; these catch the known reward
hacks by their shape, which is cheaper and explains itself: a ``try``/``except`` that falls
back to PyTorch when the kernel fails, a ``ModelNew`` that inherits ``Model``'s forward, work
on side streams or threads that the timer's stream never waits for, patching torch (timing
functions included), tensor subclasses that defer computation until a comparison, and CUDA
kernels that are defined but never launched (a decoy next to a PyTorch fallback). On top, the
filters' own static check runs with the solution's allow-list: no ``os``/``sys``/``ctypes``
/``open``/introspection, and ``torch.utils.cpp_extension.load_inline`` as the one permitted
native-code entry point.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable

from opsynth.filters.static_check import check_source
from opsynth.source import dotted_name, import_aliases
from opsynth.stage import KEEP, Decision, drop

EXTENSION_MODULE = "solution_ext"
PERMITTED = frozenset({"torch.utils.cpp_extension.load_inline"})

REASONS: dict[str, str] = {
    "hack_try_except": "ModelNew's module catches exceptions (a fallback to PyTorch)",
    "hack_subclass_model": "a class inherits the task's Model (and so its forward)",
    "hack_stream": "work on another CUDA stream, which the timed stream does not wait for",
    "hack_thread": "threads started from the solution, which the timer does not wait for",
    "hack_patch": "assigns to an attribute of torch (timing functions, ops)",
    "hack_tensor_subclass": "a tensor subclass or __torch_function__/__torch_dispatch__ hook",
    "hack_decoy_kernel": "a __global__ kernel that is never launched",
    "hack_indirect_name": "kernel sources build or look up names the guards cannot read "
    "(## token pasting, dlopen/dlsym)",
    "hack_torch_compiler": "hands PyTorch code to one of torch's compilers (torch.jit, "
    "torch.compile, torch.fx, ...), whose ops run where the runtime guard does not see them",
}

STREAM_NAMES = ("torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.set_stream")
# TorchScript, Dynamo/Inductor and FX run the ops they were given from C++ or generated code,
# never through the torch function mode that counts a solution's PyTorch compute.
TORCH_COMPILERS = (
    "torch.jit",
    "torch.compile",
    "torch._dynamo",
    "torch._inductor",
    "torch.fx",
    "torch.export",
    "torch._export",
    "torch._higher_order_ops",
)
STREAM_CPP = re.compile(r"\b(cudaStreamCreate\w*|getStreamFromPool|setCurrentCUDAStream)\b")
THREAD_CPP = re.compile(r"\bstd::(thread|async)\b|\bpthread_create\b")
# Names assembled by the preprocessor (``CAT(cudaStream, Create)``) or looked up at run time
# would get past the patterns above, which read the source text.
INDIRECT_CPP = re.compile(r"##|\b(dlopen|dlsym|dlvsym)\s*\(")
GLOBAL_KERNEL = re.compile(r"__global__\s+(?:[\w:<>,\s\*&]+?\s+)?(\w+)\s*\(")


def check_solution(model_new: str, kernel_sources: Iterable[str] = ()) -> Decision:
    """KEEP, or the first hack or forbidden construct found, with its line."""
    base = check_source(
        model_new,
        required=("ModelNew",),
        extra_modules=frozenset({EXTENSION_MODULE}),
        permitted=PERMITTED,
    )
    if not base.keep:
        return base
    tree = ast.parse(model_new)
    problem = _python_hack(tree)
    if problem is not None:
        return problem
    sources = list(kernel_sources) + _inline_sources(tree)
    return _kernel_hack(sources) or KEEP


def _python_hack(tree: ast.Module) -> Decision | None:
    aliases = import_aliases(tree)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", "?")
        if isinstance(node, ast.Try | ast.TryStar):
            return drop("hack_try_except", f"line {line}: try/except")
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                name = dotted_name(base, aliases) or getattr(base, "id", "")
                if name == "Model" or name.endswith(".Model"):
                    return drop("hack_subclass_model", f"line {line}: class {node.name}({name})")
                if name in ("torch.Tensor", "Tensor"):
                    return drop("hack_tensor_subclass", f"line {line}: class {node.name}({name})")
            hooks = {"__torch_function__", "__torch_dispatch__"}
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name in hooks:
                    return drop("hack_tensor_subclass", f"line {item.lineno}: {item.name}")
        if isinstance(node, ast.Attribute | ast.Name):
            dotted = dotted_name(node, aliases)
            if any(dotted == s or dotted.startswith(s + ".") for s in STREAM_NAMES):
                return drop("hack_stream", f"line {line}: {dotted}")
            if any(dotted == s or dotted.startswith(s + ".") for s in TORCH_COMPILERS):
                return drop("hack_torch_compiler", f"line {line}: {dotted}")
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute):
                    dotted = dotted_name(target, aliases)
                    if dotted.split(".")[0] == "torch":
                        return drop("hack_patch", f"line {line}: assigns {dotted}")
    return None


def _inline_sources(tree: ast.Module) -> list[str]:
    """String constants in the module: load_inline's sources are usually module-level strings
    or literals in the call."""
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "{" in node.value
    ]


def _kernel_hack(sources: list[str]) -> Decision | None:
    text = "\n".join(sources)
    found = INDIRECT_CPP.search(text)
    if found:
        return drop("hack_indirect_name", f"kernel sources use {found.group(0).strip('( ')}")
    found = STREAM_CPP.search(text)
    if found:
        return drop("hack_stream", f"kernel sources call {found.group(1)}")
    found = THREAD_CPP.search(text)
    if found:
        return drop("hack_thread", f"kernel sources start threads ({found.group(0)})")
    for kernel in GLOBAL_KERNEL.findall(text):
        name = re.escape(kernel)
        launched = re.search(rf"\b{name}\s*<<<", text) or re.search(
            rf"cudaLaunch\w*\s*\([^;]*\b{name}\b", text
        )
        if not launched:
            return drop("hack_decoy_kernel", f"__global__ {kernel} is never launched")
    return None
