package ptxemu

import (
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
