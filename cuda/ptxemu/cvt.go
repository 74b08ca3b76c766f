package ptxemu

import (
	"fmt"
	"math"
	"math/big"
)

// decCvt: cvt[.rnd][.ftz][.sat].dtype.atype d, a  (and the packing forms
// cvt.rn.{f16x2,bf16x2}.f32 d, hi, lo and cvt.rn.satfinite.e4m3x2.f32).
func decCvt(f *Function, in *inst) error {
	var types []string // e4m3x2 and e5m2x2 are cvt-only types, unknown to typeSize
	for _, m := range in.mods {
		if typeSize(m) > 0 || m == "e4m3x2" || m == "e5m2x2" {
			types = append(types, m)
		}
	}
	if len(types) != 2 {
		return fmt.Errorf("cvt needs two types")
	}
	dst, src := types[0], types[1]
	if in.has("pack") || in.has("rna") || in.has("rs") || dst == "tf32" || src == "tf32" {
		return unsupported("cvt form %v", in.mods)
	}
	dw := typeSize(dst) * 8
	sw := typeSize(src) * 8
	rnd, ftz := in.rnd, in.ftz
	sat, satfinite, relu := in.has("sat"), in.has("satfinite"), in.has("relu")
	// toHalf converts to f16 or bf16 bits with .relu (negative -> 0, NaN
	// stays NaN) and .satfinite (past the largest finite -> it, signed).
	toHalf := func(x float64, bf bool) uint16 {
		if relu && x < 0 {
			x = 0
		}
		var h uint16
		if bf {
			h = f32ToBF16(f32Odd(x))
		} else {
			h = f32ToF16(f32Odd(x))
		}
		if satfinite {
			switch {
			case !bf && h&0x7fff == 0x7c00:
				h = h&0x8000 | 0x7bff
			case bf && h&0x7fff == 0x7f80:
				h = h&0x8000 | 0x7f7f
			}
		}
		return h
	}
	switch {
	case (dst == "f16x2" || dst == "bf16x2") && src == "f32":
		if rnd != "rn" {
			return unsupported("cvt.%s.%s.%s", rnd, dst, src)
		}
		bf := dst == "bf16x2"
		in.exec = func(t *thread, in *inst) {
			hi, lo := t.f32(&in.args[1]), t.f32(&in.args[2])
			t.set(&in.args[0], uint64(toHalf(float64(hi), bf))<<16|uint64(toHalf(float64(lo), bf)))
		}
		return nil
	case dst == "e4m3x2" && src == "f32":
		in.exec = func(t *thread, in *inst) {
			hi, lo := t.f32(&in.args[1]), t.f32(&in.args[2])
			if relu {
				hi, lo = reluF32(hi), reluF32(lo)
			}
			t.set(&in.args[0], uint64(f32ToE4M3(hi))<<8|uint64(f32ToE4M3(lo)))
		}
		return nil
	case dst == "f16x2" && src == "e4m3x2":
		in.exec = func(t *thread, in *inst) {
			v := t.get(&in.args[1])
			hi, lo := e4m3ToF32(uint8(v>>8)), e4m3ToF32(uint8(v))
			if relu {
				hi, lo = reluF32(hi), reluF32(lo)
			}
			t.set(&in.args[0], uint64(f32ToF16(hi))<<16|uint64(f32ToF16(lo)))
		}
		return nil
	case dw == 0 || sw == 0 || dst == "f16x2" || dst == "bf16x2" || src == "f16x2" || src == "bf16x2" ||
		dst == "e4m3x2" || dst == "e5m2x2" || src == "e4m3x2" || src == "e5m2x2":
		return unsupported("cvt.%s.%s", dst, src)
	}
	fd, fs := isFloat(dst), isFloat(src)
	readF := func(t *thread, o *operand) float64 {
		v := t.get(o)
		switch src {
		case "f64":
			return math.Float64frombits(v)
		case "f32":
			x := math.Float32frombits(uint32(v))
			if ftz {
				x = ftz32(x)
			}
			return float64(x)
		case "f16":
			return float64(f16ToF32(uint16(v)))
		case "bf16":
			return float64(bf16ToF32(uint16(v)))
		}
		t.panicf("cvt from %s", src)
		return 0
	}
	writeF := func(x float64) uint64 {
		switch dst {
		case "f64":
			return math.Float64bits(x)
		case "f32":
			v := float32(x)
			if ftz {
				v = ftz32(v)
			}
			return uint64(math.Float32bits(v))
		case "f16":
			return uint64(toHalf(x, false))
		case "bf16":
			return uint64(toHalf(x, true))
		}
		return 0
	}
	roundInt := func(x float64) float64 {
		switch rnd {
		case "rni", "rn", "":
			return math.RoundToEven(x)
		case "rzi", "rz":
			return math.Trunc(x)
		case "rmi", "rm":
			return math.Floor(x)
		case "rpi", "rp":
			return math.Ceil(x)
		}
		return x
	}
	// signed results are sign-extended to the register, the others
	// zero-extended (PTX ISA, cvt: "Notes")
	put := func(t *thread, v uint64) {
		if signed(dst) {
			t.set(&in.args[0], sext(v, dw))
		} else {
			t.set(&in.args[0], mask(v, dw))
		}
	}
	switch {
	case fd && fs:
		if (src == "f64" && dst == "f32" || dst == "f16" || dst == "bf16") && rnd != "" && rnd != "rn" && rnd != "rni" && rnd != "rzi" && rnd != "rmi" && rnd != "rpi" {
			return fmt.Errorf("cvt.%s.%s.%s unsupported", rnd, dst, src)
		}
		integral := rnd == "rni" || rnd == "rzi" || rnd == "rmi" || rnd == "rpi"
		in.exec = func(t *thread, in *inst) {
			x := readF(t, &in.args[1])
			if integral {
				x = roundInt(x)
			}
			if sat {
				x = minF(maxF(x, 0), 1)
			}
			t.set(&in.args[0], writeF(x))
		}
	case fd: // int -> float
		mode, directed := map[string]big.RoundingMode{"rz": big.ToZero, "rm": big.ToNegativeInf, "rp": big.ToPositiveInf}[rnd]
		if directed && dst != "f32" && dst != "f64" {
			return unsupported("cvt.%s.%s.%s", rnd, dst, src)
		}
		in.exec = func(t *thread, in *inst) {
			v := t.get(&in.args[1])
			if directed {
				b := new(big.Float)
				if signed(src) {
					b.SetInt64(int64(sext(v, sw)))
				} else {
					b.SetUint64(mask(v, sw))
				}
				prec := uint(24)
				if dst == "f64" {
					prec = 53
				}
				x, _ := b.SetMode(mode).SetPrec(prec).Float64() // exact: prec bits, in range
				t.set(&in.args[0], writeF(x))
				return
			}
			var x float64
			if signed(src) {
				x = float64(int64(sext(v, sw)))
				if dst == "f32" { // round once, straight from the integer
					t.set(&in.args[0], uint64(math.Float32bits(float32(int64(sext(v, sw))))))
					return
				}
			} else {
				x = float64(mask(v, sw))
				if dst == "f32" {
					t.set(&in.args[0], uint64(math.Float32bits(float32(mask(v, sw)))))
					return
				}
			}
			t.set(&in.args[0], writeF(x))
		}
	case fs: // float -> int, saturating
		// NaN gives 0, except from .f64 or to a 64-bit integer: 1 << (bits-1)
		nanVal := uint64(0)
		if src == "f64" || dw == 64 {
			nanVal = 1 << (dw - 1)
		}
		lim := math.Exp2(float64(dw)) // 2^dw, or 2^(dw-1) for signed
		if signed(dst) {
			lim /= 2
		}
		in.exec = func(t *thread, in *inst) {
			x := roundInt(readF(t, &in.args[1]))
			var r uint64
			switch {
			case x != x:
				r = nanVal
			case signed(dst) && x >= lim:
				r = 1<<(dw-1) - 1
			case signed(dst) && x < -lim:
				r = 1 << (dw - 1) // MININT
			case signed(dst):
				r = uint64(int64(x))
			case x >= lim:
				r = math.MaxUint64
			case x <= 0:
				r = 0
			default:
				r = uint64(x)
			}
			put(t, r)
		}
	default: // int -> int
		in.exec = func(t *thread, in *inst) {
			v := t.get(&in.args[1])
			if signed(src) {
				v = sext(v, sw)
			} else {
				v = mask(v, sw)
			}
			if sat {
				v = satInt(v, signed(src), dw, signed(dst))
			}
			put(t, v)
		}
	}
	return nil
}

// satInt clamps v (a 64-bit integer, signed if sgn) to the range of a dw-bit
// integer, signed if dsgn.
func satInt(v uint64, sgn bool, dw int, dsgn bool) uint64 {
	var lo int64
	var hi uint64 = math.MaxUint64
	switch {
	case dsgn:
		lo, hi = -1<<(dw-1), 1<<(dw-1)-1
	case dw < 64:
		hi = 1<<dw - 1
	}
	if sgn {
		s := int64(v)
		switch {
		case s < lo:
			return uint64(lo)
		case s >= 0 && uint64(s) > hi:
			return hi
		}
		return v
	}
	return min(v, hi)
}

func reluF32(x float32) float32 {
	if x < 0 {
		return 0
	}
	return x
}
