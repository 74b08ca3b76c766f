package cuda

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

//go:embed kernels/*.cu kernels/*.cuh
var kernelFS embed.FS

// KernelSources lists the embedded kernel sources (file names without .cu).
func KernelSources() []string {
	ents, _ := kernelFS.ReadDir("kernels")
	var out []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".cu") {
			out = append(out, strings.TrimSuffix(e.Name(), ".cu"))
		}
	}
	sort.Strings(out)
	return out
}

// KernelSource returns the text of kernels/<name>.cu.
func KernelSource(name string) (string, error) {
	b, err := kernelFS.ReadFile(path.Join("kernels", name+".cu"))
	if err != nil {
		return "", fmt.Errorf("cuda: kernel source %q: %w", name, err)
	}
	return string(b), nil
}

// headers are the embedded .cuh files, offered to NVRTC by name.
func headers() (names, texts []string) {
	ents, _ := kernelFS.ReadDir("kernels")
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".cuh") {
			b, _ := kernelFS.ReadFile(path.Join("kernels", e.Name()))
			names = append(names, e.Name())
			texts = append(texts, string(b))
		}
	}
	return names, texts
}

// NVRTC is the loaded runtime compiler.
type NVRTC struct {
	api          nvrtcAPI
	Major, Minor int
}

// LoadNVRTC opens libnvrtc (.so.13, .so.12, .so; or $MEGAMOE_NVRTC).
// It needs no GPU.
func LoadNVRTC() (*NVRTC, error) {
	api, err := openNVRTC()
	if err != nil {
		return nil, err
	}
	n := &NVRTC{api: api}
	n.Major, n.Minor = api.version()
	return n, nil
}

// Path is the library that was opened.
func (n *NVRTC) Path() string { return n.api.libPath() }

// CompileOptions are the NVRTC options used for arch (e.g. "sm_90a").
func CompileOptions(arch string) []string {
	opts := []string{"--gpu-architecture=" + arch, "-std=c++17", "-default-device"}
	if st, err := os.Stat("/usr/local/cuda/include"); err == nil && st.IsDir() {
		opts = append(opts, "-I/usr/local/cuda/include")
	}
	return opts
}

// Compile compiles one CUDA C++ source for arch to a CUBIN. The embedded
// kernels/*.cuh headers can be #included. The log holds NVRTC's and ptxas's
// messages even on success.
func (n *NVRTC) Compile(src, arch string) ([]byte, string, error) {
	return n.compileNamed(src, "kernel.cu", arch)
}

// CompileVerbose is Compile with ptxas's resource and performance messages
// in the log (registers, spills, wgmma serialisation), for inspection only:
// the options differ from the cached builds'.
func (n *NVRTC) CompileVerbose(src, arch string) ([]byte, string, error) {
	return n.compileNamed(src, "kernel.cu", arch, "--ptxas-options=-v")
}

func (n *NVRTC) compileNamed(src, name, arch string, extra ...string) ([]byte, string, error) {
	inc, txt := headers()
	cubin, log, call, code := n.api.compile(src, name, txt, inc, append(CompileOptions(arch), extra...))
	if code != 0 {
		return nil, log, &Error{Call: call, What: name + " " + arch, Code: code, Name: n.api.errString(code), Log: log}
	}
	return cubin, log, nil
}

// cacheKey hashes everything that determines the CUBIN.
func (n *NVRTC) cacheKey(src, arch string) string {
	h := sha256.New()
	fmt.Fprintf(h, "nvrtc %d.%d\narch %s\n", n.Major, n.Minor, arch)
	for _, o := range CompileOptions(arch) {
		fmt.Fprintf(h, "opt %s\n", o)
	}
	inc, txt := headers()
	for i := range inc {
		fmt.Fprintf(h, "header %s %d\n%s", inc[i], len(txt[i]), txt[i])
	}
	fmt.Fprintf(h, "source %d\n%s", len(src), src)
	return hex.EncodeToString(h.Sum(nil))
}

// cacheDir is os.UserCacheDir()/megamoe/kernels, or "" when unavailable.
func cacheDir() string {
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "megamoe", "kernels")
}

// CompileCached is Compile with an on-disk CUBIN cache keyed by the sha256 of
// source, headers, options, arch and NVRTC version. Cache failures are not
// errors: the kernel is simply compiled again.
func (n *NVRTC) CompileCached(name, src, arch string) ([]byte, error) {
	dir := cacheDir()
	var file string
	if dir != "" {
		file = filepath.Join(dir, n.cacheKey(src, arch)+".cubin")
		if b, err := os.ReadFile(file); err == nil && len(b) > 0 {
			return b, nil
		}
	}
	cubin, _, err := n.compileNamed(src, name+".cu", arch)
	if err != nil {
		return nil, err
	}
	if file != "" && os.MkdirAll(dir, 0o755) == nil {
		tmp, err := os.CreateTemp(dir, "tmp-*.cubin")
		if err == nil {
			_, werr := tmp.Write(cubin)
			cerr := tmp.Close()
			if werr == nil && cerr == nil {
				_ = os.Rename(tmp.Name(), file)
			} else {
				_ = os.Remove(tmp.Name())
			}
		}
	}
	return cubin, nil
}

// Module is a loaded CUBIN.
type Module struct {
	ctx   *Context
	h     uintptr
	name  string
	funcs map[string]*Function
}

// Module compiles (or loads from cache) kernels/<name>.cu for the context's
// device and loads it, once per context.
func (c *Context) Module(name string) (*Module, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("cuda: module %s: context closed", name)
	}
	if m := c.modules[name]; m != nil {
		return m, nil
	}
	if c.nvrtc == nil {
		n, err := LoadNVRTC()
		if err != nil {
			return nil, fmt.Errorf("module %s: %w", name, err)
		}
		c.nvrtc = n
	}
	src, err := KernelSource(name)
	if err != nil {
		return nil, err
	}
	cubin, arch, err := c.emuSM100Image(name)
	if err == nil && cubin == nil {
		cubin, err = c.nvrtc.CompileCached(name, src, arch)
	}
	if err != nil {
		return nil, fmt.Errorf("module %s: %w", name, err)
	}
	m, err := c.LoadModule(name, cubin)
	if err != nil {
		return nil, err
	}
	c.modules[name] = m
	return m, nil
}

// LoadModule loads a CUBIN image (cuModuleLoadData). The caller owns it.
func (c *Context) LoadModule(name string, cubin []byte) (*Module, error) {
	if len(cubin) == 0 {
		return nil, fmt.Errorf("cuda: cuModuleLoadData(%s): empty image", name)
	}
	h, r := c.drv.api.moduleLoadData(c.h, cubin)
	if err := c.check("cuModuleLoadData", name, r); err != nil {
		return nil, err
	}
	return &Module{ctx: c, h: h, name: name, funcs: map[string]*Function{}}, nil
}

// Function looks up an extern "C" kernel in the module. Lookups are cached;
// the context's mutex is not held, so callers serialize per module (the
// Kernels type does).
func (m *Module) Function(name string) (*Function, error) {
	if f := m.funcs[name]; f != nil {
		return f, nil
	}
	h, r := m.ctx.drv.api.moduleGetFunction(m.ctx.h, m.h, name)
	if err := m.ctx.check("cuModuleGetFunction", name, r); err != nil {
		return nil, err
	}
	f := &Function{ctx: m.ctx, h: h, Name: name}
	m.funcs[name] = f
	return f, nil
}

// ptxTarget reports whether opts name a virtual architecture (compute_XX),
// whose output is PTX text rather than a CUBIN.
func ptxTarget(opts []string) bool {
	for _, o := range opts {
		if strings.HasPrefix(o, "--gpu-architecture=compute_") {
			return true
		}
	}
	return false
}
