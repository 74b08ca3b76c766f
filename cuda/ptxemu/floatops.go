package ptxemu

import (
	"fmt"
	"math"
	"math/big"
	"strings"
)

// Float instructions: f32/f64 (round to nearest and directed) and f16/bf16.

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
		t.setF32(&in.args[0], float32(r), in.sat, ftz)
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
		t.setF32(&in.args[0], float32(r), in.sat, ftz) // exact: r is a float32 value or NaN
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

// setF32 writes an f32 result, clamped to [0, 1] under .sat (NaN -> 0) and
// flushed under .ftz.
func (t *thread) setF32(o *operand, v float32, sat, ftz bool) {
	if sat {
		v = float32(minF(maxF(float64(v), 0), 1))
	}
	if ftz {
		v = ftz32(v)
	}
	t.set(o, uint64(math.Float32bits(v)))
}
