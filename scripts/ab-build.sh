#!/usr/bin/env bash
# Builds the device binaries of two revisions for a same-run A/B of a kernel
# change (docs/performance.md: a variant is kept only if it beats the kernel
# it replaces in the same device call and the end-to-end tests pass):
#   scripts/ab-build.sh main exp/some-branch   # -> bin/a, bin/b (+ ab-device.sh)
# Binaries are stripped and gzipped so that both fit the device's 64 MiB
# carry; then, with bin carried: (device) cd bin && ./ab-device.sh OUTDIR
set -eu
# More revisions go to bin/c, bin/d, ... (ab-device.sh compares a and b; the
# others are for ab-multi.sh, which compares all of them).
[ $# -ge 2 ] || { echo "usage: ab-build.sh REV_A REV_B [REV_C ...]" >&2; exit 2; }
root=$(git rev-parse --show-toplevel)
cd "$root"
names=(a b c d e)
rm -rf "${names[@]/#/bin/}" && mkdir -p bin
[ $# -le ${#names[@]} ] || { echo "ab-build.sh: at most ${#names[@]} revisions" >&2; exit 2; }
i=0
for rev in "$@"; do
	v=${names[$i]}
	i=$((i + 1))
	wt=$(mktemp -d)
	git worktree add -q --detach "$wt" "$rev"
	(cd "$wt" && mkdir -p "$root/bin/$v" &&
		go test -c -ldflags="-s -w" -o "$root/bin/$v/cuda.test" ./cuda &&
		go test -c -ldflags="-s -w" -o "$root/bin/$v/gpu.test" ./backend/gpu &&
		go build -ldflags="-s -w" -o "$root/bin/$v/bench" ./cmd/bench)
	git worktree remove --force "$wt"
	git rev-parse --short "$rev" > "bin/$v/REV"
	gzip -f "bin/$v/cuda.test" "bin/$v/gpu.test" "bin/$v/bench"
done
cp scripts/ab-device.sh scripts/ab-multi.sh bin/
du -sh bin
