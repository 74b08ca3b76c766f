package ptxemu

import (
	"fmt"
	"math"
)

func mask(v uint64, bits int) uint64 {
	if bits >= 64 || bits <= 0 {
		return v
	}
	return v & (1<<bits - 1)
}

func sext(v uint64, bits int) uint64 {
	if bits >= 64 || bits <= 0 {
		return v
	}
	s := 64 - bits
	return uint64(int64(v<<s) >> s)
}

func signed(t string) bool { return len(t) > 0 && t[0] == 's' }

func decMov(f *Function, in *inst) error {
	if len(in.args) != 2 {
		return fmt.Errorf("mov takes 2 operands")
	}
	d, s := in.args[0], in.args[1]
	w := in.w
	switch {
	case s.kind == oVec: // pack
		ew := w / len(s.vec)
		in.exec = func(t *thread, in *inst) {
			var v uint64
			for i := range in.args[1].vec {
				v |= mask(t.get(&in.args[1].vec[i]), ew) << (i * ew)
			}
			t.set(&in.args[0], v)
		}
	case d.kind == oVec: // unpack
		ew := w / len(d.vec)
		in.exec = func(t *thread, in *inst) {
			v := t.get(&in.args[1])
			for i := range in.args[0].vec {
				t.set(&in.args[0].vec[i], mask(v>>(i*ew), ew))
			}
		}
	default:
		in.exec = func(t *thread, in *inst) { t.set(&in.args[0], mask(t.get(&in.args[1]), in.w)) }
	}
	return nil
}

// load reads a value of ty at b into a register value.
func loadVal(b []byte, ty string) uint64 {
	v := getLE(b)
	if signed(ty) {
		return sext(v, len(b)*8)
	}
	return v
}

// checkAlign faults on an address that is not a multiple of the access size
// n (PTX ISA 6.4.1: addresses must be naturally aligned to the access size,
// a whole vector for ld.v4; the GPU stops with a misaligned-address error).
func (t *thread) checkAlign(addr uint64, n int) {
	if n > 1 && addr%uint64(n) != 0 {
		t.illegal(fmt.Errorf("misaligned address %#x for a %d-byte access", addr, n))
	}
}

func decLd(f *Function, in *inst) error {
	if len(in.args) != 2 || in.args[1].kind != oAddr {
		return fmt.Errorf("ld takes a destination and an address")
	}
	es := in.w / 8
	n := max(in.vec, 1)
	in.exec = func(t *thread, in *inst) {
		addr := t.addr(&in.args[1])
		t.checkAlign(addr, es*n)
		b := t.mem(in.sp, addr, es*n)
		if n == 1 {
			t.set(&in.args[0], loadVal(b, in.typ))
			return
		}
		for i := range in.args[0].vec {
			t.set(&in.args[0].vec[i], loadVal(b[i*es:(i+1)*es], in.typ))
		}
	}
	return nil
}

func decSt(f *Function, in *inst) error {
	if len(in.args) != 2 || in.args[0].kind != oAddr {
		return fmt.Errorf("st takes an address and a value")
	}
	es := in.w / 8
	n := max(in.vec, 1)
	in.exec = func(t *thread, in *inst) {
		addr := t.addr(&in.args[0])
		t.checkAlign(addr, es*n)
		b := t.mem(in.sp, addr, es*n)
		if n == 1 {
			putLE(b, t.get(&in.args[1]))
			return
		}
		for i := range in.args[1].vec {
			putLE(b[i*es:(i+1)*es], t.get(&in.args[1].vec[i]))
		}
	}
	return nil
}

func decCvta(f *Function, in *inst) error {
	var base uint64
	switch in.sp {
	case spShared:
		base = sharedWin
	case spLocal:
		base = localWin
	case spParamIn:
		base = 0 // param symbols already carry paramWin
	case spGlobal, spConst:
		base = 0
	default:
		return fmt.Errorf("cvta to an unknown space")
	}
	to := in.has("to")
	in.exec = func(t *thread, in *inst) {
		v := t.get(&in.args[1])
		if to {
			v -= base
		} else {
			v += base
		}
		t.set(&in.args[0], mask(v, in.w))
	}
	return nil
}

// decAtom covers atom (with a result) and red (without).
func decAtom(f *Function, in *inst) error {
	red := len(in.args) == 2 || (len(in.args) > 0 && in.args[0].kind == oAddr)
	op := ""
	for _, m := range in.mods {
		switch m {
		case "add", "inc", "dec", "min", "max", "and", "or", "xor", "exch", "cas":
			op = m
		}
	}
	if op == "" {
		return fmt.Errorf("atomic without an operation")
	}
	ty, w := in.typ, in.w
	es := w / 8
	half := ty == "f16" || ty == "bf16" || ty == "f16x2" || ty == "bf16x2"
	switch {
	case in.vec > 0:
		return unsupported("vector %s.%s", in.base, ty)
	case half && op != "add", ty == "f64" && op != "add", ty == "f32" && op != "add" && op != "exch":
		return unsupported("%s.%s.%s", in.base, op, ty)
	}
	in.exec = func(t *thread, in *inst) {
		a := in.args
		if !red {
			a = a[1:]
		}
		d := t.b.dev
		addr := t.addr(&a[0])
		t.checkAlign(addr, es)
		b := t.mem(in.sp, addr, es)
		x := t.get(&a[1])
		d.atomicMu.Lock()
		old := getLE(b)
		var nv uint64
		switch op {
		case "add":
			switch ty {
			case "f32":
				// on global memory atom.add.f32 flushes subnormal inputs and
				// results to zero; on shared memory it keeps them
				p, q := math.Float32frombits(uint32(old)), math.Float32frombits(uint32(x))
				global := in.sp == spGlobal || in.sp == spGeneric && !(addr >= sharedWin && addr < sharedWin+windowBytes)
				if global {
					p, q = ftz32(p), ftz32(q)
				}
				r := p + q
				if global {
					r = ftz32(r)
				}
				nv = uint64(math.Float32bits(r))
			case "f16", "bf16", "f16x2", "bf16x2": // .noftz: subnormals kept
				nv = halfAdd(old, x, ty)
			case "f64":
				nv = math.Float64bits(math.Float64frombits(old) + math.Float64frombits(x))
			default:
				nv = old + x
			}
		case "inc":
			if mask(old, w) >= mask(x, w) {
				nv = 0
			} else {
				nv = old + 1
			}
		case "dec":
			if old == 0 || mask(old, w) > mask(x, w) {
				nv = x
			} else {
				nv = old - 1
			}
		case "min", "max":
			less := false
			switch {
			case signed(ty):
				less = int64(sext(x, w)) < int64(sext(old, w))
			default:
				less = mask(x, w) < mask(old, w)
			}
			if less == (op == "min") {
				nv = x
			} else {
				nv = old
			}
		case "and":
			nv = old & x
		case "or":
			nv = old | x
		case "xor":
			nv = old ^ x
		case "exch":
			nv = x
		case "cas":
			nv = old
			if mask(old, w) == mask(x, w) {
				nv = t.get(&a[2])
			}
		}
		putLE(b, nv)
		d.atomicMu.Unlock()
		if !red {
			if signed(ty) {
				old = sext(old, w)
			}
			t.set(&in.args[0], old)
		}
	}
	return nil
}

// halfAdd adds f16 or bf16 lanes (one or two a word) exactly and rounds once.
func halfAdd(a, b uint64, ty string) uint64 {
	bf := ty == "bf16" || ty == "bf16x2"
	lanes := 1
	if ty == "f16x2" || ty == "bf16x2" {
		lanes = 2
	}
	toF := func(h uint16) float64 {
		if bf {
			return float64(bf16ToF32(h))
		}
		return float64(f16ToF32(h))
	}
	var r uint64
	for l := 0; l < lanes; l++ {
		s := f32Odd(toF(uint16(a>>(16*l))) + toF(uint16(b>>(16*l))))
		h := f32ToF16(s)
		if bf {
			h = f32ToBF16(s)
		}
		r |= uint64(h) << (16 * l)
	}
	return r
}

// decCp: cp.async checks its addresses when issued and copies when a wait
// completes its group, as late as the PTX ISA allows: wait_group N completes
// all but the N most recent committed groups, wait_all commits and completes
// all, copies never committed are not waited for. A kernel that reads the
// destination without the wait (or waits for too few groups) sees the old
// data, as it may on the GPU. Copies still pending when the thread exits are
// dropped.
func decCp(f *Function, in *inst) error {
	if !in.has("async") {
		return fmt.Errorf("unsupported cp form")
	}
	switch {
	case in.has("commit_group"):
		in.exec = func(t *thread, _ *inst) {
			t.cpGroups = append(t.cpGroups, t.cpIssued)
			t.cpIssued = nil
		}
		return nil
	case in.has("wait_group"), in.has("wait_all"):
		all := in.has("wait_all")
		in.exec = func(t *thread, in *inst) {
			keep := 0
			if all {
				t.cpGroups = append(t.cpGroups, t.cpIssued)
				t.cpIssued = nil
			} else {
				keep = int(t.get(&in.args[0]))
			}
			for len(t.cpGroups) > keep {
				for _, c := range t.cpGroups[0] {
					c()
				}
				t.cpGroups = t.cpGroups[1:]
			}
		}
		return nil
	}
	if in.has("bulk") || in.has("mbarrier") {
		return fmt.Errorf("unsupported cp.async form (sm_90)")
	}
	// the fourth operand is src-size, or the predicate ignore-src (true:
	// zero-fill the whole destination)
	ignoreSrc := len(in.args) > 3 && in.args[3].kind == oReg && f.preds[in.args[3].reg]
	in.exec = func(t *thread, in *inst) {
		n := int(uint32(t.get(&in.args[2])))
		src := n
		switch {
		case ignoreSrc:
			if t.get(&in.args[3]) != 0 {
				src = 0
			}
		case len(in.args) > 3:
			src = int(uint32(t.get(&in.args[3])))
		}
		da := t.addr(&in.args[0])
		t.checkAlign(da, n)
		dst := t.mem(spShared, da, n)
		var sb []byte
		if src > 0 { // with src-size 0 the source is not read
			sa := t.addr(&in.args[1])
			t.checkAlign(sa, n)
			sb = t.mem(spGlobal, sa, min(src, n))
		}
		t.cpIssued = append(t.cpIssued, func() { // the slices alias the memory
			copy(dst, sb)
			for i := len(sb); i < n; i++ {
				dst[i] = 0
			}
		})
	}
	return nil
}
