"""Prompt templates shipped with the package, rendered per candidate.

The templates are files (``synth/llm/prompts/*.md``, ``string.Template`` syntax) so a prompt
can be read and reviewed as text; ``TEMPLATE_HASH`` names the template version in each task's
provenance, and the rendered messages are part of every reply's cache key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from importlib import resources
from string import Template

Messages = list[dict[str, str]]


def _template(name: str) -> str:
    return (resources.files("opsynth.synth.llm") / "prompts" / f"{name}.md").read_text(
        encoding="utf-8"
    )


SYSTEM = _template("system")
USER = Template(_template("user"))
TEMPLATE_HASH = hashlib.sha256((SYSTEM + "\0" + USER.template).encode()).hexdigest()[:12]


def render(ops: Sequence[str], seed_codes: Sequence[str]) -> Messages:
    """Chat messages asking for one task fusing ``ops`` (in order), each shown by its seed
    task's code so the model sees the KernelBench format and sensible sizes."""
    shown = dict(zip(ops, seed_codes, strict=True))  # a repeated op is shown once
    examples = "\n\n".join(f"{op}:\n```python\n{code.strip()}\n```" for op, code in shown.items())
    user = USER.substitute(
        k=len(ops),
        ops_inline=" -> ".join(ops),
        ops_json=json.dumps(list(ops)),
        seed_examples=examples,
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
