"""The demo tokenizer: byte-level BPE trained on the corpus, saved for `AutoTokenizer`.

Byte-level means every string maps to tokens and back exactly: text is first turned into
bytes (each byte shown as a printable stand-in character), merges never cross the
pre-tokenizer's word boundaries, and the decoder maps the stand-ins back to bytes. No
normalizer, no prefix space and no tokenization-space clean-up, so decode(encode(s)) == s
for any unicode string. The tokenizer adds no special tokens when encoding.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from build_engines.cache import build_once, default_cache_root, short_hash
from build_engines.corpus import CorpusSpec, training_texts

ENDOFTEXT = "<|endoftext|>"
TOKENIZER_FORMAT_VERSION = 1
# What a tokenizer directory holds; copied next to every model built here.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# Written into tokenizer_config.json so transformers 4.x (which has no
# "TokenizersBackend", the v5 default) loads it too.
TOKENIZER_CLASS = "PreTrainedTokenizerFast"


@dataclass(frozen=True)
class TokenizerRecipe:
    vocab_size: int = 8192
    min_frequency: int = 2
    corpus: CorpusSpec = field(default_factory=CorpusSpec)

    def __post_init__(self) -> None:
        # 256 byte symbols + the special token must fit, with room for merges.
        if self.vocab_size < 512:
            raise ValueError(f"vocab_size must be >= 512 (256 bytes + special + merges), got {self.vocab_size}")
        if self.min_frequency < 1:
            raise ValueError(f"min_frequency must be >= 1, got {self.min_frequency}")

    def fingerprint(self) -> str:
        return short_hash({"format": TOKENIZER_FORMAT_VERSION, "recipe": asdict(self)})


def train_tokenizer(texts: list[str], recipe: TokenizerRecipe) -> PreTrainedTokenizerFast:
    """Train byte-level BPE on `texts`; ENDOFTEXT is bos, eos, pad and unk."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=recipe.vocab_size,
        min_frequency=recipe.min_frequency,
        special_tokens=[ENDOFTEXT],  # id 0
        # All 256 byte symbols, so no input ever needs an unknown token.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=ENDOFTEXT,
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
        unk_token=ENDOFTEXT,
        clean_up_tokenization_spaces=False,
    )


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    """Save so that `AutoTokenizer.from_pretrained(out_dir)` works offline on transformers 4 and 5."""
    tokenizer.save_pretrained(out_dir)
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = TOKENIZER_CLASS
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    # transformers 5 no longer writes this file; older readers (and people) look for it.
    special = {name: ENDOFTEXT for name in ("bos_token", "eos_token", "pad_token", "unk_token")}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def copy_tokenizer(src_dir: Path, dst_dir: Path) -> None:
    for name in TOKENIZER_FILES:
        (dst_dir / name).write_bytes((src_dir / name).read_bytes())


def endoftext_id(tokenizer_dir: Path) -> int:
    """The ENDOFTEXT id, read from tokenizer.json without loading transformers."""
    added = json.loads((tokenizer_dir / "tokenizer.json").read_text())["added_tokens"]
    return next(t["id"] for t in added if t["content"] == ENDOFTEXT)


def build_tokenizer(cache_root: Path | None = None, recipe: TokenizerRecipe = TokenizerRecipe()) -> Path:
    """Train (once) and return `cache_root / f"tokenizer-{fingerprint}"`."""
    cache_root = cache_root or default_cache_root()

    def build(tmp: Path) -> None:
        save_tokenizer(train_tokenizer(training_texts(recipe.corpus), recipe), tmp)
        (tmp / "tokenizer_recipe.json").write_text(json.dumps(asdict(recipe), indent=2) + "\n")

    return build_once(cache_root / f"tokenizer-{recipe.fingerprint()}", build)
