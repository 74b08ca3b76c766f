package ptxemu

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

func decBar(f *Function, in *inst) error {
	switch {
	case in.has("warp"):
		in.exec = func(t *thread, in *inst) { t.collective(uint32(t.get(&in.args[0]))) }
	case in.has("red"):
		return fmt.Errorf("bar.red unsupported")
	default:
		arrive := in.has("arrive")
		in.exec = func(t *thread, in *inst) {
			id, count := int(t.get(&in.args[0])), 0
			if len(in.args) > 1 {
				count = int(t.get(&in.args[1]))
			}
			t.barSync(id, count, arrive)
		}
	}
	return nil
}

func decShfl(f *Function, in *inst) error {
	mode := ""
	for _, m := range in.mods {
		switch m {
		case "up", "down", "bfly", "idx":
			mode = m
		}
	}
	two := in.aux == -1
	a := 1
	if two {
		a = 2
	}
	if len(in.args) != a+4 {
		return fmt.Errorf("shfl.sync takes d[|p], a, b, c, membermask")
	}
	in.exec = func(t *thread, in *inst) {
		mask := uint32(t.get(&in.args[a+3]))
		vals := &t.collective(mask, t.get(&in.args[a])).vals
		lane := uint32(t.lane)
		b := uint32(t.get(&in.args[a+1])) & 0x1f
		c := uint32(t.get(&in.args[a+2]))
		cval, seg := c&0x1f, (c>>8)&0x1f
		maxLane := lane&seg | cval&^seg
		minLane := lane & seg
		var j uint32
		var ok bool
		switch mode {
		case "up":
			j = lane - b
			ok = int32(j) >= int32(maxLane)
		case "down":
			j = lane + b
			ok = j <= maxLane
		case "bfly":
			j = lane ^ b
			ok = j <= maxLane
		case "idx":
			j = minLane | b&^seg
			ok = j <= maxLane
		}
		if !ok || j > 31 {
			j = lane
		}
		t.set(&in.args[0], vals[j][0])
		if two {
			t.set(&in.args[1], b2u(ok))
		}
	}
	return nil
}

func decVote(f *Function, in *inst) error {
	mode := ""
	for _, m := range in.mods {
		switch m {
		case "all", "any", "uni", "ballot":
			mode = m
		}
	}
	in.exec = func(t *thread, in *inst) {
		mask := uint32(t.get(&in.args[2]))
		p := b2u(t.get(&in.args[1]) != 0)
		c := t.collective(mask, p)
		m := mask & c.alive // the lanes that voted
		var ballot uint32
		for l := 0; l < 32; l++ {
			if m&(1<<l) != 0 && c.vals[l][0] != 0 {
				ballot |= 1 << l
			}
		}
		var r uint64
		switch mode {
		case "ballot":
			r = uint64(ballot)
		case "all":
			r = b2u(ballot&m == m)
		case "any":
			r = b2u(ballot&m != 0)
		case "uni":
			r = b2u(ballot&m == m || ballot&m == 0)
		}
		t.set(&in.args[0], r)
	}
	return nil
}

func decRedux(f *Function, in *inst) error {
	op := ""
	for _, m := range in.mods {
		switch m {
		case "add", "min", "max", "and", "or", "xor":
			op = m
		}
	}
	sg := signed(in.typ)
	in.exec = func(t *thread, in *inst) {
		mask := uint32(t.get(&in.args[2]))
		c := t.collective(mask, t.get(&in.args[1]))
		first := true
		var r uint64
		for l := 0; l < 32; l++ {
			if mask&c.alive&(1<<l) == 0 {
				continue
			}
			v := mask32(c.vals[l][0])
			if first {
				r, first = v, false
				continue
			}
			switch op {
			case "add":
				r += v
			case "and":
				r &= v
			case "or":
				r |= v
			case "xor":
				r ^= v
			case "min", "max":
				less := v < r
				if sg {
					less = int32(v) < int32(r)
				}
				if less == (op == "min") {
					r = v
				}
			}
		}
		t.set(&in.args[0], mask32(r))
	}
	return nil
}

func mask32(v uint64) uint64 { return v & math.MaxUint32 }

func decActivemask(f *Function, in *inst) error {
	in.exec = func(t *thread, in *inst) {
		t.b.mu.Lock()
		a := t.w.alive
		t.b.mu.Unlock()
		t.set(&in.args[0], uint64(a))
	}
	return nil
}

// decLdmatrix: ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16.
// Lanes 8i..8i+7 give the row addresses of matrix i.
func decLdmatrix(f *Function, in *inst) error {
	num := 1
	trans := in.has("trans")
	for _, m := range in.mods {
		if strings.HasPrefix(m, "x") {
			num, _ = strconv.Atoi(m[1:])
		}
	}
	if !in.has("m8n8") || in.has("b8") {
		return fmt.Errorf("ldmatrix shape unsupported")
	}
	if in.args[0].kind != oVec || len(in.args[0].vec) != num {
		return fmt.Errorf("ldmatrix .x%d needs %d destinations", num, num)
	}
	sp := in.sp
	if sp == spNone {
		sp = spGeneric
	}
	in.exec = func(t *thread, in *inst) {
		vals := &t.collective(math.MaxUint32, t.addr(&in.args[1])).vals
		g, tig := t.lane>>2, t.lane&3
		for i := 0; i < num; i++ {
			var r uint64
			for k := 0; k < 2; k++ {
				row, col := g, 2*tig+k
				if trans {
					row, col = 2*tig+k, g
				}
				ra := vals[8*i+row][0]
				t.checkAlign(ra, 16) // each row: 16 contiguous, aligned bytes
				b := t.mem(sp, ra+uint64(2*col), 2)
				r |= (uint64(b[0]) | uint64(b[1])<<8) << (16 * k)
			}
			t.set(&in.args[0].vec[i], r)
		}
	}
	return nil
}

// decMma: mma.sync.aligned.{m16n8k16,m16n8k8}.row.col.{f32,f16}.{f16,bf16}...
// and m16n8k32 with e4m3/e5m2 inputs. Products are summed exactly in
// float64 and rounded once; the tensor core's internal rounding differs in
// the last bits.
func decMma(f *Function, in *inst) error {
	if !in.has("row") || !in.has("col") {
		return fmt.Errorf("mma layout unsupported")
	}
	var m, n, k int
	for _, x := range in.mods {
		if strings.HasPrefix(x, "m16n8k") {
			m, n = 16, 8
			k, _ = strconv.Atoi(x[6:])
		}
	}
	var types []string
	for _, x := range in.mods {
		if typeSize(x) > 0 {
			types = append(types, x)
		}
	}
	if m == 0 || len(types) != 4 {
		return fmt.Errorf("mma shape or types unsupported")
	}
	dt, at, bt, ct := types[0], types[1], types[2], types[3]
	if at != bt && !(isFP8(at) && isFP8(bt)) {
		return fmt.Errorf("mma mixed input types unsupported")
	}
	esz := 16
	if isFP8(at) {
		esz = 8
		if k != 32 {
			return fmt.Errorf("fp8 mma needs k=32")
		}
	} else if at != "f16" && at != "bf16" {
		return fmt.Errorf("mma input %s unsupported", at)
	} else if k != 16 && k != 8 {
		return fmt.Errorf("mma k=%d unsupported", k)
	}
	per := 32 / esz // elements per register
	na, nb := m*k/32/per, k*n/32/per
	nc := 4
	if ct == "f16" {
		nc = 2
	}
	nd := 4
	if dt == "f16" {
		nd = 2
	}
	if len(in.args) != 4 || len(in.args[0].vec) != nd || len(in.args[1].vec) != na || len(in.args[2].vec) != nb || len(in.args[3].vec) != nc {
		return fmt.Errorf("mma operand counts")
	}
	conv := func(ty string) func(reg uint64, i int) float64 {
		switch ty {
		case "f16":
			return func(reg uint64, i int) float64 { return float64(f16Table[uint16(reg>>(16*i))]) }
		case "bf16":
			return func(reg uint64, i int) float64 { return float64(bf16ToF32(uint16(reg >> (16 * i)))) }
		case "e4m3":
			return func(reg uint64, i int) float64 { return float64(e4m3Table[uint8(reg>>(8*i))]) }
		}
		return func(reg uint64, i int) float64 { return float64(f16Table[uint16(uint8(reg>>(8*i)))<<8]) } // e5m2
	}
	tablesOnce.Do(buildTables)
	ea, eb := conv(at), conv(bt)
	in.exec = func(t *thread, in *inst) {
		var words [16]uint64
		for i := 0; i < na; i++ {
			words[i] = t.get(&in.args[1].vec[i])
		}
		for i := 0; i < nb; i++ {
			words[na+i] = t.get(&in.args[2].vec[i])
		}
		vals := &t.collective(math.MaxUint32, words[:na+nb]...).vals
		g, tig := t.lane>>2, t.lane&3
		// This lane's two rows of A and two columns of B, from the lanes'
		// fragments: element c of row r sits in lane (r%8)*4 + (c%(4*per))/per,
		// register r/8 + 2*(c/(4*per)), slot c%per; B likewise by column.
		var arow, bcol [2][32]float64
		for h := 0; h < 2; h++ {
			r, c := g+8*h, 2*tig+h
			for kk := 0; kk < k; kk++ {
				cc := kk % (4 * per)
				arow[h][kk] = ea(vals[(r%8)<<2|cc/per][r/8+2*(kk/(4*per))], cc%per)
				bcol[h][kk] = eb(vals[c<<2|cc/per][na+kk/(4*per)], cc%per)
			}
		}
		var out [4]float64
		for i := 0; i < 4; i++ {
			var cv float64
			if ct == "f32" {
				cv = float64(math.Float32frombits(uint32(t.get(&in.args[3].vec[i]))))
			} else {
				cv = float64(f16ToF32(uint16(t.get(&in.args[3].vec[i/2]) >> (16 * (i % 2)))))
			}
			s := cv
			ar, bc := &arow[i/2], &bcol[i%2]
			for kk := 0; kk < k; kk++ {
				s += ar[kk] * bc[kk]
			}
			out[i] = s
		}
		if dt == "f32" {
			for i := 0; i < 4; i++ {
				t.set(&in.args[0].vec[i], uint64(math.Float32bits(float32(out[i]))))
			}
		} else {
			for i := 0; i < 2; i++ {
				// f32Odd: round the float64 sum once, not via float32
				t.set(&in.args[0].vec[i], uint64(f32ToF16(f32Odd(out[2*i])))|uint64(f32ToF16(f32Odd(out[2*i+1])))<<16)
			}
		}
	}
	return nil
}

func isFP8(t string) bool { return t == "e4m3" || t == "e5m2" }
