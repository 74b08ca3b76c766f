#!/usr/bin/env bash
# Decode and prefill at depth on an NVIDIA GPU:
#   scripts/bench-context.sh OUTDIR [DEPTHS]
# bench stack --context runs the Flash layer stack (4 of 43 layers, random
# weights, CUDA graphs) with every sequence filled to each depth of DEPTHS
# (default 4K,32K,128K,512K,1M), at batch 1 and batch 8: decode step time,
# the attention's and the indexer's share of it, the indexer's time over its
# read floor, and prefill tokens/s of a 2,048-token chunk ending at the depth
# (docs/performance.md, "Speed at length"). It builds bin/bench unless BIN
# names a directory that holds it. OUTDIR gets gpu.txt, per batch B
# context-bB.txt (the table) and context-bB.jsonl (a JSON object per depth),
# and context.svg (python3 with matplotlib: scripts/plot_context.py), and
# indexer.txt: the indexer's scores and top-k alone at each depth (bench
# kernels --only indexer). Timeouts bound the runs to 9 minutes in all.
set -u
out=${1:?usage: bench-context.sh OUTDIR [DEPTHS]}
depths=${2:-4K,32K,128K,512K,1M}
mkdir -p "$out" && out=$(cd "$out" && pwd)
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
use_bins bench
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee "$out/gpu.txt"
git log -1 --format='commit %h %cs' 2>/dev/null | tee -a "$out/gpu.txt"
timeout 60 "$bin/bench" kernels --model flash --only indexer --context "$depths" --batch 1,8 --reps 10 > "$out/indexer.txt" 2>&1
echo "bench kernels --only indexer --context $depths: rc=$?"
cat "$out/indexer.txt"
for b in 1 8; do
	timeout 230 "$bin/bench" stack --preset flash --layers 4 --device cuda --batch "$b" --context "$depths" \
		--prefill 2048 --decode 16 --jsonl "$out/context-b$b.jsonl" > "$out/context-b$b.txt" 2>&1
	echo "bench stack --context $depths --batch $b: rc=$?"
	cat "$out/context-b$b.txt"
done
if python3 -c 'import matplotlib' 2>/dev/null; then
	python3 scripts/plot_context.py "$out/context.svg" "$out"/context-b*.jsonl
else
	echo "no matplotlib: plot later with scripts/plot_context.py OUT.svg $out/context-b*.jsonl"
fi
