"""A tiny, randomly initialised chat model built offline, for smoke tests of the trainers.

Real checkpoints are gigabytes and need the network; the SFT and GRPO code paths (chat
template, tool calls, assistant masks, generation, reward, optimiser step, saving) are the
same for a 50k-parameter model whose tokenizer is trained in-process on a few lines of text.
Its outputs are noise, so it proves wiring, never learning.
"""

from __future__ import annotations

from pathlib import Path

IM_START, IM_END, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"

# ChatML with tool calls, as Qwen2.5/Qwen3 render them, and {% generation %} markers around what
# the assistant writes, so SFT can mask everything else out of the loss.
CHAT_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}"
    "{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}"
    "{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}{{- message.content or '' }}"
    "{%- for call in message.tool_calls or [] %}"
    "{%- set fn = call.function if call.function is defined else call %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + fn.name + \'", "arguments": \' }}'
    "{%- if fn.arguments is string %}{{- fn.arguments }}{%- else %}"
    "{{- fn.arguments | tojson }}{%- endif %}{{- '}\\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>' }}{%- endgeneration %}{{- '\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content "
    "+ '\\n</tool_response><|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

CORPUS = [
    "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, x):",
    "from torch.utils.cpp_extension import load_inline\nsource = '''torch::Tensor f();'''",
    "__global__ void kernel(const float* x, float* y, int n) { int i = blockIdx.x; }",
    '<tool_call>\n{"name": "bash", "arguments": {"command": "nvcc -O3 kernel.cu"}}\n</tool_call>',
    "```python\ndef get_inputs():\n    return [torch.randn(16, 32)]\n```",
    "The kernel is correct and 1.5x faster than eager; reward 2. Done.",
]


def build_tokenizer(vocab_size: int = 400):
    """A byte-level BPE tokenizer (any text encodes, nothing is unknown) with ChatML tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(CORPUS * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=IM_END, pad_token=PAD, bos_token=None
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(out: Path, *, hidden: int = 32, layers: int = 2, seed: int = 0) -> Path:
    """Save a tokenizer and a random Qwen2-architecture causal LM under ``out``; loadable by
    path wherever a Hub id is accepted."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    eos, pad = tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(PAD)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
