"""Tokenizer folders for the trainer round-trip check (jobs/analysis/template_check.py):
the test models' tokenizer (serve_apps/engines/sglang_cpu/models.py, the simulator's ids)
with another chat template put in.

- ROUND_TRIP renders an assistant turn as the scripted model writes it: raygen's prompt
  ends in ``<think>\\n``, the model writes ``abc...z</think>ABCDEFGHIJ`` and EOS, so a
  record re-renders to exactly the ids it was generated with (+ the ``\\n`` after EOS).
- QWEN3 is Qwen3's own rule for the last assistant turn, ``<think>\\n{reasoning}
  \\n</think>\\n\\n{answer}``: newlines the scripted model never wrote.
- The models' stock template (models.CHAT_TEMPLATE) ignores ``reasoning_content``: the
  record loses its reasoning and the ``<think>\\n`` of the generation prompt.
"""

from __future__ import annotations

import json
from pathlib import Path

from serve_apps.engines.sglang_cpu import models

_TURNS = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.reasoning_content is defined %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + ASSISTANT + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}")
ROUND_TRIP = _TURNS.replace("ASSISTANT", "m.reasoning_content + '</think>' + m.content")
QWEN3 = _TURNS.replace("ASSISTANT", "m.reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + "
                                    "m.content.lstrip('\\n')")


def tokenizer_dir(folder: Path, chat_template: str | None = None) -> Path:
    """The test tokenizer in ``folder``, its chat template replaced when one is given
    (where transformers keeps it: chat_template.jinja, or tokenizer_config.json)."""
    models.write_tokenizer(folder)
    if chat_template is not None:
        jinja = folder / "chat_template.jinja"
        if jinja.exists():
            jinja.write_text(chat_template)
        else:
            config = folder / "tokenizer_config.json"
            tree = json.loads(config.read_text())
            tree["chat_template"] = chat_template
            config.write_text(json.dumps(tree))
    return folder
