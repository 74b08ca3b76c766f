package cuda_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/num"
)

// indexerInputs are compact index keys of rows sequences (blocks of per
// entries, shuffled) and FP4-simulated queries, with the cases the tensor-core
// path must hand to the fp32 one mixed in: NaN key blocks, zero blocks, keys
// whose block scales lie far apart, a head that is no FP4 value.
type indexerInputs struct {
	keys          []byte
	q, w          []float32
	seqs, pos     []int32
	seqOf, blocks []int32
	ld            int
}

const ixTestKeyBytes = 68 // 128 e2m1 values and 4 scales

func newIndexerInputs(rng *rand.Rand, entries []int, heads, per int) indexerInputs {
	const hd, ratio = 128, 4
	var in indexerInputs
	nb := 0
	for _, n := range entries {
		in.ld = max(in.ld, n)
		nb += (n + per - 1) / per
	}
	in.keys = make([]byte, nb*per*ixTestKeyBytes)
	for k := 0; k < len(in.keys); k += ixTestKeyBytes {
		key := in.keys[k : k+ixTestKeyBytes]
		for i := range 64 {
			key[i] = byte(rng.Uint32())
		}
		for b := range 4 {
			key[64+b] = byte(124 + rng.IntN(7))
			switch rng.IntN(40) {
			case 0: // NaN block
				key[64+b] = 0xff
				clear(key[16*b : 16*b+16])
			case 1: // zero codes (signs kept)
				for i := 16 * b; i < 16*b+16; i++ {
					key[i] &= 0x88
				}
			case 2, 3, 4: // far from the other blocks (the fp32 path)
				key[64+b] = byte(127 + 8 + rng.IntN(14))
			}
		}
	}
	for _, p := range rng.Perm(nb) {
		in.blocks = append(in.blocks, int32(p))
	}
	rows := len(entries)
	in.q = make([]float32, rows*heads*hd)
	for r := range rows {
		for h := range heads {
			v := in.q[(r*heads+h)*hd : (r*heads+h+1)*hd]
			switch {
			case r == 1 && h == 3: // no FP4 values
				for i := range v {
					v[i] = float32(rng.NormFloat64())
				}
				continue
			case r == 0 && h == 2: // all zero
				continue
			}
			for b := range 4 {
				if rng.IntN(12) == 0 {
					continue // a zero block
				}
				s := num.Pow2F32(rng.IntN(7) - 3)
				for i := 32 * b; i < 32*b+32; i++ {
					v[i] = num.E2M1ToF32(uint8(rng.IntN(16))) * s
				}
				v[32*b+rng.IntN(32)] = 6 * s // amax 6·s, as fp4_act_quant leaves most blocks
				if rng.IntN(4) == 0 {
					v[32*b+rng.IntN(32)] = 3 * s // or 3·s at most
					for i := 32 * b; i < 32*b+32; i++ {
						v[i] = float32(math.Copysign(math.Min(math.Abs(float64(v[i])), 3*float64(s)), float64(v[i])))
					}
				}
			}
		}
	}
	in.w = make([]float32, rows*heads)
	for i := range in.w {
		in.w[i] = num.RoundBF16(float32(rng.NormFloat64() * 0.05))
	}
	off := 0
	for r, n := range entries {
		c := (n + per - 1) / per
		in.seqs = append(in.seqs, int32(r), 0, int32(r), 1, int32(off), int32(c))
		in.pos = append(in.pos, int32(n*ratio+rng.IntN(ratio)-1))
		if n == 0 {
			in.pos[r] = int32(rng.IntN(ratio - 1))
		}
		in.seqOf = append(in.seqOf, int32(r))
		off += c
	}
	return in
}

// TestIndexerScoresMMAVsSIMT: indexer_scores_mma writes the scores of
// indexer_scores_kv8 bit for bit (outputs poisoned; entries past a row's
// available ones untouched), on keys and queries that take both its exact
// tensor-core path and its fp32 one.
func TestIndexerScoresMMAVsSIMT(t *testing.T) {
	ctx, s := gpu(t)
	d := devBufs{t, ctx, s}
	rng := rand.New(rand.NewPCG(rand.Uint64(), 32))
	const hd, ratio, per = 128, 4, 64
	for _, c := range []struct {
		heads   int
		entries []int
	}{
		{16, []int{70, 0, 5}},
		{32, []int{130, 64, 1}},
	} {
		t.Run(fmt.Sprintf("heads%d_%v", c.heads, c.entries), func(t *testing.T) {
			in := newIndexerInputs(rng, c.entries, c.heads, per)
			rows := len(c.entries)
			keys, q, w := d.up(in.keys), d.up(sliceBytes(in.q)), d.up(sliceBytes(in.w))
			seqs, pos, seqOf, blocks := d.up(sliceBytes(in.seqs)), d.up(sliceBytes(in.pos)), d.up(sliceBytes(in.seqOf)), d.up(sliceBytes(in.blocks))
			var got [2][]float32
			for i, run := range []func(out cuda.DevicePtr) error{
				func(out cuda.DevicePtr) error {
					return cuda.IndexerScoresF32(s, out, q, w, keys, seqs, pos, seqOf, blocks, rows, in.ld, c.heads, hd, ratio, per, ixTestKeyBytes, true)
				},
				func(out cuda.DevicePtr) error {
					return cuda.IndexerScoresSIMT(s, out, q, w, keys, seqs, pos, seqOf, blocks, rows, in.ld, c.heads, hd, ratio, per, ixTestKeyBytes, true)
				},
			} {
				out := d.up(make([]byte, 4*rows*in.ld))
				if err := s.Memset32(out, 0x7fc00bad, rows*in.ld); err != nil {
					t.Fatal(err)
				}
				if err := run(out); err != nil {
					t.Fatal(err)
				}
				got[i] = make([]float32, rows*in.ld)
				if err := s.CopyDtoH(sliceBytes(got[i]), out); err != nil {
					t.Fatal(err)
				}
				if err := s.Synchronize(); err != nil {
					t.Fatal(err)
				}
			}
			nan := 0
			for r, n := range c.entries {
				for j := range in.ld {
					a, b := got[0][r*in.ld+j], got[1][r*in.ld+j]
					if j >= n {
						if math.Float32bits(a) != 0x7fc00bad || math.Float32bits(b) != 0x7fc00bad {
							t.Errorf("row %d entry %d (of %d): written past the available entries: %v, %v", r, j, n, a, b)
						}
						continue
					}
					if a != a {
						nan++
					}
					if math.Float32bits(a) != math.Float32bits(b) && !(a != a && b != b) {
						t.Errorf("row %d entry %d: tensor cores %v (%#x), fp32 %v (%#x)", r, j, a, math.Float32bits(a), b, math.Float32bits(b))
					}
				}
			}
			t.Logf("%d NaN scores (keys with NaN blocks)", nan)
		})
	}
}
