package ptxemu

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// inst is one decoded instruction; exec runs it for a thread.
type inst struct {
	text     string
	base     string
	guard    int
	guardNot bool
	args     []operand
	exec     func(*thread, *inst)
	mods     []string // opcode parts after the base
	typ      string   // last type modifier
	typ2     string   // the type before it (cvt source, mul.wide, ...)
	w        int      // bits of typ
	sp       space
	vec      int
	target   int
	callee   *Function
	aux      int
	rnd      string
	ftz, sat bool
}

var reGuard = regexp.MustCompile(`^@(!?)(%?[A-Za-z_$][\w$]*)\s+`)

func (in *inst) has(m string) bool {
	for _, x := range in.mods {
		if x == m {
			return true
		}
	}
	return false
}

func (f *Function) decode(in *inst, text string) error {
	in.text, in.guard = text, -1
	if g := reGuard.FindStringSubmatch(text); g != nil {
		r, ok := f.regIdx[g[2]]
		if !ok {
			return fmt.Errorf("unknown guard %s", g[2])
		}
		in.guard, in.guardNot = r, g[1] == "!"
		text = text[len(g[0]):]
	}
	opcode, rest := text, ""
	if i := strings.IndexAny(text, " \t"); i >= 0 {
		opcode, rest = text[:i], strings.TrimSpace(text[i:])
	}
	parts := strings.Split(opcode, ".")
	base := parts[0]
	in.base, in.mods = base, parts[1:]
	var types []string
	for _, m := range in.mods {
		switch {
		case typeSize(m) > 0 && m != "pred" || m == "pred":
			types = append(types, m)
		case m == "v2" || m == "v4" || m == "v8":
			in.vec, _ = strconv.Atoi(m[1:])
		case m == "rn" || m == "rz" || m == "rm" || m == "rp" || m == "rni" || m == "rzi" || m == "rmi" || m == "rpi":
			in.rnd = m
		case m == "ftz":
			in.ftz = true
		case m == "sat" || m == "satfinite":
			in.sat = true
		case m == "global":
			in.sp = spGlobal
		case m == "shared" || m == "shared::cta":
			in.sp = spShared
		case m == "shared::cluster":
			in.sp = spCluster
		case m == "local":
			in.sp = spLocal
		case m == "param":
			in.sp = spParamIn
		case m == "const":
			in.sp = spConst
		}
	}
	if n := len(types); n > 0 {
		in.typ = types[n-1]
		if n > 1 {
			in.typ2 = types[n-2]
		}
		in.w = typeSize(in.typ) * 8
		if in.typ == "pred" {
			in.w = 1
		}
	}
	switch {
	case base == "cp" && in.has("bulk") && in.has("prefetch"):
		in.exec = func(*thread, *inst) {} // an L2 prefetch: no effect on results
		return nil
	case base == "cp" && in.has("bulk"):
		return f.decodeBulk(in, rest) // TMA: its own operand syntax
	case base == "tensormap":
		return f.deferUnsupported(in, "sm_90 instruction "+opcode)
	case decoders[base] == nil && base != "bra" && base != "call":
		return f.deferUnsupported(in, "instruction "+opcode)
	case base == "barrier" && in.has("cluster"):
		f.usesCluster = true
		decBarrierCluster(in)
		return nil
	}
	switch base {
	case "bra":
		t, ok := f.labels[rest]
		if !ok {
			return fmt.Errorf("unknown label %s", rest)
		}
		in.target = t
		in.exec = func(t *thread, in *inst) { t.pc = in.target }
		return nil
	case "call":
		return f.decodeCall(in, rest)
	}
	for _, a := range splitOperands(rest) {
		if strings.Contains(a, "|") && !strings.HasPrefix(a, "{") { // d|p of setp and shfl
			for _, s := range strings.Split(a, "|") {
				o, err := f.operand(s)
				if err != nil {
					return err
				}
				in.args = append(in.args, o)
			}
			in.aux = -1 // marks the extra predicate destination
			continue
		}
		o, err := f.operand(a)
		if err != nil {
			return err
		}
		if in.sp != spNone && o.kind == oAddr && o.sym != spNone && (base == "ld" || base == "st") && in.sp == spParamIn {
			in.sp = o.sym // param in, out or ret
		}
		in.args = append(in.args, o)
	}
	if (base == "ld" || base == "st" || base == "ldu" || base == "atom" || base == "red") && in.sp == spNone {
		in.sp = spGeneric
	}
	err := decoders[base](f, in)
	var u unsupportedError
	if errors.As(err, &u) {
		return f.deferUnsupported(in, u.what)
	}
	return err
}

// unsupportedError is an instruction form the emulator does not run: the
// module still loads, and the instruction fails when a thread reaches it.
type unsupportedError struct{ what string }

func (e unsupportedError) Error() string { return "unsupported " + e.what }

func unsupported(format string, a ...any) error {
	return unsupportedError{fmt.Sprintf(format, a...)}
}

func (f *Function) deferUnsupported(in *inst, what string) error {
	f.unsupported = append(f.unsupported, what)
	in.exec = func(t *thread, _ *inst) { t.panicf("ptxemu does not emulate %s", what) }
	return nil
}

func (f *Function) decodeCall(in *inst, rest string) error {
	ops := splitOperands(rest)
	var ret, args []string
	name := ""
	for _, o := range ops {
		switch {
		case strings.HasPrefix(o, "(") && name == "":
			ret = splitOperands(strings.Trim(o, "()"))
		case strings.HasPrefix(o, "("):
			args = splitOperands(strings.Trim(o, "()"))
		default:
			name = o
		}
	}
	callee := f.mod.funcs[name]
	if callee == nil {
		return fmt.Errorf("call of unknown function %s", name)
	}
	in.callee = callee
	in.args = make([]operand, 2)
	for i, list := range [][]string{ret, args} {
		in.args[i].kind = oVec
		for _, s := range list {
			off, ok := f.outParams[s]
			if !ok {
				return fmt.Errorf("call: %s is not a call parameter", s)
			}
			in.args[i].vec = append(in.args[i].vec, operand{kind: oImm, imm: uint64(off)})
		}
	}
	in.exec = func(t *thread, in *inst) { t.call(in) }
	return nil
}

type decoder func(f *Function, in *inst) error

var decoders map[string]decoder

func init() {
	decoders = map[string]decoder{
		"ret":  func(f *Function, in *inst) error { in.exec = func(t *thread, _ *inst) { t.doRet() }; return nil },
		"exit": func(f *Function, in *inst) error { in.exec = func(t *thread, _ *inst) { t.exited = true }; return nil },
		"trap": func(f *Function, in *inst) error {
			in.exec = func(t *thread, _ *inst) { t.panicf("trap (a device-side assert)") }
			return nil
		},
		"membar":         nop,
		"fence":          nop,
		"prefetch":       nop,
		"prefetchu":      nop,
		"nanosleep":      nop,
		"pmevent":        nop,
		"griddepcontrol": nop,
		"mov":            decMov,
		"ld":             decLd,
		"ldu":            decLd,
		"st":             decSt,
		"cvta":           decCvta,
		"cvt":            decCvt,
		"setp":           decSetp,
		"selp":           decSelp,
		"atom":           decAtom,
		"red":            decAtom,
		"bar":            decBar,
		"barrier":        decBar,
		"shfl":           decShfl,
		"vote":           decVote,
		"redux":          decRedux,
		"activemask":     decActivemask,
		"cp":             decCp,
		"ldmatrix":       decLdmatrix,
		"mma":            decMma,
		"mapa":           decMapa,
		"mbarrier":       decMbarrier,
		"elect":          decElect,
		"tcgen05":        decTcgen05,
		"wgmma":          decWgmma,
		"stmatrix":       decStmatrix,
		"setmaxnreg":     decSetmaxnreg,
	}
	for _, op := range []string{"add", "sub", "mul", "mad", "fma", "div", "rem", "min", "max", "neg", "abs",
		"and", "or", "xor", "not", "cnot", "shl", "shr", "popc", "clz", "brev", "bfe", "bfi", "prmt", "lop3", "shf",
		"addc", "subc", "madc", "rcp", "sqrt", "rsqrt", "ex2", "lg2", "sin", "cos", "tanh", "copysign", "testp"} {
		decoders[op] = decArith
	}
}

func nop(f *Function, in *inst) error { in.exec = func(*thread, *inst) {}; return nil }
