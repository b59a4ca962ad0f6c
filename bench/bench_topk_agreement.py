"""How well the sparse top-K ICT score (what vLLM returns at sampling time) picks the same tokens as the exact one.

For each K, every response keeps its top 10% of positions by u (exact: group_js_divergence over full logits;
sparse: group_js_divergence_topk over each position's top-K log-probs plus one shared tail bucket). Reported per K:
precision = |sel_topk & sel_exact| / |sel_topk| (equal counts, so also recall), Jaccard = |&| / |union|, the
Spearman correlation of the two scores, and the mean |u_topk - u_exact|. Averaged over --seeds.

Synthetic heavy-tailed logits, groups of 8 responses sharing a per-(group, position) base:
- zipf: base = -alpha * log(rank), alpha ~ U(1, 2), ranks a random permutation of the vocabulary;
- student_t: base = scale * t(df=3) noise, scale ~ U(0.3, 1) (larger scales make every row near one-hot);
each response adds sigma * t(df=3) noise with sigma log-uniform in [0.05, 1] per (response, position), so some
responses deviate from the group much more than others.

    .venv/bin/python bench/bench_topk_agreement.py            # V 32768, 4 groups x 8 responses x 100 positions
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

from ictrl.files import atomic_write_json
from ictrl.core.stats import group_js_divergence, group_js_divergence_topk

G = 8


def synth_logits(dist: str, n_groups: int, T: int, V: int, gen: torch.Generator) -> torch.Tensor:
    """[n_groups * G, T, V] float32; responses of a group are adjacent."""
    t3 = torch.distributions.StudentT(3.0)
    if dist == "zipf":
        alpha = 1.0 + torch.rand(n_groups, T, 1, generator=gen)
        ranks = torch.rand(n_groups, T, V, generator=gen).argsort(dim=-1).float() + 1.0
        base = -alpha * ranks.log_()
        del ranks
    else:
        scale = 0.3 + 0.7 * torch.rand(n_groups, T, 1, generator=gen)
        torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
        base = scale * t3.sample((n_groups, T, V))
    sigma = torch.exp(math.log(0.05) + (math.log(1.0) - math.log(0.05)) * torch.rand(n_groups, G, T, 1, generator=gen))
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    logits = t3.sample((n_groups, G, T, V)).mul_(sigma).add_(base.unsqueeze(1))
    return logits.view(n_groups * G, T, V)


def top_fraction(u: torch.Tensor, ratio: float) -> torch.Tensor:
    """[B, T] bool: the top ceil(ratio * T) positions of each response (all positions active here)."""
    k = max(1, math.ceil(ratio * u.shape[1]))
    sel = torch.zeros_like(u, dtype=torch.bool)
    return sel.scatter_(1, u.topk(k, dim=1).indices, True)


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    ra = a.flatten().argsort().argsort().double()
    rb = b.flatten().argsort().argsort().double()
    return float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--v", type=int, default=32768, help="vocabulary size")
    ap.add_argument("--groups", type=int, default=4, help="groups of 8 responses")
    ap.add_argument("--t", type=int, default=100, help="positions per response")
    ap.add_argument("--k", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    ap.add_argument("--dist", nargs="+", default=["zipf", "student_t"], choices=["zipf", "student_t"])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--ratio", type=float, default=0.1, help="fraction selected per response")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "topk_agreement.json")
    args = ap.parse_args()

    rows = []
    for dist in args.dist:
        per_k: dict[int, list[dict]] = {k: [] for k in args.k}
        for seed in range(args.seeds):
            gen = torch.Generator().manual_seed(seed)
            logits = synth_logits(dist, args.groups, args.t, args.v, gen)
            B = logits.shape[0]
            mask = torch.ones(B, args.t, dtype=torch.bool)
            groups = torch.arange(B) // G
            t0 = time.perf_counter()
            u_exact = group_js_divergence(logits, mask, groups)
            t_exact = time.perf_counter() - t0
            sel_exact = top_fraction(u_exact, args.ratio)
            logp = torch.log_softmax(logits, dim=-1)
            del logits
            for k in args.k:
                lp, ids = logp.topk(k, dim=-1)
                t0 = time.perf_counter()
                u = group_js_divergence_topk(lp, ids, mask, groups)
                t_topk = time.perf_counter() - t0
                sel = top_fraction(u, args.ratio)
                inter, union = (sel & sel_exact).sum().item(), (sel | sel_exact).sum().item()
                per_k[k].append({
                    "precision": inter / sel.sum().item(), "jaccard": inter / union,
                    "spearman": spearman(u, u_exact), "mean_abs_diff": float((u - u_exact).abs().mean()),
                    "mean_u_exact": float(u_exact.mean()), "within_response_std_u": float(u_exact.std(dim=1).mean()),
                    "mean_entropy": float(-(logp.exp() * logp).sum(-1).mean()),
                    "tail_mass_mean": float(1 - lp.exp().sum(-1).mean()),
                    "time_exact_s": t_exact, "time_topk_s": t_topk,
                })
            print(f"  {dist} seed {seed} done", file=sys.stderr)
        for k, runs in per_k.items():
            mean = {key: sum(r[key] for r in runs) / len(runs) for key in runs[0]}
            rows.append({"dist": dist, "k": k, "seeds": len(runs), **mean, "runs": runs})

    atomic_write_json(args.out, {"argv": sys.argv[1:], "v": args.v, "groups": args.groups, "t": args.t,
                                 "ratio": args.ratio, "results": rows})
    print(f"V={args.v}, {args.groups} groups x {G} responses x {args.t} positions, top {args.ratio:.0%} per response, "
          f"mean over {args.seeds} seeds")
    print(f"{'dist':>9} {'K':>4} {'precision':>9} {'jaccard':>8} {'spearman':>8} {'mean|du|':>9} {'mean u':>7} "
          f"{'std u':>6} {'H':>5} {'tail':>6}")
    for r in rows:
        print(f"{r['dist']:>9} {r['k']:>4} {r['precision']:>9.3f} {r['jaccard']:>8.3f} {r['spearman']:>8.3f} "
              f"{r['mean_abs_diff']:>9.4f} {r['mean_u_exact']:>7.4f} {r['within_response_std_u']:>6.4f} "
              f"{r['mean_entropy']:>5.2f} {r['tail_mass_mean']:>6.3f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
