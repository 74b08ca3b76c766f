"""Held-out perplexity through the trainer's model, for comparing with the
engine's (`generate --perplexity`) and for the cost of quantisation:
  python3 train/ppl.py --model DIR [--trained RUN] --tokens FILE.bin [--limit N]
DIR is a checkpoint in the release formats (dequantised exactly); RUN, if
given, is train/train.py's fp32 output, evaluated too."""
import argparse
import glob
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import model as v4  # noqa: E402
import parity  # noqa: E402
import st  # noqa: E402


def trained(run):
    cfg = v4.Config(json.load(open(os.path.join(run, "config.json"))))
    m = v4.Model(cfg)
    t = {}
    for p in sorted(glob.glob(os.path.join(run, "trained-*.safetensors"))):
        t.update(st.read(p))
    m.load_state_dict({k: torch.from_numpy(st.plain(*v)) for k, v in t.items()})
    return m.eval()


def loss(m, ids, window):
    total, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(ids) - window - 1, window):
            x = torch.from_numpy(ids[i: i + window + 1].astype(np.int64))[None]
            total += F.cross_entropy(m(x[:, :-1])[0], x[0, 1:], reduction="sum").item()
            n += window
    return total / n, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--trained")
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--limit", type=int, default=20000)
    ap.add_argument("--window", type=int, default=256)
    a = ap.parse_args()
    ids = np.fromfile(a.tokens, np.uint16)[: a.limit]
    models = [("checkpoint", parity.load(a.model))]
    if a.trained:
        models.append(("trained fp32", trained(a.trained)))
    for name, m in models:
        l, n = loss(m, ids, a.window)
        print(f"{name}: tokens {n}, loss {l:.4f}, perplexity {math.exp(l):.3f}")


if __name__ == "__main__":
    main()
