#!/usr/bin/env python3
"""Plots bench stack --context's JSON lines (one file per batch size):

    scripts/plot_context.py OUT.svg context-b1.jsonl [context-b8.jsonl ...]

Left: decode step time against context, with the attention and indexer parts
of it (ops timed alone). Right: prefill tokens/s of a chunk ending at that
context. Log-scaled context axis; the format follows OUT's suffix (svg, png).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    fig, (dec, pre) = plt.subplots(1, 2, figsize=(11, 4.2))
    title = ""
    for path in argv[2:]:
        rows = sorted(load(path), key=lambda r: r["context"])
        if not rows:
            continue
        b = rows[0]["batch"]
        title = f'{rows[0]["preset"]}, {rows[0]["layers"]} layers, {rows[0]["device"]}'
        ctx = [r["context"] for r in rows]
        (line,) = dec.plot(ctx, [r["decode_step_ms"] for r in rows], "o-", label=f"step, batch {b}")
        c = line.get_color()
        dec.plot(ctx, [r["attention_ms"] for r in rows], "s--", color=c, alpha=0.7, label=f"attention, batch {b}")
        dec.plot(ctx, [r["indexer_ms"] for r in rows], "^:", color=c, alpha=0.7, label=f"indexer, batch {b}")
        dec.plot(ctx, [r["indexer_floor_ms"] for r in rows], "x", color=c, alpha=0.5, label=f"indexer read floor, batch {b}")
        pre.plot(ctx, [r["prefill_tok_s"] for r in rows], "o-", color=c, label=f"batch {b}")
    for ax in (dec, pre):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.grid(True, which="both", alpha=0.3)
    dec.set_yscale("log")
    dec.set_ylabel("ms per decode step")
    dec.set_title("decode at depth")
    dec.legend(fontsize=7)
    pre.set_ylabel(f'prefill tokens/s ({load(argv[2])[0]["prefill_tokens"]}-token chunk)')
    pre.set_ylim(bottom=0)
    pre.set_title("prefill at depth")
    pre.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(argv[1])
    print("wrote", argv[1])


if __name__ == "__main__":
    main(sys.argv)
