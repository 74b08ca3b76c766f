"""Engine vs trainer: the Go engine's exact-numerics logits (cmd/generate
--dump-logits) against train/model.py on the same checkpoint and tokens.
  python3 train/parity.py [--model DIR] [--tokens N] [--steps N] [--chunk N]
DIR defaults to the embedded small model (models/small). Exit status 1 when
the max relative error exceeds --tol (1e-4)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
import model as v4  # noqa: E402
import st  # noqa: E402


def load(d):
    """The trainer's model with the checkpoint's weights, dequantised to fp32."""
    cfg = v4.Config(json.load(open(os.path.join(d, "config.json"))))
    m = v4.Model(cfg)
    t = st.read_dir(d)
    state = {}
    for name, p in list(m.named_parameters()) + list(m.named_buffers()):
        if name.endswith(".weight") and name[: -len(".weight")] + ".scale" in t:
            v = st.linear(t, name[: -len(".weight")])
        elif name in t:
            v = st.plain(*t[name])
        else:
            raise KeyError(f"{name}: not in the checkpoint")
        if tuple(v.shape) != tuple(p.shape):
            raise ValueError(f"{name}: checkpoint shape {v.shape}, model {tuple(p.shape)}")
        state[name] = torch.from_numpy(np.ascontiguousarray(v))
    extra = set(t) - set(state) - {n[: -len(".weight")] + ".scale" for n in state}
    if extra:
        raise KeyError(f"checkpoint tensors the trainer does not know: {sorted(extra)[:5]}")
    m.load_state_dict(state)
    return m.eval()


def engine_logits(d, tokens, steps, chunk):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.safetensors")
        cmd = ["go", "run", "./cmd/generate", "--numerics", "exact", "--model", d,
               "--tokens", ",".join(map(str, tokens)), "--steps", str(steps),
               "--chunk", str(chunk), "--dump-logits", out]
        subprocess.run(cmd, cwd=root, check=True, stdout=subprocess.DEVNULL)
        t = st.read(out)
        return st.plain(*t["logits"]), st.plain(*t["tokens"])


def main():
    ap = argparse.ArgumentParser()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--model", default=os.path.join(root, "models", "small"))
    ap.add_argument("--tokens", type=int, default=300, help="prompt length (random ids, seeded)")
    ap.add_argument("--steps", type=int, default=8, help="greedy decode steps after the prompt")
    ap.add_argument("--chunk", type=int, default=0, help="engine prefill chunk (0 = whole prompt)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    m = load(a.model)
    rng = np.random.default_rng(a.seed)
    prompt = [0] + rng.integers(2, m.c.vocab, a.tokens - 1).tolist()
    want, toks = engine_logits(a.model, prompt, a.steps, a.chunk)
    with torch.no_grad():
        got = m(torch.from_numpy(toks)[None])[0].numpy()
    err = np.abs(got - want).max() / np.abs(want).max()
    agree = (got.argmax(-1) == want.argmax(-1)).mean()
    print(f"{len(toks)} positions, vocab {want.shape[1]}: max |Δ| / max |logit| = {err:.3g}, argmax agreement {agree:.4f}")
    rows = np.abs(got - want).max(-1) / np.abs(want).max()
    worst = int(rows.argmax())
    print(f"worst position {worst}: {rows[worst]:.3g}")
    return 0 if err <= a.tol else 1


if __name__ == "__main__":
    sys.exit(main())
