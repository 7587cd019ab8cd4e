"""SLA fine-tuning check (issue 29, item 4), in the spirit of the SLA paper's Table 1 on a toy: a small DiT-like
transformer is trained with dense attention (PyTorch SDPA), then fine-tuned from that checkpoint three ways on the
same batches: (a) dense, continued; (b) its attention replaced by SLA (sagegen.SparseLinearAttention, one per layer,
Proj zero-initialised as the paper does) at 95% sparsity; (c) sparse-only attention at the same sparsity. Writes the
loss curves (JSON, and a PNG when matplotlib is present) and prints the final-loss table. The paper's claim to check:
SLA recovers the dense loss (target: within 2%), sparse-only does not.

The task. A token grid of --grid-h rows by --grid-w columns, flattened row-major, so that with --grid-w equal to the
SLA block (64) every 64-token block is one grid row. Each token carries C = --channels input features
    x[r, c] = m + f(r) + eps[r, c]
m ~ N(0, I) per sample (a global offset), f a smooth random profile down the rows (two sinusoids of random amplitude
and phase, whole periods over the grid, so its grid mean is zero), eps ~ N(0, I) per token. The targets (2C channels
per token) are
    local:  the mean of x over the token's 3x3 neighbourhood (the grid edge: over the neighbours that exist);
    global: the mean of x over the whole grid (the same for every token of a sample).
Local needs sharp attention to 9 tokens in 3 grid rows = 3 of the 80 blocks, which the sparse part covers (k_h = 5%
of 80 blocks = 4 critical blocks, exactly 95% sparsity); global needs every token, which no 4 blocks give (the rows
near a query carry f(r), which the global mean does not): sparse-only attention loses it, SLA's linear branch over
the marginal blocks can carry it. Loss: MSE over all 2C target channels (the PyTorch loss is also reported per half).

Sparse-only. The module has no switch to drop its linear branch; the arm uses the documented equivalent: each layer's
Proj is zero and frozen (weight and bias, requires_grad False), so O = O^s + Proj(O^l) = O^s exactly, with the same
mask prediction and the same critical blocks as SLA, and the backward hands the kernels dO^l = 0.

Precision. Weights f32, the model under bf16 autocast on CUDA; every arm's attention takes q, k, v in f16 (SLA's
kernels take f16 only; the dense arms use SDPA on the same f16 tensors) and Proj runs in f32 on O^l (f32). The
backward uses a fixed loss scale (--loss-scale 128) so that f16 gradients of q, k, v stay clear of subnormals; AdamW
is scale-invariant, the reported losses are unscaled.

Same data for every arm: the batch of step s of a phase is drawn from a generator seeded with (seed, phase, s), the
held-out evaluation set from its own seed; the model's init is seeded too.

--reference replaces sagegen's SLA with a pure-PyTorch implementation of the same formula (as python/sagegen/_sla.py
and python/tests/test_sla_gpu.py document it: block-mean pooled Q.K^T / sqrt(d) per row of blocks, the top
ceil(k_h% * blocks) critical, the bottom floor(k_l% * blocks) negligible, the rest marginal, ties to the lower block;
O^s = softmax over the critical keys, O^l = phi(Q) phi(K)^T V over the marginal keys, normalised, phi = softmax over
the head dim; classes held fixed in the backward). It runs on the CPU; --tiny shrinks everything (grid 80 x 16,
blocks of 8, width 64, 2 layers) so that the whole pipeline runs on 2 cores (3.5 minutes here; a pipeline check, too short to learn the task).

    PYTHONPATH=python python3 bench/sla_finetune.py --out bench/results/sla_finetune       # one H200, ~3-4 min
    python3 bench/sla_finetune.py --reference --tiny --out /tmp/sla_ft_tiny                # CPU, pure PyTorch

Exit status: 0 when SLA's final loss is within --target (2%) of dense and sparse-only is worse than SLA by more than
--margin (5%) of dense; 1 otherwise; 2 when the dense phase did not learn the task (its eval loss above half the loss
of predicting zero), in which case no verdict is drawn.
"""

import argparse
import copy
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ARMS = ("dense", "sla", "sparse_only")


# ---------------------------------------------------------------------------------------------------------------
# The task


def make_batch(batch, grid_h, grid_w, channels, seed, device):
    """(x [B, N, C], y [B, N, 2C]) from a generator seeded with `seed` (the same on every call with that seed)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    m = torch.randn(batch, 1, 1, channels, generator=gen, device=device)
    rows = torch.arange(grid_h, device=device, dtype=torch.float32).view(1, grid_h, 1, 1)
    f = torch.zeros(batch, grid_h, 1, channels, device=device)
    for k in (1, 2):  # whole periods over the grid: the profile's grid mean is zero
        amplitude = torch.randn(batch, 1, 1, channels, generator=gen, device=device) * (1.5 / k)
        phase = torch.rand(batch, 1, 1, channels, generator=gen, device=device) * (2 * math.pi)
        f = f + amplitude * torch.sin(2 * math.pi * k * rows / grid_h + phase)
    eps = torch.randn(batch, grid_h, grid_w, channels, generator=gen, device=device)
    x = m + f + eps  # [B, H, W, C]
    grid = x.permute(0, 3, 1, 2)  # [B, C, H, W]
    local = F.avg_pool2d(grid, 3, stride=1, padding=1, count_include_pad=False).permute(0, 2, 3, 1)
    glob = x.mean(dim=(1, 2), keepdim=True).expand_as(x)
    n = grid_h * grid_w
    return x.reshape(batch, n, channels), torch.cat([local, glob], dim=-1).reshape(batch, n, 2 * channels)


def batch_seed(seed, phase, step):
    return (seed * 1_000_003 + phase * 100_003 + step) % (2 ** 62)


# ---------------------------------------------------------------------------------------------------------------
# SLA in pure PyTorch (--reference)


def critical_blocks(percent, kv_blocks):
    return min(max(math.ceil(percent / 100.0 * kv_blocks * (1 - 1e-9)), 1), kv_blocks)


def negligible_blocks(critical_percent, percent, kv_blocks):
    return min(max(math.floor(percent / 100.0 * kv_blocks * (1 + 1e-9)), 0),
               kv_blocks - critical_blocks(critical_percent, kv_blocks))


class ReferenceSLA(nn.Module):
    """sagegen.SparseLinearAttention's formula in PyTorch: O = O^s + proj(O^l), the classes from block-mean pooled
    Q.K^T (no gradient through them). q, k, v [b, h, n, d] (equal heads); computed in f32, returned in q's dtype."""

    def __init__(self, head_dim, proj, critical_percent, negligible_percent, block=64):
        super().__init__()
        self.head_dim, self.proj, self.block = head_dim, proj, block
        self.critical_percent, self.negligible_percent = critical_percent, negligible_percent
        self.last_classes = None

    def forward(self, q, k, v):
        dtype = q.dtype
        q, k, v = q.float(), k.float(), v.float()
        b, h, n, d = q.shape
        blk = self.block
        if n % blk:
            raise ValueError(f"reference SLA: tokens ({n}) must be a multiple of the block ({blk})")
        nb = n // blk
        with torch.no_grad():
            pooled_q = q.view(b, h, nb, blk, d).mean(3)
            pooled_k = k.view(b, h, nb, blk, d).mean(3)
            logits = pooled_q @ pooled_k.transpose(-1, -2) / math.sqrt(d)
            order = torch.sort(logits, dim=-1, descending=True, stable=True).indices
            rank = torch.empty_like(order)
            rank.scatter_(-1, order, torch.arange(nb, device=q.device).expand_as(order))
            crit = critical_blocks(self.critical_percent, nb)
            negl = negligible_blocks(self.critical_percent, self.negligible_percent, nb)
            classes = torch.zeros_like(rank, dtype=torch.int8)
            classes[rank < crit] = 1
            classes[rank >= nb - negl] = -1
            self.last_classes = classes
            full = classes.repeat_interleave(blk, dim=2).repeat_interleave(blk, dim=3)
            critical_mask, marginal_mask = full == 1, full == 0
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        o_sparse = torch.softmax(scores.masked_fill(~critical_mask, float("-inf")), dim=-1) @ v
        weights = (torch.softmax(q, dim=-1) @ torch.softmax(k, dim=-1).transpose(-1, -2)) * marginal_mask
        denominator = weights.sum(-1, keepdim=True)
        o_linear = torch.where(denominator > 0, (weights @ v) / denominator.clamp_min(1e-30), torch.zeros_like(q))
        return (o_sparse + self.proj(o_linear.to(self.proj.weight.dtype)).float()).to(dtype)


# ---------------------------------------------------------------------------------------------------------------
# The model


def sincos_2d(grid_h, grid_w, dim):
    """DiT's fixed 2D sin-cos position embedding, [H*W, dim] (half the channels for rows, half for columns)."""
    def one(positions, d):
        omega = 1.0 / 10000 ** (torch.arange(d // 2, dtype=torch.float64) / (d // 2))
        angles = positions.double()[:, None] * omega[None]
        return torch.cat([angles.sin(), angles.cos()], dim=1)
    rows = torch.arange(grid_h).repeat_interleave(grid_w)
    cols = torch.arange(grid_w).repeat(grid_h)
    return torch.cat([one(rows, dim // 2), one(cols, dim // 2)], dim=1).float()


class Attention(nn.Module):
    def __init__(self, dim, heads, head_dim):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.qkv = nn.Linear(dim, 3 * heads * head_dim)
        self.out = nn.Linear(heads * head_dim, dim)
        self.core = None  # None: dense; else an SLA module taking [b, h, n, d]

    def forward(self, x):
        b, n, _ = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        attn_dtype = torch.float16 if x.is_cuda else torch.float32
        q, k, v = (t.to(attn_dtype).contiguous() for t in qkv.unbind(0))
        with torch.autocast(device_type=x.device.type, enabled=False):
            if self.core is None:
                if hasattr(F, "scaled_dot_product_attention"):
                    o = F.scaled_dot_product_attention(q, k, v)
                else:  # PyTorch < 2.0 (the CPU reference runs)
                    o = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.head_dim), dim=-1) @ v
            else:
                o = self.core(q, k, v)
        return self.out(o.transpose(1, 2).reshape(b, n, self.heads * self.head_dim).to(x.dtype))


class Block(nn.Module):
    def __init__(self, dim, heads, head_dim, mlp_ratio=4):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, head_dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ToyDiT(nn.Module):
    def __init__(self, channels, grid_h, grid_w, dim, heads, head_dim, layers):
        super().__init__()
        self.embed = nn.Linear(channels, dim)
        self.register_buffer("pos", sincos_2d(grid_h, grid_w, dim), persistent=False)
        self.blocks = nn.ModuleList(Block(dim, heads, head_dim) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 2 * channels)

    def forward(self, x):
        h = self.embed(x) + self.pos
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def install_sla(model, args, sparse_only):
    """Each layer's attention core -> an SLA module whose Proj (Linear(head_dim, head_dim)) starts at zero; frozen
    at zero for sparse-only."""
    for block in model.blocks:
        attn = block.attn
        proj = nn.Linear(attn.head_dim, attn.head_dim).to(next(model.parameters()).device)
        nn.init.zeros_(proj.weight)
        nn.init.zeros_(proj.bias)
        if sparse_only:
            proj.requires_grad_(False)
        if args.reference:
            attn.core = ReferenceSLA(attn.head_dim, proj, args.critical, args.negligible, block=args.block)
        else:
            import sagegen
            attn.core = sagegen.SparseLinearAttention(attn.head_dim, proj, preset=args.preset,
                                                      critical_percent=args.critical,
                                                      negligible_percent=args.negligible)


# ---------------------------------------------------------------------------------------------------------------
# Training


def losses(pred, y, channels):
    err = (pred.float() - y) ** 2
    return err.mean(), err[..., :channels].mean(), err[..., channels:].mean()


def evaluate(model, eval_set, args, autocast):
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64)
    with torch.no_grad(), autocast():
        for x, y in eval_set:
            totals += torch.tensor([float(t) for t in losses(model(x), y, args.channels)], dtype=torch.float64)
    model.train()
    totals /= len(eval_set)
    return {"loss": totals[0].item(), "local": totals[1].item(), "global": totals[2].item()}


def critical_fraction(model):
    fractions = [float((b.attn.core.last_classes == 1).float().mean()) for b in model.blocks
                 if b.attn.core is not None and b.attn.core.last_classes is not None]
    return sum(fractions) / len(fractions) if fractions else None


def train(model, steps, lr, warmup, phase, args, eval_set, autocast, device, label, cosine):
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.95))

    def schedule(step):
        if step < warmup:
            return (step + 1) / warmup
        if not cosine:
            return 1.0
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    curve, evals = [], []
    evals.append({"step": 0, **evaluate(model, eval_set, args, autocast)})
    start = time.time()
    for step in range(steps):
        x, y = make_batch(args.batch, args.grid_h, args.grid_w, args.channels, batch_seed(args.seed, phase, step),
                          device)
        with autocast():
            loss, _, _ = losses(model(x), y, args.channels)
        optimizer.zero_grad(set_to_none=True)
        (loss * args.loss_scale).backward()
        torch.nn.utils.clip_grad_norm_(params, args.clip * args.loss_scale)
        optimizer.step()
        scheduler.step()
        curve.append(float(loss.detach()))  # one sync a step: fine at these sizes
        if not math.isfinite(curve[-1]):
            raise RuntimeError(f"{label}: the loss is {curve[-1]} at step {step}")
        if (step + 1) % args.eval_every == 0 or step + 1 == steps:
            evals.append({"step": step + 1, **evaluate(model, eval_set, args, autocast)})
            print(f"  {label:12s} step {step + 1:5d}  train {sum(curve[-20:]) / len(curve[-20:]):.4f}  "
                  f"eval {evals[-1]['loss']:.4f} (local {evals[-1]['local']:.4f}, global {evals[-1]['global']:.4f})"
                  f"  {time.time() - start:6.1f} s", flush=True)
    return {"train": curve, "eval": evals, "seconds": time.time() - start}


def plot(results, path, dense_steps):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not found: no PNG")
        return None
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    colors = {"dense": "C0", "sla": "C2", "sparse_only": "C3"}

    def smooth(values, width=20):
        out, acc = [], 0.0
        for i, v in enumerate(values):
            acc += v
            if i >= width:
                acc -= values[i - width]
            out.append(acc / min(i + 1, width))
        return out

    pre = results["pretrain"]
    axes[0].plot(range(1, len(pre["train"]) + 1), smooth(pre["train"]), color="k", lw=1, label="dense (phase 1)")
    for arm in ARMS:
        r = results["arms"][arm]
        xs = range(dense_steps + 1, dense_steps + len(r["train"]) + 1)
        axes[0].plot(xs, smooth(r["train"]), color=colors[arm], lw=1, label=arm)
    axes[0].axvline(dense_steps, color="gray", ls=":")
    axes[0].set_yscale("log")
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("train MSE (20-step mean)")
    axes[0].set_title("phase 1 dense, phase 2 from its checkpoint")
    axes[0].legend()
    for arm in ARMS:
        e = results["arms"][arm]["eval"]
        axes[1].plot([p["step"] for p in e], [p["loss"] for p in e], "o-", color=colors[arm], ms=3, label=arm)
    axes[1].set_yscale("log")
    axes[1].set_xlabel("fine-tuning step")
    axes[1].set_ylabel("held-out MSE")
    axes[1].set_title("phase 2, held-out loss")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True, help="folder for sla_finetune.json and sla_finetune.png")
    p.add_argument("--reference", action="store_true", help="pure-PyTorch SLA instead of sagegen's (CPU or GPU)")
    p.add_argument("--tiny", action="store_true", help="a CPU-sized run of the whole pipeline (a few minutes)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grid-h", type=int, default=80)
    p.add_argument("--grid-w", type=int, default=64)
    p.add_argument("--channels", type=int, default=8)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dense-steps", type=int, default=1500, help="phase 1 (K)")
    p.add_argument("--finetune-steps", type=int, default=400, help="phase 2, each arm (M)")
    p.add_argument("--lr", type=float, default=5e-4, help="phase 1 peak (warmup, cosine to a tenth)")
    p.add_argument("--finetune-lr", type=float, default=1e-4, help="phase 2, every arm (warmup, then constant)")
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--finetune-warmup", type=int, default=20)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--loss-scale", type=float, default=128.0)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--preset", default="sla-f16")
    p.add_argument("--critical", type=float, default=5.0, help="k_h %% (5: 4 of 80 blocks, 95%% sparsity)")
    p.add_argument("--negligible", type=float, default=10.0, help="k_l %%")
    p.add_argument("--block", type=int, default=64, help="--reference only: its block (sagegen's is 64)")
    p.add_argument("--target", type=float, default=2.0, help="SLA within this %% of dense")
    p.add_argument("--margin", type=float, default=5.0, help="sparse-only above SLA by this %% of dense")
    args = p.parse_args(argv)
    if args.tiny:
        for name, value in dict(grid_h=80, grid_w=8, block=8, channels=4, dim=64, heads=4, head_dim=16, layers=2,
                                batch=4, dense_steps=60, finetune_steps=20, warmup=10, finetune_warmup=5,
                                eval_every=20, eval_batches=2, lr=2e-3, finetune_lr=5e-4).items():
            if getattr(args, name) == p.get_default(name):
                setattr(args, name, value)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if not args.reference:
        if args.device != "cuda":
            p.error("sagegen's SLA runs on CUDA only: use --reference on the CPU")
        if args.block != 64 and args.block != p.get_default("block"):
            p.error("--block is the reference's; sagegen's SLA blocks are 64")
        args.block = 64
        if args.head_dim not in (64, 128):
            p.error("sagegen's SLA takes head_dim 64 or 128")
    tokens = args.grid_h * args.grid_w
    if tokens % args.block:
        p.error(f"grid {args.grid_h} x {args.grid_w} = {tokens} tokens: not a multiple of the block {args.block}")
    return args


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    os.makedirs(args.out, exist_ok=True)
    tokens = args.grid_h * args.grid_w
    kv_blocks = tokens // args.block
    crit = critical_blocks(args.critical, kv_blocks)
    negl = negligible_blocks(args.critical, args.negligible, kv_blocks)
    sparsity = 100.0 * (1 - crit / kv_blocks)
    print(f"sla_finetune: {'reference (PyTorch) SLA' if args.reference else 'sagegen SLA ' + args.preset} on "
          f"{device}; grid {args.grid_h} x {args.grid_w} = {tokens} tokens, {kv_blocks} blocks of {args.block}: "
          f"{crit} critical, {negl} negligible, {kv_blocks - crit - negl} marginal per row "
          f"(sparsity {sparsity:.2f}%); model {args.layers} x d{args.dim}, {args.heads} heads of {args.head_dim}; "
          f"batch {args.batch}; K {args.dense_steps} dense steps, M {args.finetune_steps} per arm", flush=True)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

        def autocast():
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    else:
        import contextlib

        def autocast():
            return contextlib.nullcontext()

    started = time.time()
    eval_set = [make_batch(args.batch, args.grid_h, args.grid_w, args.channels, batch_seed(args.seed + 7919, 9, i),
                           device) for i in range(args.eval_batches)]
    zero_loss = sum(float((y ** 2).mean()) for _, y in eval_set) / len(eval_set)
    torch.manual_seed(args.seed)
    model = ToyDiT(args.channels, args.grid_h, args.grid_w, args.dim, args.heads, args.head_dim,
                   args.layers).to(device)
    print(f"phase 1: dense (SDPA) for {args.dense_steps} steps; predicting zero scores {zero_loss:.4f}", flush=True)
    pretrain = train(model, args.dense_steps, args.lr, args.warmup, 1, args, eval_set, autocast, device, "dense-pre",
                     cosine=True)
    checkpoint = copy.deepcopy(model.state_dict())
    results = {"config": vars(args), "tokens": tokens, "kv_blocks": kv_blocks, "critical_blocks": crit,
               "negligible_blocks": negl, "sparsity_percent": sparsity, "predict_zero_loss": zero_loss,
               "pretrain": pretrain, "arms": {}}
    for arm in ARMS:
        torch.manual_seed(args.seed + 1)
        arm_model = ToyDiT(args.channels, args.grid_h, args.grid_w, args.dim, args.heads, args.head_dim,
                           args.layers).to(device)
        arm_model.load_state_dict(checkpoint)
        if arm != "dense":
            install_sla(arm_model, args, sparse_only=(arm == "sparse_only"))
        print(f"phase 2: {arm} for {args.finetune_steps} steps", flush=True)
        results["arms"][arm] = train(arm_model, args.finetune_steps, args.finetune_lr, args.finetune_warmup, 2, args,
                                     eval_set, autocast, device, arm, cosine=False)
        results["arms"][arm]["critical_fraction"] = critical_fraction(arm_model)
        del arm_model
    results["seconds"] = time.time() - started

    dense_pre = pretrain["eval"][-1]["loss"]
    final = {arm: results["arms"][arm]["eval"][-1] for arm in ARMS}
    tail = {arm: sum(results["arms"][arm]["train"][-50:]) / len(results["arms"][arm]["train"][-50:]) for arm in ARMS}
    base = final["dense"]["loss"]
    table = {arm: {"eval_loss": final[arm]["loss"], "eval_local": final[arm]["local"],
                   "eval_global": final[arm]["global"], "train_last50": tail[arm],
                   "vs_dense_percent": 100.0 * (final[arm]["loss"] / base - 1.0),
                   "critical_fraction": results["arms"][arm]["critical_fraction"]} for arm in ARMS}
    learned = dense_pre < 0.5 * zero_loss
    sla_ok = table["sla"]["vs_dense_percent"] <= args.target
    sparse_worse = (final["sparse_only"]["loss"] - final["sla"]["loss"]) / base * 100.0 > args.margin
    results.update(table=table, dense_learned=learned, sla_within_target=sla_ok, sparse_only_worse=sparse_worse)
    with open(os.path.join(args.out, "sla_finetune.json"), "w") as f:
        json.dump(results, f, indent=1)
    png = plot(results, os.path.join(args.out, "sla_finetune.png"), args.dense_steps)

    print(f"\nafter phase 1 (dense, {args.dense_steps} steps): held-out {dense_pre:.4f} "
          f"(predicting zero: {zero_loss:.4f})")
    print(f"phase 2, {args.finetune_steps} steps from that checkpoint, sparsity {sparsity:.2f}% "
          f"({crit}/{kv_blocks} blocks critical, {negl} negligible):")
    print(f"{'arm':12s} {'held-out':>9s} {'local':>8s} {'global':>8s} {'train(50)':>10s} {'vs dense':>9s} "
          f"{'critical':>9s}")
    for arm in ARMS:
        t = table[arm]
        cf = "-" if t["critical_fraction"] is None else f"{100 * t['critical_fraction']:.2f}%"
        print(f"{arm:12s} {t['eval_loss']:9.4f} {t['eval_local']:8.4f} {t['eval_global']:8.4f} "
              f"{t['train_last50']:10.4f} {t['vs_dense_percent']:+8.2f}% {cf:>9s}")
    print(f"SLA within {args.target}% of dense: {'yes' if sla_ok else 'NO'}; sparse-only worse than SLA by more than "
          f"{args.margin}% of dense: {'yes' if sparse_worse else 'NO'}; "
          f"{results['seconds']:.0f} s in all; wrote {args.out}/sla_finetune.json" + (f" and {png}" if png else ""))
    if not learned:
        print("the dense phase did not learn the task (held-out loss above half of predicting zero): no verdict")
        return 2
    return 0 if sla_ok and sparse_worse else 1


if __name__ == "__main__":
    sys.exit(main())
