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

func decLd(f *Function, in *inst) error {
	if len(in.args) != 2 || in.args[1].kind != oAddr {
		return fmt.Errorf("ld takes a destination and an address")
	}
	es := in.w / 8
	n := max(in.vec, 1)
	in.exec = func(t *thread, in *inst) {
		b := t.mem(in.sp, t.addr(&in.args[1]), es*n)
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
		b := t.mem(in.sp, t.addr(&in.args[0]), es*n)
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
	in.exec = func(t *thread, in *inst) {
		a := in.args
		if !red {
			a = a[1:]
		}
		d := t.b.dev
		addr := t.addr(&a[0])
		b := t.mem(in.sp, addr, es)
		x := t.get(&a[1])
		d.atomicMu.Lock()
		old := getLE(b)
		var nv uint64
		switch op {
		case "add":
			switch ty {
			case "f32":
				nv = uint64(math.Float32bits(math.Float32frombits(uint32(old)) + math.Float32frombits(uint32(x))))
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
			case ty == "f32":
				less = math.Float32frombits(uint32(x)) < math.Float32frombits(uint32(old))
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

// decCp: cp.async copies at once (a stronger ordering than the hardware's),
// so commit_group and wait_group have nothing to wait for.
func decCp(f *Function, in *inst) error {
	if !in.has("async") {
		return fmt.Errorf("unsupported cp form")
	}
	if in.has("commit_group") || in.has("wait_group") || in.has("wait_all") {
		in.exec = func(*thread, *inst) {}
		return nil
	}
	if in.has("bulk") || in.has("mbarrier") {
		return fmt.Errorf("unsupported cp.async form (sm_90)")
	}
	in.exec = func(t *thread, in *inst) {
		n := int(t.get(&in.args[2]))
		src := n
		if len(in.args) > 3 {
			src = int(t.get(&in.args[3]))
		}
		dst := t.mem(spShared, t.addr(&in.args[0]), n)
		if src > 0 {
			copy(dst, t.mem(spGlobal, t.addr(&in.args[1]), min(src, n)))
		}
		for i := max(src, 0); i < n; i++ {
			dst[i] = 0
		}
	}
	return nil
}
