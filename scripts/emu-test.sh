#!/usr/bin/env bash
# Runs GPU tests on the CPU: the CUDA backend over ptxemu (MEGAMOE_EMU=1),
# kernels compiled by NVRTC to compute_80 PTX. Fetches NVRTC 12.4 from the
# Debian archive when none is found. Slow (an emulated kernel is ~10^4 times
# slower than the GPU) and sm_80 only: wgmma/TMA kernels are not covered.
#
#   scripts/emu-test.sh                       # the default set below
#   scripts/emu-test.sh ./backend/gpu 'TestHcPreNorm|TestExperts'
set -euo pipefail
cd "$(dirname "$0")/.."

nvrtc_dir="${MEGAMOE_NVRTC_DIR:-$HOME/.cache/megamoe/nvrtc12}"
lib="$nvrtc_dir/usr/lib/x86_64-linux-gnu"
if [ -z "${MEGAMOE_NVRTC:-}" ]; then
	if [ ! -e "$lib/libnvrtc.so.12" ]; then
		echo "emu-test: fetching NVRTC 12.4 (libnvrtc12, libnvrtc-builtins12.4) into $nvrtc_dir" >&2
		tmp=$(mktemp -d)
		(cd "$tmp" && { apt-get download libnvrtc12 libnvrtc-builtins12.4 >&2 ||
			{ apt-get update >&2 && apt-get download libnvrtc12 libnvrtc-builtins12.4 >&2; }; })
		mkdir -p "$nvrtc_dir"
		for f in "$tmp"/*.deb; do dpkg -x "$f" "$nvrtc_dir"; done
		rm -rf "$tmp"
	fi
	export MEGAMOE_NVRTC="$lib/libnvrtc.so.12"
	export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export MEGAMOE_EMU=1

if [ $# -ge 1 ]; then
	pkg=$1
	run=${2:-.}
	exec go test -count=1 -timeout 120m -run "$run" "$pkg"
fi
# The default set (about 15 minutes on two cores): every kernel against its
# CPU twin, every backend op on tiny shapes (CheckOps), the fused hc, norm
# and elementwise ops, graphs and error paths.
go test -count=1 -timeout 120m -run 'TestKernelsVsCPU|TestGraphReplay|TestErrorsNameCallAndCode|TestCopiesMemsetPinned' ./cuda
go test -count=1 -timeout 120m -run 'TestCheckOpsTiny|TestElementwiseOps|TestEmbedAndRope|TestHeadNorm|TestHcPreHead' ./backend/gpu
