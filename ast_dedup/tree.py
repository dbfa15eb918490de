"""Hash-consed AST structure: the only view of a program that the similarity metric needs.

``PythonASTSimilarity`` compares nodes by their Python type and by the AST nodes among their
children (``ast.iter_child_nodes``); identifiers, attribute names and constants never enter it.
So a tree is fully described by ``(type name, child trees)``. Interning every distinct such
tree to one integer makes identical subtrees (``return x``, ``super().__init__()``...) share
one id, which lets the metric answer ``compare(a, a)`` from the subtree size and memoise every
other pair once for a whole batch.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator


class Interner:
    """A table of distinct structural trees; ids are dense, children always precede parents."""

    def __init__(self) -> None:
        self.label_ids: dict[str, int] = {}
        self.label_names: list[str] = []
        self.labels: list[int] = []
        self.children: list[tuple[int, ...]] = []
        self.sizes: list[int] = []
        self._ids: dict[tuple[int, tuple[int, ...]], int] = {}
        self._specs: dict[type, tuple[int, tuple[str, ...]]] = {}

    def __len__(self) -> int:
        return len(self.labels)

    def label_id(self, name: str) -> int:
        label = self.label_ids.get(name)
        if label is None:
            label = len(self.label_names)
            self.label_ids[name] = label
            self.label_names.append(name)
        return label

    def node(self, label: int, children: tuple[int, ...]) -> int:
        """The id of the tree ``label(children...)``, creating it if it is new."""
        key = (label, children)
        tid = self._ids.get(key)
        return tid if tid is not None else self._new(key)

    def add_ast(self, root: ast.AST) -> int:
        """Intern a Python AST; its children are exactly ``ast.iter_child_nodes``."""
        try:
            return self._add(root)
        except RecursionError:  # absurdly deep expressions; rare, so the slow path is fine
            return self._add_iterative(root)

    def _spec(self, cls: type) -> tuple[int, tuple[str, ...]]:
        spec = self._specs.get(cls)
        if spec is None:
            spec = (self.label_id(cls.__name__), cls._fields)
            self._specs[cls] = spec
        return spec

    def _add(self, node: ast.AST) -> int:
        label, fields = self._specs.get(type(node)) or self._spec(type(node))
        kids = []
        for name in fields:
            value = getattr(node, name, None)
            if isinstance(value, ast.AST):
                kids.append(self._add(value))
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        kids.append(self._add(item))
        key = (label, tuple(kids))
        tid = self._ids.get(key)
        if tid is None:
            tid = self._new(key)
        return tid

    def _new(self, key: tuple[int, tuple[int, ...]]) -> int:
        tid = len(self.labels)
        self._ids[key] = tid
        self.labels.append(key[0])
        self.children.append(key[1])
        sizes = self.sizes
        self.sizes.append(1 + sum(sizes[c] for c in key[1]))
        return tid

    def _add_iterative(self, root: ast.AST) -> int:
        stack: list[tuple[ast.AST, int]] = [(root, -1)]
        done: list[int] = []
        while stack:
            node, count = stack.pop()
            if count < 0:
                children = list(ast.iter_child_nodes(node))
                stack.append((node, len(children)))
                stack.extend((child, -1) for child in reversed(children))
                continue
            kids = tuple(done[len(done) - count :]) if count else ()
            if count:
                del done[len(done) - count :]
            done.append(self.node(self._spec(type(node))[0], kids))
        return done[0]

    def walk(self, tid: int) -> Iterator[int]:
        """Breadth-first, the order of ``ast.walk``."""
        queue = deque([tid])
        while queue:
            node = queue.popleft()
            yield node
            queue.extend(self.children[node])

    def export(self, roots: list[int]) -> tuple[list[str], list[list[int]], list[int]]:
        """The subtable reachable from ``roots``: (label names, [label, *children] rows, roots),
        renumbered densely with children first, so it can be stored and re-interned."""
        order: list[int] = []
        seen: dict[int, int] = {}
        for root in roots:
            stack = [(root, False)]
            while stack:
                tid, expanded = stack.pop()
                if tid in seen:
                    continue
                if expanded:
                    seen[tid] = len(order)
                    order.append(tid)
                    continue
                stack.append((tid, True))
                stack.extend((c, False) for c in reversed(self.children[tid]) if c not in seen)
        used_labels = sorted({self.labels[t] for t in order}, key=lambda x: self.label_names[x])
        label_pos = {label: i for i, label in enumerate(used_labels)}
        rows = [[label_pos[self.labels[t]], *(seen[c] for c in self.children[t])] for t in order]
        return [self.label_names[x] for x in used_labels], rows, [seen[r] for r in roots]

    def load(self, label_names: list[str], rows: list[list[int]], roots: list[int]) -> list[int]:
        """Re-intern an exported subtable; returns the ids of its roots in this table."""
        local_labels = [self.label_id(name) for name in label_names]
        ids: list[int] = []
        for row in rows:
            ids.append(self.node(local_labels[row[0]], tuple(ids[c] for c in row[1:])))
        return [ids[r] for r in roots]
