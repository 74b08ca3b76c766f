#!/usr/bin/env bash
# The device half of ab-build.sh: the kernel and end-to-end tests of b, then
# `bench kernels` from a and b in the same call and their "% of copy" side by
# side. ONLY (default expert), MODELS (flash,pro) and TOKENS (1,8,64) pick the
# rows; TESTS=0 skips the tests.
#   (device) cd bin && ./ab-device.sh OUTDIR
set -u
out=${1:?usage: ab-device.sh OUTDIR}
mkdir -p "$out"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
here=$(cd "$(dirname "$0")" && pwd)
for v in a b; do (cd "$here/$v" && gunzip -f ./*.gz 2>/dev/null); done
echo "a $(cat "$here/a/REV")  b $(cat "$here/b/REV")"
t0=$(date +%s)
if [ "${TESTS:-1}" != 0 ]; then
	(cd "$here/b" && timeout 150 ./cuda.test -test.v -test.run 'TestKernelsVsCPU|TestKernelResources' > "$out/b-cuda.txt" 2>&1)
	echo "b cuda.test rc=$? ($(($(date +%s) - t0)) s)"
	(cd "$here/b" && timeout 150 ./gpu.test -test.v -test.run \
		'TestRegressionPromptsOnGPU|TestSmallModelEndToEnd|TestGreedyExact|TestRecordedDecodeSteps' > "$out/b-gpu.txt" 2>&1)
	echo "b gpu.test rc=$? ($(($(date +%s) - t0)) s)"
	grep -hE "^(--- FAIL|FAIL)|regression prompts" "$out/b-cuda.txt" "$out/b-gpu.txt"
fi
for v in a b; do
	timeout 150 "$here/$v/bench" kernels --model "${MODELS:-flash,pro}" --tokens "${TOKENS:-1,8,64}" \
		--only "${ONLY:-expert}" --paths --reps 10 > "$out/bench-$v.txt" 2>&1
	echo "bench $v rc=$? ($(($(date +%s) - t0)) s)"
done
# Rows keyed by model, kernel, path, shape, format and tokens; "% of copy" of
# a and b side by side ("-" where one binary has no such row).
awk 'FNR == 1 { f++ }
	/% of copy/ {
		p = $0; sub(/% of copy.*/, "", p); sub(/.*\(/, "", p)
		k = sprintf("%-6s %-10s %-6s %-18s %-6s %5s", $1, $2, $3, $4, $5, $7)
		if (!(k in seen)) { seen[k] = 1; keys[++n] = k }
		v[f, k] = p + 0; has[f, k] = 1
	}
	END {
		for (i = 1; i <= n; i++) {
			k = keys[i]
			if (has[1, k] && has[2, k]) printf "%s  a %5.1f  b %5.1f  %+5.1f\n", k, v[1, k], v[2, k], v[2, k] - v[1, k]
			else printf "%s  a %5s  b %5s\n", k, has[1, k] ? v[1, k] : "-", has[2, k] ? v[2, k] : "-"
		}
	}' "$out/bench-a.txt" "$out/bench-b.txt" | tee "$out/ab.txt"
