"""The project's demo model: a ~10M-parameter Llama trained at setup time on the stdlib.

`build_demo_model()` is deterministic and cached by recipe fingerprint: the first call
trains the tokenizer (cached on its own) and the model on 2 CPU threads for a few
minutes; later calls return the cached directory at once.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import AutoTokenizer, LlamaForCausalLM

from build_engines.cache import build_once, default_cache_root, short_hash
from build_engines.corpus import CorpusSpec, heldout_text, training_texts
from build_engines.model_dims import LlamaDims
from build_engines.random_model import make_random_model, make_tiny_random, new_model, save_model
from build_engines.tokenizer import TokenizerRecipe, build_tokenizer, endoftext_id
from build_engines.training import TrainResult, TrainSchedule, greedy_sample, mean_loss, train_model

__all__ = ["DemoRecipe", "build_demo_model", "heldout_text", "make_random_model", "make_tiny_random"]

# Bump when the build changes in a way the recipe fields do not capture.
DEMO_FORMAT_VERSION = 1
# The demo model's chat template (a code model: the conversation as Python comments, the answer continues it).
# It lives beside the tokenizer files as chat_template.jinja (where transformers reads it); the weights and the
# recipe fingerprint do not depend on it, so it is added to a cached build too.
CHAT_TEMPLATE = (
    "{% for message in messages %}# {{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}# assistant:\n{% endif %}"
)
SAMPLE_PROMPTS = ("def ", "import os\n", "class ")
HELDOUT_CHARS = 200_000  # ~60k tokens: enough for a stable held-out loss, quick to score


@dataclass(frozen=True)
class DemoRecipe:
    tokenizer: TokenizerRecipe = field(default_factory=TokenizerRecipe)
    model: LlamaDims = field(default_factory=LlamaDims)
    train: TrainSchedule = field(default_factory=TrainSchedule)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.train.seq_len > self.model.max_position_embeddings:
            raise ValueError(f"train.seq_len ({self.train.seq_len}) exceeds model.max_position_embeddings "
                             f"({self.model.max_position_embeddings})")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")

    @property
    def corpus(self) -> CorpusSpec:
        return self.tokenizer.corpus

    def to_dict(self) -> dict:
        return {"format": DEMO_FORMAT_VERSION, **asdict(self)}

    def fingerprint(self) -> str:
        """Short hash of every field and DEMO_FORMAT_VERSION: the cache key."""
        return short_hash(self.to_dict())


def encode_corpus(tokenizer_dir: Path, texts: list[str]) -> torch.Tensor:
    """One flat int64 stream: each file preceded by the end-of-text token."""
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    eot = endoftext_id(tokenizer_dir)
    ids: list[int] = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.append(eot)
        ids.extend(enc.ids)
    return torch.tensor(ids, dtype=torch.int64)


def build_demo_model(cache_root: Path | None = None, recipe: DemoRecipe = DemoRecipe()) -> Path:
    """Return `cache_root / f"demo-{fingerprint}" / "hf"`, training it first if not cached.

    The HF directory holds model.safetensors (float32), config.json, generation_config.json,
    the tokenizer files and recipe.json; its parent holds stats.json (loss, timing, samples).
    """
    cache_root = cache_root or default_cache_root()
    recipe.corpus.check_interpreter()
    tokenizer_dir = build_tokenizer(cache_root, recipe.tokenizer)

    def build(tmp: Path) -> None:
        stats = _train_and_save(recipe, tokenizer_dir, tmp / "hf")
        (tmp / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")

    hf_dir = build_once(cache_root / f"demo-{recipe.fingerprint()}", build) / "hf"
    write_chat_template(hf_dir)
    return hf_dir


def write_chat_template(hf_dir: Path) -> None:
    """Put CHAT_TEMPLATE beside the tokenizer files unless it is there already (atomic: readers never see half)."""
    path = hf_dir / "chat_template.jinja"
    if path.is_file() and path.read_text() == CHAT_TEMPLATE:
        return
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(CHAT_TEMPLATE)
    os.replace(tmp, path)


def _train_and_save(recipe: DemoRecipe, tokenizer_dir: Path, hf_dir: Path) -> dict:
    tokens = encode_corpus(tokenizer_dir, training_texts(recipe.corpus))
    model = new_model(recipe.model, tokenizer_dir, recipe.seed, initializer_range=0.02)
    n_params = sum(p.numel() for p in model.parameters())
    _log(f"corpus {len(tokens):,} tokens; model {n_params / 1e6:.2f}M parameters; recipe {recipe.fingerprint()}")
    result = train_model(model, tokens, recipe.train, recipe.seed)
    stats = _evaluate(model, tokenizer_dir, recipe, result)
    stats["parameters"] = n_params
    stats["corpus_tokens"] = len(tokens)
    _log(f"trained {result.tokens_seen:,} tokens in {result.seconds:.0f}s; final train loss "
        f"{stats['final_train_loss']:.3f}; held-out loss {stats['heldout_loss']:.3f} "
        f"(ppl {stats['heldout_perplexity']:.1f})")
    for prompt, text in stats["samples"].items():
        _log(f"greedy sample for {prompt!r}:\n{text}\n---")
    save_model(model, tokenizer_dir, hf_dir)
    (hf_dir / "recipe.json").write_text(json.dumps(recipe.to_dict(), indent=2) + "\n")
    return stats


def _log(message: str) -> None:
    print(f"[demo] {message}", file=sys.stderr, flush=True)


def _evaluate(model: LlamaForCausalLM, tokenizer_dir: Path, recipe: DemoRecipe, result: TrainResult) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    heldout = encode_corpus(tokenizer_dir, [heldout_text(HELDOUT_CHARS, recipe.corpus)])
    with torch.no_grad():
        heldout_loss = mean_loss(model, heldout, recipe.train.seq_len)
    return {
        "train_seconds": round(result.seconds, 1),
        "tokens_seen": result.tokens_seen,
        "first_train_loss": result.losses[0],
        "final_train_loss": result.final_loss,
        "heldout_loss": heldout_loss,
        "heldout_perplexity": math.exp(heldout_loss),
        "samples": {p: greedy_sample(model, tokenizer, p) for p in SAMPLE_PROMPTS},
    }
