"""Writes perf_analyzer's --input-data files beside this script from one prompt list:

- ensemble_inputs.json: text prompts for the ensemble (text_input, max_tokens, min_tokens = max_tokens so every
  request generates exactly max_tokens tokens, stream);
- tensorrt_llm_inputs.json: the same prompts as token ids of a tokenizer (default: the demo model's), for the
  tensorrt_llm model directly (input_ids with its shape, input_lengths, request_output_len, min_tokens, streaming).

    .venv/bin/python perf/perf_analyzer/make_inputs.py [--tokenizer DIR] [--max-tokens 64]
Token ids are only valid for the tokenizer they were made with: rerun with --tokenizer for another model.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROMPTS = [
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main():\n",
    "class LRUCache:\n    def __init__(self, capacity):\n",
    "def read_config(path):\n    \"\"\"Read a config file and return a dict.\"\"\"\n",
    "for i in range(10):\n",
    "def parse_args(argv=None):\n    parser = argparse.ArgumentParser(",
    "with open(filename) as f:\n",
    "try:\n    import json\nexcept ImportError:\n",
    "def __repr__(self):\n        return ",
    "if __name__ == '__main__':\n",
    "def merge_sort(items):\n    if len(items) <= 1:\n",
    "class Queue(object):\n    \"\"\"A simple FIFO queue.\"\"\"\n\n",
    "def encode(self, data, errors='strict'):\n",
    "    raise ValueError('invalid literal for int() with base %d: %r' % (",
    "def walk(top, topdown=True, onerror=None):\n",
    "import re\n\n_pattern = re.compile(r'",
]


def ensemble_entries(max_tokens: int, stream: bool = True) -> list[dict]:
    return [{"text_input": [p], "max_tokens": [max_tokens], "min_tokens": [max_tokens], "stream": [stream]}
            for p in PROMPTS]


def tensorrt_llm_entries(tokenizer_dir: Path, max_tokens: int, stream: bool = True) -> list[dict]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    entries = []
    for prompt in PROMPTS:
        ids = tok.encode(prompt, add_special_tokens=False)  # as preprocessing tokenizes (add_special_tokens false)
        entries.append({"input_ids": {"content": ids, "shape": [len(ids)]}, "input_lengths": [len(ids)],
                        "request_output_len": [max_tokens], "min_tokens": [max_tokens], "streaming": [stream]})
    return entries


def write(path: Path, entries: list[dict]) -> Path:
    path.write_text('{"data": [\n ' + ",\n ".join(json.dumps(e) for e in entries) + "\n]}\n")  # one request a line
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, help="HF tokenizer dir (default: the demo model's)")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    if args.tokenizer is None:
        from ensembles import artifacts

        args.tokenizer = artifacts.demo().tokenizer_dir
    print(write(HERE / "ensemble_inputs.json", ensemble_entries(args.max_tokens)))
    print(write(HERE / "tensorrt_llm_inputs.json", tensorrt_llm_entries(args.tokenizer, args.max_tokens)))


if __name__ == "__main__":
    main()
