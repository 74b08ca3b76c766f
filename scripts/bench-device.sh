#!/usr/bin/env bash
# One command for the performance report (docs/performance.md), run on the
# device from the directory that holds the binaries built here:
#   go build -o bin/bench ./cmd/bench && cp scripts/*.py scripts/*.sh bin/
#   (device) cd bin && ./bench-device.sh OUTDIR [flash,pro]
# It writes OUTDIR/ours.jsonl (bench kernels), OUTDIR/paths.jsonl (every
# kernel path), OUTDIR/torch.jsonl (torch_baseline.py), OUTDIR/stack-*.txt
# (bench stack, Flash dimensions: CUDA graphs, eager, --profile) and
# OUTDIR/report.md + OUTDIR/perf/*.png (perf_report.py).
set -u
out=${1:?usage: bench-device.sh OUTDIR [models] [stack-layers]}
models=${2:-flash,pro}
layers=${3:-4}
mkdir -p "$out/perf"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
here=$(cd "$(dirname "$0")" && pwd)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee "$out/gpu.txt"
"$here/bench" kernels --model "$models" --tokens "${TOKENS:-1,8,64,512,4096}" --reps 10 --json "$out/ours.jsonl" | tee "$out/kernels.txt"
"$here/bench" kernels --model "$models" --tokens 1,64,4096 --reps 10 --paths --json "$out/paths.jsonl" > "$out/paths.txt"
python3 "$here/torch_baseline.py" > "$out/torch.jsonl"
for b in 1 8 64 256; do
	"$here/bench" stack --preset flash --layers "$layers" --prefill 512 --decode 16 --batch "$b" > "$out/stack-b$b.txt" 2>&1
	grep -E "^(prefill|decode|cuda graphs)" "$out/stack-b$b.txt"
done
"$here/bench" stack --preset flash --layers "$layers" --prefill 512 --decode 16 --batch 1 --cuda-graphs=false > "$out/stack-b1-eager.txt" 2>&1
"$here/bench" stack --preset flash --layers "$layers" --prefill 512 --decode 16 --batch 1 --profile > "$out/stack-b1-profile.txt" 2>&1
python3 "$here/perf_report.py" --ours "$out/ours.jsonl" --torch "$out/torch.jsonl" --out-md "$out/report.md" --plots "$out/perf"
