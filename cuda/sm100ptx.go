package cuda

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// The sm_100a PTX of the tcgen05 kernels is committed (kernels/sm100/*.ptx):
// tests run it in the emulator on machines whose NVRTC cannot target
// sm_100a, and TestSM100FixturesFresh fails when a kernel's source changes
// without its fixture being regenerated (gpucheck --compile-only --arch
// sm_100a --ptx-out cuda/kernels/sm100; docs/blackwell.md).

//go:embed kernels/sm100/*.ptx
var sm100FS embed.FS

// SM100Kernels are the kernel sources built only for sm_100a.
var SM100Kernels = []string{"linear_fp8_sm100", "moe_fp4_sm100"}

// provisionalMacro selects the tcgen05 code of the kernels when compiling
// for compute_90a (an NVRTC without sm_100a): the inline asm passes through.
const provisionalMacro = "MEGAMOE_SM100_PTX"

var includeRE = regexp.MustCompile(`(?m)^\s*#include\s+"([^"]+)"`)

// KernelSourceHash is the sha256 of kernels/<name>.cu and the embedded
// headers it includes, transitively (what its PTX depends on).
func KernelSourceHash(name string) (string, error) {
	src, err := KernelSource(name)
	if err != nil {
		return "", err
	}
	seen := map[string]bool{}
	var walk func(text string) error
	walk = func(text string) error {
		for _, m := range includeRE.FindAllStringSubmatch(text, -1) {
			if seen[m[1]] {
				continue
			}
			seen[m[1]] = true
			b, err := kernelFS.ReadFile(path.Join("kernels", m[1]))
			if err != nil {
				continue // a system header (NVRTC's own)
			}
			if err := walk(string(b)); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(src); err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s.cu %d\n%s", name, len(src), src)
	var hs []string
	for n := range seen {
		hs = append(hs, n)
	}
	sort.Strings(hs)
	for _, n := range hs {
		if b, err := kernelFS.ReadFile(path.Join("kernels", n)); err == nil {
			fmt.Fprintf(h, "%s %d\n%s", n, len(b), b)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// SM100Fixture is one committed PTX fixture: the header fields and the PTX.
type SM100Fixture struct {
	SourceHash  string
	NVRTC       string // version that produced it
	Provisional bool   // compute_90a output with its target rewritten
	PTX         string // the text NVRTC wrote (header comments included)
}

const fixtureTag = "// megamoe sm_100a fixture"

// LoadSM100Fixture returns the committed fixture of kernels/<name>.cu.
func LoadSM100Fixture(name string) (SM100Fixture, error) {
	b, err := sm100FS.ReadFile(path.Join("kernels/sm100", name+".ptx"))
	if err != nil {
		return SM100Fixture{}, fmt.Errorf("cuda: sm_100a fixture %s: %w", name, err)
	}
	return ParseSM100Fixture(string(b))
}

// ParseSM100Fixture reads a fixture's header.
func ParseSM100Fixture(text string) (SM100Fixture, error) {
	f := SM100Fixture{PTX: text}
	if !strings.HasPrefix(text, fixtureTag) {
		return f, fmt.Errorf("cuda: sm_100a fixture: no %q header", fixtureTag)
	}
	for _, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, "//") {
			break
		}
		k, v, ok := strings.Cut(strings.TrimSpace(strings.TrimPrefix(l, "//")), ": ")
		if !ok {
			continue
		}
		switch k {
		case "source sha256":
			f.SourceHash = v
		case "nvrtc":
			f.NVRTC = v
		case "provisional":
			f.Provisional = v == "yes"
		}
	}
	if f.SourceHash == "" {
		return f, fmt.Errorf("cuda: sm_100a fixture: no source hash")
	}
	return f, nil
}

var (
	targetRE  = regexp.MustCompile(`(?m)^\.target\s+\S+`)
	versionRE = regexp.MustCompile(`(?m)^\.version\s+\S+`)
)

// SM100PTX compiles kernels/<name>.cu to sm_100a PTX with n and returns the
// fixture text. NVRTC 12.8 and later target compute_100a; an older one
// compiles for compute_90a with the tcgen05 code selected by a macro and
// the target rewritten to sm_100a, ISA 8.7: a provisional fixture, marked as
// such, that an NVRTC 13 run replaces.
func SM100PTX(n *NVRTC, name string) (string, error) {
	src, err := KernelSource(name)
	if err != nil {
		return "", err
	}
	hash, err := KernelSourceHash(name)
	if err != nil {
		return "", err
	}
	provisional := n.Major < 12 || n.Major == 12 && n.Minor < 8
	arch, extra := "compute_100a", []string(nil)
	if provisional {
		arch, extra = "compute_90a", []string{"-D" + provisionalMacro}
	}
	out, _, err := n.compileNamed(src, name+".cu", arch, extra...)
	if err != nil {
		return "", fmt.Errorf("cuda: sm_100a PTX of %s: %w", name, err)
	}
	ptx := strings.TrimRight(string(out), "\x00")
	if provisional {
		ptx = targetRE.ReplaceAllString(ptx, ".target sm_100a")
		ptx = versionRE.ReplaceAllString(ptx, ".version 8.7")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s of kernels/%s.cu\n", fixtureTag, name)
	fmt.Fprintf(&b, "// source sha256: %s\n", hash)
	fmt.Fprintf(&b, "// nvrtc: %d.%d\n", n.Major, n.Minor)
	if provisional {
		fmt.Fprintf(&b, "// provisional: yes\n")
		fmt.Fprintf(&b, "// (compute_90a with -D%s, target rewritten; regenerate with NVRTC 13:\n", provisionalMacro)
		fmt.Fprintf(&b, "//  go run ./cmd/gpucheck --compile-only --arch sm_100a --ptx-out cuda/kernels/sm100)\n")
	} else {
		fmt.Fprintf(&b, "// provisional: no\n")
	}
	b.WriteString(ptx)
	return b.String(), nil
}

// emuSM100Image is the module image for the emulated sm_100a device, whose
// PTX an NVRTC older than 12.8 cannot write: the committed fixture of a
// tcgen05 kernel, else nil and the compute_90a target (the portable and
// non-TMA kernels' PTX; the Hopper TMA kernels are never picked on 10.x).
// Elsewhere it is nil and the device's own target.
func (c *Context) emuSM100Image(name string) ([]byte, string, error) {
	arch := c.dev.Arch()
	if !c.dev.Emulated() || c.dev.Major != 10 || c.nvrtc.Major > 12 || c.nvrtc.Major == 12 && c.nvrtc.Minor >= 8 {
		return nil, arch, nil
	}
	if !slices.Contains(SM100Kernels, name) {
		return nil, "compute_90a", nil
	}
	f, err := LoadSM100Fixture(name)
	if err != nil {
		return nil, arch, err
	}
	return []byte(f.PTX), arch, nil
}
