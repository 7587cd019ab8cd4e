"""Whole models with PyTorch SDPA and with sagegen behind it (`with sagegen.sdpa(preset)`), in one run.

- LLM prefill: a Llama-style transformers model (random weights, GQA 16 query / 4 key-value heads, head dim 128,
  hidden 2048, --llm-layers layers) prefilling --prompt tokens (batch 1, causal).
- ViT: timm's ViT-L/16 (random weights, head dim 64) at --image pixels (1024: 4097 tokens), batch --vit-batch.

Each model runs forward under torch.inference_mode in --dtype; the time is the median of --repeats forwards after
two warm-ups (CUDA events). Prints one table (ms, speed-up over SDPA) and the output's agreement with SDPA's
(cos of the final hidden states / logits); --json writes it.
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import sagegen  # noqa: E402
from cuda_timing import time_ms  # noqa: E402


def llm(args, dtype):
    from transformers import LlamaConfig, LlamaModel
    config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=args.llm_layers,
                         num_attention_heads=16, num_key_value_heads=4, head_dim=128,
                         max_position_embeddings=max(args.prompt, 4096), vocab_size=32000)
    config._attn_implementation = "sdpa"
    model = LlamaModel(config).to("cuda", dtype).eval()
    tokens = torch.randint(0, config.vocab_size, (1, args.prompt), device="cuda")
    return f"LLM prefill ({args.llm_layers} layers, GQA 16/4, d128, {args.prompt} tokens)", \
        lambda: model(input_ids=tokens).last_hidden_state


def vit(args, dtype):
    import timm
    model = timm.create_model("vit_large_patch16_224", pretrained=False, img_size=args.image).to("cuda", dtype).eval()
    images = torch.randn(args.vit_batch, 3, args.image, args.image, device="cuda", dtype=dtype)
    tokens = (args.image // 16) ** 2 + 1
    return f"ViT-L/16 ({args.image} px, {tokens} tokens, d64, batch {args.vit_batch})", lambda: model(images)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--presets", default="sage-b,sage2-fp8")
    parser.add_argument("--models", default="llm,vit")
    parser.add_argument("--prompt", type=int, default=16384)
    parser.add_argument("--llm-layers", type=int, default=8)
    parser.add_argument("--image", type=int, default=1024)
    parser.add_argument("--vit-batch", type=int, default=2)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    torch.manual_seed(0)
    rows = []
    print(f"whole models, {args.dtype}, {torch.cuda.get_device_name()}; ms per forward (median of {args.repeats})")
    print(f"{'model':<52} {'SDPA ms':>9}" + "".join(f" {p + ' ms':>15} {'x SDPA':>7} {'cos':>9}"
                                                    for p in args.presets.split(",")))
    for name in args.models.split(","):
        with torch.inference_mode():
            title, run = {"llm": llm, "vit": vit}[name](args, dtype)
            baseline_out = run().float()
            baseline = time_ms(run, warmup=2, repeats=args.repeats)
            row = {"model": title, "sdpa_ms": baseline}
            line = f"{title:<52} {baseline:>9.2f}"
            for preset in args.presets.split(","):
                with sagegen.sdpa(preset):
                    out = run().float()
                    milliseconds = time_ms(run, warmup=2, repeats=args.repeats)
                cos = torch.nn.functional.cosine_similarity(out.flatten(), baseline_out.flatten(), dim=0).item()
                row[preset] = {"ms": milliseconds, "speedup": baseline / milliseconds, "cos": cos}
                line += f" {milliseconds:>15.2f} {baseline / milliseconds:>7.2f} {cos:>9.6f}"
            print(line, flush=True)
            rows.append(row)
            del run
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
