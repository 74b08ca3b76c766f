"""Trains the small DeepSeek-V4 on the token streams of train/prep.
  python3 train/train.py --data DIR --out OUT [--steps N] [--seed S]
writes OUT/config.json, OUT/trained-*.safetensors (fp32, the checkpoint's
tensor names) and OUT/log.jsonl (loss curve). `go run ./cmd/mkmodel --from
OUT --tokenizer DIR/tokenizer.json --out models/small` quantises it into the
release formats. Seeded: a rerun on the same device repeats the loss curve."""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import model as v4  # noqa: E402
import st  # noqa: E402

# The architecture: the engine's small preset (checkpoint.SmallConfig) with
# the trained tokenizer's vocabulary, and index_topk covering every compressed
# entry of a training sequence (the indexer is not trained; see docs/training.md).
CONFIG = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "hidden_size": 256, "num_hidden_layers": 6, "num_attention_heads": 6, "num_key_value_heads": 1,
    "head_dim": 128, "qk_rope_head_dim": 64, "q_lora_rank": 128, "o_lora_rank": 64, "o_groups": 3,
    "sliding_window": 16, "compress_ratios": [0, 4, 128, 4, 128, 4, 0],
    "rope_theta": 10000, "compress_rope_theta": 160000,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "index_n_heads": 4, "index_head_dim": 64, "index_topk": 64,
    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
    "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": True,
    "routed_scaling_factor": 1.5, "num_hash_layers": 2, "swiglu_limit": 10.0,
    "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
    "num_nextn_predict_layers": 1, "bos_token_id": 0, "eos_token_id": 1,
    "max_position_embeddings": 1048576, "expert_dtype": "fp4",
}


def batches(tokens, starts, seq, batch, gen):
    """Random windows of seq+1 tokens, each starting at a document's BOS."""
    while True:
        idx = starts[torch.randint(len(starts), (batch,), generator=gen)]
        yield torch.stack([tokens[i: i + seq + 1] for i in idx.tolist()])


def doc_starts(tokens, seq):
    s = torch.nonzero(tokens == 0).flatten()
    return s[s + seq + 1 <= len(tokens)]


def evaluate(m, tokens, seq, device, limit):
    """Mean next-token loss over consecutive documents' windows (up to limit tokens)."""
    m.eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, min(len(tokens), limit) - seq - 1, seq):
            x = tokens[i: i + seq + 1][None].to(device)
            logits = m(x[:, :-1])
            total += F.cross_entropy(logits[0], x[0, 1:], reduction="sum").item()
            n += seq
    m.train()
    return total / max(n, 1)


def balance(m, rate):
    """Auxiliary-loss-free load balancing (noaux_tc): nudge each router bias
    towards the experts that got fewer tokens in the last step."""
    for layer in list(m.layers) + list(m.mtp):
        moe = layer.ffn
        if moe.hashed or moe.load is None:
            continue
        with torch.no_grad():
            moe.gate.bias += rate * torch.sign(moe.load.mean() - moe.load)


def export(m, cfg, out, shard=12 << 20):
    """OUT/trained-NNNNN.safetensors (fp32, shards of at most `shard` bytes) and OUT/config.json."""
    os.makedirs(out, exist_ok=True)
    shards, cur, size = [], {}, 0
    for name, p in list(m.named_parameters()) + list(m.named_buffers()):
        v = p.detach().cpu().numpy().astype(np.int64 if name.endswith("tid2eid") else np.float32)
        if cur and size + v.nbytes > shard:
            shards.append(cur)
            cur, size = {}, 0
        cur[name] = v
        size += v.nbytes
    shards.append(cur)
    for i, t in enumerate(shards):
        st.write(os.path.join(out, f"trained-{i + 1:05d}.safetensors"), t, {"producer": "megamoe train/train.py"})
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-tokens", type=int, default=200_000, help="held-out tokens evaluated at the end")
    ap.add_argument("--minutes", type=float, default=0, help="stop after this many minutes (0 = no limit)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    tok = json.load(open(os.path.join(a.data, "tokenizer.json")))
    vocab = max(max(tok["model"]["vocab"].values()), max(t["id"] for t in tok["added_tokens"])) + 1
    cfg = dict(CONFIG, vocab_size=vocab)
    m = v4.Model(v4.Config(cfg)).to(a.device)
    train = torch.from_numpy(np.fromfile(os.path.join(a.data, "train.bin"), np.uint16).astype(np.int64))
    held = torch.from_numpy(np.fromfile(os.path.join(a.data, "heldout.bin"), np.uint16).astype(np.int64))
    data = batches(train, doc_starts(train, a.seq), a.seq, a.batch, gen)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=a.lr, betas=(0.9, 0.95),
                            weight_decay=0.1)
    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, "log.jsonl"), "w")
    t0 = time.time()
    steps = a.steps
    step = 0
    while step < steps:
        if a.minutes and step == 20:
            # --minutes: fix the step count from the speed of the first 20
            # steps; the log records it, and --steps N reruns the same schedule.
            steps = min(a.steps, int(20 + (60 * a.minutes - (time.time() - t0)) / ((time.time() - t0) / 20)))
        warm = max(1, min(200, steps // 10))
        lr = a.lr * min(1, (step + 1) / warm) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for g in opt.param_groups:
            g["lr"] = lr
        x = next(data).to(a.device)
        with torch.autocast(device_type="cuda" if a.device.startswith("cuda") else "cpu", dtype=torch.bfloat16, enabled=a.device.startswith("cuda")):
            logits, mtp = m(x[:, :-1], mtp=True)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten())
            lm = F.cross_entropy(mtp.flatten(0, 1).float(), x[:, 2:].flatten())
        opt.zero_grad(set_to_none=True)
        (loss + a.mtp_weight * lm).backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        balance(m, 1e-3)
        step += 1
        if step % 50 == 1 or step == steps:
            rec = {"step": step - 1, "loss": round(loss.item(), 4), "mtp_loss": round(lm.item(), 4),
                   "lr": lr, "tokens": step * a.batch * a.seq, "s": round(time.time() - t0, 1)}
            print(json.dumps(rec), flush=True)
            log.write(json.dumps(rec) + "\n")
            log.flush()
    held_loss = evaluate(m.float(), held, a.seq, a.device, a.eval_tokens)
    rec = {"heldout_loss": round(held_loss, 4), "heldout_ppl": round(math.exp(held_loss), 3),
           "steps": step, "tokens": step * a.batch * a.seq, "seconds": round(time.time() - t0)}
    print(json.dumps(rec))
    log.write(json.dumps(rec) + "\n")
    export(m, cfg, a.out)


if __name__ == "__main__":
    main()
