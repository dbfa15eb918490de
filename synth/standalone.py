"""A transformers seed as a task of its own, with a batch the sizing stage can scale.

Seeds are validated at small shapes (a batch of 2, a few tokens), which a GPU runs in
microseconds: passed through as they are, every one would be ``too_fast``. Sizing scales a
module-level ``batch_size`` (``filters.sizing``), so the seed's input shapes are rewritten to
take their leading dim from one: ``x_shape = (2, 16, 32)`` becomes ``batch_size = 2`` and
``x_shape = (batch_size, 16, 32)``. Only when every shape literal (``<name>_shape`` and each
shape of ``<name>_shapes``) leads with the same dim, which is how the catalogue writes a batch;
otherwise, or when the module already names a ``batch_size``, the code is left as it is.
Plain functions on source text.
"""

from __future__ import annotations

import ast

BATCH_NAME = "batch_size"


def with_batch_knob(code: str) -> str:
    """``code`` with its common leading input dim as a ``batch_size`` constant (see above)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    leads: list[ast.Constant] = []
    first_line = 0
    for node in tree.body:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        if not isinstance(target, ast.Name):
            continue
        if target.id == BATCH_NAME:
            return code
        shapes = _shape_literals(target.id, node.value)
        if shapes is None:
            continue
        for shape in shapes:
            leads.append(shape.elts[0])  # type: ignore[arg-type]
        first_line = first_line or node.lineno
    values = {lead.value for lead in leads}
    if not leads or len(values) != 1:
        return code
    (batch,) = values
    lines = code.splitlines(keepends=True)
    # right to left within a line, so earlier offsets stay valid
    for lead in sorted(leads, key=lambda c: (c.lineno, c.col_offset), reverse=True):
        raw = lines[lead.lineno - 1].encode()
        start, end = lead.col_offset, lead.end_col_offset or lead.col_offset
        lines[lead.lineno - 1] = (raw[:start] + BATCH_NAME.encode() + raw[end:]).decode()
    lines.insert(first_line - 1, f"{BATCH_NAME} = {batch}\n")
    return "".join(lines)


def _shape_literals(name: str, value: ast.expr) -> list[ast.Tuple] | None:
    """The shape tuples assigned to ``<name>_shape`` (one) or ``<name>_shapes`` (a list of
    them), each of at least two positive int literals on one line; None for anything else."""
    if name.endswith("_shape"):
        found = [value]
    elif name.endswith("_shapes") and isinstance(value, ast.List | ast.Tuple):
        found = list(value.elts)
    else:
        return None
    shapes = []
    for shape in found:
        if not (isinstance(shape, ast.Tuple) and len(shape.elts) >= 2):
            return None
        lead = shape.elts[0]
        if not all(
            isinstance(e, ast.Constant) and type(e.value) is int and e.value > 0 for e in shape.elts
        ):
            return None
        if lead.lineno != lead.end_lineno:
            return None
        shapes.append(shape)
    return shapes or None
