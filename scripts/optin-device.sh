#!/usr/bin/env bash
# Checks and times the kernel choices of one build on a machine with an NVIDIA
# GPU: the tests (every kernel against its CPU twin, the end-to-end and
# side-stream tests under the defaults), the fp32 head on
# linear_bf16x3_dec against its op check, decode stacks of the default, no
# side stream and the SIMT fp32 linears (f32-simt), and ncu of the default
# step. From a checkout (about 14 minutes on an H200):
#   scripts/optin-device.sh OUTDIR
# It builds bin/cuda.test, bin/gpu.test and bin/bench unless BIN names a
# directory that holds them. STEPS picks parts (default "tests kernels stacks
# ncu"); KMODELS, KTOKENS and BATCHES trim the kernel rows and stacks. Make an
# opt-in the default only if its tests pass and its stacks beat the default in
# the same run (docs/performance.md).
set -u
out=${1:?usage: optin-device.sh OUTDIR}
mkdir -p "$out" && out=$(cd "$out" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
bin=
if [ -n "${BIN:-}" ]; then
	bin=$(cd "$BIN" && pwd) || { echo "$0: no directory $BIN" >&2; exit 1; }
fi
cd "$here/.." || exit 1
if [ -z "$bin" ]; then
	go test -c -o bin/cuda.test ./cuda && go test -c -o bin/gpu.test ./backend/gpu &&
		go build -o bin/bench ./cmd/bench || exit 1
	bin=$PWD/bin
fi
cd "$bin" || exit 1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
t0=$(date +%s)
log() { echo "[$(($(date +%s) - t0)) s] $*" | tee -a "$out/log.txt"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$out/gpu.txt" 2>&1
steps=" ${STEPS:-tests kernels stacks ncu} "
on() { [[ $steps == *" $1 "* ]]; }
if on tests; then
	timeout 200 ./cuda.test -test.v -test.run 'TestKernelsVsCPU|TestKernelResources|TestPlanBF16Dec|TestStreamForkJoin|TestPoolHold' >"$out/cuda.txt" 2>&1
	log "cuda.test rc=$? ($(grep -c -- '--- PASS' "$out/cuda.txt") passed, $(grep -c -- '--- FAIL' "$out/cuda.txt") failed)"
	timeout 240 ./gpu.test -test.v -test.run 'TestLinears|TestHc|TestKVStoreSteps|TestAttnSmallWindows|TestExperts|TestForkRules|TestSideStreamSameBits|TestStepsReturnPoolMemory|TestRegressionPromptsOnGPU|TestSmallModelEndToEnd|TestGreedyExact|TestRecordedDecodeSteps|TestTraceNonFiniteOnGPU|TestModelDrawsOnGPU|TestFusedLinearInputs' >"$out/gpu-tests.txt" 2>&1
	log "gpu.test rc=$? ($(grep -c -- '--- PASS' "$out/gpu-tests.txt") passed, $(grep -c -- '--- FAIL' "$out/gpu-tests.txt") failed)"
fi
if on kernels; then
	timeout 150 ./bench kernels --model "${KMODELS:-flash,pro}" --tokens "${KTOKENS:-1,4,8,32}" --only gemv --reps 10 >"$out/kernels.txt" 2>&1
	log "bench kernels rc=$?: $(grep -c FAIL "$out/kernels.txt") FAIL"
fi
if on stacks; then
	# One model per batch size, every variant timed on it in turn; default first
	# and last shows the drift of the call.
	vars="default;no-side;f32-simt;default2=default"
	IFS=';' read -ra batches <<<"${BATCHES:-1;1 --draw;8;32 --draw}"
	for b in "${batches[@]}"; do
		f="$out/stack-b${b// /}.txt"
		# shellcheck disable=SC2086 # $b is a list
		timeout 120 ./bench stack --preset flash --layers 4 --prefill 64 --decode 48 --batch $b --variants "$vars" >"$f" 2>&1
		log "batch $b rc=$?: $(awk '/^variant /{v=$2} /^decode [0-9]/{printf "%s %s ms; ", v, $13}' "$f")"
	done
fi
if on ncu; then
	for bo in 1:default 8:default; do
		b=${bo%%:*} o=${bo#*:}
		n="$out/ncu-b$b-$o"
		kopt=""
		[[ $o == default ]] || kopt=$o
		timeout 60 "${NCU:-/usr/local/cuda/bin/ncu}" --metrics gpu__time_duration.sum --csv --cache-control all --clock-control none \
			./bench stack --preset flash --layers 4 --prefill 8 --decode 3 --batch "$b" --cuda-graphs=false --side-stream=false --kernel-opts "$kopt" >"$n.csv" 2>/dev/null
		python3 "$here/ncu_steps.py" "$n.csv" >"$n.txt" 2>&1
	done
	log "ncu done"
fi
