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


def ensemble_entry(text: str, max_tokens: int, stream: bool = True) -> dict:
    return {"text_input": [text], "max_tokens": [max_tokens], "min_tokens": [max_tokens], "stream": [stream]}


def tensorrt_llm_entry(ids: list[int], max_tokens: int, stream: bool = True) -> dict:
    return {"input_ids": {"content": ids, "shape": [len(ids)]}, "input_lengths": [len(ids)],
            "request_output_len": [max_tokens], "min_tokens": [max_tokens], "streaming": [stream]}


def tokenize(tokenizer_dir: Path, texts: list[str]) -> list[list[int]]:
    """As the preprocessing model tokenizes (add_special_tokens false)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    return [tok.encode(t, add_special_tokens=False) for t in texts]


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
    print(write(HERE / "ensemble_inputs.json", [ensemble_entry(p, args.max_tokens) for p in PROMPTS]))
    ids = tokenize(args.tokenizer, PROMPTS)
    print(write(HERE / "tensorrt_llm_inputs.json", [tensorrt_llm_entry(i, args.max_tokens) for i in ids]))


if __name__ == "__main__":
    main()
