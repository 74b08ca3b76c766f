// Package ptxemu runs PTX on the CPU: a goroutine per thread, real barriers
// and warp collectives, byte-addressed global, shared, local and param
// memory. It covers the instructions NVRTC emits for MegaMoE's kernels at
// compute_80 and compute_90a (integer and float arithmetic, conversions,
// shuffles, votes, atomics, ldmatrix, mma.sync m16n8k8/k16/k32, cp.async,
// clusters), sm_90a's TMA and bulk stores, mbarriers, wgmma, stmatrix and
// setmaxnreg, and sm_100a's tcgen05 (docs/emulator.md); forms it does not
// run fail with a clear error when executed. It exists so the GPU backend's
// tests can run, slowly, on a machine without a GPU.
package ptxemu

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Module is a loaded PTX module.
type Module struct {
	dev     *Device
	funcs   map[string]*Function
	globals map[string]uint64 // .global/.const symbol -> device address
	shared  map[string]symDecl
	extern  map[string]bool // .extern .shared arrays: all name dynamic shared memory
	allocs  []uint64
	// Shared symbols that a .func names sit at fixed offsets, first in every
	// function's layout, so a callee sees them where its caller put them
	// (see fixFuncShared).
	sharedOrder []string // module-level shared symbols in declaration order
	fixedShared map[string]int
	fixedSize   int
	funcDyn     bool // a .func names an extern array: one dynamic base for all
}

type symDecl struct {
	name  string
	size  int
	align int
}

type param struct {
	name        string
	size, align int
	off         int
}

// Function is one .entry or .func.
type Function struct {
	Name   string
	Entry  bool
	mod    *Module
	params []param
	rets   []param
	// registers
	regIdx map[string]int
	nregs  int
	preds  map[int]bool // the .pred registers
	insts  []inst
	labels map[string]int
	// memory layout
	shared      map[string]int // static shared symbol -> offset
	sharedSize  int
	dynBase     int
	local       map[string]int // .local symbol -> offset in the frame
	localSize   int
	outParams   map[string]int // call-scope .param symbols -> offset in the out buffer
	outSize     int
	inSize      int
	retSize     int
	maxThreads  int
	cluster     Dim      // .reqnctapercluster; zero: none
	usesCluster bool     // barrier.cluster, mapa or %cluster_ctarank
	unsupported []string // instructions that fail when reached
}

// StaticShared is the static shared memory the function declares, in bytes.
func (f *Function) StaticShared() int { return f.sharedSize }

// LocalBytes is the function's local (stack) memory per thread.
func (f *Function) LocalBytes() int { return f.localSize }

// Registers is the number of virtual registers the PTX declares.
func (f *Function) Registers() int { return f.nregs }

var (
	reComment   = regexp.MustCompile(`(?s)/\*.*?\*/|//[^\n]*`)
	reDirective = regexp.MustCompile(`(?m)^\s*\.(version|target|address_size)\b[^\n]*$`)
	reVarDecl   = regexp.MustCompile(`^(?:\.(?:visible|extern|weak)\s+)*\.(global|shared|const|local)\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+([\w$.]+)(?:\[(\d*)\])?`)
	reRegDecl   = regexp.MustCompile(`^\.reg\s+\.(\w+)\s+(%?[\w$]+)(?:<(\d+)>)?$`)
	reParamDcl  = regexp.MustCompile(`^\.param\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+(?:\.ptr\s+(?:\.(?:global|const|local|shared)\s+)?(?:\.align\s+\d+\s+)?)?([\w$]+)(?:\[(\d+)\])?$`)
)

// typeSize is the byte size of a PTX fundamental type name (no dot).
func typeSize(t string) int {
	switch t {
	case "b8", "s8", "u8", "pred", "e4m3", "e5m2":
		return 1
	case "b16", "s16", "u16", "f16", "bf16":
		return 2
	case "b32", "s32", "u32", "f32", "f16x2", "bf16x2", "tf32":
		return 4
	case "b64", "s64", "u64", "f64":
		return 8
	case "b128":
		return 16
	}
	return 0
}

// Load parses PTX text into a module; .global and .const variables are
// allocated and initialised on dev. A module that fails to load frees the
// variables it had allocated.
func (dev *Device) Load(ptx []byte) (_ *Module, err error) {
	src := reComment.ReplaceAllString(strings.TrimRight(string(ptx), "\x00"), "")
	src = reDirective.ReplaceAllString(src, "")
	m := &Module{dev: dev, funcs: map[string]*Function{}, globals: map[string]uint64{}, shared: map[string]symDecl{}, extern: map[string]bool{}}
	defer func() {
		if r := recover(); r != nil { // malformed PTX the checks below missed: an error, not a crash
			err = fmt.Errorf("ptxemu: malformed PTX: %v", r)
		}
		if err != nil {
			m.Unload()
		}
	}()
	stmts, err := splitTop(src)
	if err != nil {
		return nil, err
	}
	type fbody struct {
		f    *Function
		body string
	}
	var bodies []fbody
	for _, s := range stmts {
		switch {
		case s.body != "":
			f, err := m.parseHeader(s.head)
			if err != nil {
				return nil, err
			}
			bodies = append(bodies, fbody{f, s.body})
		case strings.HasPrefix(s.head, ".version"), strings.HasPrefix(s.head, ".target"), strings.HasPrefix(s.head, ".address_size"):
		case strings.Contains(s.head, ".func") || strings.Contains(s.head, ".entry"):
			// prototype only
		default:
			if err := m.parseModuleVar(s.head); err != nil {
				return nil, err
			}
		}
	}
	for _, b := range bodies {
		if !b.f.Entry {
			m.fixFuncShared(b.body)
		}
	}
	for _, b := range bodies {
		if err := m.parseBody(b.f, b.body); err != nil {
			return nil, err
		}
	}
	// Dynamic shared memory starts after the static symbols, 1024-aligned
	// (the strictest alignment a swizzled tile needs); at one base for the
	// whole module when a .func addresses it.
	dynBase := 0
	for _, b := range bodies {
		b.f.dynBase = alignUp(b.f.sharedSize, 1024)
		dynBase = max(dynBase, b.f.dynBase)
	}
	for _, b := range bodies {
		if m.funcDyn {
			b.f.dynBase = dynBase
		}
		for i := range b.f.insts {
			for j := range b.f.insts[i].args {
				fixDyn(&b.f.insts[i].args[j], uint64(b.f.dynBase))
			}
		}
	}
	return m, nil
}

// fixFuncShared gives the module shared symbols that a .func body names a
// fixed place. A function lays out the symbols it uses in first-use order,
// so without this a callee and its caller could disagree on an offset.
func (m *Module) fixFuncShared(body string) {
	if m.fixedShared == nil {
		m.fixedShared = map[string]int{}
	}
	for name := range m.extern {
		if namesSymbol(body, name) {
			m.funcDyn = true
		}
	}
	for _, name := range m.sharedOrder {
		if _, ok := m.fixedShared[name]; ok || !namesSymbol(body, name) {
			continue
		}
		d := m.shared[name]
		m.fixedSize = alignUp(m.fixedSize, d.align)
		m.fixedShared[name] = m.fixedSize
		m.fixedSize += d.size
	}
}

// namesSymbol reports whether text contains name as a whole identifier.
func namesSymbol(text, name string) bool {
	ident := func(c byte) bool {
		return c == '_' || c == '$' || c == '.' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
	}
	for i := 0; ; {
		k := strings.Index(text[i:], name)
		if k < 0 {
			return false
		}
		k += i
		end := k + len(name)
		if (k == 0 || !ident(text[k-1])) && (end == len(text) || !ident(text[end])) {
			return true
		}
		i = k + 1
	}
}

// Unload frees the module's global variables.
func (m *Module) Unload() {
	for _, p := range m.allocs {
		m.dev.Free(p)
	}
	m.allocs = nil
}

// Function finds an entry point by name.
func (m *Module) Function(name string) (*Function, error) {
	f := m.funcs[name]
	if f == nil || !f.Entry {
		return nil, fmt.Errorf("ptxemu: no entry %q", name)
	}
	return f, nil
}

type topStmt struct{ head, body string }

// splitTop cuts the module into top-level statements; a function keeps its
// header and its brace-delimited body.
func splitTop(src string) ([]topStmt, error) {
	var out []topStmt
	i := 0
	for i < len(src) {
		j := strings.IndexAny(src[i:], ";{")
		if j < 0 {
			if strings.TrimSpace(src[i:]) != "" {
				return nil, fmt.Errorf("ptxemu: trailing text %q", trunc(src[i:]))
			}
			break
		}
		j += i
		head := strings.TrimSpace(src[i:j])
		if src[j] == ';' {
			out = append(out, topStmt{head: head})
			i = j + 1
			continue
		}
		if strings.Contains(head, "=") { // initializer list: .global ... = { ... };
			k := strings.IndexByte(src[j:], ';')
			if k < 0 {
				return nil, fmt.Errorf("ptxemu: unterminated initializer")
			}
			out = append(out, topStmt{head: strings.TrimSpace(src[i : j+k])})
			i = j + k + 1
			continue
		}
		depth, k := 0, j
		for ; k < len(src); k++ {
			if src[k] == '{' {
				depth++
			} else if src[k] == '}' {
				depth--
				if depth == 0 {
					break
				}
			}
		}
		if depth != 0 {
			return nil, fmt.Errorf("ptxemu: unbalanced braces after %q", trunc(head))
		}
		out = append(out, topStmt{head: head, body: src[j+1 : k]})
		i = k + 1
	}
	return out, nil
}

func trunc(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

func (m *Module) parseModuleVar(s string) error {
	mt := reVarDecl.FindStringSubmatch(s)
	if mt == nil {
		return fmt.Errorf("ptxemu: unknown module statement %q", trunc(s))
	}
	space, ty, name := mt[1], mt[3], mt[4]
	align, _ := strconv.Atoi(mt[2])
	es := typeSize(ty)
	if align == 0 {
		align = es
	}
	n := 1
	if mt[5] != "" {
		n, _ = strconv.Atoi(mt[5])
	} else if strings.Contains(s, "[]") {
		n = 0
	}
	size := es * n
	switch space {
	case "shared":
		if strings.Contains(s, ".extern") || n == 0 {
			m.extern[name] = true
		} else {
			m.shared[name] = symDecl{name, size, align}
			m.sharedOrder = append(m.sharedOrder, name)
		}
		return nil
	case "global", "const":
		if size == 0 {
			size = es
		}
		p, err := m.dev.Alloc(size)
		if err != nil {
			return err
		}
		m.allocs = append(m.allocs, p)
		m.globals[name] = p
		if k := strings.IndexByte(s, '='); k >= 0 {
			init := strings.Trim(strings.TrimSpace(s[k+1:]), "{}")
			buf, _ := m.dev.bytes(p, size)
			off := 0
			for _, v := range strings.Split(init, ",") {
				v = strings.TrimSpace(v)
				if v == "" {
					continue
				}
				bits, ok := parseImm(v)
				if !ok {
					return fmt.Errorf("ptxemu: initializer %q of %s", v, name)
				}
				if off+es > len(buf) {
					return fmt.Errorf("ptxemu: initializer of %s overflows", name)
				}
				putLE(buf[off:off+es], bits)
				off += es
			}
		}
		return nil
	}
	return fmt.Errorf("ptxemu: unsupported module variable %q", trunc(s))
}

var reHeader = regexp.MustCompile(`^((?:\.\w+\s+)*)\.(entry|func)\s*(?:\(([^)]*)\))?\s*([\w$]+)\s*(?:\(([^)]*)\))?(.*)$`)

func (m *Module) parseHeader(h string) (*Function, error) {
	h = strings.Join(strings.Fields(h), " ")
	mt := reHeader.FindStringSubmatch(h)
	if mt == nil {
		return nil, fmt.Errorf("ptxemu: bad function header %q", trunc(h))
	}
	f := &Function{Name: mt[4], Entry: mt[2] == "entry", mod: m, regIdx: map[string]int{}, labels: map[string]int{},
		shared: map[string]int{}, local: map[string]int{}, outParams: map[string]int{}}
	var err error
	if f.rets, f.retSize, err = parseParams(mt[3]); err != nil {
		return nil, err
	}
	if f.params, f.inSize, err = parseParams(mt[5]); err != nil {
		return nil, err
	}
	if k := strings.Index(mt[6], ".reqnctapercluster"); k >= 0 {
		fmt.Sscanf(strings.ReplaceAll(mt[6][k+18:], ",", " "), "%d %d %d", &f.cluster.X, &f.cluster.Y, &f.cluster.Z)
	}
	if k := strings.Index(mt[6], ".maxntid"); k >= 0 {
		fmt.Sscanf(strings.TrimSpace(mt[6][k+8:]), "%d", &f.maxThreads)
	}
	m.funcs[f.Name] = f
	return f, nil
}

func parseParams(s string) ([]param, int, error) {
	var ps []param
	off := 0
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		mt := reParamDcl.FindStringSubmatch(p)
		if mt == nil {
			return nil, 0, fmt.Errorf("ptxemu: bad parameter %q", p)
		}
		es := typeSize(mt[2])
		if es == 0 {
			return nil, 0, fmt.Errorf("ptxemu: parameter %q: unknown type .%s", p, mt[2])
		}
		align, _ := strconv.Atoi(mt[1])
		if align == 0 {
			align = es
		}
		n := 1
		if mt[4] != "" {
			n, _ = strconv.Atoi(mt[4])
		}
		off = alignUp(off, align)
		ps = append(ps, param{name: mt[3], size: es * n, align: align, off: off})
		off += es * n
	}
	return ps, off, nil
}

func alignUp(n, a int) int {
	if a <= 1 {
		return n
	}
	return (n + a - 1) / a * a
}

// parseBody declares registers and locals, records labels and decodes
// instructions.
func (m *Module) parseBody(f *Function, body string) error {
	for name, off := range m.fixedShared {
		f.shared[name] = off
	}
	f.sharedSize = m.fixedSize
	stmts, err := unscope(splitBody(body))
	if err != nil {
		return fmt.Errorf("%w in %s", err, f.Name)
	}
	slots := map[string][2]int{} // call parameter -> its slot's size and alignment
	type pending struct {
		text string
		pc   int
	}
	var code []pending
	for _, s := range stmts {
		switch {
		case strings.HasSuffix(s, ":"):
			f.labels[strings.TrimSuffix(s, ":")] = len(code)
		case strings.HasPrefix(s, ".reg"):
			if err := f.declRegs(strings.TrimSuffix(s, ";")); err != nil {
				return err
			}
		case strings.HasPrefix(s, ".local"), strings.HasPrefix(s, ".shared"):
			mt := reVarDecl.FindStringSubmatch(strings.TrimSuffix(s, ";"))
			if mt == nil {
				return fmt.Errorf("ptxemu: %s: bad declaration %q", f.Name, s)
			}
			align, _ := strconv.Atoi(mt[2])
			n, _ := strconv.Atoi(mt[5])
			if n == 0 {
				n = 1
			}
			size := typeSize(mt[3]) * n
			if size == 0 {
				return fmt.Errorf("ptxemu: %s: declaration %q: unknown type .%s", f.Name, s, mt[3])
			}
			if mt[1] == "local" {
				f.localSize = alignUp(f.localSize, max(align, 1))
				f.local[mt[4]] = f.localSize
				f.localSize += size
			} else {
				m.shared[mt[4]] = symDecl{mt[4], size, max(align, 1)}
			}
		case strings.HasPrefix(s, ".param"):
			mt := reParamDcl.FindStringSubmatch(strings.TrimSuffix(strings.TrimSuffix(s, ";"), " "))
			if mt == nil {
				return fmt.Errorf("ptxemu: %s: bad call parameter %q", f.Name, s)
			}
			es := typeSize(mt[2])
			if es == 0 {
				return fmt.Errorf("ptxemu: %s: call parameter %q: unknown type .%s", f.Name, s, mt[2])
			}
			align, _ := strconv.Atoi(mt[1])
			n := 1
			if mt[4] != "" {
				n, _ = strconv.Atoi(mt[4])
			}
			// Every call sequence declares its own param0, param1, ...,
			// with its own types; all uses resolve to one slot per name,
			// so the slot must fit and align every declaration.
			size, al := es*n, max(align, es)
			old, ok := slots[mt[3]]
			if !ok || old[0] < size || f.outParams[mt[3]]%al != 0 {
				size, al = max(size, old[0]), max(al, old[1])
				f.outSize = alignUp(f.outSize, al)
				f.outParams[mt[3]] = f.outSize
				f.outSize += size
				slots[mt[3]] = [2]int{size, al}
			}
		case strings.HasPrefix(s, ".pragma"), strings.HasPrefix(s, ".loc"), strings.HasPrefix(s, ".file"):
		default:
			code = append(code, pending{strings.TrimSuffix(s, ";"), len(code)})
		}
	}
	f.insts = make([]inst, len(code))
	for i, c := range code {
		if err := f.decode(&f.insts[i], c.text); err != nil {
			return fmt.Errorf("ptxemu: %s: %q: %w", f.Name, c.text, err)
		}
	}
	return nil
}

func fixDyn(o *operand, base uint64) {
	if o.sym == spShared && o.imm >= dynSharedMarker && o.imm < 2*dynSharedMarker {
		o.imm = o.imm - dynSharedMarker + base
	}
	for i := range o.vec {
		fixDyn(&o.vec[i], base)
	}
}

// maxRegDecl bounds one .reg %r<n> declaration, so that a malformed count
// fails instead of exhausting memory.
const maxRegDecl = 1 << 20

func (f *Function) declRegs(s string) error {
	fields := strings.Fields(s)
	if len(fields) < 3 {
		return fmt.Errorf("ptxemu: %s: bad register declaration %q", f.Name, s)
	}
	head := fields[0] + " " + fields[1] + " "
	for _, name := range strings.Split(strings.Join(fields[2:], ""), ",") {
		mt := reRegDecl.FindStringSubmatch(head + name)
		if mt == nil {
			return fmt.Errorf("ptxemu: %s: bad register declaration %q", f.Name, s)
		}
		if n, _ := strconv.Atoi(mt[3]); n > maxRegDecl {
			return fmt.Errorf("ptxemu: %s: %d registers in %q", f.Name, n, s)
		}
		if mt[1] == "pred" {
			if f.preds == nil {
				f.preds = map[int]bool{}
			}
			n, err := strconv.Atoi(mt[3])
			if err != nil {
				n = 1 // no <n>: one register
			}
			for i := 0; i < n; i++ {
				f.preds[f.nregs+i] = true
			}
		}
		if mt[3] == "" {
			f.regIdx[mt[2]] = f.nregs
			f.nregs++
			continue
		}
		n, _ := strconv.Atoi(mt[3])
		for i := 0; i < n; i++ {
			f.regIdx[mt[2]+strconv.Itoa(i)] = f.nregs
			f.nregs++
		}
	}
	return nil
}

// sharedOffset places a static shared symbol in f's layout on first use.
func (f *Function) sharedOffset(name string) (int, bool) {
	if off, ok := f.shared[name]; ok {
		return off, true
	}
	d, ok := f.mod.shared[name]
	if !ok {
		return 0, false
	}
	f.sharedSize = alignUp(f.sharedSize, d.align)
	f.shared[name] = f.sharedSize
	f.sharedSize += d.size
	return f.shared[name], true
}

// parseImm reads an integer or PTX float literal (0fXXXXXXXX, 0dXXXXXXXXXXXXXXXX).
func parseImm(s string) (uint64, bool) {
	neg := false
	if strings.HasPrefix(s, "-") {
		neg, s = true, s[1:]
	}
	var v uint64
	var err error
	switch {
	case strings.HasPrefix(s, "0f") || strings.HasPrefix(s, "0F"):
		v, err = strconv.ParseUint(s[2:], 16, 32)
		if neg {
			v ^= 1 << 31
		}
		return v, err == nil
	case strings.HasPrefix(s, "0d") || strings.HasPrefix(s, "0D"):
		v, err = strconv.ParseUint(s[2:], 16, 64)
		if neg {
			v ^= 1 << 63
		}
		return v, err == nil
	case strings.HasPrefix(s, "0x") || strings.HasPrefix(s, "0X"):
		v, err = strconv.ParseUint(strings.TrimSuffix(strings.TrimSuffix(s[2:], "U"), "u"), 16, 64)
	default:
		v, err = strconv.ParseUint(strings.TrimSuffix(strings.TrimSuffix(s, "U"), "u"), 10, 64)
	}
	if err != nil {
		return 0, false
	}
	if neg {
		v = -v
	}
	return v, true
}

func putLE(b []byte, v uint64) {
	for i := range b {
		b[i] = byte(v >> (8 * i))
	}
}

func getLE(b []byte) uint64 {
	var v uint64
	for i := len(b) - 1; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

var reLabel = regexp.MustCompile(`^[\w$.]+:$`)

// splitBody cuts a function body into statements: instructions and
// declarations end at ';', labels at ':' on their line. A '{' that starts a
// statement opens a scope (inline asm blocks: "{.reg .b16 a, b; ...}"),
// marked by a "{" statement, and its '}' by "}" (see unscope); braces
// inside a statement are a vector operand.
func splitBody(body string) []string {
	var out []string
	var cur strings.Builder
	depth := 0
	flush := func() {
		if t := strings.TrimSpace(cur.String()); t != "" {
			out = append(out, t+";")
		}
		cur.Reset()
	}
	for i := 0; i < len(body); i++ {
		c := body[i]
		switch {
		case c == '{' && strings.TrimSpace(cur.String()) == "":
			out = append(out, "{") // scope open
		case c == '{':
			depth++
			cur.WriteByte(c)
		case c == '}' && depth > 0:
			depth--
			cur.WriteByte(c)
		case c == '}':
			flush()
			out = append(out, "}") // scope close
		case c == ';' && depth == 0:
			flush()
		case c == '\n':
			if t := strings.TrimSpace(cur.String()); reLabel.MatchString(t) {
				out = append(out, t)
				cur.Reset()
			} else {
				cur.WriteByte(' ')
			}
		default:
			cur.WriteByte(c)
		}
	}
	flush()
	return out
}
