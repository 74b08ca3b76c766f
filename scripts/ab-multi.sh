#!/usr/bin/env bash
# Runs the trees that scripts/ab-build.sh built (bin/a .. bin/e) on a machine
# with an NVIDIA GPU: each tree's tests, then the same `bench kernels` and
# `bench stack` commands from every tree, and the "% of copy" of every kernel
# row side by side. Everything lands in OUTDIR.
#   scripts/ab-multi.sh OUTDIR
# Environment (defaults in brackets):
#   CUDA_TESTS  cuda.test -test.run regex    [TestKernelsVsCPU|TestKernelResources]
#   GPU_TESTS   gpu.test -test.run regex     [TestLinears|TestRegressionPromptsOnGPU|TestSmallModelEndToEnd|TestGreedyExact|TestRecordedDecodeSteps]
#   KERNELS     bench kernels arguments      [--model flash,pro --tokens 1,8,16 --only linear_fp8]
#   STACKS      ';'-separated bench stack argument lists
#               [--preset flash --layers 4 --prefill 64 --decode 48 --batch 1;--preset flash --layers 4 --prefill 64 --decode 48 --batch 8]
#   TESTS=0 skips the tests, KERNELS=none / STACKS=none skip those parts.
set -u
out=${1:?usage: ab-multi.sh OUTDIR}
mkdir -p "$out" && out=$(cd "$out" && pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
here=$(cd "$(dirname "$0")/../bin" && pwd) || { echo "ab-multi.sh: no bin/: run scripts/ab-build.sh first" >&2; exit 2; }
trees=()
for v in a b c d e; do
	[ -d "$here/$v" ] || continue
	trees+=("$v")
	echo "$v $(cat "$here/$v/REV" 2>/dev/null)"
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | tee "$out/gpu.txt"
t0=$(date +%s)
el() { echo "  [$(($(date +%s) - t0)) s]"; }
if [ "${TESTS:-1}" != 0 ]; then
	for v in "${trees[@]}"; do
		if [ -x "$here/$v/cuda.test" ]; then
			(cd "$here/$v" && timeout 150 ./cuda.test -test.v -test.run "${CUDA_TESTS:-TestKernelsVsCPU|TestKernelResources}" >"$out/$v-cuda.txt" 2>&1)
			echo "$v cuda.test rc=$? ($(grep -c -- '--- PASS' "$out/$v-cuda.txt") passed)"
		fi
		if [ -x "$here/$v/gpu.test" ]; then
			(cd "$here/$v" && timeout 200 ./gpu.test -test.v -test.run \
				"${GPU_TESTS:-TestLinears|TestRegressionPromptsOnGPU|TestSmallModelEndToEnd|TestGreedyExact|TestRecordedDecodeSteps}" >"$out/$v-gpu.txt" 2>&1)
			echo "$v gpu.test rc=$? ($(grep -c -- '--- PASS' "$out/$v-gpu.txt") passed)"
		fi
		el
	done
	grep -hE "^(--- FAIL|FAIL)|regression prompts|panic" "$out"/*-cuda.txt "$out"/*-gpu.txt 2>/dev/null | head -20
fi
kargs=${KERNELS:---model flash,pro --tokens 1,8,16 --only linear_fp8}
if [ "$kargs" != none ]; then
	for v in "${trees[@]}"; do
		# shellcheck disable=SC2086 # the arguments are a list
		timeout 150 "$here/$v/bench" kernels $kargs --reps 10 >"$out/kernels-$v.txt" 2>&1
		echo "$v bench kernels rc=$?"
	done
	el
	# One row per model, op, path, shape and tokens; the "% of copy" of every tree.
	awk -v trees="${trees[*]}" 'FNR == 1 { f++ }
		/% of copy/ {
			p = $0; sub(/% of copy.*/, "", p); sub(/.*\(/, "", p)
			k = sprintf("%-6s %-10s %-6s %-18s %5s", $1, $2, $3, $4, $6)
			if (!(k in seen)) { seen[k] = 1; keys[++n] = k }
			v[f, k] = p
		}
		END {
			split(trees, t, " ")
			printf "%-50s", "% of copy"
			for (i = 1; i <= f; i++) printf " %6s", t[i]
			printf "\n"
			for (j = 1; j <= n; j++) {
				printf "%-50s", keys[j]
				for (i = 1; i <= f; i++) printf " %6s", ((i, keys[j]) in v) ? v[i, keys[j]] : "-"
				printf "\n"
			}
		}' $(for v in "${trees[@]}"; do echo "$out/kernels-$v.txt"; done) | tee "$out/kernels.txt"
fi
stacks=${STACKS:---preset flash --layers 4 --prefill 64 --decode 48 --batch 1;--preset flash --layers 4 --prefill 64 --decode 48 --batch 8}
if [ "$stacks" != none ]; then
	IFS=';' read -r -a lists <<<"$stacks"
	for i in "${!lists[@]}"; do
		for v in "${trees[@]}"; do
			# shellcheck disable=SC2086
			timeout 120 "$here/$v/bench" stack ${lists[$i]} >"$out/stack$i-$v.txt" 2>&1
			echo "stack $i ($v, rc $?): $(grep -hE '^(prefill|decode [0-9])' "$out/stack$i-$v.txt" | sed 's/  */ /g' | tr '\n' ' ')"
		done
	done
	el
fi
