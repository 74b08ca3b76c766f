#!/usr/bin/env bash
# Runs GPU tests on the CPU: the CUDA backend over ptxemu (MEGAMOE_EMU=1, in a
# build with -tags megamoe_emu), kernels compiled by NVRTC to compute_80 PTX.
# Fetches NVRTC 12.4 from the Debian archive (trixie non-free, at the mirror
# the machine's apt sources name; MEGAMOE_DEBIAN_ARCHIVE overrides it) when
# none is found. Slow (an emulated kernel is ~10^4 times slower than the GPU).
# MEGAMOE_EMU=sm_90a+tma runs the Hopper TMA/wgmma kernels (docs/emulator.md).
#
#   scripts/emu-test.sh                       # the default set below
#   scripts/emu-test.sh ./backend/gpu 'TestHcPreNorm|TestExperts'
set -euo pipefail
cd "$(dirname "$0")/.."

# The Debian archive URI of the machine's apt sources: the first enabled "deb"
# entry, one-line (sources.list, *.list) or deb822 (*.sources), whose URI ends
# in /debian and which has the main component (so debian-security and
# third-party repositories do not count).
debian_archive() {
	local files=()
	[ -f /etc/apt/sources.list ] && files+=(/etc/apt/sources.list)
	for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] && files+=("$f")
	done
	[ ${#files[@]} -gt 0 ] || return 1
	awk '
		function ok(uri, comps) { return uri ~ /\/debian\/?$/ && (" " comps " ") ~ / main / }
		function flush() {
			if (types ~ /(^| )deb( |$)/ && enabled != "no") {
				n = split(uris, u, " ")
				for (i = 1; i <= n; i++) if (ok(u[i], comps)) { print u[i]; found = 1; exit }
			}
			types = uris = comps = enabled = ""
		}
		FNR == 1 { flush(); deb822 = FILENAME ~ /\.sources$/ }
		/^[ \t]*#/ { next } # a comment line (no stanza break in deb822)
		{ sub(/#.*/, "") }
		!deb822 && $1 == "deb" {
			i = 2
			if ($i ~ /^\[/) { # [options], one field or several
				while ($i !~ /\]$/ && i < NF) i++
				i++
			}
			comps = ""
			for (j = i + 2; j <= NF; j++) comps = comps " " $j
			if (ok($i, comps)) { print $i; found = 1; exit }
			next
		}
		deb822 && /^[ \t]*$/ { flush(); next }
		deb822 && /^[A-Za-z-]+:/ {
			k = tolower($1); v = $0; sub(/^[^:]*:[ \t]*/, "", v)
			if (k == "types:") types = v
			else if (k == "uris:") uris = v
			else if (k == "components:") comps = v
			else if (k == "enabled:") enabled = tolower(v)
		}
		END { if (!found) flush(); exit !found }
	' "${files[@]}"
}

nvrtc_dir="${MEGAMOE_NVRTC_DIR:-$HOME/.cache/megamoe/nvrtc12}"
lib="$nvrtc_dir/usr/lib/x86_64-linux-gnu"
if [ -z "${MEGAMOE_NVRTC:-}" ]; then
	if [ ! -e "$lib/libnvrtc.so.12" ]; then
		echo "emu-test: fetching NVRTC 12.4 (libnvrtc12, libnvrtc-builtins12.4) into $nvrtc_dir" >&2
		tmp=$(mktemp -d)
		trap 'rm -rf "$tmp"' EXIT
		chmod 755 "$tmp" # as root, apt downloads as _apt, which must be able to write here
		# A private apt configuration (lists and cache under $tmp) for Debian trixie's
		# non-free, where libnvrtc12 lives: the machine's own sources are not touched.
		mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
		archive="${MEGAMOE_DEBIAN_ARCHIVE:-}"
		if [ -z "$archive" ] && ! archive=$(debian_archive); then
			echo "emu-test: no Debian archive (a \"deb\" entry whose URI ends in /debian, component main)" \
				"in /etc/apt/sources.list or /etc/apt/sources.list.d/*.{list,sources};" \
				"set MEGAMOE_DEBIAN_ARCHIVE to a Debian mirror, or MEGAMOE_NVRTC to a libnvrtc.so.12" >&2
			exit 1
		fi
		echo "emu-test: using the Debian archive $archive" >&2
		echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${archive%/} trixie non-free" >"$tmp/sources.list"
		apt_opts=(-o "Dir::Etc::SourceList=$tmp/sources.list" -o Dir::Etc::SourceParts=/dev/null
			-o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o Debug::NoLocking=1)
		if ! (cd "$tmp" && apt-get "${apt_opts[@]}" update >&2 &&
			apt-get "${apt_opts[@]}" download libnvrtc12 libnvrtc-builtins12.4 >&2); then
			echo "emu-test: could not fetch libnvrtc12 from Debian trixie non-free at $archive;" \
				"set MEGAMOE_NVRTC to a libnvrtc.so.12 instead" >&2
			exit 1
		fi
		# Unpack both packages before publishing, so a failed run leaves no half install.
		mkdir -p "$tmp/root"
		for f in "$tmp"/*.deb; do dpkg -x "$f" "$tmp/root"; done
		mkdir -p "$nvrtc_dir"
		cp -a "$tmp/root/." "$nvrtc_dir/"
	fi
	export MEGAMOE_NVRTC="$lib/libnvrtc.so.12"
	export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export MEGAMOE_EMU="${MEGAMOE_EMU:-1}" # 1: sm_80; sm_90a: compute_90a without TMA; sm_90a+tma: with TMA

if [ $# -ge 1 ]; then
	pkg=$1
	run=${2:-.}
	exec go test -tags megamoe_emu -count=1 -timeout 120m -run "$run" "$pkg"
fi
# The default set (about 8 minutes on two cores): every kernel against its
# CPU twin, every backend op on tiny shapes (CheckOps), the fused hc, norm
# and elementwise ops, sparse attention split over CTAs in a graph, graphs
# and error paths, and the emulated driver's own
# tests (TestEmu*, which plain go test no longer builds).
go test -tags megamoe_emu -count=1 -timeout 120m -run 'TestEmu|TestKernelsVsCPU|TestIndexerTopKVsCPU|TestIndexerScoresMMAVsSIMT|TestGraphReplay|TestStreamForkJoin|TestPoolHold|TestErrorsNameCallAndCode|TestCopiesMemsetPinned' ./cuda
# gemvr's rows against gemv1's bits on two shapes (about a minute; every shape: TestGemvRowsBits, 15 minutes).
go test -tags megamoe_emu -count=1 -timeout 120m -run 'TestGemvRowsBits/(8x8200|200x1032)' ./cuda
go test -tags megamoe_emu -count=1 -timeout 120m -run 'TestElementwiseOps|TestEmbedAndRope|TestHeadNorm|TestHcPreHead|TestForkRules|TestAttnSplitGraph' ./backend/gpu
go test -tags megamoe_emu -count=1 -timeout 120m -run 'TestCheckOpsTiny' ./backend/gpu/opcheck
# The Hopper TMA/wgmma kernels on the emulated H200 (about 40 s): linear_fp8_wg
# with its stage ring wrapping and its staged bulk-store epilogue (wg-bulk),
# moe_fp4_wg (MXFP4 and NVFP4), linear_fp8_tdec and the planner's
# linear_fp8_tdec3. Every case: MEGAMOE_EMU=sm_90a+tma
# scripts/emu-test.sh ./cuda 'TestKernelsVsCPU/^(wg|decwg)$' (about 30 minutes).
MEGAMOE_EMU=sm_90a+tma go test -tags megamoe_emu -count=1 -timeout 120m -run 'TestKernelsVsCPU/^(wg|wg-bulk)$/linear_fp8/^70x384x1024$' ./cuda
MEGAMOE_EMU=sm_90a+tma go test -tags megamoe_emu -count=1 -timeout 120m -run 'TestKernelsVsCPU/^wg$/moe_fp4/^(E=256_M=8_n=256_k=512_nvfp4|E=4_M=200_n=384_k=256_mxfp4_gap)$' ./cuda
MEGAMOE_EMU=sm_90a+tma go test -tags megamoe_emu -count=1 -timeout 120m -run 'TestKernelsVsCPU/^(decwg|auto)$/linear_fp8/^2x136x16512$' ./cuda
# The sm_100a tcgen05 kernels (their committed PTX fixtures) on the emulated B200.
MEGAMOE_EMU=sm_100a go test -tags megamoe_emu -count=1 -timeout 120m -run 'TestTCKernels' ./cuda
