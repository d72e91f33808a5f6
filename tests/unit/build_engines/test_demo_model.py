"""Demo model recipe, tokenizer, corpus split, training loop and tiny random models.

The full demo model is not trained here (minutes); the training loop runs on a tiny
model and a synthetic token stream instead.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from build_engines import demo_model
from build_engines.cache import COMPLETE_MARKER
from build_engines.cli import main
from build_engines.corpus import CorpusSpec, heldout_text, read_source, source_files, split_files
from build_engines.demo_model import DemoRecipe, build_demo_model, make_tiny_random
from build_engines.model_dims import LlamaDims
from build_engines.tokenizer import ENDOFTEXT, TOKENIZER_FILES, TokenizerRecipe, endoftext_id
from build_engines.training import TrainSchedule, train_model

REPO = Path(__file__).resolve().parents[3]
ROUND_TRIP_TEXTS = [
    "def f(x):\n    return x  # done\n",
    "  leading and trailing spaces   ",
    " ",
    "",
    "tabs\tand\r\nwindows newlines\n\n",
    "héllo wörld, naïve café",
    "日本語のテキストと中文",
    "emoji 🎉👩‍💻 and flags 🇯🇵",
    "combining e\u0301 and zero\u200bwidth",
    "\x00\x01 control chars \x7f",
    ENDOFTEXT + " literal special text",
]


# tokenizer_dir and tiny_hf_dir (make_tiny_random, seed 0) come from tests/conftest.py.

# --- recipe -------------------------------------------------------------------------

@pytest.mark.parametrize("build, message", [
    (lambda: LlamaDims(num_heads=5), r"num_heads \(5\) must divide hidden_size \(256\)"),
    (lambda: LlamaDims(num_kv_heads=3), r"num_kv_heads \(3\) must divide num_heads \(8\)"),
    (lambda: LlamaDims(num_layers=0), "num_layers must be positive"),
    (lambda: LlamaDims(hidden_size=36, num_heads=4, num_kv_heads=4), r"head_dim \(9\) must be even"),
    (lambda: TrainSchedule(steps=100, warmup_steps=100), r"warmup_steps must be in \[0, steps=100\)"),
    (lambda: TrainSchedule(learning_rate=0), "learning_rate must be positive"),
    (lambda: TrainSchedule(batch_size=0), "batch_size must be >= 1"),
    (lambda: TokenizerRecipe(vocab_size=300), "vocab_size must be >= 512"),
    (lambda: CorpusSpec(heldout_every=1), "heldout_every must be >= 2"),
    (lambda: DemoRecipe(train=TrainSchedule(seq_len=4096)), r"seq_len \(4096\) exceeds"),
    (lambda: DemoRecipe(seed=-1), "seed must be >= 0"),
])
def test_recipe_validation(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_default_recipe_is_a_small_gqa_llama():
    dims, vocab = DemoRecipe().model, DemoRecipe().tokenizer.vocab_size
    h, kv_rows = dims.hidden_size, dims.num_kv_heads * dims.head_dim
    per_layer = h * (h + 2 * kv_rows) + h * h + 3 * h * dims.intermediate_size + 2 * h
    params = 2 * vocab * h + dims.num_layers * per_layer + h  # untied embedding + lm_head
    assert 10e6 < params < 20e6  # ~10.1M, 4.2M of it the untied 8192-row embedding and lm_head
    assert dims.num_kv_heads < dims.num_heads and dims.max_position_embeddings == 2048


def test_fingerprint_is_stable_and_covers_nested_fields():
    recipe = DemoRecipe()
    assert recipe.fingerprint() == DemoRecipe().fingerprint()
    assert len(recipe.fingerprint()) == 12 and int(recipe.fingerprint(), 16) >= 0
    changed = [
        dataclasses.replace(recipe, seed=1),
        dataclasses.replace(recipe, train=dataclasses.replace(recipe.train, steps=recipe.train.steps + 1)),
        dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, rope_theta=5e5)),
        dataclasses.replace(recipe, tokenizer=TokenizerRecipe(vocab_size=4096)),
        dataclasses.replace(recipe, tokenizer=TokenizerRecipe(corpus=CorpusSpec(heldout_every=40))),
    ]
    assert len({r.fingerprint() for r in changed} | {recipe.fingerprint()}) == len(changed) + 1


def test_fingerprint_is_the_same_in_a_fresh_interpreter():
    code = "from build_engines.demo_model import DemoRecipe; print(DemoRecipe().fingerprint())"
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == DemoRecipe().fingerprint()


# --- corpus -------------------------------------------------------------------------

def test_heldout_split_is_deterministic_and_disjoint():
    spec = CorpusSpec()
    train, heldout = split_files(spec)
    assert (train, heldout) == split_files(spec)
    assert not set(train) & set(heldout) and len(train) + len(heldout) == len(source_files(spec))
    assert len(heldout) == len(source_files(spec)[spec.heldout_every // 2::spec.heldout_every])
    assert not any(part in spec.skip_dirs for p in train + heldout for part in p.parts[-3:-1])


def test_heldout_text():
    text = heldout_text(5000)
    assert len(text) == 5000 and text == heldout_text(5000)
    assert text.startswith(read_source(split_files(CorpusSpec())[1][0])[:100])
    with pytest.raises(ValueError, match="max_chars must be positive"):
        heldout_text(0)


# --- tokenizer ----------------------------------------------------------------------

def test_tokenizer_files_and_special_tokens(tokenizer_dir):
    assert all((tokenizer_dir / name).is_file() for name in TOKENIZER_FILES)
    assert json.loads((tokenizer_dir / "tokenizer_config.json").read_text())["clean_up_tokenization_spaces"] is False
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    eot = endoftext_id(tokenizer_dir)
    assert len(tok) == 8192
    assert tok.bos_token_id == tok.eos_token_id == tok.pad_token_id == tok.unk_token_id == eot
    assert tok.convert_ids_to_tokens(eot) == ENDOFTEXT


@pytest.mark.parametrize("where", ["tokenizer_dir", "tiny_hf_dir"])
@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_tokenizer_round_trip_is_lossless(where, text, request):
    tok = AutoTokenizer.from_pretrained(request.getfixturevalue(where))
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    if ENDOFTEXT not in text:
        assert tok.eos_token_id not in ids  # encoding adds no special tokens


def test_tokenizer_compresses_code(tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    text = "import os\n\ndef main(argv):\n    for name in sorted(os.listdir('.')):\n        print(name)\n"
    assert len(tok.encode(text)) < len(text) / 2.5


# --- models ---------------------------------------------------------------------------

def test_tiny_model_generates_greedily_with_hf(tiny_hf_dir, tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(tiny_hf_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_hf_dir).eval()
    assert model.config.bos_token_id == model.config.eos_token_id == endoftext_id(tokenizer_dir)
    assert model.config.vocab_size == len(tok) and not model.config.tie_word_embeddings
    ids = torch.tensor([tok.encode("def main(")])
    with torch.no_grad():
        logits = model(ids).logits[0, -1]  # (vocab,)
        top2 = logits.topk(2).values
        out1 = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                              pad_token_id=tok.pad_token_id)
        out2 = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                              pad_token_id=tok.pad_token_id)
    assert logits.std() > 1.0 and top2[0] - top2[1] > 1e-3  # far from uniform: argmax is not float noise
    assert torch.equal(out1, out2) and out1.shape[1] > ids.shape[1]
    assert isinstance(tok.decode(out1[0]), str)


def test_tiny_random_is_seeded_and_overridable(tmp_path, tiny_hf_dir, tokenizer_dir):
    again = load_file(str(make_tiny_random(tmp_path / "a", tokenizer_dir) / "model.safetensors"))
    first = load_file(str(tiny_hf_dir / "model.safetensors"))
    assert all(torch.equal(first[k], again[k]) for k in first)
    other = make_tiny_random(tmp_path / "b", tokenizer_dir, seed=1, num_layers=3)
    config = json.loads((other / "config.json").read_text())
    assert config["num_hidden_layers"] == 3
    assert not torch.equal(load_file(str(other / "model.safetensors"))["lm_head.weight"], first["lm_head.weight"])


def test_cli_tiny(tmp_path, capsys):
    assert main(["tiny", "--out", str(tmp_path / "t")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "t")
    assert (tmp_path / "t" / "model.safetensors").is_file() and (tmp_path / "t" / "tokenizer.json").is_file()


def test_train_model_reduces_loss(tiny_hf_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_hf_dir)
    # A repeating 17-token pattern: learnable in a few dozen steps.
    tokens = torch.arange(17).repeat(200) + 100  # (3400,)
    schedule = TrainSchedule(seq_len=32, batch_size=4, steps=40, warmup_steps=4, learning_rate=1e-2)
    result = train_model(model, tokens, schedule, seed=0)
    assert len(result.losses) == 40 and result.tokens_seen == 40 * 4 * 32
    assert result.final_loss < result.losses[0] / 3
    assert not model.training


def test_build_demo_model_is_cached_and_atomic(tmp_path, tokenizer_dir, monkeypatch):
    calls = []

    def fake_train(recipe, tok_dir, hf_dir):
        calls.append(recipe)
        hf_dir.mkdir()
        (hf_dir / "config.json").write_text("{}")
        return {"final_train_loss": 1.0}

    monkeypatch.setattr(demo_model, "build_tokenizer", lambda root, recipe: tokenizer_dir)
    monkeypatch.setattr(demo_model, "_train_and_save", fake_train)
    recipe = DemoRecipe(seed=7)
    path = build_demo_model(tmp_path, recipe)
    assert path == tmp_path / f"demo-{recipe.fingerprint()}" / "hf"
    assert (path.parent / COMPLETE_MARKER).is_file() and (path.parent / "stats.json").is_file()
    assert build_demo_model(tmp_path, recipe) == path and len(calls) == 1

    def failing_train(recipe, tok_dir, hf_dir):
        hf_dir.mkdir()
        raise RuntimeError("interrupted")

    monkeypatch.setattr(demo_model, "_train_and_save", failing_train)
    with pytest.raises(RuntimeError, match="interrupted"):
        build_demo_model(tmp_path, DemoRecipe(seed=8))
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.parent.name]  # nothing half-built
