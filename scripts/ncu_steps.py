#!/usr/bin/env python3
"""Per-kernel GPU time of the last forward pass in an ncu CSV (run-checks.sh's
ncu-b1.csv): kernels grouped by name, sorted by total time."""
import collections
import csv
import sys

rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 14 and r[12] == "gpu__time_duration.sum"]
starts = [i for i, r in enumerate(rows) if r[4] == "embed_f32"]
last = rows[starts[-1]:]
agg = collections.OrderedDict()
for r in last:
    a = agg.setdefault(r[4], [0, 0.0])
    a[0] += 1
    a[1] += float(r[14].replace(",", "")) / 1000
total = sum(v for _, v in agg.values())
print(f"last pass: {len(last)} kernels, {total:.1f} us of kernel time")
print(f"{'kernel':40s} {'calls':>5s} {'us':>8s} {'us/call':>8s}")
for k, (n, v) in sorted(agg.items(), key=lambda x: -x[1][1]):
    print(f"{k:40s} {n:5d} {v:8.1f} {v / n:8.1f}")
