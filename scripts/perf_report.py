#!/usr/bin/env python3
"""Merge our `bench kernels --json` output with scripts/torch_baseline.py output
(both JSON lines, measured on the same GPU) into a markdown fragment and PNG
plots for docs/performance.md.

    python3 scripts/perf_report.py --ours ours.jsonl --torch torch.jsonl \
        --out-md perf_fragment.md --plots docs/perf [--no-plots]

The markdown is written to --out-md and also printed on stdout. Plots are
written to --plots (default: the directory holding --out-md, plus "perf") and
linked as perf/<file>, assuming docs/performance.md sits next to docs/perf/.
matplotlib is imported only when plotting; --no-plots skips it entirely.

Lines starting with '#' and blank lines are skipped; malformed lines are
reported on stderr and skipped.
"""
import argparse
import json
import os
import sys
from collections import defaultdict

MODELS = ("flash", "pro")
TARGET_MOE_COPY = 75.0     # MoE, tokens 1..64: % of copy bandwidth
TARGET_DENSE_LARGE = 90.0  # FP8 dense, m >= 2048: % of torch fp8 speed
TARGET_DENSE_SMALL = 70.0  # FP8 dense, m <= 64: % of copy bandwidth


# ---------------------------------------------------------------- input

def load_jsonl(path, label):
    """Return a list of dict records; never raises on bad content."""
    recs = []
    try:
        f = open(path, "r", encoding="utf-8", errors="replace")
    except OSError as e:
        print("perf_report: cannot open %s file %s: %s" % (label, path, e), file=sys.stderr)
        return recs
    with f:
        for lineno, line in enumerate(f, 1):
            s = line.strip()
            if not s or s.startswith("#"):
                continue
            try:
                obj = json.loads(s)
            except ValueError as e:
                print("perf_report: %s:%d: malformed JSON skipped (%s): %s"
                      % (path, lineno, e, s[:120]), file=sys.stderr)
                continue
            if not isinstance(obj, dict) or "kind" not in obj:
                print("perf_report: %s:%d: not a record with 'kind', skipped: %s"
                      % (path, lineno, s[:120]), file=sys.stderr)
                continue
            recs.append(obj)
    return recs


def num(r, key):
    """Float value of r[key], or None if missing / not a finite number."""
    v = r.get(key)
    if isinstance(v, bool) or v is None:
        return None
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    if v != v or v in (float("inf"), float("-inf")):
        return None
    return v


def intval(r, key):
    v = num(r, key)
    return int(v) if v is not None else None


# ---------------------------------------------------------------- formatting

def f_us(v):
    return "—" if v is None else "%.1f" % v


def f_gbs(v):
    return "—" if v is None else "%d" % round(v)


def f_tf(v):
    return "—" if v is None else "%.1f" % v


def f_pct(v):
    return "—" if v is None else "%.1f%%" % v


def f_pass(r):
    p = r.get("pass")
    if p is True:
        s = "yes"
    elif p is False:
        s = "**NO**"
    else:
        s = "—"
    err = r.get("error")
    if err:
        s += " (%s)" % str(err).replace("|", "\\|").splitlines()[0][:80]
    return s


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        out.append("| " + " | ".join(row) + " |")
    return out


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    if n == 0:
        return None
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def pct(a, b):
    if a is None or b is None or b == 0:
        return None
    return 100.0 * a / b


# ---------------------------------------------------------------- data model

class Data:
    def __init__(self, ours, torch):
        self.ours_copy = None
        self.torch_copy = None
        self.anchor_tflops = None
        self.dense = defaultdict(list)   # model -> [rec]
        self.moe = defaultdict(list)     # model -> [rec]
        self.torch = {}                  # (kind, model, shape, m) -> rec
        for r in ours:
            kind = r.get("kind")
            if kind == "copy":
                g = num(r, "gbs")
                if g is not None:
                    self.ours_copy = g if self.ours_copy is None else max(self.ours_copy, g)
            elif kind == "ours":
                model, op = r.get("model"), r.get("op")
                if intval(r, "m") is None:
                    print("perf_report: ours record without m skipped: %r" % r, file=sys.stderr)
                    continue
                if op == "linear_fp8":
                    self.dense[model].append(r)
                elif op == "moe_fp4":
                    self.moe[model].append(r)
        for r in torch:
            kind = r.get("kind")
            if kind == "copy":
                g = num(r, "gbs")
                if g is not None:
                    self.torch_copy = g if self.torch_copy is None else max(self.torch_copy, g)
            elif kind in ("bf16", "fp8"):
                if r.get("model") == "anchor":
                    t = num(r, "tflops")
                    if t is not None:
                        self.anchor_tflops = t
                    continue
                key = (kind, r.get("model"), r.get("shape"), intval(r, "m"))
                self.torch[key] = r
        # Keep shapes in the order they first appear in our file; tokens ascending.
        for d in (self.dense, self.moe):
            for model in d:
                first = {}
                for r in d[model]:
                    first.setdefault(r.get("shape"), len(first))
                d[model].sort(key=lambda r: (first[r.get("shape")], intval(r, "m")))

    def torch_rec(self, kind, model, shape, m):
        return self.torch.get((kind, model, shape, m))

    def torch_us(self, kind, model, shape, m):
        r = self.torch_rec(kind, model, shape, m)
        return num(r, "us") if r else None

    def shape_order(self, recs):
        seen = []
        for r in recs:
            s = r.get("shape")
            if s not in seen:
                seen.append(s)
        return seen


def moe_base_shape(shape):
    """'expert_w13 mxfp4' -> ('expert_w13', 'mxfp4')."""
    parts = str(shape).split()
    return (parts[0], " ".join(parts[1:])) if parts else ("", "")


# ---------------------------------------------------------------- markdown

def dense_rows(data, model):
    rows = []
    for r in data.dense.get(model, []):
        m = intval(r, "m")
        shape = r.get("shape")
        us = num(r, "us")
        gbs = num(r, "gbs")
        t8 = data.torch_rec("fp8", model, shape, m)
        t8us = num(t8, "us") if t8 else None
        t16us = data.torch_us("bf16", model, shape, m)
        speed = pct(t8us, us)  # torch_us / ours_us
        t8cell = f_us(t8us)
        if t8 is not None and t8us is None and t8.get("error"):
            t8cell = "err"
        rows.append({
            "rec": r, "m": m, "shape": shape, "us": us, "gbs": gbs,
            "copy_pct": pct(gbs, data.ours_copy), "tflops": num(r, "tflops"),
            "t8us": t8us, "t16us": t16us, "speed": speed, "t8cell": t8cell,
            "t8tflops": num(t8, "tflops") if t8 else None,
            "t16tflops": num(data.torch_rec("bf16", model, shape, m) or {}, "tflops"),
        })
    return rows


def moe_rows(data, model):
    rows = []
    for r in data.moe.get(model, []):
        m = intval(r, "m")
        shape = r.get("shape")
        base, fmt = moe_base_shape(shape)
        gbs = num(r, "gbs")
        rows.append({
            "rec": r, "m": m, "shape": shape, "base": base, "fmt": fmt,
            "us": num(r, "us"), "gbs": gbs, "copy_pct": pct(gbs, data.ours_copy),
            "tflops": num(r, "tflops"), "t16us": data.torch_us("bf16", model, base, m),
        })
    return rows


def target_line(name, values, target, unit_desc):
    vals = [v for v in values if v is not None]
    if not vals:
        return "- %s: no data — **MISSED** (target %.0f%% %s)" % (name, target, unit_desc)
    mn, md = min(vals), median(vals)
    verdict = "MET" if mn >= target else "MISSED"
    return ("- %s: min %.1f%%, median %.1f%% over %d rows (target %.0f%% %s, judged on min) — **%s**"
            % (name, mn, md, len(vals), target, unit_desc, verdict))


def build_markdown(data, plots_enabled, plot_files):
    L = []
    L.append("### Ceilings")
    L.append("")
    L.append("Ceilings: our copy %s GB/s, torch copy %s GB/s, torch bf16 8192^3 %s TFLOP/s."
             % (f_gbs(data.ours_copy), f_gbs(data.torch_copy), f_tf(data.anchor_tflops)))
    L.append("")
    if data.ours_copy is None:
        L.append("_No `copy` record in our results: % of copy columns are empty._")
        L.append("")

    all_dense, all_moe = {}, {}
    for model in MODELS:
        drows = dense_rows(data, model)
        mrows = moe_rows(data, model)
        all_dense[model], all_moe[model] = drows, mrows
        L.append("### %s" % model.capitalize())
        L.append("")
        L.append("#### FP8 dense linears (%s)" % model)
        L.append("")
        if drows:
            hdr = ["shape", "N×K", "tokens", "ours us", "ours GB/s", "% of copy", "ours TF/s",
                   "torch fp8 us", "torch bf16 us", "ours vs torch fp8 speed", "pass"]
            rows = []
            for d in drows:
                r = d["rec"]
                rows.append([
                    str(d["shape"]), "%s×%s" % (intval(r, "n"), intval(r, "k")), str(d["m"]),
                    f_us(d["us"]), f_gbs(d["gbs"]), f_pct(d["copy_pct"]), f_tf(d["tflops"]),
                    d["t8cell"], f_us(d["t16us"]), f_pct(d["speed"]), f_pass(r)])
            L.extend(md_table(hdr, rows))
            L.append("")
            L.append("_ours vs torch fp8 speed = torch fp8 us / ours us: ours reaches X% of "
                     "torch fp8 speed (>100% means faster). `err`: torch._scaled_mm refused the shape._")
        else:
            L.append("_No data._")
        L.append("")
        L.append("#### MoE grouped GEMM (FP4 weights) (%s)" % model)
        L.append("")
        if mrows:
            hdr = ["shape", "tokens", "ours us", "ours GB/s", "% of copy", "ours TF/s",
                   "torch bf16 one expert, m=tokens (us)", "pass"]
            rows = []
            for d in mrows:
                rows.append([str(d["shape"]), str(d["m"]), f_us(d["us"]), f_gbs(d["gbs"]),
                             f_pct(d["copy_pct"]), f_tf(d["tflops"]), f_us(d["t16us"]),
                             f_pass(d["rec"])])
            L.extend(md_table(hdr, rows))
            L.append("")
            L.append("_tokens are before top-k routing (6 experts per token); GB/s counts the "
                     "expert weight bytes actually read. The torch column is one dense bf16 "
                     "expert-shaped GEMM at m=tokens, a reference only, not a like-for-like baseline._")
        else:
            L.append("_No data._")
        L.append("")
        if plots_enabled:
            for fn, alt in plot_files.get(model, []):
                L.append("![%s](perf/%s)" % (alt, fn))
            if plot_files.get(model):
                L.append("")

    L.append("### Targets")
    L.append("")
    moe_vals = [d["copy_pct"] for m in MODELS for d in all_moe[m]
                if d["m"] is not None and 1 <= d["m"] <= 64]
    large_vals = [d["speed"] for m in MODELS for d in all_dense[m]
                  if d["m"] is not None and d["m"] >= 2048]
    small_vals = [d["copy_pct"] for m in MODELS for d in all_dense[m]
                  if d["m"] is not None and d["m"] <= 64]
    L.append(target_line("(a) MoE grouped GEMM, tokens 1..64, % of copy", moe_vals,
                         TARGET_MOE_COPY, "of copy"))
    L.append(target_line("(b) FP8 dense, m >= 2048, % of torch fp8 speed", large_vals,
                         TARGET_DENSE_LARGE, "of torch fp8 speed"))
    L.append(target_line("(c) FP8 dense, m <= 64, % of copy", small_vals,
                         TARGET_DENSE_SMALL, "of copy"))
    for model in MODELS:
        parts = []
        for name, vals, tgt in (
                ("a", [d["copy_pct"] for d in all_moe[model] if d["m"] is not None and 1 <= d["m"] <= 64], TARGET_MOE_COPY),
                ("b", [d["speed"] for d in all_dense[model] if d["m"] is not None and d["m"] >= 2048], TARGET_DENSE_LARGE),
                ("c", [d["copy_pct"] for d in all_dense[model] if d["m"] is not None and d["m"] <= 64], TARGET_DENSE_SMALL)):
            vals = [v for v in vals if v is not None]
            if vals:
                parts.append("(%s) min %.1f%% / median %.1f%% %s" % (
                    name, min(vals), median(vals), "MET" if min(vals) >= tgt else "MISSED"))
            else:
                parts.append("(%s) no data" % name)
        L.append("  - %s: %s" % (model, "; ".join(parts)))
    L.append("")
    return "\n".join(L) + "\n"


# ---------------------------------------------------------------- plots

def plan_plots(data):
    """File names (and alt text) the plots will have, per model, for data that exists."""
    files = {}
    for model in MODELS:
        fl = []
        if data.dense.get(model):
            fl.append(("%s_dense_bandwidth.png" % model, "%s FP8 dense bandwidth" % model))
            fl.append(("%s_dense_tflops.png" % model, "%s FP8 dense TFLOP/s" % model))
        if data.moe.get(model):
            fl.append(("%s_moe_bandwidth.png" % model, "%s MoE FP4 bandwidth" % model))
        files[model] = fl
    return files


def make_plots(data, plot_dir, plot_files):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # ImportError or backend trouble
        print("perf_report: matplotlib unavailable (%s); plots skipped" % e, file=sys.stderr)
        return False
    os.makedirs(plot_dir, exist_ok=True)

    def series(recs, ykey):
        by = defaultdict(list)
        for r in recs:
            m, y = intval(r, "m"), num(r, ykey)
            if m is not None and m > 0 and y is not None:
                by[r.get("shape")].append((m, y))
        return {s: sorted(v) for s, v in by.items()}

    def finish(fig, ax, title, ylabel, path):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens (m)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        print("perf_report: wrote %s" % path, file=sys.stderr)

    def copy_line(ax):
        if data.ours_copy is not None:
            ax.axhline(data.ours_copy, ls="--", color="k", lw=1,
                       label="copy %d GB/s" % round(data.ours_copy))

    for model in MODELS:
        wanted = {fn for fn, _ in plot_files.get(model, [])}
        dense = data.dense.get(model, [])
        if "%s_dense_bandwidth.png" % model in wanted:
            fig, ax = plt.subplots(figsize=(8, 5))
            for shape, pts in series(dense, "gbs").items():
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label="ours %s" % shape)
            copy_line(ax)
            finish(fig, ax, "%s: FP8 dense linears, bandwidth" % model, "GB/s",
                   os.path.join(plot_dir, "%s_dense_bandwidth.png" % model))
        if "%s_dense_tflops.png" % model in wanted:
            fig, ax = plt.subplots(figsize=(8, 5))
            ours = series(dense, "tflops")
            cmap = plt.get_cmap("tab10")
            for i, shape in enumerate(ours):
                c = cmap(i % 10)
                pts = ours[shape]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=c,
                        label="ours %s" % shape)
                for kind, ls, mk in (("fp8", "--", "s"), ("bf16", ":", "^")):
                    tp = []
                    for m, _ in pts:
                        tr = data.torch_rec(kind, model, shape, m)
                        t = num(tr, "tflops") if tr else None
                        if t is not None:
                            tp.append((m, t))
                    if tp:
                        ax.plot([p[0] for p in tp], [p[1] for p in tp], ls=ls, marker=mk,
                                color=c, alpha=0.7, label="torch %s %s" % (kind, shape))
            finish(fig, ax, "%s: FP8 dense linears, ours vs torch TFLOP/s" % model, "TFLOP/s",
                   os.path.join(plot_dir, "%s_dense_tflops.png" % model))
        if "%s_moe_bandwidth.png" % model in wanted:
            fig, ax = plt.subplots(figsize=(8, 5))
            for shape, pts in series(data.moe.get(model, []), "gbs").items():
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label="ours %s" % shape)
            copy_line(ax)
            finish(fig, ax, "%s: MoE grouped GEMM (FP4 weights), bandwidth" % model, "GB/s",
                   os.path.join(plot_dir, "%s_moe_bandwidth.png" % model))
    return True


# ---------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ours", required=True, help="JSON lines from `bench kernels --json`")
    ap.add_argument("--torch", required=True, help="JSON lines from scripts/torch_baseline.py")
    ap.add_argument("--out-md", required=True, help="markdown fragment to write")
    ap.add_argument("--plots", default=None,
                    help="directory for PNG plots (default: <dir of --out-md>/perf)")
    ap.add_argument("--no-plots", action="store_true", help="skip plots (no matplotlib needed)")
    args = ap.parse_args(argv)

    data = Data(load_jsonl(args.ours, "ours"), load_jsonl(args.torch, "torch"))
    plot_files = plan_plots(data)
    plots_ok = False
    if not args.no_plots:
        plot_dir = args.plots or os.path.join(os.path.dirname(os.path.abspath(args.out_md)), "perf")
        plots_ok = make_plots(data, plot_dir, plot_files)
    md = build_markdown(data, plots_ok, plot_files)
    d = os.path.dirname(os.path.abspath(args.out_md))
    os.makedirs(d, exist_ok=True)
    with open(args.out_md, "w", encoding="utf-8") as f:
        f.write(md)
    sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
