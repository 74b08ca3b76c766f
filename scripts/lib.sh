# Sourced by the GPU scripts. use_bins TARGET...: sets bin to BIN (made
# absolute) or builds the targets into the checkout's bin/ (bench, or a
# package path for a test binary: ./cuda builds bin/cuda.test), then
# changes to the checkout's root.
use_bins() {
	local here t
	here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
	bin=
	if [ -n "${BIN:-}" ]; then
		bin=$(cd "$BIN" && pwd) || { echo "$0: no directory $BIN" >&2; exit 1; }
	fi
	cd "$here/.." || exit 1
	[ -n "$bin" ] && return
	for t in "$@"; do
		case $t in
		bench) go build -o bin/bench ./cmd/bench ;;
		*) go test -c -o "bin/$(basename "$t").test" "$t" ;;
		esac || exit 1
	done
	bin=$PWD/bin
}
