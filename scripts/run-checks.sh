#!/usr/bin/env bash
# Correctness on the GPU after a kernel change, then the decode-step numbers,
# from a checkout on a machine with an NVIDIA GPU:
#   scripts/run-checks.sh OUTDIR [test-regex]
# It builds bin/cuda.test, bin/gpu.test, bin/opcheck.test and bin/bench unless
# BIN names a directory that holds them. OUTDIR gets cuda.txt, gpu.txt and
# opcheck.txt (go test -v output), stack-*.txt (also without PDL) and ncu-b1.csv (per-kernel time of
# eager batch-1 decode steps, cold caches; scripts/ncu_steps.py sums it; NCU
# names ncu if it is not /usr/local/cuda/bin/ncu).
set -u
out=${1:?usage: run-checks.sh OUTDIR [test-regex]}
run=${2:-.}
mkdir -p "$out" && out=$(cd "$out" && pwd)
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
use_bins ./cuda ./backend/gpu ./backend/gpu/opcheck bench
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee "$out/gpu.txt"
(cd "$bin" && timeout 200 ./cuda.test -test.v -test.run "$run" > "$out/cuda.txt" 2>&1; echo "cuda.test rc=$?")
(cd "$bin" && timeout 300 ./gpu.test -test.v -test.run "$run" > "$out/gpu.txt" 2>&1; echo "gpu.test rc=$?")
(cd "$bin" && timeout 300 ./opcheck.test -test.v -test.run "$run" > "$out/opcheck.txt" 2>&1; echo "opcheck.test rc=$?")
grep -E "^(--- FAIL|FAIL|ok|PASS)" "$out/cuda.txt" "$out/gpu.txt" "$out/opcheck.txt" | head -40
for b in 1 8 64; do
	timeout 60 "$bin/bench" stack --preset flash --layers 4 --prefill 64 --decode 48 --batch "$b" > "$out/stack-b$b.txt" 2>&1
	grep -E "^(decode|cuda graphs)" "$out/stack-b$b.txt"
done
timeout 60 "$bin/bench" stack --preset flash --layers 4 --prefill 64 --decode 48 --batch 1 --cuda-graphs=false > "$out/stack-b1-eager.txt" 2>&1
grep -E "^decode" "$out/stack-b1-eager.txt"
for b in 1 8 64; do # the same without programmatic dependent launch
	timeout 60 "$bin/bench" stack --preset flash --layers 4 --prefill 64 --decode 48 --batch "$b" --pdl=false > "$out/stack-b$b-nopdl.txt" 2>&1
	grep -E "^(decode|programmatic)" "$out/stack-b$b-nopdl.txt"
done
timeout 200 "${NCU:-/usr/local/cuda/bin/ncu}" --metrics gpu__time_duration.sum --csv --cache-control all --clock-control none \
	"$bin/bench" stack --preset flash --layers 4 --prefill 8 --decode 3 --batch 1 --cuda-graphs=false > "$out/ncu-b1.csv" 2>&1
echo "ncu rc=$?"
