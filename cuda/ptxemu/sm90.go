package ptxemu

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// decStmatrix: stmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared{::cta}.b16
// [p], {r..}, the inverse of ldmatrix: lanes 8i..8i+7 give the row
// addresses of matrix i, and register i of lane l holds its elements
// (l/4, 2*(l%4)+{0,1}) (transposed with .trans).
func decStmatrix(f *Function, in *inst) error {
	num := 0
	for _, m := range in.mods {
		if len(m) == 2 && m[0] == 'x' {
			num, _ = strconv.Atoi(m[1:])
		}
	}
	switch {
	case !in.has("m8n8") || !in.has("b16"):
		return unsupported("stmatrix form %s (only .m8n8 .b16)", strings.Join(in.mods, "."))
	case num != 1 && num != 2 && num != 4:
		return fmt.Errorf("stmatrix needs .x1, .x2 or .x4")
	case len(in.args) != 2 || in.args[0].kind != oAddr || in.args[1].kind != oVec || len(in.args[1].vec) != num:
		return fmt.Errorf("stmatrix .x%d takes [addr], {%d registers}", num, num)
	}
	trans := in.has("trans")
	sp := in.sp
	if sp == spNone {
		sp = spGeneric
	}
	in.exec = func(t *thread, in *inst) {
		var words [5]uint64
		words[0] = t.addr(&in.args[0])
		for i := range num {
			words[1+i] = t.get(&in.args[1].vec[i])
		}
		c := t.collective(math.MaxUint32, words[:1+num]...)
		if c.alive != math.MaxUint32 {
			t.panicf("stmatrix with exited lanes in the warp (it is .sync.aligned)")
		}
		if t.lane >= 8*num {
			return
		}
		vals := &c.vals
		i, r := t.lane/8, t.lane%8
		addr := words[0]
		t.checkAlign(addr, 16)
		var row [16]byte
		for j := range 8 {
			src, slot := r*4+j/2, j%2 // lane and half holding (r, j)
			if trans {
				src, slot = j*4+r/2, r%2 // (j, r) of the fragment
			}
			h := uint16(vals[src][1+i] >> (16 * slot))
			row[2*j], row[2*j+1] = byte(h), byte(h>>8)
		}
		copy(t.mem(sp, addr, 16), row[:])
	}
	return nil
}

// decSetmaxnreg: setmaxnreg.{inc,dec}.sync.aligned.u32 n. The register
// count is the compiler's business; the emulator checks the hardware's
// rules: n in 24..256, a multiple of 8, the same in every thread of the
// warpgroup, and once every warp of the block has set one, at most 64K
// registers in all.
func decSetmaxnreg(f *Function, in *inst) error {
	inc := in.has("inc")
	if inc == in.has("dec") || len(in.args) != 1 || in.args[0].kind != oImm {
		return fmt.Errorf("setmaxnreg takes .inc or .dec and an immediate count")
	}
	n := in.args[0].imm
	if n < 24 || n > 256 || n%8 != 0 {
		return fmt.Errorf("setmaxnreg %d: the count must be a multiple of 8 in 24..256", n)
	}
	in.exec = func(t *thread, _ *inst) {
		v := n | b2u(inc)<<32
		c := t.collective(math.MaxUint32, v)
		if c.alive != math.MaxUint32 {
			t.panicf("setmaxnreg with exited lanes in the warp (it is .sync.aligned)")
		}
		for l := range 32 {
			if c.vals[l][0] != v {
				t.panicf("setmaxnreg differs between lanes %d and %d of the warp", t.lane, l)
			}
		}
		if t.lane != 0 {
			return
		}
		b := t.b
		b.mu.Lock()
		err := b.async.setmaxnreg(t.flat/32, len(b.warps), v)
		b.mu.Unlock()
		if err != nil {
			t.panicf("setmaxnreg: %v", err)
		}
	}
	return nil
}

// setmaxnreg records warp w's next setmaxnreg (count | inc<<32) and checks
// it against the other warps of its warpgroup at the same call.
func (a *asyncState) setmaxnreg(w, nwarps int, v uint64) error {
	if a.maxnreg == nil {
		a.maxnreg = map[int][]uint64{}
	}
	a.maxnreg[w] = append(a.maxnreg[w], v)
	i := len(a.maxnreg[w]) - 1
	for o := w &^ 3; o < w&^3+4; o++ {
		if s := a.maxnreg[o]; o != w && len(s) > i && s[i] != v {
			return fmt.Errorf("warps %d and %d of one warpgroup ask for %d and %d registers (%s/%s)", w, o,
				uint32(v), uint32(s[i]), incDec(v), incDec(s[i]))
		}
	}
	if len(a.maxnreg) < nwarps {
		return nil
	}
	total := 0
	for _, s := range a.maxnreg {
		total += 32 * int(uint32(s[len(s)-1]))
	}
	if total > 65536 {
		return fmt.Errorf("the block's warps now ask for %d registers, more than the SM's 65536", total)
	}
	return nil
}

func incDec(v uint64) string {
	if v>>32 != 0 {
		return "inc"
	}
	return "dec"
}
