package ptxemu

import (
	"fmt"
	"math"
)

// decCvt: cvt[.rnd][.ftz][.sat].dtype.atype d, a  (and the packing forms
// cvt.rn.{f16x2,bf16x2}.f32 d, hi, lo and cvt.rn.satfinite.e4m3x2.f32).
func decCvt(f *Function, in *inst) error {
	dst, src := in.typ2, in.typ
	if dst == "" {
		return fmt.Errorf("cvt needs two types")
	}
	dw := typeSize(dst) * 8
	sw := typeSize(src) * 8
	rnd, ftz, sat := in.rnd, in.ftz, in.sat
	switch {
	case (dst == "f16x2" || dst == "bf16x2") && src == "f32":
		bf := dst == "bf16x2"
		in.exec = func(t *thread, in *inst) {
			hi, lo := t.f32(&in.args[1]), t.f32(&in.args[2])
			cv := f32ToF16
			if bf {
				cv = f32ToBF16
			}
			t.set(&in.args[0], uint64(cv(hi))<<16|uint64(cv(lo)))
		}
		return nil
	case dst == "e4m3x2" && src == "f32":
		in.exec = func(t *thread, in *inst) {
			hi, lo := t.f32(&in.args[1]), t.f32(&in.args[2])
			t.set(&in.args[0], uint64(f32ToE4M3(hi))<<8|uint64(f32ToE4M3(lo)))
		}
		return nil
	case dst == "f16x2" && src == "e4m3x2":
		in.exec = func(t *thread, in *inst) {
			v := t.get(&in.args[1])
			t.set(&in.args[0], uint64(f32ToF16(e4m3ToF32(uint8(v>>8))))<<16|uint64(f32ToF16(e4m3ToF32(uint8(v)))))
		}
		return nil
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
			return uint64(f32ToF16(f32Odd(x)))
		case "bf16":
			return uint64(f32ToBF16(f32Odd(x)))
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
		in.exec = func(t *thread, in *inst) {
			v := t.get(&in.args[1])
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
	case fs: // float -> int, saturating, NaN -> 0
		lo, hi := intRange(dst)
		in.exec = func(t *thread, in *inst) {
			x := roundInt(readF(t, &in.args[1]))
			var r uint64
			switch {
			case x != x:
				r = 0
			case x <= lo:
				r = uint64(int64(lo))
				if !signed(dst) {
					r = 0
				}
			case x >= hi:
				if signed(dst) {
					r = uint64(int64(hi))
				} else {
					r = uint64(hi)
					if dw == 64 {
						r = math.MaxUint64
					}
				}
			case signed(dst):
				r = uint64(int64(x))
			default:
				r = uint64(x)
			}
			t.set(&in.args[0], mask(r, dw))
		}
	default: // int -> int
		lo, hi := intRange(dst)
		in.exec = func(t *thread, in *inst) {
			v := t.get(&in.args[1])
			if signed(src) {
				v = sext(v, sw)
			} else {
				v = mask(v, sw)
			}
			if sat {
				x := float64(int64(v))
				if !signed(src) {
					x = float64(v)
				}
				if x < lo {
					v = uint64(int64(lo))
				} else if x > hi {
					v = uint64(hi)
				}
			}
			if signed(dst) && dw < 64 {
				v = sext(v, dw)
			}
			t.set(&in.args[0], mask(v, max(dw, 8)))
		}
	}
	return nil
}

func intRange(ty string) (lo, hi float64) {
	w := typeSize(ty) * 8
	if signed(ty) {
		return -math.Exp2(float64(w - 1)), math.Exp2(float64(w-1)) - 1
	}
	return 0, math.Exp2(float64(w)) - 1
}
