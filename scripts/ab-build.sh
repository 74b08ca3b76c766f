#!/usr/bin/env bash
# Builds the GPU test binaries and bench of up to five revisions into
# bin/a, bin/b, ... for a same-run A/B of a kernel change (docs/performance.md:
# a variant is kept only if it beats the kernel it replaces in the same run and
# the end-to-end tests pass); scripts/ab-multi.sh then runs and compares them:
#   scripts/ab-build.sh main exp/some-branch && scripts/ab-multi.sh OUTDIR
set -eu
[ $# -ge 2 ] || { echo "usage: ab-build.sh REV_A REV_B [REV_C ...]" >&2; exit 2; }
root=$(git rev-parse --show-toplevel)
cd "$root"
names=(a b c d e)
[ $# -le ${#names[@]} ] || { echo "ab-build.sh: at most ${#names[@]} revisions" >&2; exit 2; }
rm -rf "${names[@]/#/bin/}" && mkdir -p bin
i=0
for rev in "$@"; do
	v=${names[$i]}
	i=$((i + 1))
	wt=$(mktemp -d)
	git worktree add -q --detach "$wt" "$rev"
	(cd "$wt" && mkdir -p "$root/bin/$v" &&
		go test -c -o "$root/bin/$v/cuda.test" ./cuda &&
		go test -c -o "$root/bin/$v/gpu.test" ./backend/gpu &&
		go build -o "$root/bin/$v/bench" ./cmd/bench)
	git worktree remove --force "$wt"
	git rev-parse --short "$rev" > "bin/$v/REV"
done
