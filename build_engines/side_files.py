"""The files that travel with every checkpoint artifact besides its weights: the tokenizer, the chat template and
generation_config.json (eos ids, default sampling), so whatever serves the artifact (the OpenAI front's chat
endpoint) finds them in it. convert.py copies them from the HF dir; quantize and shard copy them along.

transformers 5 saves a chat template as chat_template.jinja; the copied tokenizer_config.json gets it as its
`chat_template` key too, where readers of tokenizer_config.json (and transformers 4) look for it.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
              "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json", "generation_config.json")


def copy_side_files(src_dir: Path, dst_dir: Path) -> list[str]:
    """Copy the side files src_dir has into dst_dir; returns their names."""
    copied = [name for name in SIDE_FILES if (Path(src_dir) / name).is_file()]
    for name in copied:
        shutil.copyfile(Path(src_dir) / name, Path(dst_dir) / name)
    _embed_chat_template(Path(dst_dir))
    return copied


def _embed_chat_template(directory: Path) -> None:
    config, template = directory / "tokenizer_config.json", directory / "chat_template.jinja"
    if not (config.is_file() and template.is_file()):
        return
    data = json.loads(config.read_text())
    if "chat_template" not in data:
        data["chat_template"] = template.read_text()
        config.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
