package ptxemu

import (
	"fmt"
	"math"
	"math/big"
	"math/bits"
	"strings"
)

func isFloat(ty string) bool { return strings.HasPrefix(ty, "f") || strings.HasPrefix(ty, "bf") }

// decArith decodes the ALU instructions: integer, bitwise and float.
func decArith(f *Function, in *inst) error {
	base := in.base
	ty := in.typ
	for _, m := range in.mods {
		if strings.HasSuffix(m, "x2") && typeSize(m) == 0 { // s16x2, u16x2: SIMD forms
			return unsupported("%s.%s", base, m)
		}
		if m == "xorsign" || m == "abs" && (base == "min" || base == "max") {
			return unsupported("%s.%s", base, m)
		}
	}
	if ty == "" || in.typ2 != "" && base != "testp" { // no type, or mixed (add.f32.bf16: sm_100)
		return unsupported("%s: types %v", base, in.mods)
	}
	switch {
	case ty == "f16x2" || ty == "bf16x2" || ty == "f16" || ty == "bf16":
		return decHalf(base, in)
	case ty == "f32" || ty == "f64":
		return decFloat(base, in)
	}
	return decInt(base, in)
}

func decInt(base string, in *inst) error {
	w, ty := in.w, in.typ
	sg := signed(ty)
	ex := func(v uint64) uint64 { // operand as a 64-bit integer of ty
		if sg {
			return sext(v, w)
		}
		return mask(v, w)
	}
	var fn func(t *thread, a []operand) uint64
	g := func(t *thread, o *operand) uint64 { return ex(t.get(o)) }
	switch base {
	case "add", "sub":
		neg := base == "sub"
		cc := in.has("cc")
		sat := in.sat && w == 32
		fn = func(t *thread, a []operand) uint64 {
			x, y := g(t, &a[1]), g(t, &a[2])
			if cc {
				ux, uy := mask(x, w), mask(y, w)
				if neg {
					t.carry = b2u(ux < uy) // CC.CF is the borrow
				} else {
					t.carry = b2u(mask(ux+uy, w) < ux)
				}
			}
			if sat {
				s := int64(int32(x)) + int64(int32(y))
				if neg {
					s = int64(int32(x)) - int64(int32(y))
				}
				return uint64(min(max(s, math.MinInt32), math.MaxInt32))
			}
			if neg {
				return x - y
			}
			return x + y
		}
	case "addc", "subc":
		neg := base == "subc"
		cc := in.has("cc")
		fn = func(t *thread, a []operand) uint64 {
			x, y := mask(t.get(&a[1]), w), mask(t.get(&a[2]), w)
			var r, c uint64
			if neg {
				r, c = bits.Sub64(x, y, t.carry)
				if w == 32 {
					c = b2u(x < y+t.carry)
				}
			} else {
				r, c = bits.Add64(x, y, t.carry)
				if w == 32 {
					c = r >> 32 & 1
				}
			}
			if cc {
				t.carry = c
			}
			return r
		}
	case "mul", "mad", "madc":
		hi, wide := in.has("hi"), in.has("wide")
		mad := base != "mul"
		cc, carryIn := in.has("cc"), base == "madc"
		satHi := in.sat && hi && ty == "s32" // mad.hi.sat.s32: (a*b)>>32 + c, clamped
		fn = func(t *thread, a []operand) uint64 {
			x, y := g(t, &a[1]), g(t, &a[2])
			var r uint64
			switch {
			case wide && w <= 32:
				r = x * y // sign- or zero-extended operands: the full product fits
			case hi && w <= 32:
				if sg {
					r = uint64(int64(x) * int64(y) >> w)
				} else {
					r = x * y >> w
				}
			case hi:
				h, _ := bits.Mul64(x, y)
				if sg {
					if int64(x) < 0 {
						h -= y
					}
					if int64(y) < 0 {
						h -= x
					}
				}
				r = h
			default:
				r = x * y
			}
			if mad {
				z := t.get(&a[3])
				if !wide {
					z = ex(z)
				}
				c := uint64(0)
				if carryIn {
					c = t.carry
				}
				if satHi {
					s := int64(int32(r)) + int64(int32(z))
					return uint64(min(max(s, math.MinInt32), math.MaxInt32))
				}
				ow := w
				if wide {
					ow = 2 * w
				}
				sum := mask(r, ow) + mask(z, ow) + c
				if cc {
					if ow == 64 {
						_, cc1 := bits.Add64(mask(r, ow), mask(z, ow), c)
						t.carry = cc1
					} else {
						t.carry = sum >> ow & 1
					}
				}
				r = sum
			}
			return r
		}
		if wide {
			in.w = 2 * w
		}
	case "div", "rem":
		div := base == "div"
		fn = func(t *thread, a []operand) uint64 {
			x, y := g(t, &a[1]), g(t, &a[2])
			if mask(y, w) == 0 {
				return mask(math.MaxUint64, w) // undefined on hardware; no fault
			}
			if sg {
				xs, ys := int64(x), int64(y)
				if ys == -1 {
					if div {
						return uint64(-xs)
					}
					return 0
				}
				if div {
					return uint64(xs / ys)
				}
				return uint64(xs % ys)
			}
			if div {
				return x / y
			}
			return x % y
		}
	case "min", "max":
		mn := base == "min"
		relu := in.has("relu") // max.relu.s32: a negative result is 0
		fn = func(t *thread, a []operand) uint64 {
			x, y := g(t, &a[1]), g(t, &a[2])
			less := x < y
			if sg {
				less = int64(x) < int64(y)
			}
			r := y
			if less == mn {
				r = x
			}
			if relu && int64(r) < 0 {
				r = 0
			}
			return r
		}
	case "neg":
		fn = func(t *thread, a []operand) uint64 { return -g(t, &a[1]) }
	case "abs":
		fn = func(t *thread, a []operand) uint64 {
			x := int64(g(t, &a[1]))
			if x < 0 {
				x = -x
			}
			return uint64(x)
		}
	case "and", "or", "xor":
		fn = func(t *thread, a []operand) uint64 {
			x, y := t.get(&a[1]), t.get(&a[2])
			if ty == "pred" {
				x, y = b2u(x != 0), b2u(y != 0)
			}
			switch base {
			case "and":
				return x & y
			case "or":
				return x | y
			}
			return x ^ y
		}
	case "not":
		fn = func(t *thread, a []operand) uint64 {
			if ty == "pred" {
				return b2u(t.get(&a[1]) == 0)
			}
			return ^t.get(&a[1])
		}
	case "cnot":
		fn = func(t *thread, a []operand) uint64 { return b2u(mask(t.get(&a[1]), w) == 0) }
	case "shl":
		fn = func(t *thread, a []operand) uint64 {
			s := uint32(t.get(&a[2]))
			if s >= uint32(w) {
				return 0
			}
			return t.get(&a[1]) << s
		}
	case "shr":
		fn = func(t *thread, a []operand) uint64 {
			s := uint32(t.get(&a[2]))
			x := g(t, &a[1])
			if s >= uint32(w) {
				s = uint32(w)
				if !sg {
					return 0
				}
				return uint64(int64(x) >> 63)
			}
			if sg {
				return uint64(int64(x) >> s)
			}
			return x >> s
		}
	case "popc":
		fn = func(t *thread, a []operand) uint64 { return uint64(bits.OnesCount64(mask(t.get(&a[1]), w))) }
		defer func() { in.w = 32 }()
	case "clz":
		fn = func(t *thread, a []operand) uint64 {
			return uint64(bits.LeadingZeros64(mask(t.get(&a[1]), w)) - (64 - w))
		}
		defer func() { in.w = 32 }()
	case "brev":
		fn = func(t *thread, a []operand) uint64 { return bits.Reverse64(t.get(&a[1])) >> (64 - w) }
	case "bfe":
		fn = func(t *thread, a []operand) uint64 {
			x := mask(t.get(&a[1]), w)
			pos, ln := int(t.get(&a[2])&0xff), int(t.get(&a[3])&0xff)
			if ln == 0 {
				return 0
			}
			// bit i of d is a[pos+i] for i < len and pos+i < w, else the
			// sign bit: 0 for .u, a[min(pos+len-1, w-1)] for .s
			n := min(ln, max(w-pos, 0)) // bits taken from a
			var r uint64
			if n > 0 {
				r = mask(x>>pos, n)
			}
			if sg && x>>min(pos+ln-1, w-1)&1 == 1 {
				r |= ^uint64(0) << n
			}
			return r
		}
	case "bfi":
		fn = func(t *thread, a []operand) uint64 {
			x, y := t.get(&a[1]), t.get(&a[2])
			pos, ln := int(t.get(&a[3])&0xff), int(t.get(&a[4])&0xff)
			if ln == 0 || pos >= w {
				return y
			}
			m := mask(math.MaxUint64, min(ln, w-pos)) << pos
			return y&^m | x<<pos&m
		}
	case "prmt":
		if len(in.mods) > 1 {
			return fmt.Errorf("prmt mode %v unsupported", in.mods)
		}
		fn = func(t *thread, a []operand) uint64 {
			x := mask(t.get(&a[1]), 32) | mask(t.get(&a[2]), 32)<<32
			c := t.get(&a[3])
			var r uint64
			for i := 0; i < 4; i++ {
				sel := c >> (4 * i) & 0xf
				byt := x >> (8 * (sel & 7)) & 0xff
				if sel&8 != 0 { // sign-replicate
					if byt&0x80 != 0 {
						byt = 0xff
					} else {
						byt = 0
					}
				}
				r |= byt << (8 * i)
			}
			return r
		}
	case "lop3":
		fn = func(t *thread, a []operand) uint64 {
			x, y, z, lut := t.get(&a[1]), t.get(&a[2]), t.get(&a[3]), t.get(&a[4])
			var r uint64
			for i := 0; i < w; i++ {
				idx := (x>>i&1)<<2 | (y>>i&1)<<1 | z>>i&1
				r |= (lut >> idx & 1) << i
			}
			return r
		}
	case "shf":
		left, clamp := in.has("l"), in.has("clamp")
		fn = func(t *thread, a []operand) uint64 {
			lo, hi := mask(t.get(&a[1]), 32), mask(t.get(&a[2]), 32)
			s := uint32(t.get(&a[3]))
			if clamp {
				s = min(s, 32)
			} else {
				s &= 31
			}
			v := hi<<32 | lo
			if left {
				return (v << s) >> 32
			}
			return v >> s
		}
	default:
		return fmt.Errorf("unsupported integer instruction %s.%s", base, ty)
	}
	in.exec = func(t *thread, in *inst) { t.set(&in.args[0], mask(fn(t, in.args), in.w)) }
	return nil
}

func decFloat(base string, in *inst) error {
	d64 := in.typ == "f64"
	ftz := in.ftz && !d64
	rnd := in.rnd
	if rnd == "" || rnd == "rn" {
		rnd = ""
	}
	type fop func(x, y, z float64) float64
	var op fop
	nargs := 2
	switch base {
	case "add":
		op = func(x, y, _ float64) float64 { return x + y }
	case "sub":
		op = func(x, y, _ float64) float64 { return x - y }
	case "mul":
		op = func(x, y, _ float64) float64 { return x * y }
	case "fma", "mad":
		op, nargs = math.FMA, 3
		if !d64 {
			op = fmaOdd // rounded once more, to float32, below
		}
	case "div":
		op = func(x, y, _ float64) float64 { return x / y }
	case "min", "max":
		op = minMaxOp(base, in.has("NaN"))
	case "neg":
		op, nargs = func(x, _, _ float64) float64 { return -x }, 1
	case "abs":
		op, nargs = func(x, _, _ float64) float64 { return math.Abs(x) }, 1
	case "rcp":
		op, nargs = func(x, _, _ float64) float64 { return 1 / x }, 1
	case "sqrt":
		op, nargs = func(x, _, _ float64) float64 { return math.Sqrt(x) }, 1
	case "rsqrt":
		op, nargs = func(x, _, _ float64) float64 { return 1 / math.Sqrt(x) }, 1
	case "ex2":
		op, nargs = func(x, _, _ float64) float64 { return math.Exp2(x) }, 1
	case "lg2":
		op, nargs = func(x, _, _ float64) float64 { return math.Log2(x) }, 1
	case "sin":
		op, nargs = func(x, _, _ float64) float64 { return math.Sin(x) }, 1
	case "cos":
		op, nargs = func(x, _, _ float64) float64 { return math.Cos(x) }, 1
	case "tanh":
		op, nargs = func(x, _, _ float64) float64 { return math.Tanh(x) }, 1
	case "copysign":
		op = func(x, y, _ float64) float64 { return math.Copysign(y, x) }
	case "testp":
		return fmt.Errorf("testp unsupported")
	default:
		return fmt.Errorf("unsupported float instruction %s.%s", base, in.typ)
	}
	exact := base == "add" || base == "sub" || base == "mul" || base == "fma" || base == "div" || base == "sqrt" || base == "rcp"
	if rnd != "" && exact && !in.has("approx") {
		return decFloatRounded(base, in, d64)
	}
	in.exec = func(t *thread, in *inst) {
		var x, y, z float64
		rd := func(o *operand) float64 {
			if d64 {
				return t.f64(o)
			}
			v := t.f32(o)
			if ftz {
				v = ftz32(v)
			}
			return float64(v)
		}
		x = rd(&in.args[1])
		if nargs > 1 {
			y = rd(&in.args[2])
		}
		if nargs > 2 {
			z = rd(&in.args[3])
		}
		r := op(x, y, z)
		if d64 {
			t.set(&in.args[0], math.Float64bits(r))
			return
		}
		v := float32(r)
		if in.sat {
			v = float32(minF(maxF(float64(v), 0), 1))
		}
		if ftz {
			v = ftz32(v)
		}
		t.set(&in.args[0], uint64(math.Float32bits(v)))
	}
	return nil
}

// decFloatRounded handles .rz/.rm/.rp: the exact result (or one rounded at
// 256 bits in the same direction, which rounds on to the same value) is
// rounded to the format with its subnormals and overflow (roundDirected).
// NaN and infinite operands, x/0 and sqrt of x <= 0 take the float64 path:
// their results are exact.
func decFloatRounded(base string, in *inst, d64 bool) error {
	mode := map[string]big.RoundingMode{"rz": big.ToZero, "rm": big.ToNegativeInf, "rp": big.ToPositiveInf}[in.rnd]
	ftz := in.ftz && !d64
	n := map[string]int{"sqrt": 1, "rcp": 1, "fma": 3}[base]
	if n == 0 {
		n = 2
	}
	in.exec = func(t *thread, in *inst) {
		var v [3]float64
		for i := 0; i < n; i++ {
			o := &in.args[1+i]
			if d64 {
				v[i] = t.f64(o)
				continue
			}
			f := t.f32(o)
			if ftz {
				f = ftz32(f)
			}
			v[i] = float64(f)
		}
		x, y, z := v[0], v[1], v[2]
		op := base
		if op == "sub" {
			op, y = "add", -y
		}
		nanInf := false
		for i := 0; i < n; i++ {
			nanInf = nanInf || math.IsNaN(v[i]) || math.IsInf(v[i], 0)
		}
		// zeroSum is an exact zero sum of two zeros: -0 if both are, or
		// if they differ rounding down (IEEE 754 6.3)
		zeroSum := func(an, bn bool) float64 {
			if an && bn || an != bn && mode == big.ToNegativeInf {
				return math.Copysign(0, -1)
			}
			return 0
		}
		var r float64
		switch {
		case nanInf || op == "div" && y == 0 || op == "rcp" && x == 0 || op == "sqrt" && x <= 0:
			switch op { // exact special results
			case "add":
				r = x + y
			case "mul":
				r = x * y
			case "div":
				r = x / y
			case "rcp":
				r = 1 / x
			case "sqrt":
				r = math.Sqrt(x)
			case "fma":
				r = math.FMA(x, y, z)
			}
		case op == "add" && x == 0 && y == 0:
			r = zeroSum(math.Signbit(x), math.Signbit(y))
		case op == "fma" && (x == 0 || y == 0) && z == 0:
			r = zeroSum(math.Signbit(x) != math.Signbit(y), math.Signbit(z))
		case op == "sqrt":
			r = sqrtDirected(x, mode, d64)
		default:
			b := new(big.Float).SetPrec(256).SetMode(mode)
			bx, by := new(big.Float).SetFloat64(x), new(big.Float).SetFloat64(y)
			switch op {
			case "add":
				b.Add(bx, by)
			case "mul":
				b.Mul(bx, by)
			case "div":
				b.Quo(bx, by)
			case "rcp":
				b.Quo(new(big.Float).SetFloat64(1), bx)
			case "fma":
				b.Mul(bx, by) // exact: 2*53 bits
				b.Add(b, new(big.Float).SetFloat64(z))
			}
			r = roundDirected(b, mode, d64)
		}
		if d64 {
			t.set(&in.args[0], math.Float64bits(r))
			return
		}
		f := float32(r) // exact: r is a float32 value or NaN
		if in.sat {
			f = float32(minF(maxF(float64(f), 0), 1))
		}
		if ftz {
			f = ftz32(f)
		}
		t.set(&in.args[0], uint64(math.Float32bits(f)))
	}
	return nil
}

// roundDirected rounds x (finite) to float32 (or float64 if d64) in mode,
// subnormals and overflow included: past the largest finite value, rounding
// away from zero gives an infinity, toward zero the largest finite value.
func roundDirected(x *big.Float, mode big.RoundingMode, d64 bool) float64 {
	prec, tiny, top := 24, -149, float64(math.MaxFloat32)
	if d64 {
		prec, tiny, top = 53, -1074, math.MaxFloat64
	}
	if x.Sign() == 0 {
		f, _ := x.Float64()
		return f
	}
	neg := x.Signbit()
	var r *big.Float
	if x.MantExp(nil)-1 >= tiny+prec-1 { // normal: the leading bit at or above the least normal exponent
		r = new(big.Float).SetMode(mode).SetPrec(uint(prec)).Set(x)
	} else { // subnormal: a multiple of 2^tiny
		q := new(big.Float).SetMantExp(x, -tiny)
		i, acc := q.Int(nil) // toward zero
		if acc != big.Exact && (mode == big.ToNegativeInf && neg || mode == big.ToPositiveInf && !neg) {
			if neg {
				i.Sub(i, big.NewInt(1))
			} else {
				i.Add(i, big.NewInt(1))
			}
		}
		if i.Sign() == 0 {
			if neg {
				return math.Copysign(0, -1)
			}
			return 0
		}
		r = new(big.Float).SetMantExp(new(big.Float).SetInt(i), tiny)
	}
	f, _ := r.Float64()
	if math.Abs(f) > top {
		up := mode == big.ToPositiveInf && !neg || mode == big.ToNegativeInf && neg
		f = math.Copysign(top, f)
		if up {
			f = math.Copysign(math.Inf(1), f)
		}
	}
	return f
}

// sqrtDirected is sqrt.{rz,rm,rp} of a positive finite x: math.Sqrt rounds
// to nearest, and the sign of x - s*s (exact) tells which side of s the root
// lies on.
func sqrtDirected(x float64, mode big.RoundingMode, d64 bool) float64 {
	s := math.Sqrt(x)
	bs := new(big.Float).SetFloat64(s)
	res := new(big.Float).SetPrec(512).Mul(bs, bs)
	res.Sub(new(big.Float).SetFloat64(x), res) // exact: x and s*s are close
	side := res.Sign()                         // sign of sqrt(x) - s
	onGrid := d64 || float64(float32(s)) == s
	if !onGrid { // no grid point between s and the root: round s
		return roundDirected(bs, mode, d64)
	}
	switch {
	case side < 0 && mode != big.ToPositiveInf:
		if d64 {
			return math.Nextafter(s, 0)
		}
		return float64(math.Nextafter32(float32(s), 0))
	case side > 0 && mode == big.ToPositiveInf:
		if d64 {
			return math.Nextafter(s, math.Inf(1))
		}
		return float64(math.Nextafter32(float32(s), float32(math.Inf(1))))
	}
	return s
}

// minMaxOp is min or max of PTX: a NaN operand yields the other one, or with
// .NaN a NaN.
func minMaxOp(base string, nan bool) func(x, y, _ float64) float64 {
	f := minF
	if base == "max" {
		f = maxF
	}
	if !nan {
		return func(x, y, _ float64) float64 { return f(x, y) }
	}
	return func(x, y, _ float64) float64 {
		if x != x || y != y {
			return math.NaN()
		}
		return f(x, y)
	}
}

// decHalf: f16/bf16 scalar and x2 arithmetic, computed in float64 and
// rounded once to the half type.
func decHalf(base string, in *inst) error {
	bf := strings.HasPrefix(in.typ, "bf")
	lanes := 1
	if strings.HasSuffix(in.typ, "x2") {
		lanes = 2
	}
	toF := func(h uint16) float64 {
		if bf {
			return float64(bf16ToF32(h))
		}
		return float64(f16ToF32(h))
	}
	fromF := func(v float64) uint16 {
		if bf {
			return f32ToBF16(f32Odd(v))
		}
		return f32ToF16(f32Odd(v))
	}
	var op func(x, y, z float64) float64
	switch base {
	case "add":
		op = func(x, y, _ float64) float64 { return x + y }
	case "sub":
		op = func(x, y, _ float64) float64 { return x - y }
	case "mul":
		op = func(x, y, _ float64) float64 { return x * y }
	case "fma":
		op = fmaOdd
	case "min", "max":
		op = minMaxOp(base, in.has("NaN"))
	case "neg":
		op = func(x, _, _ float64) float64 { return -x }
	case "abs":
		op = func(x, _, _ float64) float64 { return math.Abs(x) }
	default:
		return fmt.Errorf("unsupported half instruction %s.%s", base, in.typ)
	}
	relu := in.has("relu")
	ftz := in.ftz && !bf
	n := len(in.args) - 1
	in.exec = func(t *thread, in *inst) {
		var vals [3]uint64
		for i := 0; i < n; i++ {
			vals[i] = t.get(&in.args[1+i])
		}
		var r uint64
		for l := 0; l < lanes; l++ {
			var xs [3]float64
			for i := 0; i < n; i++ {
				h := uint16(vals[i] >> (16 * l))
				if ftz && h&0x7c00 == 0 {
					h &= 0x8000
				}
				xs[i] = toF(h)
			}
			v := op(xs[0], xs[1], xs[2])
			if relu && v < 0 { // .relu: negative -> 0; a NaN stays NaN (canonical)
				v = 0
			}
			if in.sat {
				v = minF(maxF(v, 0), 1)
			}
			h := fromF(v)
			if ftz && h&0x7c00 == 0 {
				h &= 0x8000
			}
			r |= uint64(h) << (16 * l)
		}
		t.set(&in.args[0], r)
	}
	return nil
}

func decSelp(f *Function, in *inst) error {
	in.exec = func(t *thread, in *inst) {
		if t.get(&in.args[3]) != 0 {
			t.set(&in.args[0], t.get(&in.args[1]))
		} else {
			t.set(&in.args[0], t.get(&in.args[2]))
		}
	}
	return nil
}

func decSetp(f *Function, in *inst) error {
	cmp, boolOp := "", ""
	for _, m := range in.mods {
		switch m {
		case "eq", "ne", "lt", "le", "gt", "ge", "lo", "ls", "hi", "hs", "equ", "neu", "ltu", "leu", "gtu", "geu", "num", "nan":
			cmp = m
		case "and", "or", "xor":
			boolOp = m
		}
	}
	ty, w := in.typ, in.w
	two := in.aux == -1 // p|q
	a := 1
	if two {
		a = 2
	}
	var c func(t *thread, x, y *operand) bool
	switch {
	case ty == "f32" || ty == "f64":
		rd := func(t *thread, o *operand) float64 {
			if ty == "f64" {
				return t.f64(o)
			}
			v := t.f32(o)
			if in.ftz {
				v = ftz32(v)
			}
			return float64(v)
		}
		c = func(t *thread, x, y *operand) bool {
			p, q := rd(t, x), rd(t, y)
			nan := p != p || q != q
			switch cmp {
			case "eq":
				return p == q
			case "ne":
				return p != q && !nan
			case "lt":
				return p < q
			case "le":
				return p <= q
			case "gt":
				return p > q
			case "ge":
				return p >= q
			case "equ":
				return nan || p == q
			case "neu":
				return nan || p != q
			case "ltu":
				return nan || p < q
			case "leu":
				return nan || p <= q
			case "gtu":
				return nan || p > q
			case "geu":
				return nan || p >= q
			case "num":
				return !nan
			case "nan":
				return nan
			}
			return false
		}
	case strings.HasPrefix(ty, "f") || strings.HasPrefix(ty, "bf"):
		return fmt.Errorf("setp on %s unsupported", ty)
	default:
		sg := signed(ty)
		c = func(t *thread, x, y *operand) bool {
			p, q := t.get(x), t.get(y)
			if ty == "pred" {
				p, q = b2u(p != 0), b2u(q != 0)
			}
			if sg {
				ps, qs := int64(sext(p, w)), int64(sext(q, w))
				switch cmp {
				case "eq":
					return ps == qs
				case "ne":
					return ps != qs
				case "lt":
					return ps < qs
				case "le":
					return ps <= qs
				case "gt":
					return ps > qs
				case "ge":
					return ps >= qs
				}
				return false
			}
			p, q = mask(p, w), mask(q, w)
			switch cmp {
			case "eq":
				return p == q
			case "ne":
				return p != q
			case "lt", "lo":
				return p < q
			case "le", "ls":
				return p <= q
			case "gt", "hi":
				return p > q
			case "ge", "hs":
				return p >= q
			}
			return false
		}
	}
	if cmp == "" {
		return fmt.Errorf("setp without a comparison")
	}
	in.exec = func(t *thread, in *inst) {
		r := c(t, &in.args[a], &in.args[a+1])
		if boolOp != "" {
			q := t.get(&in.args[a+2]) != 0
			switch boolOp {
			case "and":
				r = r && q
			case "or":
				r = r || q
			case "xor":
				r = r != q
			}
		}
		t.set(&in.args[0], b2u(r))
		if two {
			nr := !c(t, &in.args[a], &in.args[a+1])
			if boolOp != "" {
				q := t.get(&in.args[a+2]) != 0
				switch boolOp {
				case "and":
					nr = nr && q
				case "or":
					nr = nr || q
				case "xor":
					nr = nr != q
				}
			}
			t.set(&in.args[1], b2u(nr))
		}
	}
	return nil
}
