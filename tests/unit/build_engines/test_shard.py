"""build_engines/shard.py and rank_layout.py: per-rank shapes by TensorRT-LLM's rules, shards that reassemble to
the original tensors, vocab padding, uneven pipeline split, KV-head replication, and clear refusals."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from backend.formats.checkpoint import LM_HEAD, LN_F, VOCAB_EMBEDDING, TrtllmCheckpointConfig
from backend.formats.checkpoint_tensors import LayerNames, qkv_split_sizes
from backend.formats.rank_layout import RankPosition, padded_vocab, pp_layers
from build_engines.cli import main as cli_main
from build_engines.shard import shard_checkpoint, split_qkv, split_vocab

# 3 layers (uneven over 2 stages), 4 heads, 2 KV heads, vocab 8192 (demo tokenizer), head_size 16.
DIMS = dict(num_layers=3)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, tokenizer_dir) -> Path:
    from build_engines.convert import convert_hf_to_trtllm
    from build_engines.random_model import make_tiny_random

    root = tmp_path_factory.mktemp("shard")
    hf = make_tiny_random(root / "hf", tokenizer_dir, seed=3, **DIMS)
    return convert_hf_to_trtllm(hf, root / "ckpt")


def _load(d: Path, rank: int) -> dict[str, torch.Tensor]:
    return load_file(str(d / f"rank{rank}.safetensors"))


def test_pp_layers_give_first_stages_the_extra_layer():
    assert [list(pp_layers(7, 3, r)) for r in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]
    # The same split as TRT-LLM's Mapping.pp_layers (torch.tensor_split).
    for n, pp in [(6, 4), (5, 2), (3, 3)]:
        assert [list(pp_layers(n, pp, r)) for r in range(pp)] == [
            t.tolist() for t in torch.tensor_split(torch.arange(n), pp)]


def test_rank_layout_is_tp_fastest():
    pos = RankPosition(5, tp_size=2, pp_size=3)
    assert (pos.tp_rank, pos.pp_rank, pos.prev_stage_rank, pos.next_stage_rank) == (1, 2, 3, 7)
    assert pos.stage_ranks() == [4, 5] and pos.is_last_stage and not pos.is_first_stage


def test_config_mapping_and_other_keys_kept(ckpt, tmp_path):
    out = shard_checkpoint(ckpt, tmp_path / "s", tp_size=2, pp_size=2)
    assert out == tmp_path / "s"
    raw = json.loads((out / "config.json").read_text())
    src = json.loads((ckpt / "config.json").read_text())
    assert raw["mapping"]["world_size"] == 4 and raw["mapping"]["tp_size"] == 2 and raw["mapping"]["pp_size"] == 2
    assert raw["vocab_size"] == src["vocab_size"]  # TRT-LLM keeps the true vocabulary; only lm_head is padded
    assert {k: v for k, v in raw.items() if k != "mapping"} == {k: v for k, v in src.items() if k != "mapping"}
    assert sorted(p.name for p in out.glob("rank*.safetensors")) == [f"rank{r}.safetensors" for r in range(4)]
    assert TrtllmCheckpointConfig.from_json(out).mapping.world_size == 4


def test_tp2_shapes_and_reassembly(ckpt, tmp_path):
    cfg = TrtllmCheckpointConfig.from_json(ckpt)
    full = _load(ckpt, 0)
    out = shard_checkpoint(ckpt, tmp_path / "tp2", 2, 1)
    ranks = [_load(out, r) for r in range(2)]
    h, hd, nh, nkv = cfg.hidden_size, cfg.head_size, cfg.num_attention_heads, cfg.num_key_value_heads
    for i in range(cfg.num_hidden_layers):
        n = LayerNames.of(i)
        assert ranks[0][n.qkv].shape == ((nh // 2 + 2 * nkv // 2) * hd, h)
        assert ranks[1][n.dense].shape == (h, nh // 2 * hd)
        # Column-parallel: rows; row-parallel: columns.
        for name in (n.mlp_fc, n.mlp_gate):
            assert torch.equal(torch.cat([r[name] for r in ranks], 0), full[name])
        for name in (n.mlp_proj, n.dense):
            assert torch.equal(torch.cat([r[name] for r in ranks], 1), full[name])
        for name in (n.input_layernorm, n.post_layernorm):
            assert all(torch.equal(r[name], full[name]) for r in ranks)
        # qkv: each rank's q, k, v are its heads; concatenated per part they give the original parts back.
        q, k, v = full[n.qkv].split(qkv_split_sizes(cfg))
        parts = [r[n.qkv].split([nh // 2 * hd, nkv // 2 * hd, nkv // 2 * hd]) for r in ranks]
        for j, whole in enumerate((q, k, v)):
            assert torch.equal(torch.cat([p[j] for p in parts]), whole)
    assert all(torch.equal(r[VOCAB_EMBEDDING], full[VOCAB_EMBEDDING]) for r in ranks)
    assert torch.equal(torch.cat([r[LM_HEAD] for r in ranks]), full[LM_HEAD])


def test_lm_head_vocab_padded_to_multiple_of_tp():
    lm_head = torch.randn(10, 4)
    shards = [split_vocab(lm_head, 4, r) for r in range(4)]
    assert padded_vocab(10, 4) == 12 and all(s.shape == (3, 4) for s in shards)
    joined = torch.cat(shards)
    assert torch.equal(joined[:10], lm_head) and not joined[10:].any()  # zero padding rows


def test_kv_heads_replicated_when_tp_exceeds_them(ckpt):
    cfg = TrtllmCheckpointConfig.from_json(ckpt)  # 4 heads, 2 KV heads
    qkv = _load(ckpt, 0)[LayerNames.of(0).qkv]
    q, k, v = qkv.split(qkv_split_sizes(cfg))
    hd = cfg.head_size
    for rank in range(4):
        local = split_qkv(qkv, cfg, 4, rank)
        assert local.shape == (3 * hd, cfg.hidden_size)  # one q head, one k head, one v head
        lq, lk, lv = local.split(hd)
        assert torch.equal(lq, q[rank * hd:(rank + 1) * hd])
        kv_head = rank // 2  # q heads 2h and 2h+1 share KV head h, as in the unsharded GQA model
        assert torch.equal(lk, k[kv_head * hd:(kv_head + 1) * hd])
        assert torch.equal(lv, v[kv_head * hd:(kv_head + 1) * hd])


def test_uneven_pipeline_split_files(ckpt, tmp_path):
    full = _load(ckpt, 0)
    out = shard_checkpoint(ckpt, tmp_path / "pp2", 1, 2)
    first, last = _load(out, 0), _load(out, 1)
    layers = lambda d: sorted({int(k.split(".")[2]) for k in d if k.startswith("transformer.layers.")})
    assert layers(first) == [0, 1] and layers(last) == [0]  # renumbered from 0 in each stage
    assert VOCAB_EMBEDDING in first and VOCAB_EMBEDDING not in last
    assert LM_HEAD in last and LN_F in last and LM_HEAD not in first
    assert torch.equal(last[LayerNames.of(0).qkv], full[LayerNames.of(2).qkv])


def test_fp8_per_tensor_scales_replicated(ckpt, tmp_path):
    src = tmp_path / "fp8"
    src.mkdir()
    raw = json.loads((ckpt / "config.json").read_text())
    raw["quantization"]["quant_algo"] = "FP8"
    (src / "config.json").write_text(json.dumps(raw))
    weights = _load(ckpt, 0)
    n = LayerNames.of(0)
    weights[n.qkv] = weights[n.qkv].to(torch.float8_e4m3fn)
    weights[n.qkv.replace(".weight", ".weights_scaling_factor")] = torch.tensor([0.5])
    save_file(weights, str(src / "rank0.safetensors"))
    out = shard_checkpoint(src, tmp_path / "fp8-tp2", 2, 1)
    r1 = _load(out, 1)
    assert r1["transformer.layers.0.attention.qkv.weights_scaling_factor"].item() == 0.5
    assert r1[n.qkv].dtype == torch.float8_e4m3fn


def _quantized_copy(ckpt: Path, dst: Path, algo: str, group: int = 16) -> dict[str, torch.Tensor]:
    """ckpt with every decoder linear in W8A16 or W4A16_AWQ's tensor layout (random values: only shapes and
    placement matter to the sharder)."""
    dst.mkdir()
    raw = json.loads((ckpt / "config.json").read_text())
    raw["quantization"].update(quant_algo=algo, group_size=group, pre_quant_scale=algo == "W4A16_AWQ")
    (dst / "config.json").write_text(json.dumps(raw))
    weights = _load(ckpt, 0)
    gen = torch.Generator().manual_seed(0)
    for name in [n for n in weights if n.startswith("transformer.layers.") and n.endswith(LINEARS)]:
        out_f, in_f = weights[name].shape
        base = name[: -len(".weight")]
        if algo == "W8A16":
            weights[name] = torch.randint(-127, 128, (out_f, in_f), dtype=torch.int8, generator=gen)
            weights[f"{base}.per_channel_scale"] = torch.rand(out_f, generator=gen)
        else:
            weights[name] = torch.randint(-128, 128, (out_f, in_f // 2), dtype=torch.int8, generator=gen)
            weights[f"{base}.weights_scaling_factor"] = torch.rand(out_f, in_f // group, generator=gen)
            weights[f"{base}.prequant_scaling_factor"] = torch.rand(in_f, generator=gen)
    save_file(weights, str(dst / "rank0.safetensors"))
    return weights


LINEARS = ("qkv.weight", "dense.weight", "fc.weight", "gate.weight", "proj.weight")


@pytest.mark.parametrize("algo", ["W8A16", "W4A16_AWQ"])
def test_quantized_tensors_follow_their_weights(ckpt, tmp_path, algo):
    full = _quantized_copy(ckpt, tmp_path / "q", algo)
    out = shard_checkpoint(tmp_path / "q", tmp_path / "q-tp2", 2, 1)
    ranks = [_load(out, r) for r in range(2)]
    n = "transformer.layers.1."
    cat = lambda name, dim: torch.cat([r[n + name] for r in ranks], dim)
    same = lambda name: all(torch.equal(r[n + name], full[n + name]) for r in ranks)
    for col in ("mlp.fc", "mlp.gate"):  # column-parallel: everything per output row
        assert torch.equal(cat(f"{col}.weight", 0), full[f"{n}{col}.weight"])
    assert torch.equal(cat("mlp.proj.weight", 1), full[n + "mlp.proj.weight"])  # row-parallel: by input
    if algo == "W8A16":
        assert torch.equal(cat("mlp.fc.per_channel_scale", 0), full[n + "mlp.fc.per_channel_scale"])
        assert same("mlp.proj.per_channel_scale") and same("attention.dense.per_channel_scale")
    else:
        assert torch.equal(cat("mlp.fc.weights_scaling_factor", 0), full[n + "mlp.fc.weights_scaling_factor"])
        assert torch.equal(cat("mlp.proj.weights_scaling_factor", 1), full[n + "mlp.proj.weights_scaling_factor"])
        assert same("mlp.fc.prequant_scaling_factor") and same("attention.qkv.prequant_scaling_factor")
        assert torch.equal(cat("mlp.proj.prequant_scaling_factor", 0), full[n + "mlp.proj.prequant_scaling_factor"])
    # qkv scales split by heads exactly as the qkv rows.
    cfg = TrtllmCheckpointConfig.from_json(ckpt)
    scale = "per_channel_scale" if algo == "W8A16" else "weights_scaling_factor"
    assert torch.equal(ranks[1][f"{n}attention.qkv.{scale}"], split_qkv(full[f"{n}attention.qkv.{scale}"], cfg, 2, 1))


def test_int4_group_cut_by_tp_refused(ckpt, tmp_path):
    _quantized_copy(ckpt, tmp_path / "q", "W4A16_AWQ", group=32)  # dense: 64 inputs = 2 groups; tp 4 cuts them
    with pytest.raises(ValueError, match=r"attention.dense.weights_scaling_factor \(64, 2\): dimension 1 does not "
                                         r"split into 4 equal parts \(INT4 groups"):
        shard_checkpoint(tmp_path / "q", tmp_path / "q-tp4", 4, 1)
    assert not (tmp_path / "q-tp4").exists()


def test_unknown_tensor_refused_clearly(ckpt, tmp_path):
    src = tmp_path / "odd"
    src.mkdir()
    (src / "config.json").write_text((ckpt / "config.json").read_text())
    weights = _load(ckpt, 0)
    weights["transformer.layers.0.mlp.fc.smoothquant_scale"] = torch.ones(64)
    save_file(weights, str(src / "rank0.safetensors"))
    with pytest.raises(ValueError, match="smoothquant_scale .* does not know how to split"):
        shard_checkpoint(src, tmp_path / "odd-tp2", 2, 1)
    assert not (tmp_path / "odd-tp2").exists()


@pytest.mark.parametrize("tp, pp, message", [
    (3, 1, r"tp_size 3 cannot split 4 attention heads / 2 KV heads evenly; tp sizes that work: \[1, 2, 4\]"),
    (1, 4, r"pp_size 4 exceeds num_hidden_layers \(3\)"),
    (0, 1, r"must be >= 1"),
])
def test_bad_sizes_refused_with_what_works(ckpt, tmp_path, tp, pp, message):
    with pytest.raises(ValueError, match=message):
        shard_checkpoint(ckpt, tmp_path / "bad", tp, pp)
    assert not (tmp_path / "bad").exists()


def test_already_sharded_refused(ckpt, tmp_path):
    out = shard_checkpoint(ckpt, tmp_path / "tp2", 2, 1)
    with pytest.raises(ValueError, match="already sharded"):
        shard_checkpoint(out, tmp_path / "again", 2, 1)


def test_cli_prints_dir_and_reports_errors(ckpt, tmp_path, capsys):
    assert cli_main(["shard", str(ckpt), str(tmp_path / "c"), "--tp", "2", "--pp", "1"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "c")
    with pytest.raises(SystemExit, match="error: tp_size 3 cannot split"):
        cli_main(["shard", str(ckpt), str(tmp_path / "d"), "--tp", "3"])
