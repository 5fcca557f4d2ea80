#!/usr/bin/env python3
"""PyTorch beside Spillway: the GPT of examples/gpt (same layers, width, heads, vocabulary, batch,
sequence; fp32, no TF32; Adam as the example's) trained three ways, each with its CUDA memory
capped at the device budget Spillway gets (torch.cuda.set_per_process_memory_fraction):

  resident     everything on the GPU
  checkpoint   torch.utils.checkpoint around every block (activations recomputed in backward)
  save_on_cpu  torch.autograd.graph.save_on_cpu(pin_memory=True) (activations in pinned host memory)

Prints tokens/s for each, or "does not fit", and writes them as JSON. Where torch or a GPU is
missing it prints SKIP with the reason, writes that, and exits 0. Used by bench/gpu_check.
"""
import argparse
import json
import math
import sys
import time


def write(path, doc):
    if path:
        with open(path, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")


def skip(args, reason):
    print(f"SKIP pytorch peers: {reason}")
    write(args.json, {"skipped": True, "reason": reason})
    return 0


def build_model(torch, shape):
    nn = torch.nn
    F = torch.nn.functional
    C, H, T, V, L = shape["channels"], shape["heads"], shape["seq"], shape["vocab"], shape["layers"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(C)
            self.qkv = nn.Linear(C, 3 * C)
            self.proj = nn.Linear(C, C)
            self.ln2 = nn.LayerNorm(C)
            self.fc = nn.Linear(C, 4 * C)
            self.fcproj = nn.Linear(4 * C, C)

        def forward(self, x):
            B = x.shape[0]
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(B, T, C))
            return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, C)
            self.wpe = nn.Embedding(T, C)
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.lnf = nn.LayerNorm(C)
            self.checkpoint = False
            nn.init.normal_(self.wte.weight, std=0.02)
            nn.init.normal_(self.wpe.weight, std=0.01)
            for b in self.blocks:
                for lin in (b.qkv, b.fc):
                    nn.init.normal_(lin.weight, std=0.02)
                for lin in (b.proj, b.fcproj):
                    nn.init.normal_(lin.weight, std=0.02 / math.sqrt(2 * L))
                for lin in (b.qkv, b.proj, b.fc, b.fcproj):
                    nn.init.zeros_(lin.bias)

        def forward(self, idx, targets):
            pos = torch.arange(T, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for b in self.blocks:
                if self.checkpoint:
                    x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False)
                else:
                    x = b(x)
            logits = self.lnf(x) @ self.wte.weight.t()  # the head shares the embedding, as the example's
            return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))

    return GPT()


def run_variant(torch, shape, variant, fraction, steps, warmup):
    """Tokens/s of one variant under the cap, or None with the reason it did not fit."""
    dev = torch.device("cuda")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(fraction, 0)
    model = opt = None
    try:
        torch.manual_seed(1)
        model = build_model(torch, shape).to(dev)
        model.checkpoint = variant == "checkpoint"
        try:
            opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, fused=True)
        except (TypeError, RuntimeError):
            opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
        B, T, V = shape["batch"], shape["seq"], shape["vocab"]
        g = torch.Generator(device="cpu").manual_seed(1)
        data = torch.randint(0, V, (steps + warmup, B, T + 1), generator=g)
        losses = []

        def step(i):
            batch = data[i].to(dev, non_blocking=True)
            idx, tgt = batch[:, :-1], batch[:, 1:]
            if variant == "save_on_cpu":
                with torch.autograd.graph.save_on_cpu(pin_memory=True):
                    loss = model(idx, tgt)
            else:
                loss = model(idx, tgt)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        for i in range(warmup):
            step(i)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(steps):
            losses.append(step(warmup + i))
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        return {"variant": variant, "fits": True, "tokens_per_s": steps * B * T / seconds,
                "step_ms": 1000 * seconds / steps, "peak_bytes": torch.cuda.max_memory_allocated(),
                "reserved_peak_bytes": torch.cuda.max_memory_reserved(),
                "last_loss": float(losses[-1])}
    except torch.cuda.OutOfMemoryError as e:
        return {"variant": variant, "fits": False, "reason": "does not fit: " + str(e).splitlines()[0][:200],
                "peak_bytes": torch.cuda.max_memory_allocated()}
    finally:
        del model, opt
        torch.cuda.empty_cache()
        if fraction is not None:
            torch.cuda.set_per_process_memory_fraction(1.0, 0)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", required=True, help="JSON from spillway-bench gpt-shape")
    p.add_argument("--budget-bytes", type=int, required=True, help="the device budget Spillway gets")
    p.add_argument("--steps", type=int, default=6, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--uncapped", action="store_true", help="also time everything resident without a cap")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    shape = json.load(open(args.shape))
    try:
        import torch
        import torch.utils.checkpoint  # noqa: F401: torch.utils.checkpoint.checkpoint below
    except Exception as e:  # noqa: BLE001: any import failure means no peer here
        return skip(args, f"torch cannot be imported ({type(e).__name__}: {e})")
    if not torch.cuda.is_available():
        return skip(args, f"torch {torch.__version__} sees no GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = min(1.0, args.budget_bytes / total)
    tokens = shape["batch"] * shape["seq"]
    print(f"pytorch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}) on "
          f"{torch.cuda.get_device_name(0)}; GPT {shape['layers']} layers x {shape['channels']}, {shape['heads']} heads, "
          f"vocab {shape['vocab']}, batch {shape['batch']} x {shape['seq']} tokens, fp32")
    print(f"memory capped at {args.budget_bytes / 2**20:.0f} MiB ({fraction:.4f} of {total / 2**30:.1f} GiB)")
    rows = []
    for variant in ("resident", "checkpoint", "save_on_cpu"):
        r = run_variant(torch, shape, variant, fraction, args.steps, args.warmup)
        r["capped"] = True
        rows.append(r)
        print(f"  {variant:12} " + (f"{r['tokens_per_s']:12.0f} tokens/s  ({r['step_ms']:.1f} ms/step, peak "
                                    f"{r['peak_bytes'] / 2**20:.0f} MiB)" if r["fits"] else r["reason"]))
    if args.uncapped:
        r = run_variant(torch, shape, "resident", None, args.steps, args.warmup)
        r["capped"] = False
        rows.append(r)
        if r["fits"]:
            print(f"  {'(no cap)':12} {r['tokens_per_s']:12.0f} tokens/s  ({r['step_ms']:.1f} ms/step, peak "
                  f"{r['peak_bytes'] / 2**20:.0f} MiB): everything resident without a budget")
    fitting = [r for r in rows if r["capped"] and r["fits"]]
    best = max(fitting, key=lambda r: r["tokens_per_s"]) if fitting else None
    write(args.json, {"skipped": False, "torch": torch.__version__, "cuda": torch.version.cuda,
                      "device": torch.cuda.get_device_name(0), "budget_bytes": args.budget_bytes,
                      "memory_fraction": fraction, "tokens_per_step": tokens, "shape": shape, "rows": rows,
                      "best_fitting": best})
    return 0


if __name__ == "__main__":
    sys.exit(main())
