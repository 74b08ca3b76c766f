package ptxemu

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

type okind uint8

const (
	oReg okind = iota + 1
	oImm
	oSpecial
	oAddr
	oVec
	oSink
	oLocalSym // address of a .local symbol: frame base + imm
)

// symbol windows an address operand's symbol came from
type space uint8

const (
	spNone space = iota
	spGlobal
	spShared
	spLocal
	spParamIn
	spParamOut
	spParamRet
	spConst
	spGeneric
	spCluster // shared::cluster: a block of the cluster's shared memory
)

type operand struct {
	kind okind
	reg  int    // register index; base register of an address (-1: none)
	imm  uint64 // immediate; constant part of an address
	sym  space  // window of the address' symbol, if any
	spec special
	vec  []operand
	not  bool
}

type special uint8

const (
	sTidX special = iota
	sTidY
	sTidZ
	sNtidX
	sNtidY
	sNtidZ
	sCtaidX
	sCtaidY
	sCtaidZ
	sNctaidX
	sNctaidY
	sNctaidZ
	sLaneid
	sWarpid
	sNwarpid
	sSmid
	sNsmid
	sClock
	sClock64
	sGlobaltimer
	sLanemaskLt
	sLanemaskLe
	sLanemaskEq
	sLanemaskGe
	sLanemaskGt
	sDynSmem
	sClusterRank
	sClusterN
)

var specials = map[string]special{
	"%tid.x": sTidX, "%tid.y": sTidY, "%tid.z": sTidZ,
	"%ntid.x": sNtidX, "%ntid.y": sNtidY, "%ntid.z": sNtidZ,
	"%ctaid.x": sCtaidX, "%ctaid.y": sCtaidY, "%ctaid.z": sCtaidZ,
	"%nctaid.x": sNctaidX, "%nctaid.y": sNctaidY, "%nctaid.z": sNctaidZ,
	"%laneid": sLaneid, "%warpid": sWarpid, "%nwarpid": sNwarpid, "%smid": sSmid, "%nsmid": sNsmid,
	"%clock": sClock, "%clock64": sClock64, "%globaltimer": sGlobaltimer,
	"%lanemask_lt": sLanemaskLt, "%lanemask_le": sLanemaskLe, "%lanemask_eq": sLanemaskEq,
	"%lanemask_ge": sLanemaskGe, "%lanemask_gt": sLanemaskGt, "%dynamic_smem_size": sDynSmem,
	"%cluster_ctarank": sClusterRank, "%cluster_nctarank": sClusterN,
}

// splitOperands cuts at commas outside (), [] and {}.
func splitOperands(s string) []string {
	var out []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(', '[', '{':
			depth++
		case ')', ']', '}':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	if t := strings.TrimSpace(s[start:]); t != "" {
		out = append(out, t)
	}
	return out
}

// operand parses one operand of f.
func (f *Function) operand(s string) (operand, error) {
	s = strings.TrimSpace(s)
	if r, ok := f.regIdx[s]; ok { // also registers declared without %
		return operand{kind: oReg, reg: r}, nil
	}
	switch {
	case s == "_":
		return operand{kind: oSink}, nil
	case strings.HasPrefix(s, "{"):
		var o operand
		o.kind = oVec
		for _, e := range splitOperands(strings.Trim(s, "{}")) {
			v, err := f.operand(e)
			if err != nil {
				return o, err
			}
			o.vec = append(o.vec, v)
		}
		return o, nil
	case strings.HasPrefix(s, "["):
		return f.address(strings.TrimSpace(strings.Trim(s, "[]")))
	case strings.HasPrefix(s, "!"):
		o, err := f.operand(s[1:])
		o.not = true
		return o, err
	case strings.HasPrefix(s, "%"):
		if r, ok := f.regIdx[s]; ok {
			return operand{kind: oReg, reg: r}, nil
		}
		if sp, ok := specials[s]; ok {
			if sp == sClusterRank || sp == sClusterN {
				f.usesCluster = true
			}
			return operand{kind: oSpecial, spec: sp}, nil
		}
		return operand{}, fmt.Errorf("unknown register %s", s)
	case s == "WARP_SZ":
		return operand{kind: oImm, imm: 32}, nil
	}
	if v, ok := parseImm(s); ok {
		return operand{kind: oImm, imm: v}, nil
	}
	// a symbol used as a value: its address
	a, err := f.address(s)
	if err != nil {
		return a, err
	}
	if a.sym == spLocal {
		a.kind = oLocalSym
		return a, nil
	}
	a.kind = oImm
	switch a.sym {
	case spParamIn, spParamOut, spParamRet:
		a.imm += paramWin
	}
	return a, nil
}

// address parses reg, sym, reg+imm, sym+imm or imm.
func (f *Function) address(s string) (operand, error) {
	o := operand{kind: oAddr, reg: -1}
	base := s
	if m := reAddrOff.FindStringSubmatch(s); m != nil && m[1] != "" {
		base = m[1]
		v, err := strconv.ParseInt(strings.ReplaceAll(strings.TrimPrefix(m[2], "+"), " ", ""), 0, 64)
		if err != nil {
			return o, fmt.Errorf("bad address offset %q", s)
		}
		o.imm = uint64(v)
	}
	if strings.HasPrefix(base, "%") {
		r, ok := f.regIdx[base]
		if !ok {
			return o, fmt.Errorf("unknown register %s", base)
		}
		o.reg = r
		return o, nil
	}
	if v, ok := parseImm(base); ok {
		o.imm += v
		return o, nil
	}
	m := f.mod
	switch {
	case m.globals[base] != 0:
		o.imm += m.globals[base]
		o.sym = spGlobal
	case m.extern[base]:
		o.imm += dynSharedMarker
		o.sym = spShared
	default:
		if off, ok := f.sharedOffset(base); ok {
			o.imm += uint64(off)
			o.sym = spShared
		} else if off, ok := f.local[base]; ok {
			o.imm += uint64(off)
			o.sym = spLocal
		} else if p := findParam(f.params, base); p != nil {
			o.imm += uint64(p.off)
			o.sym = spParamIn
		} else if p := findParam(f.rets, base); p != nil {
			o.imm += uint64(p.off)
			o.sym = spParamRet
		} else if off, ok := f.outParams[base]; ok {
			o.imm += uint64(off)
			o.sym = spParamOut
		} else if m.funcs[base] != nil {
			o.sym = spNone
		} else {
			return o, fmt.Errorf("unknown symbol %s", base)
		}
	}
	return o, nil
}

var reAddrOff = regexp.MustCompile(`^(.*?)\s*(\+\s*-?\s*(?:0[xX][0-9a-fA-F]+|\d+)|-\s*(?:0[xX][0-9a-fA-F]+|\d+))$`)

// dynSharedMarker stands for the dynamic shared base until launch, when the
// function's static size is known; see thread.sharedAddr.
const dynSharedMarker = 1 << 31

func findParam(ps []param, name string) *param {
	for i := range ps {
		if ps[i].name == name {
			return &ps[i]
		}
	}
	return nil
}
