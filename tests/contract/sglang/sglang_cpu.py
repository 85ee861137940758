"""Make SGLang 0.5.23's request path importable on CPU, and give it a model it can load.

- Importing this module defines the two ``torchvision`` op schemas (nms, qnms) that
  PyPI's CUDA torchvision would register from its ``_C`` extension, which cannot load
  with CPU torch; torchvision's own meta registrations need them to exist. Import it
  before anything imports sglang's scheduler-side modules.
- ``write_fake_model`` writes an offline "Qwen3" model folder (config, generation config,
  a fast tokenizer with the simulator's exact id layout and a ChatML template), so
  SGLang's tokenizer and detokenizer produce the simulator's ids and text.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from serve_apps.engines.simulator import tokenizer as sim


def _define_torchvision_ops() -> None:
    try:
        torch.ops.torchvision.nms  # noqa: B018  (already defined: a CPU torchvision)
        return
    except (AttributeError, RuntimeError):
        pass
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _KEEP.append(lib)  # the definitions live as long as the Library object


_KEEP: list = []
_define_torchvision_ops()

# generation_config / chat template of the fake model (Qwen3-style, thinking on by default).
CHAT_TEMPLATE = (
    "{%- for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{%- endfor %}"
    "{%- if add_generation_prompt %}{{'<|im_start|>assistant\\n'}}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{'<think>\\n\\n</think>\\n\\n'}}{%- endif %}{%- endif %}")


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map (what a ByteLevel BPE vocabulary is keyed by)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
                 + list(range(ord("\xae"), ord("\xff") + 1)))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def write_fake_model(out: Path) -> Path:
    """Write the model folder; its tokenizer's ids equal the simulator tokenizer's."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    alphabet = _byte_alphabet()
    vocab = {s: i for i, s in enumerate(sim.SPECIAL_TOKENS)}
    vocab.update({alphabet[b]: sim.BYTE_BASE + b for b in range(256)})
    vocab.update({"".join(alphabet[x] for x in (" " + w).encode()): sim.WORD_BASE + j
                  for j, w in enumerate(sim.WORDS)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    control = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}  # skipped by skip_special_tokens
    tok.add_tokens([AddedToken(s, special=s in control, normalized=False)
                    for s in sim.SPECIAL_TOKENS])
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                            pad_token="<|endoftext|>",
                            chat_template=CHAT_TEMPLATE).save_pretrained(str(out))
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 1024,
              "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
              "tie_word_embeddings": True, "torch_dtype": "bfloat16", "bos_token_id": 0,
              "eos_token_id": sim.EOS_ID, "hidden_act": "silu", "attention_bias": False}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [sim.EOS_ID, sim.ENDOFTEXT_ID], "bos_token_id": 0}))
    return out
