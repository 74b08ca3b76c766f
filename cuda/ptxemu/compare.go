package ptxemu

import (
	"fmt"
	"strings"
)

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
