"""The metric's rules, and its robustness to edits that do not change what a program does."""

from __future__ import annotations

import ast
import json
import textwrap

import pytest

from opsynth.ast_dedup.similarity import Engine, model_class_similarity, python_ast_similarity
from opsynth.ast_dedup.tree import Interner
from opsynth.refdata import KERNELBENCH, shared_file

CONV_RELU_BIAS = textwrap.dedent(
    '''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        """Conv, ReLU, bias."""
        def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
            super(Model, self).__init__()
            self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
            self.bias = nn.Parameter(torch.randn(bias_shape))

        def forward(self, x):
            x = self.conv(x)
            x = torch.relu(x)
            x = x + self.bias
            return x

    batch_size = 128
    in_channels = 3

    def get_inputs():
        return [torch.randn(batch_size, in_channels, 32, 32)]

    def get_init_inputs():
        return [in_channels, 16, 3, (16, 1, 1)]
    '''
)

# Same program: variables renamed, reformatted, comments added, independent __init__
# statements swapped. (Removing the docstring would change the class's child count, which the
# reference metric scores as a mismatch of the whole class.)
CONV_RELU_BIAS_EDITED = textwrap.dedent(
    """
    import torch
    import torch.nn as nn

    # a comment
    class Model(nn.Module):
        "Another docstring."
        def __init__(self, cin, cout, k, bshape):
            super(Model, self).__init__()
            self.b = nn.Parameter(torch.randn(bshape))  # swapped with the next line
            self.c = nn.Conv2d(cin,
                               cout,
                               k)

        def forward(self, inp):
            # forward pass
            inp = self.c(inp)
            inp = torch.relu(inp)
            inp = inp + self.b
            return inp

    N = 64
    C = 3

    def get_inputs():
        return [torch.randn(N, C, 32, 32)]

    def get_init_inputs():
        return [C, 16, 3, (16, 1, 1)]
    """
)

UNRELATED = textwrap.dedent(
    """
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, a, b, c):
            out = []
            for i in range(a.shape[0]):
                if i % 2 == 0:
                    out.append(torch.matmul(a[i], b[i]) * c)
                else:
                    out.append(torch.cumsum(a[i], dim=0))
            return torch.stack([o.sum() for o in out])

    def get_inputs():
        return [torch.randn(4, 8, 8), torch.randn(4, 8, 8), 2.0]

    def get_init_inputs():
        return []
    """
)


def test_hand_computed_example():
    # FunctionDef pair scores 8 (weight 1.2), Return pair 5; weighted sizes 2 * (9 * 1.2 + 6).
    score = python_ast_similarity("def f(x):\n    return x + 1\n", "def g(y):\n    return y * 2\n")
    assert score == round(2 * (8 * 1.2 + 5) / (2 * (9 * 1.2 + 6)), 4) == 0.869


def test_identical_structure_scores_one_and_names_are_ignored():
    assert python_ast_similarity(CONV_RELU_BIAS, CONV_RELU_BIAS) == 1.0
    renamed = CONV_RELU_BIAS.replace("relu", "sigmoid").replace("Conv2d", "Linear")
    assert python_ast_similarity(CONV_RELU_BIAS, renamed) == 1.0


def test_one_significant_subtree_scores_zero_like_the_reference():
    # The reference never fills its weighted sum when a side has <= 1 significant subtree.
    assert python_ast_similarity("import torch\n", "import torch\n") == 0.0
    assert python_ast_similarity("class A:\n    pass\n", "class A:\n    pass\n") == 0.0


def test_unparseable_scores_minus_one_like_the_reference():
    assert python_ast_similarity("def f(:\n", CONV_RELU_BIAS) == -1.0


def test_children_may_be_reordered():
    a = "def f(x):\n    y = x + 1\n    z = x * 2\n    return y\n"
    b = "def f(x):\n    z = x * 2\n    y = x + 1\n    return y\n"
    assert python_ast_similarity(a, b) == 1.0


def test_model_class_robust_to_renames_reformatting_reordering_comments():
    assert model_class_similarity(CONV_RELU_BIAS, CONV_RELU_BIAS_EDITED) > 0.9


def test_unrelated_model_scores_low():
    assert model_class_similarity(CONV_RELU_BIAS, UNRELATED) < 0.5


def test_bad_input_gives_none_not_an_exception():
    assert model_class_similarity("def f(:\n", CONV_RELU_BIAS) is None
    assert model_class_similarity("x = 1\n", CONV_RELU_BIAS) is None


def test_engine_memo_does_not_change_scores():
    fresh = python_ast_similarity(CONV_RELU_BIAS, UNRELATED)
    engine = Engine()
    for _ in range(3):
        assert python_ast_similarity(CONV_RELU_BIAS, UNRELATED, engine) == fresh
    assert python_ast_similarity(UNRELATED, CONV_RELU_BIAS, engine) == fresh


def test_interner_shares_identical_subtrees_and_survives_deep_nesting():
    trees = Interner()
    a = trees.add_ast(ast.parse("return_value = x + 1"))
    b = trees.add_ast(ast.parse("other = y + 1"))
    assert a == b  # names are not structure
    deep = ast.parse("x = " + " + ".join(["a"] * 900))
    root = trees.add_ast(deep)
    assert trees.sizes[root] == sum(1 for _ in ast.walk(deep))
    labels, rows, roots = trees.export([root])
    again = Interner()
    assert again.sizes[again.load(labels, rows, roots)[0]] == trees.sizes[root]


@pytest.mark.parametrize("level", [1, 2, 3])
def test_kernelbench_problems_survive_edits(level):
    path = shared_file(KERNELBENCH)
    if path is None:
        pytest.skip("KernelBench jsonl not found")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["level"] == level][:10]
    for row in rows:
        tree = ast.parse(row["code"])
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                node.id += "_renamed"
            elif isinstance(node, ast.arg):
                node.arg += "_renamed"
        edited = "# edited\n" + ast.unparse(tree)  # renamed, reformatted, comments dropped
        assert model_class_similarity(row["code"], edited) > 0.9, row["name"]
