package ptxemu

import (
	"fmt"
	"math"
	"math/bits"
)

// Integer and bitwise instructions.

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
