"""DeepSeek-V4 in PyTorch for training a small model, written from
docs' model specification (shared spec dsv4.md). It computes the engine's
`exact` numerics: the same function in fp32, no FP8/FP4 rounding simulation.
Parameters carry the checkpoint's tensor names (spec §8), so export is a
rename-free dump. Sequences always start at position 0 (training and the
parity check): the compressor pools whole windows of the given tokens."""
import math

import torch
import torch.nn.functional as F
from torch import nn


class Config:
    """The config.json fields the model reads (HF names, spec §1.2)."""

    def __init__(self, j):
        self.dim = j["hidden_size"]
        self.layers = j["num_hidden_layers"]
        self.heads = j["num_attention_heads"]
        self.head_dim = j["head_dim"]
        self.rope_dim = j["qk_rope_head_dim"]
        self.q_lora = j["q_lora_rank"]
        self.o_lora = j["o_lora_rank"]
        self.o_groups = j["o_groups"]
        self.window = j["sliding_window"]
        self.ratios = j["compress_ratios"]
        self.rope_theta = j["rope_theta"]
        self.compress_theta = j["compress_rope_theta"]
        self.yarn = j.get("rope_scaling")
        self.index_heads = j["index_n_heads"]
        self.index_dim = j["index_head_dim"]
        self.index_topk = j["index_topk"]
        self.experts = j["n_routed_experts"]
        self.topk = j["num_experts_per_tok"]
        self.inter = j["moe_intermediate_size"]
        self.route_scale = j["routed_scaling_factor"]
        self.hash_layers = j["num_hash_layers"]
        self.swiglu_limit = j["swiglu_limit"]
        self.hc = j["hc_mult"]
        self.sinkhorn = j["hc_sinkhorn_iters"]
        self.hc_eps = j["hc_eps"]
        self.eps = j["rms_norm_eps"]
        self.mtp_layers = j.get("num_nextn_predict_layers", 0)
        self.vocab = j["vocab_size"]

    def ratio(self, i):
        return self.ratios[i] if i < len(self.ratios) else 0


def rms_norm(x, w, eps):
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x if w is None else x * w


def rope_table(c, ratio, n):
    """cos, sin [n, rope_dim/2] for positions 0..n-1 (float64 math, spec §5.2)."""
    r = c.rope_dim
    base = c.rope_theta if ratio == 0 else c.compress_theta
    p = torch.arange(r // 2, dtype=torch.float64)
    f = base ** (-2 * p / r)
    y = c.yarn
    if ratio != 0 and y and y.get("original_max_position_embeddings", 0) > 0:
        def corr(nrot):
            return r * math.log(y["original_max_position_embeddings"] / (nrot * 2 * math.pi)) / (2 * math.log(base))
        low = max(math.floor(corr(y["beta_fast"])), 0)
        high = min(math.ceil(corr(y["beta_slow"])), r - 1)
        hi = high + 0.001 if low == high else high
        ramp = ((p - low) / (hi - low)).clamp(0, 1)
        f = f * (1 - ramp) + f / y["factor"] * ramp
    ang = torch.arange(n, dtype=torch.float64)[:, None] * f[None]
    return torch.cos(ang), torch.sin(ang)


def rope(x, cos, sin, inverse=False):
    """Interleaved-pair rotation of the last 2·cos.shape[-1] dims of x [B, T, (heads,) D];
    cos/sin [T, R/2] broadcast over batch and heads."""
    r = 2 * cos.shape[-1]
    keep, rot = x[..., :-r], x[..., -r:]
    a, b = rot[..., 0::2], rot[..., 1::2]
    shape = (cos.shape[0],) + (1,) * (a.dim() - 3) + (cos.shape[1],)
    cos, sin = cos.view(shape), sin.view(shape)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if inverse:
        sin = -sin
    out = torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)
    return torch.cat([keep, out], -1)


def hadamard(x):
    """x·H_n·n^(-1/2) over the last dim (Sylvester order, spec §3.3)."""
    n = x.shape[-1]
    h = torch.ones(1, 1, dtype=x.dtype, device=x.device)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return x @ h * n ** -0.5


class Linear(nn.Module):
    def __init__(self, out, inp):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out, inp) / math.sqrt(inp))

    def forward(self, x):
        return x @ self.weight.t()


class Norm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class HC(nn.Module):
    """One mHC site (spec §4): hc_{site}_fn/base/scale as plain parameters of the block."""

    @staticmethod
    def params(block, site, c):
        n = c.hc
        mix = (2 + n) * n
        setattr(block, f"hc_{site}_fn", nn.Parameter(torch.randn(mix, n * c.dim) * 0.5 / math.sqrt(n * c.dim)))
        base = torch.zeros(mix)
        base[:n] = -1.1
        base[2 * n + torch.arange(n) * (n + 1)] = 2.0
        setattr(block, f"hc_{site}_base", nn.Parameter(base))
        setattr(block, f"hc_{site}_scale", nn.Parameter(torch.full((3,), 0.75)))


def hc_pre(X, fn, base, scale, c):
    """X [B,T,n,d] → (a [B,T,d], post [B,T,n], C [B,T,n,n])."""
    n = c.hc
    x = X.flatten(-2)
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.eps)
    m = (x @ fn.t()) * r
    pre = torch.sigmoid(m[..., :n] * scale[0] + base[:n]) + c.hc_eps
    post = 2 * torch.sigmoid(m[..., n:2 * n] * scale[1] + base[n:2 * n])
    C = (m[..., 2 * n:] * scale[2] + base[2 * n:]).unflatten(-1, (n, n))
    C = torch.softmax(C, -1) + c.hc_eps
    C = C / (C.sum(-2, keepdim=True) + c.hc_eps)
    for _ in range(c.sinkhorn - 1):
        C = C / (C.sum(-1, keepdim=True) + c.hc_eps)
        C = C / (C.sum(-2, keepdim=True) + c.hc_eps)
    a = (pre.unsqueeze(-1) * X).sum(-2)
    return a, post, C


def hc_post(o, X, post, C):
    return post.unsqueeze(-1) * o.unsqueeze(-2) + torch.einsum("...jk,...jd->...kd", C, X)


def hc_head(X, fn, base, scale, c):
    x = X.flatten(-2)
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.eps)
    pre = torch.sigmoid((x @ fn.t()) * r * scale[0] + base) + c.hc_eps
    return (pre.unsqueeze(-1) * X).sum(-2)


class Compressor(nn.Module):
    """Pools r tokens (r = 4: overlapping windows, c = 2) into one entry (spec §5.4)."""

    def __init__(self, c, ratio, out):
        super().__init__()
        self.ratio, self.out, self.cc = ratio, out, 2 if ratio == 4 else 1
        self.wkv = Linear(self.cc * out, c.dim)
        self.wgate = Linear(self.cc * out, c.dim)
        self.ape = nn.Parameter(torch.randn(ratio, self.cc * out) * 0.1)
        self.norm = Norm(out, c.eps)

    def forward(self, a, cos, sin):
        """a [B,T,d] → entries [B,T//r,out], roped at position j·r."""
        B, T, _ = a.shape
        r, d = self.ratio, self.out
        n = T // r
        if n == 0:
            return a.new_zeros(B, 0, d)
        A = self.wkv(a[:, : n * r]).view(B, n, r, self.cc * d)
        Z = self.wgate(a[:, : n * r]).view(B, n, r, self.cc * d) + self.ape
        if self.cc == 2:  # slots: "a" halves of window j-1, then "b" halves of window j
            Aa = F.pad(A[:, :-1, :, :d], (0, 0, 0, 0, 1, 0))
            Za = F.pad(Z[:, :-1, :, :d], (0, 0, 0, 0, 1, 0), value=float("-inf"))
            A = torch.cat([Aa, A[..., d:]], 2)
            Z = torch.cat([Za, Z[..., d:]], 2)
        u = (torch.softmax(Z, 2) * A).sum(2)
        e = self.norm(u)
        return rope(e, cos[0: n * r: r], sin[0: n * r: r])


class Indexer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wq_b = Linear(c.index_heads * c.index_dim, c.q_lora)
        self.weights_proj = Linear(c.index_heads, c.dim)
        self.compressor = Compressor(c, 4, c.index_dim)
        self.c = c

    def forward(self, a, qr, cos, sin):
        """Scores [B,T,T//4] of every compressed entry for every query (unmasked)."""
        c = self.c
        B, T, _ = a.shape
        q = self.wq_b(qr).view(B, T, c.index_heads, c.index_dim)
        q = hadamard(rope(q, cos[:T], sin[:T]))
        k = hadamard(self.compressor(a, cos, sin))
        w = self.weights_proj(a) * (c.index_dim ** -0.5 * c.index_heads ** -0.5)
        d = torch.relu(torch.einsum("bthi,bji->bthj", q, k))
        return (d * w.unsqueeze(-1)).sum(2)


class Attention(nn.Module):
    def __init__(self, c, ratio):
        super().__init__()
        self.c, self.ratio = c, ratio
        self.wq_a = Linear(c.q_lora, c.dim)
        self.q_norm = Norm(c.q_lora, c.eps)
        self.wq_b = Linear(c.heads * c.head_dim, c.q_lora)
        self.wkv = Linear(c.head_dim, c.dim)
        self.kv_norm = Norm(c.head_dim, c.eps)
        self.wo_a = Linear(c.o_groups * c.o_lora, c.heads // c.o_groups * c.head_dim)
        self.wo_b = Linear(c.dim, c.o_groups * c.o_lora)
        self.attn_sink = nn.Parameter(torch.zeros(c.heads))
        if ratio:
            self.compressor = Compressor(c, ratio, c.head_dim)
        if ratio == 4:
            self.indexer = Indexer(c)

    def forward(self, a, cos, sin):
        c, r = self.c, self.ratio
        B, T, _ = a.shape
        H, D = c.heads, c.head_dim
        qr = self.q_norm(self.wq_a(a))
        q = rms_norm(self.wq_b(qr).view(B, T, H, D), None, c.eps)
        q = rope(q, cos[:T], sin[:T])
        kv = rope(self.kv_norm(self.wkv(a)), cos[:T], sin[:T])
        t = torch.arange(T, device=a.device)
        keys, masks = [kv], [(t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - c.window)]
        if r:
            e = self.compressor(a, cos, sin)
            j = torch.arange(e.shape[1], device=a.device)
            vis = (j[None, :] + 1) * r - 1 <= t[:, None]  # [T, n]
            vis = vis.expand(B, T, -1)
            if r == 4 and e.shape[1] > 0:
                s = self.indexer(a, qr, cos, sin).masked_fill(~vis, float("-inf"))
                k = min(c.index_topk, e.shape[1])
                order = torch.sort(s, dim=-1, descending=True, stable=True).indices[..., :k]
                sel = torch.zeros_like(vis).scatter_(-1, order, True)
                vis = vis & sel
            keys.append(e)
            masks.append(vis)
        else:
            masks[0] = masks[0].expand(B, T, T)
        K = torch.cat(keys, 1)  # [B, S, D]
        M = torch.cat([m.expand(B, T, -1) for m in masks], -1)  # [B, T, S]
        s = torch.einsum("bthd,bsd->bhts", q, K) * D ** -0.5
        s = s.masked_fill(~M[:, None], float("-inf"))
        sink = self.attn_sink.view(1, H, 1, 1).expand(B, H, T, 1)
        p = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1]
        o = torch.einsum("bhts,bsd->bthd", p, K)
        o = rope(o, cos[:T], sin[:T], inverse=True)
        G = c.o_groups
        o = o.reshape(B, T, G, H // G * D)
        wa = self.wo_a.weight.view(G, c.o_lora, H // G * D)
        z = torch.einsum("btgi,goi->btgo", o, wa).flatten(-2)
        return self.wo_b(z)


class Expert(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.w1 = Linear(c.inter, c.dim)
        self.w2 = Linear(c.dim, c.inter)
        self.w3 = Linear(c.inter, c.dim)


class Gate(nn.Module):
    def __init__(self, c, hashed):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(c.experts, c.dim) / math.sqrt(c.dim))
        if hashed:
            self.register_buffer("tid2eid", torch.stack([torch.randperm(c.experts)[: c.topk] for _ in range(c.vocab)]))
        else:
            self.bias = nn.Parameter(torch.zeros(c.experts))


class MoE(nn.Module):
    def __init__(self, c, hashed):
        super().__init__()
        self.c, self.hashed = c, hashed
        self.gate = Gate(c, hashed)
        self.experts = nn.ModuleList(Expert(c) for _ in range(c.experts))
        self.shared_experts = Expert(c)
        self.load = None  # tokens per expert in the last forward (load balancing)

    def swiglu(self, e, f, w=None):
        L = self.c.swiglu_limit
        g, u = e.w1(f), e.w3(f)
        if L > 0:
            u, g = u.clamp(-L, L), g.clamp(max=L)
        h = F.silu(g) * u
        return e.w2(h if w is None else h * w)

    def forward(self, f, tokens):
        c = self.c
        s = torch.sqrt(F.softplus(f @ self.gate.weight.t()))
        if self.hashed:
            idx = self.gate.tid2eid[tokens]
        else:
            idx = torch.sort(s + self.gate.bias, dim=-1, descending=True, stable=True).indices[..., : c.topk]
        w = s.gather(-1, idx)
        w = w / w.sum(-1, keepdim=True) * c.route_scale
        dense = torch.zeros_like(s).scatter_(-1, idx, w)  # [B,T,E]
        self.load = (dense != 0).flatten(0, -2).sum(0).float().detach()
        y = self.swiglu(self.shared_experts, f)
        for i, e in enumerate(self.experts):
            wi = dense[..., i: i + 1]
            if self.training or bool((wi != 0).any()):
                y = y + self.swiglu(e, f, wi)
        return y


class Block(nn.Module):
    def __init__(self, c, layer, ratio, hashed):
        super().__init__()
        self.c, self.ratio = c, ratio
        HC.params(self, "attn", c)
        HC.params(self, "ffn", c)
        self.attn_norm = Norm(c.dim, c.eps)
        self.ffn_norm = Norm(c.dim, c.eps)
        self.attn = Attention(c, ratio)
        self.ffn = MoE(c, hashed)

    def forward(self, X, tokens, cos, sin):
        c = self.c
        a, post, C = hc_pre(X, self.hc_attn_fn, self.hc_attn_base, self.hc_attn_scale, c)
        X = hc_post(self.attn(self.attn_norm(a), cos, sin), X, post, C)
        f, post, C = hc_pre(X, self.hc_ffn_fn, self.hc_ffn_base, self.hc_ffn_scale, c)
        return hc_post(self.ffn(self.ffn_norm(f), tokens), X, post, C)


class MTP(Block):
    def __init__(self, c, layer):
        super().__init__(c, layer, 0, False)
        self.e_proj = Linear(c.dim, c.dim)
        self.h_proj = Linear(c.dim, c.dim)
        self.enorm = Norm(c.dim, c.eps)
        self.hnorm = Norm(c.dim, c.eps)
        self.norm = Norm(c.dim, c.eps)
        self.hc_head_fn = nn.Parameter(torch.randn(c.hc, c.hc * c.dim) * 0.5 / math.sqrt(c.hc * c.dim))
        self.hc_head_base = nn.Parameter(torch.full((c.hc,), -1.1))
        self.hc_head_scale = nn.Parameter(torch.full((1,), 0.75))


class Model(nn.Module):
    def __init__(self, c, max_len=4096):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.dim)
        self.layers = nn.ModuleList(Block(c, i, c.ratio(i), i < c.hash_layers) for i in range(c.layers))
        self.mtp = nn.ModuleList(MTP(c, c.layers + i) for i in range(c.mtp_layers))
        self.norm = Norm(c.dim, c.eps)
        self.head = Linear(c.vocab, c.dim)
        self.hc_head_fn = nn.Parameter(torch.randn(c.hc, c.hc * c.dim) * 0.5 / math.sqrt(c.hc * c.dim))
        self.hc_head_base = nn.Parameter(torch.full((c.hc,), -1.1))
        self.hc_head_scale = nn.Parameter(torch.full((1,), 0.75))
        self.max_len = max_len
        self._ropes = {}

    def ropes(self, ratio, T, device):
        key = (0 if ratio == 0 else 1, device)
        if key not in self._ropes or self._ropes[key][0].shape[0] < T:
            cos, sin = rope_table(self.c, ratio, max(T, self.max_len))
            self._ropes[key] = (cos.float().to(device), sin.float().to(device))
        return self._ropes[key]

    def logits(self, X, block=None):
        src = self if block is None else block
        norm = self.norm if block is None else block.norm
        y = hc_head(X, src.hc_head_fn, src.hc_head_base, src.hc_head_scale, self.c)
        return self.head(norm(y))

    def forward(self, tokens, mtp=False):
        """tokens [B,T] from position 0 → logits [B,T,V] (and the MTP logits
        [B,T-1,V] for token t+2 at position t when mtp)."""
        c = self.c
        T = tokens.shape[1]
        X = self.embed(tokens).unsqueeze(-2).expand(-1, -1, c.hc, -1)
        for i, layer in enumerate(self.layers):
            cos, sin = self.ropes(layer.ratio, T, tokens.device)
            X = layer(X, tokens, cos, sin)
        out = self.logits(X)
        if not mtp or not len(self.mtp):
            return out
        m = self.mtp[0]
        nxt = tokens[:, 1:]
        e = m.e_proj(m.enorm(self.embed(nxt)))
        X0 = e.unsqueeze(-2) + m.h_proj(m.hnorm(X[:, :-1]))
        cos, sin = self.ropes(0, T, tokens.device)
        Xm = m(X0, nxt, cos, sin)
        return out, self.logits(Xm, m)
