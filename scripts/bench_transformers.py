#!/usr/bin/env python3
"""Decode-step time of tiny DeepSeek-V3 and GLM-5 transformers models with mlpjit.

Each model (transformers' own DeepseekV3ForCausalLM / GlmMoeDsaForCausalLM; 3 layers: one
dense, two MoE with a shared expert each; small attention and a 1024-token vocab; random
weights; the real MLP sizes of one TP shard at TP 8 and TP 1, as tests/gpu/
test_transformers_gpu.py builds them) is built in bf16 on the GPU; a copy gets its dense MLPs
and shared experts converted to FP8 by transformers' own pieces (replace_with_fp8_linear with
``modules_to_not_convert`` for attention, routers, routed experts and lm_head, then
Fp8Quantize: what FineGrainedFP8Config does at load). Variants of the same weights:

  mlpjit  the FP8 model with mlpjit.integrations.transformers.apply(): every dense MLP and
          shared expert call runs DenseMlp (kernels at 1 token where the shape has them,
          DenseMlp's stock path otherwise)
  bf16    the bf16 model whose converted weights are the FP8 ones dequantized (the math FP8
          approximates, run by plain nn.Linear)
  hf_fp8  the FP8 model unpatched: transformers' FP8Linear (DeepGEMM or the Triton kernel,
          both fetched from the Hugging Face Hub by the ``kernels`` package). Probed first;
          "not available: <reason>" where it cannot run (no ``kernels``, no network)

One decode step = one new token at position ``--tokens-context`` of a StaticCache filled by a
prefill: before every step the cache's length counters are put back to the context, so each
step does the same work (same position, same mask). Modes:

  eager     model(...) called from Python
  graph     the same call captured with torch.cuda.graph and replayed
  compiled  transformers' own compile path, model.get_compiled_call(None): torch.compile
            mode "reduce-overhead" (CUDA graphs through cudagraph trees), what generate()
            uses with a static cache. Tried by itself where a graph capture failed (unless
            --no-compile-fallback), or always with --modes ...,compiled

Times are CUDA events around each step (eager: the host-bound step's span), median over
``--steps`` after ``--warmup``. Beside them: the step's floor (bytes of the weights one token
reads / the device-to-device copy bandwidth of the same run: all parameters but the
embedding, routed experts counted for top-k of them; the KV cache not counted), and per MLP
shape, DenseMlp alone at 1 token (CUDA-graph replay of a chain of distinct layers whose
weights total ``--l2-multiple`` x L2, as scripts/bench_dense_mlp.py times it, activation
scales not ue8m0 as apply() defaults) against the bf16 module math (gate, up, down F.linear
and SiLU-and-mul) and its own floor.

Every section is guarded: a failure is recorded (table, JSON "errors") and the run goes on.
Progress on stderr, the markdown report on stdout, the JSON with ``--json`` (rewritten after
each variant, so a run cut short keeps what it measured; ``--report-from`` prints the report
of saved JSON files, merged, e.g. of one run per model where a run's time is limited).

    MLPJIT_CACHE_DIR=.gpu-cache python3 scripts/bench_transformers.py --json r.json
    python3 scripts/bench_transformers.py --dry-run         # no GPU: the plan and kernels
    python3 scripts/bench_transformers.py --report-from a.json b.json

The kernels (1 token, ue8m0=False, for the MLP shapes that take them) are listed by
``kernel_requests(arch)`` of mlpjit/bench/transformers_bench.py (the code; the decode step
and the report beside it); scripts/gpu_requests.py collects them for warming a cache on a
CPU machine (README: running the GPU tests and benchmarks on an H200).
"""

import sys

from mlpjit.bench import transformers_bench


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark with this docstring as its --help."""
    return transformers_bench.main(argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())
