"""One agent episode on a GPU: a scripted agent writes a CUDA kernel, builds it with nvcc in the
sandboxed bash tool (``python -m opsynth.trainer.commands compile``, the bubblewrap sandbox with the
unprivileged uid and seccomp filter), and the evaluator's judged pool scores it."""

from __future__ import annotations

import os

import openai
import pytest
import torch
from chatserver import Call, ChatServer, Reply, turn_of
from evaluator_cases import EXTENSION_MODEL_NEW, task

from opsynth.config import EvalConfig, FiltersConfig, TrainerConfig
from opsynth.trainer.agent import run_episode
from opsynth.trainer.rollout import PoolScorer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

KERNEL = """\
#include <torch/extension.h>

__global__ void fused(const float* x, float* out, float scale, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) {
    float v = x[i];
    out[i] = (v > 0.f ? v : 0.f) * scale + v;
  }
}

torch::Tensor forward(torch::Tensor x, double scale) {
  auto input = x.contiguous();
  auto out = torch::empty_like(input);
  int64_t n = input.numel();
  int threads = 256;
  int64_t blocks = (n + threads - 1) / threads;
  fused<<<blocks, threads>>>(input.data_ptr<float>(), out.data_ptr<float>(), (float)scale, n);
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward); }
"""


def kernel_writer(messages: list[dict]) -> Reply:
    turn = turn_of(messages)
    if turn == 0:
        return Reply(
            calls=(
                Call("write", {"path": "kernels/fused.cu", "content": KERNEL}),
                Call("write", {"path": "model_new.py", "content": EXTENSION_MODEL_NEW}),
            )
        )
    if turn == 1:
        command = "id -u && nvcc --version | tail -1 && python -m opsynth.trainer.commands verify"
        return Reply(calls=(Call("bash", {"command": command}),))
    return Reply("The fused kernel is in kernels/fused.cu.")


def test_an_episode_builds_its_kernel_with_nvcc_in_the_sandbox_and_earns_a_reward(tmp_path):
    with (
        ChatServer({"kernel": kernel_writer}) as chat,
        PoolScorer(EvalConfig(), FiltersConfig(workers=1), "cuda") as scorer,
    ):
        client = openai.OpenAI(base_url=chat.url, api_key="EMPTY", max_retries=0)
        episode = run_episode(client, "kernel", task(), tmp_path, TrainerConfig(), scorer)
    bash = [c for s in episode.steps for c in s.tool_calls if c.name == "bash"]
    tools = [m["content"] for m in episode.messages if m["role"] == "tool"]
    print("\n---\n".join(t[-1500:] for t in tools))
    assert episode.end_reason == "finished", episode.end_detail
    observation = tools[-1]
    assert bash and bash[0].error == "", observation
    assert "cuda_" in observation  # nvcc ran in the sandbox
    if os.geteuid() == 0:
        assert "65534" in observation  # not root in there
    assert "build: ok (1 kernel source(s)" in observation and "correctness: ok" in observation
    assert episode.reward >= 1 and episode.score_reason == "ok", episode.score_detail
