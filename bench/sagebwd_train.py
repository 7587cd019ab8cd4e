"""SageBwd training check (issue 12, part 4): a small causal transformer trained from scratch on a synthetic task,
once with sagegen's trainable INT8 attention (sagegen.sagebwd_attention: SageAttention3's Algorithm 3 on the
backward) and once with PyTorch SDPA, from the same seed and the same batches. Writes both loss curves as CSV and,
when matplotlib is present, a PNG; prints the final losses (mean of the last 20 steps) and their relative gap (the
issue's target: within 1%).

The task: sequences of random tokens in which the second half repeats the first (induction/copy): predicting the
second half needs attention to look 128 tokens back, so attention's gradients matter.

    python3 bench/sagebwd_train.py --steps 400 --out sagebwd_train      # on a GPU; writes .csv and .png
"""

import argparse
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import sagegen  # noqa: E402


class Block(nn.Module):
    def __init__(self, width, heads, attention):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x, dtype):
        batch, tokens, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, tokens, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        q, k, v = (t.to(dtype).contiguous() for t in (q, k, v))  # [batch, heads, tokens, head_dim] (HND)
        if self.attention == "sagebwd":
            o = sagegen.sagebwd_attention(q, k, v, is_causal=True)
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(o.float().transpose(1, 2).reshape(batch, tokens, width))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab, width, heads, layers, tokens, attention):
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab, width), nn.Parameter(torch.zeros(tokens, width))
        self.blocks = nn.ModuleList(Block(width, heads, attention) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)
        nn.init.normal_(self.position, std=0.02)

    def forward(self, tokens, dtype):
        x = self.embed(tokens) + self.position[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x, dtype)
        return self.head(self.norm(x))


def batches(steps, batch, tokens, vocab, seed, device):
    generator = torch.Generator(device="cpu").manual_seed(seed)
    half = (tokens + 1) // 2
    for _ in range(steps):
        first = torch.randint(0, vocab, (batch, half), generator=generator)
        yield torch.cat([first, first], dim=1)[:, :tokens].to(device)


def train(attention, args):
    torch.manual_seed(args.seed)
    device = torch.device("cuda")
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    model = TinyTransformer(args.vocab, args.width, args.heads, args.layers, args.tokens, attention).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
    losses, start = [], time.time()
    for step, sequence in enumerate(batches(args.steps, args.batch, args.tokens, args.vocab, args.seed, device)):
        logits = model(sequence[:, :-1], dtype)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab).float(), sequence[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == args.steps - 1:
            print(f"  {attention:8s} step {step:4d} loss {losses[-1]:.4f} ({time.time() - start:.0f} s)", flush=True)
    return losses


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=257, help="sequence length + 1 (inputs are tokens - 1 long)")
    parser.add_argument("--vocab", type=int, default=128)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--heads", type=int, default=4, help="head_dim = width / heads: 64 or 128")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--dtype", choices=("bf16", "f16"), default="bf16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="sagebwd_train", help="output stem: STEM.csv and STEM.png")
    args = parser.parse_args()
    if args.width // args.heads not in (64, 128) or args.width % args.heads:
        parser.error("--width / --heads must be 64 or 128 (the head dims SageBwd's kernels have)")
    if not torch.cuda.is_available():
        print("sagebwd_train.py: SKIPPED, no CUDA device")
        return 0
    print(f"== SageBwd training check on {torch.cuda.get_device_name()}: {args.layers} layers, width {args.width}, "
          f"{args.heads} heads, {args.tokens - 1} tokens, batch {args.batch}, {args.steps} steps, {args.dtype}, "
          f"seed {args.seed}")
    curves = {name: train(name, args) for name in ("sdpa", "sagebwd")}
    with open(args.out + ".csv", "w") as csv:
        csv.write("step,sdpa,sagebwd\n")
        for step, (a, b) in enumerate(zip(curves["sdpa"], curves["sagebwd"])):
            csv.write(f"{step},{a:.6f},{b:.6f}\n")
    final = {name: sum(losses[-20:]) / len(losses[-20:]) for name, losses in curves.items()}
    gap = (final["sagebwd"] - final["sdpa"]) / final["sdpa"]
    print(f"final loss (mean of the last 20 steps): sdpa {final['sdpa']:.4f}, sagebwd {final['sagebwd']:.4f}, "
          f"relative gap {100 * gap:+.2f}% ({'within' if abs(gap) <= 0.01 else 'NOT within'} 1%)")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        figure, axis = plt.subplots(figsize=(7, 4))
        for name, losses in curves.items():
            axis.plot(losses, label=f"{name} (final {final[name]:.4f})", linewidth=1)
        axis.set_xlabel("step")
        axis.set_ylabel("cross-entropy")
        axis.set_yscale("log")
        axis.set_title("SageBwd vs PyTorch SDPA, same seed and batches")
        axis.legend()
        figure.tight_layout()
        figure.savefig(args.out + ".png", dpi=120)
        print(f"wrote {args.out}.csv and {args.out}.png")
    except ImportError:
        print(f"wrote {args.out}.csv (no matplotlib: no PNG)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
