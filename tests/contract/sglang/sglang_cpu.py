"""Make SGLang 0.5.23's request path importable on CPU, and give it a model it can load.

- Importing this module installs raygen's CPU torchvision hook in this process
  (serve_apps/engines/sglang_cpu/shims/sitecustomize.py, what CPU engine processes load
  at start-up): PyPI's torchvision is a CUDA build, and its meta registrations need the
  ``nms``/``qnms`` op schemas to exist. Import it before anything imports transformers.
- ``write_fake_model`` writes an offline "Qwen3" model folder with no weights (the fake
  scheduler never loads them): a config, and the tokenizer of raygen's test models
  (simulator id layout, ChatML template), so SGLang's tokenizer and detokenizer produce
  the simulator's ids and text.
"""

from __future__ import annotations

import json
from pathlib import Path

from serve_apps.engines.sglang_cpu import install_torchvision_hook, models
from serve_apps.engines.simulator import tokenizer as sim

install_torchvision_hook()


def write_fake_model(out: Path) -> Path:
    """Write the model folder; its tokenizer's ids equal the simulator tokenizer's."""
    out.mkdir(parents=True, exist_ok=True)
    models.write_tokenizer(out)
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 1024,
              "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
              "tie_word_embeddings": True, "torch_dtype": "bfloat16", "bos_token_id": 0,
              "eos_token_id": sim.EOS_ID, "hidden_act": "silu", "attention_bias": False}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    models.write_generation_config(out)
    return out
