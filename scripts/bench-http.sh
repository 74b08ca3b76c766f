#!/usr/bin/env bash
# The whole server measured through its HTTP API on an NVIDIA GPU:
#   scripts/bench-http.sh OUTDIR [MODEL]
# bench http --serve builds MODEL (default synth:flash:4: Flash's dimensions,
# 4 layers of random weights) on GPU 0, times bench stack's decode step at
# each concurrency on it, then serves it in the same process and streams
# /v1/completions at concurrency 1, 8, 64 and 256 with prompts of 512 and 4096
# tokens and 64 output tokens each (ignore_eos): TTFT, TPOT, output tokens/s,
# requests/s and TPOT over the step time. It runs twice: tokens drawn on the
# GPU (serve's default) and sampled on the host (serve --device-sampling=false).
# Last, --host-only serves a model that computes nothing, so its TPOT is the
# host's own cost per token (scheduler, sampling, API, SSE), in both modes.
# It builds bin/bench unless BIN names a directory that holds it. OUTDIR gets
# gpu.txt and, per sampling mode (device, host), http-MODE.txt (the table),
# http-MODE.jsonl (a JSON object per level) and http-MODE.log (start-up times,
# stack steps), and hostonly-MODE.txt/.jsonl. Timeouts bound the runs to 9 minutes in all.
set -u
out=${1:?usage: bench-http.sh OUTDIR [MODEL]}
model=${2:-synth:flash:4}
mkdir -p "$out" && out=$(cd "$out" && pwd)
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
use_bins bench
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee "$out/gpu.txt"
for mode in device host; do
	sampling=true
	[ "$mode" = host ] && sampling=false
	timeout 240 "$bin/bench" http --serve --model "$model" --device cuda --device-sampling="$sampling" \
		--prompt-tokens 512,4096 --concurrency 1,8,64,256 --max-tokens 64 --max-num-batched-tokens 2048 \
		--jsonl "$out/http-$mode.jsonl" > "$out/http-$mode.txt" 2> "$out/http-$mode.log"
	echo "bench http, tokens sampled on the $mode: rc=$?"
	cat "$out/http-$mode.txt"
	grep -E "made in|stack decode step" "$out/http-$mode.log"
done
for mode in device host; do
	sampling=true
	[ "$mode" = host ] && sampling=false
	timeout 30 "$bin/bench" http --serve --host-only --device-sampling="$sampling" --prompt-tokens 512 \
		--concurrency 1,8,64,256 --max-tokens 64 --jsonl "$out/hostonly-$mode.jsonl" > "$out/hostonly-$mode.txt" 2>&1
	echo "bench http --host-only, tokens sampled on the $mode: rc=$?"
	cat "$out/hostonly-$mode.txt"
done
