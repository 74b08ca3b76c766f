package ptxemu

import (
	"fmt"
	"math"
	"strings"
)

// umma is one decoded tcgen05.mma.cta_group::1 with both operands in shared
// memory: D[M][N] (f32, tensor memory) = Σ_k A[m][k]·B[n][k] (· SFA · SFB)
// (+ D). A is M x K and B is N x K, both K-major; every kind reads 32
// bytes of K per row.
type umma struct {
	kind           string
	m, n, k        int
	a, b           smemDesc
	afmt, bfmt     uint32
	negA, negB     bool
	dlane, dcol    int
	acc            bool
	vec            int // elements per scale factor; 0: not block-scaled
	sfUE8M0        bool
	sfaCol, sfbCol int
	sfaID, sfbID   int
}

// decUMMA: tcgen05.mma.cta_group::1.kind::{f16,f8f6f4} [d], adesc, bdesc,
// idesc, p and the block-scaled .kind::{mxf8f6f4,mxf4,mxf4nvf4}.block_scale
// {.block16,.block32,.scale_vec::NX} [d], adesc, bdesc, idesc, [sfa], [sfb], p.
func decUMMA(in *inst) error {
	kind, scaled, vec := "", false, 0
	for _, m := range in.mods {
		switch {
		case strings.HasPrefix(m, "kind::"):
			kind = m[len("kind::"):]
		case m == "block_scale":
			scaled = true
		case m == "block16" || m == "scale_vec::4X":
			vec = 16
		case m == "block32" || m == "scale_vec::1X" || m == "scale_vec::2X":
			vec = 32
		case m == "ws" || m == "sp":
			return unsupported("tcgen05.mma .%s", m)
		}
	}
	switch kind {
	case "f16", "f8f6f4":
		if scaled {
			return fmt.Errorf("tcgen05.mma .kind::%s takes no .block_scale", kind)
		}
	case "mxf8f6f4", "mxf4", "mxf4nvf4":
		if !scaled {
			return fmt.Errorf("tcgen05.mma .kind::%s needs .block_scale", kind)
		}
		if vec == 0 && kind != "mxf4nvf4" {
			vec = 32 // .scale_vec::1X / 2X are the defaults
		}
		if vec == 0 || vec == 16 && kind != "mxf4nvf4" {
			return fmt.Errorf("tcgen05.mma .kind::%s: bad scale-factor vector size", kind)
		}
	default:
		return unsupported("tcgen05.mma .kind::%s", kind)
	}
	nargs := 5
	if scaled {
		nargs = 7
	}
	if len(in.args) != nargs {
		return unsupported("tcgen05.mma with %d operands (disable-output-lane or scale-input-d forms)", len(in.args))
	}
	if in.args[0].kind != oAddr || in.args[1].kind == oAddr {
		return unsupported("tcgen05.mma form %s (A in tensor memory?)", in.text)
	}
	in.exec = func(t *thread, in *inst) {
		u := umma{kind: kind, acc: t.get(&in.args[nargs-1]) != 0}
		if scaled {
			u.vec = vec
		}
		var sfa, sfb uint32
		if scaled {
			sfa, sfb = uint32(t.addr(&in.args[4])), uint32(t.addr(&in.args[5]))
		}
		err := u.decode(uint32(t.addr(&in.args[0])), t.get(&in.args[1]), t.get(&in.args[2]), uint32(t.get(&in.args[3])), sfa, sfb)
		if err == nil {
			t.tmemLocked(func(m *tmemState) error { return u.checkTmem(m) })
		}
		if err != nil {
			t.panicf("tcgen05.mma: %v", err)
		}
		t.tc.queue = append(t.tc.queue, func() { u.run(t) })
	}
	return nil
}

// decode checks and unpacks the descriptors and addresses (PTX ISA
// "Instruction descriptor"; CUTLASS UMMA::InstrDescriptor and
// InstrDescriptorBlockScaled).
func (u *umma) decode(d uint32, ad, bd uint64, id, sfa, sfb uint32) error {
	var err error
	if u.a, err = parseSmemDesc(ad); err != nil {
		return fmt.Errorf("A: %w", err)
	}
	if u.b, err = parseSmemDesc(bd); err != nil {
		return fmt.Errorf("B: %w", err)
	}
	u.m, u.n = int(id>>24&0x1f)<<4, int(id>>17&0x3f)<<3
	u.afmt, u.bfmt = id>>7&7, id>>10&7
	u.negA, u.negB = id>>13&1 != 0, id>>14&1 != 0
	switch {
	case id&7 != 0:
		return fmt.Errorf("instruction descriptor %#x: sparse MMA is not emulated", id)
	case id>>15&3 != 0:
		return fmt.Errorf("instruction descriptor %#x: MN-major operands are not emulated", id)
	case id>>6&1 != 0 || id>>3&1 != 0:
		return fmt.Errorf("instruction descriptor %#x: reserved or saturate bit set", id)
	}
	if u.vec == 0 {
		switch {
		case id>>4&3 != 1:
			return fmt.Errorf("instruction descriptor %#x: D format %d, only F32 (1) is emulated", id, id>>4&3)
		case id>>23&1 != 0 || id>>29 != 0:
			return fmt.Errorf("instruction descriptor %#x: reserved bits 23, 29-31 set", id)
		}
	} else {
		u.sfbID, u.sfaID = int(id>>4&3), int(id>>29&3)
		u.sfUE8M0 = id>>23&1 != 0
		if id>>31 != 0 {
			return fmt.Errorf("instruction descriptor %#x: K96 is not emulated", id)
		}
	}
	switch u.kind {
	case "f16":
		u.k = 16
		if u.afmt > 1 || u.bfmt != u.afmt {
			return fmt.Errorf("instruction descriptor %#x: kind::f16 takes f16 (0) or bf16 (1), A and B alike; A %d, B %d", id, u.afmt, u.bfmt)
		}
	case "f8f6f4", "mxf8f6f4":
		u.k = 32
		for _, f := range []uint32{u.afmt, u.bfmt} {
			if f != 0 && f != 1 && f != 5 {
				return fmt.Errorf("instruction descriptor %#x: format %d: e4m3 (0), e5m2 (1) and e2m1 (5) are emulated", id, f)
			}
		}
	case "mxf4", "mxf4nvf4":
		u.k = 64
		if u.afmt != 1 || u.bfmt != 1 {
			return fmt.Errorf("instruction descriptor %#x: kind::%s takes e2m1 (1) for A and B; A %d, B %d", id, u.kind, u.afmt, u.bfmt)
		}
		if u.negA || u.negB {
			return fmt.Errorf("instruction descriptor %#x: kind::%s has no negate", id, u.kind)
		}
	}
	if u.vec > 0 {
		nsf := u.k / u.vec
		switch {
		case !u.sfUE8M0 && !(u.kind == "mxf4nvf4" && u.vec == 16):
			return fmt.Errorf("instruction descriptor %#x: ue4m3 scale factors need kind::mxf4nvf4 with .block16", id)
		case u.sfaID%nsf != 0 || u.sfbID%nsf != 0:
			return fmt.Errorf("instruction descriptor %#x: scale-factor ids %d/%d for %d scale factors a row", id, u.sfaID, u.sfbID, nsf)
		case u.m != 128:
			return fmt.Errorf("instruction descriptor %#x: block-scaled M=%d, only M=128 is emulated", id, u.m)
		case sfa>>16&0x3fff != 0 || sfb>>16&0x3fff != 0:
			return fmt.Errorf("scale-factor addresses %#x/%#x: lane must be 0", sfa, sfb)
		}
		u.sfaCol, u.sfbCol = int(sfa&0xffff), int(sfb&0xffff)
	}
	switch {
	case u.m == 128 && (u.n < 16 || u.n > 256 || u.n%16 != 0), u.m == 64 && (u.n < 8 || u.n > 256 || u.n%8 != 0):
		return fmt.Errorf("instruction descriptor %#x: N=%d invalid for M=%d", id, u.n, u.m)
	case u.m != 64 && u.m != 128:
		return fmt.Errorf("instruction descriptor %#x: M=%d, cta_group::1 takes 64 or 128", id, u.m)
	}
	u.dlane, u.dcol = int(d>>16), int(d&0xffff)
	if u.dlane != 0 && !(u.m == 64 && u.dlane == 16) {
		return fmt.Errorf("D at lane %d: M=128 starts at lane 0, M=64 at lane 0 or 16", u.dlane)
	}
	return nil
}

func (u *umma) checkTmem(m *tmemState) error {
	if err := m.checkCols(u.dcol, u.n); err != nil {
		return fmt.Errorf("D: %w", err)
	}
	if u.vec > 0 {
		if err := m.checkCols(u.sfaCol, (u.m+31)/32); err != nil {
			return fmt.Errorf("SFA: %w", err)
		}
		if err := m.checkCols(u.sfbCol, (u.n+31)/32); err != nil {
			return fmt.Errorf("SFB: %w", err)
		}
	}
	return nil
}

// elem decodes element k of a 32-byte operand row of format f.
func (u *umma) elem(row []byte, f uint32, k int) float64 {
	switch u.kind {
	case "f16":
		h := uint16(row[2*k]) | uint16(row[2*k+1])<<8
		if f == 1 {
			return float64(bf16ToF32(h))
		}
		return float64(f16ToF32(h))
	case "mxf4", "mxf4nvf4": // packed, two a byte, low nibble first
		return e2m1(row[k/2] >> (4 * (k % 2)) & 15)
	}
	switch f {
	case 0:
		return float64(e4m3ToF32(row[k]))
	case 1:
		return float64(f16ToF32(uint16(row[k]) << 8))
	}
	// e2m1 in kind::(mx)f8f6f4 is unpacked: 16 elements in the first 8
	// bytes of each 16 (the .b4x16_p64 format, TMA's 16U4_ALIGN16B)
	return e2m1(row[16*(k/16)+k%16/2] >> (4 * (k % 2)) & 15)
}

// operand reads rows x K values of an operand, negated if asked.
func (u *umma) operand(t *thread, s smemDesc, f uint32, rows int, neg bool) []float64 {
	out := make([]float64, rows*u.k)
	var row [32]byte
	for r := range rows {
		t.rowBytes(s, r, 32, row[:])
		for k := range u.k {
			v := u.elem(row[:], f, k)
			if neg {
				v = -v
			}
			out[r*u.k+k] = v
		}
	}
	return out
}

// dLane is the tensor-memory lane of row m of D (CUTLASS tmem_frg: M=128
// row m -> lane m; M=64 rows 16j..16j+15 -> lanes 32j.. of each quarter).
func (u *umma) dLane(m int) int {
	if u.m == 64 {
		return u.dlane + m%16 + 32*(m/16)
	}
	return m
}

// sf is scale factor j of row (or column) i of SFA/SFB: byte id+j of lane
// i%128, column col+i/32 (CUTLASS tmem_sf_frg: the 32x128b.warpx4 copy of
// the 512-byte scale-factor atom repeats it in every lane quarter).
func (u *umma) sf(m *tmemState, col, id, i, j int) float64 {
	w := *m.cell(i%128, col+i/32)
	b := byte(w >> (8 * (id + j)))
	if u.sfUE8M0 {
		return ue8m0(b)
	}
	return ue4m3(b)
}

// run performs the MMA. Products are exact in float64; each D element is
// float32(D + Σ_k products), the sum taken in float64 in k order and
// rounded once. The tensor core's internal order and precision differ
// within rounding.
func (u *umma) run(t *thread) {
	a := u.operand(t, u.a, u.afmt, u.m, u.negA)
	b := u.operand(t, u.b, u.bfmt, u.n, u.negB)
	t.tmemLocked(func(m *tmemState) error {
		if u.vec > 0 {
			for r := range u.m {
				for k := range u.k {
					a[r*u.k+k] *= u.sf(m, u.sfaCol, u.sfaID, r, k/u.vec)
				}
			}
			for r := range u.n {
				for k := range u.k {
					b[r*u.k+k] *= u.sf(m, u.sfbCol, u.sfbID, r, k/u.vec)
				}
			}
		}
		for r := range u.m {
			ar := a[r*u.k : (r+1)*u.k]
			lane := u.dLane(r)
			for c := range u.n {
				br := b[c*u.k : (c+1)*u.k]
				var s float64
				for k, x := range ar {
					s += x * br[k]
				}
				cell := m.cell(lane, u.dcol+c)
				if u.acc {
					s += float64(math.Float32frombits(*cell))
				}
				*cell = math.Float32bits(float32(s))
			}
		}
		return nil
	})
}
