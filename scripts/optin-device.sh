#!/usr/bin/env bash
# Times the opt-in kernels (cuda.KernelChoice: F32Dec, BF16DecRing8, HcFast, AttnScoreCache;
# written 2026-12-05c without a device; AttnClusterFit, 2026-12-05d) and the side stream (gpu.Options.SideStream,
# bench stack --side-stream; 2026-12-05d) against the defaults from ONE build,
# after their tests. Build here, carry bin, run there:
#   go test -c -ldflags="-s -w" -o bin/cuda.test ./cuda && go test -c -ldflags="-s -w" -o bin/gpu.test ./backend/gpu &&
#   go build -ldflags="-s -w" -o bin/bench ./cmd/bench && cp scripts/optin-device.sh scripts/ncu_steps.py bin/
#   (device) cd bin && STEPS="tests kernels" ./optin-device.sh OUT1    # ~6 minutes
#   (device) cd bin && STEPS="stacks ncu" ./optin-device.sh OUT2       # ~8 minutes
# (about 14 minutes in all, more than one call's 10: hence two; each OUTn.tgz is the one file to bring back).
# STEPS picks parts (default "tests kernels stacks ncu").
# Keep an opt-in as the default only if its tests pass and its stacks beat the
# default in this same call (docs/performance.md, 2026-12-05c).
set -u
out=${1:?usage: optin-device.sh OUTDIR}
mkdir -p "$out"
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s)
log() { echo "[$(($(date +%s) - t0)) s] $*" | tee -a "$out/log.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$out/gpu.txt" 2>&1
steps=" ${STEPS:-tests kernels stacks ncu} "
on() { [[ $steps == *" $1 "* ]]; }
# Kernel tests: every gemv case under the default and the ring-8 choice; the hc
# fast kernels' bits against the default ones; the fp32-linear decode path and
# the attention score cache against the default kernels.
if on tests; then
	timeout 200 ./cuda.test -test.v -test.run 'TestKernelsVsCPU|TestKernelResources|TestPlanBF16Dec|TestStreamForkJoin|TestPoolHold|TestAttnClusterFit' >"$out/cuda.txt" 2>&1
	log "cuda.test rc=$? ($(grep -c -- '--- PASS' "$out/cuda.txt") passed, $(grep -c -- '--- FAIL' "$out/cuda.txt") failed)"
	timeout 240 ./gpu.test -test.v -test.run 'TestLinears|TestHc|TestKVStoreSteps|TestAttnScoreCache|TestAttnClusterFit|TestExperts|TestForkRules|TestSideStreamSameBits|TestStepsReturnPoolMemory|TestRegressionPromptsOnGPU|TestSmallModelEndToEnd|TestGreedyExact|TestRecordedDecodeSteps' >"$out/gpu.txt" 2>&1
	log "gpu.test rc=$? ($(grep -c -- '--- PASS' "$out/gpu.txt") passed, $(grep -c -- '--- FAIL' "$out/gpu.txt") failed)"
fi
if on kernels; then
	timeout 150 ./bench kernels --model flash,pro --tokens 1,2,4,8,16,32 --only gemv --reps 10 >"$out/kernels.txt" 2>&1
	log "bench kernels rc=$?"
	timeout 120 ./bench kernels --model flash,pro --tokens 1,2,4,8,16,32 --only gemv --dec-ring8 --reps 10 >"$out/kernels-r8.txt" 2>&1
	log "bench kernels --dec-ring8 rc=$?"
fi
if on stacks; then
	# One model per batch size, every variant timed on it in turn (bench stack --variants);
	# default first and last shows the drift of the call.
	all=hc-fast,f32-dec,dec-ring8,attn-sc,attn-fit
	vars="default;hc-fast;f32-dec;dec-ring8;attn-sc;attn-fit;side;all=$all;all-side=$all,side;default2=default"
	for b in "1" "1 --draw" "8" "32 --draw"; do
		f="$out/stack-b${b// /}.txt"
		# shellcheck disable=SC2086 # $b is a list
		timeout 150 ./bench stack --preset flash --layers 4 --prefill 64 --decode 48 --batch $b --variants "$vars" >"$f" 2>&1
		log "batch $b rc=$?: $(awk '/^variant /{v=$2} /^decode [0-9]/{printf "%s %s ms; ", v, $13}' "$f")"
	done
fi
if on ncu; then
	for o in "" "hc-fast,f32-dec,attn-sc,attn-fit"; do
		for b in 1 8; do
			n="$out/ncu-b$b-${o:-default}"
			timeout 60 /usr/local/cuda/bin/ncu --metrics gpu__time_duration.sum --csv --cache-control all --clock-control none \
				./bench stack --preset flash --layers 4 --prefill 8 --decode 3 --batch $b --cuda-graphs=false --kernel-opts "$o" >"$n.csv" 2>/dev/null
			python3 ncu_steps.py "$n.csv" >"$n.txt" 2>&1
		done
	done
	log "ncu done"
fi
tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
