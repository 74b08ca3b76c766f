// Package opcheck compares every op of a backend (the CUDA one, in
// practice) with the CPU reference on random inputs: CheckOps for
// cmd/gpucheck, and the Pair helpers for the GPU backend's tests. It is kept
// out of backend/gpu so the serving binaries do not link it.
package opcheck

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/backend/cpu"
	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/cuda/kcheck"
	"github.com/megamoe/megamoe/num"
	"github.com/megamoe/megamoe/safetensors"
)

// Reporter is the part of *testing.T the comparison helpers use, so the same
// helpers serve the tests and cmd/gpucheck.
type Reporter interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// Row is one GPU-vs-CPU comparison. For id outputs Rel is the fraction of
// differing ids, MaxAbs their count, Cos 1-Rel and Limit the allowed fraction.
type Row struct {
	Name      string
	N         int
	Cos       float64
	Rel       float64
	MaxAbs    float64
	NonFinite int
	Limit     float64
	Pass      bool
	GPUMicros float64 // 0 when the op was not timed
	Err       string  // set when the op group aborted (then Pass is false)
}

// FormatRow prints r in the style of kcheck.Row.
func FormatRow(r Row) string {
	status := "ok"
	if !r.Pass {
		status = "FAIL"
	}
	if r.Err != "" {
		return fmt.Sprintf("%-4s %-52s aborted: %s", status, r.Name, r.Err)
	}
	t := "        -"
	if r.GPUMicros > 0 {
		t = fmt.Sprintf("%8.1fµs", r.GPUMicros)
	}
	return fmt.Sprintf("%-4s %-52s n=%-10d cos=%.6f rel=%.2e max=%.3g nonfinite=%d lim=%.0e %s",
		status, r.Name, r.N, r.Cos, r.Rel, r.MaxAbs, r.NonFinite, r.Limit, t)
}

// Device is what the helpers need of the GPU side: *gpu.Backend, or a CPU
// stand-in in the tests that exercise the comparison code without a GPU.
type Device interface {
	backend.Backend
	Poison(t backend.Tensor) error
	UploadI32(t backend.Tensor, data []int32) error
	NewVec(v []float32) (backend.Vec, error)
	NewMat(rows, cols int, v []float32) (backend.Mat, error)
	NewHC(mix, width int, fn, base, scale []float32) (backend.HC, error)
	Sync() error
}

// Pair runs an op on the CPU reference and on the GPU with the same inputs.
type Pair struct {
	C   *cpu.Backend // the reference
	G   Device       // the backend under test
	Rng *rand.Rand   // the source of every random input

	t Reporter

	rows   []Row
	prefix string           // prepended to row names (model, numerics)
	gpuDur time.Duration    // last timeGPU duration, taken by the next row
	allocs []backend.Tensor // GPU tensors made by the helpers (release frees them)
}

// NewPair pairs the reference c with the device g; r receives the log lines
// and failures, seed fixes the inputs.
func NewPair(r Reporter, c *cpu.Backend, g Device, seed uint64) *Pair {
	return &Pair{t: r, C: c, G: g, Rng: rand.New(rand.NewPCG(seed, 1))}
}

// Rows returns the rows recorded so far.
func (p *Pair) Rows() []Row { return p.rows }

// Must fails the test (or aborts the op group) on an error.
func (p *Pair) Must(err error) {
	p.t.Helper()
	if err != nil {
		p.t.Fatalf("%v", err)
	}
}

// timeGPU runs f between two stream syncs and keeps its duration for the next row.
func (p *Pair) timeGPU(f func() error) error {
	if err := p.G.Sync(); err != nil {
		return fmt.Errorf("sync before: %w", err)
	}
	t0 := time.Now()
	err := f()
	if serr := p.G.Sync(); err == nil && serr != nil {
		err = fmt.Errorf("sync after: %w", serr)
	}
	p.gpuDur = time.Since(t0)
	return err
}

func (p *Pair) takeDur() float64 {
	d := p.gpuDur
	p.gpuDur = 0
	return float64(d.Nanoseconds()) / 1e3
}

// Release frees the GPU tensors the helpers allocated.
func (p *Pair) Release() {
	for _, t := range p.allocs {
		p.G.Free(t)
	}
	p.allocs = p.allocs[:0]
}

func (p *Pair) galloc(rows, cols int, dt backend.DType) backend.Tensor {
	t := p.G.Alloc(rows, cols, dt)
	p.allocs = append(p.allocs, t)
	return t
}

// Twin is one tensor on both backends, with the host values it was made
// from (Rand, From).
type Twin struct {
	C, G backend.Tensor
	Host []float32
}

// Rand makes bf16-representable normal values times scale on both backends.
func (p *Pair) Rand(rows, cols int, scale float64) Twin {
	v := make([]float32, rows*cols)
	for i := range v {
		v[i] = num.RoundBF16(float32(p.Rng.NormFloat64() * scale))
	}
	return p.From(rows, cols, v)
}

// From uploads the values v to both backends.
func (p *Pair) From(rows, cols int, v []float32) Twin {
	ct := cpu.NewTensor(rows, cols, append([]float32(nil), v...))
	gt := p.galloc(rows, cols, backend.F32)
	if err := p.G.Upload(gt, v); err != nil {
		p.t.Fatalf("upload: %v", err)
	}
	return Twin{C: ct, G: gt, Host: v}
}

// Out allocates an output pair; the GPU side is poisoned (NaN).
func (p *Pair) Out(rows, cols int) Twin {
	gt := p.galloc(rows, cols, backend.F32)
	if err := p.G.Poison(gt); err != nil {
		p.t.Fatalf("poison: %v", err)
	}
	return Twin{C: cpu.NewTensor(rows, cols, make([]float32, rows*cols)), G: gt}
}

// Check compares the GPU result with the CPU's: relative L2 error ≤ lim and
// no non-finite value where the CPU has none. It records a Row.
func (p *Pair) Check(name string, o Twin, lim float64) {
	p.t.Helper()
	want := o.C.(*cpu.Tensor).F
	got := make([]float32, len(want))
	if err := p.G.Download(o.G, got); err != nil {
		p.t.Fatalf("%s: %v", name, err)
	}
	var st kcheck.ErrStats
	bad := 0
	for i := range want {
		w, g := float64(want[i]), float64(got[i])
		if math.IsNaN(g) || math.IsInf(g, 0) {
			if !(math.IsNaN(w) || math.IsInf(w, 0)) {
				bad++
			}
			continue
		}
		if math.IsNaN(w) || math.IsInf(w, 0) {
			bad++ // GPU finite where the CPU is not: also a mismatch
			continue
		}
		st.Add(w, g)
	}
	rel, cos, maxAbs := st.Rel(), st.Cos(), st.MaxAbs
	r := Row{Name: p.prefix + name, N: len(want), Cos: cos, Rel: rel, MaxAbs: maxAbs, NonFinite: bad, Limit: lim, GPUMicros: p.takeDur()}
	r.Pass = bad == 0 && rel <= lim
	p.rows = append(p.rows, r)
	p.t.Logf("%-40s n=%-8d rel=%.2e max=%.3g nonfinite=%d lim=%.0e", name, len(want), rel, maxAbs, bad, lim)
	if !r.Pass {
		p.t.Errorf("%s: rel %.3e (limit %.0e), %d non-finite outputs", name, rel, lim, bad)
	}
}

// KVTwin is a KV store on both backends.
type KVTwin struct{ C, G backend.KVStore }

// IDs makes an I32 pair from host values.
func (p *Pair) IDs(rows, cols int, v []int32) Twin {
	ct := p.C.Alloc(rows, cols, backend.I32).(*cpu.Tensor)
	copy(ct.I, v)
	gt := p.galloc(rows, cols, backend.I32)
	p.Must(p.G.UploadI32(gt, v))
	return Twin{C: ct, G: gt}
}

// OutI32 allocates an I32 output pair; the GPU side is poisoned.
func (p *Pair) OutI32(rows, cols int) Twin {
	gt := p.galloc(rows, cols, backend.I32)
	p.Must(p.G.Poison(gt))
	return Twin{C: p.C.Alloc(rows, cols, backend.I32), G: gt}
}

// CheckIDs requires identical ids.
func (p *Pair) CheckIDs(name string, o Twin) {
	p.t.Helper()
	p.CheckIDsTol(name, o, 0)
}

// CheckIDsTol allows up to frac of the ids to differ (near-tie flips from
// summation order), records a row and returns the number that differ.
func (p *Pair) CheckIDsTol(name string, o Twin, frac float64) int {
	p.t.Helper()
	want := o.C.(*cpu.Tensor).I
	got := make([]int32, len(want))
	p.Must(p.G.DownloadI32(o.G, got))
	diff, first := 0, -1
	for i := range want {
		if got[i] != want[i] {
			if first < 0 {
				first = i
			}
			diff++
		}
	}
	f := float64(diff) / float64(max(len(want), 1))
	r := Row{Name: p.prefix + name, N: len(want), Cos: 1 - f, Rel: f, MaxAbs: float64(diff), Limit: frac, GPUMicros: p.takeDur()}
	r.Pass = f <= frac
	p.rows = append(p.rows, r)
	p.t.Logf("%s: %d/%d ids differ", name, diff, len(want))
	if !r.Pass {
		p.t.Errorf("%s: id %d = %d, want %d (%d of %d differ, allowed %.2g)", name, first, got[first], want[first], diff, len(want), frac)
	}
	return diff
}

// I64Table makes the int64 tid2eid tensor [rows, cols] of v.
func I64Table(v []int64, rows, cols int) safetensors.Tensor {
	d := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(d[8*i:], uint64(x))
	}
	return safetensors.Tensor{Name: "tid2eid", DType: safetensors.I64, Shape: []int{rows, cols}, Data: d}
}

// HCRand returns n normal values times scale (not bf16-rounded: parameters are fp32).
func HCRand(p *Pair, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(p.Rng.NormFloat64() * scale)
	}
	return v
}

// HCParams makes random hc parameters for both backends: fn scaled so the
// projections are O(1), and a strongly asymmetric comb base (catches Cᵀ vs C).
func (p *Pair) HCParams(mix, n, d int, scale []float32) (backend.HC, backend.HC) {
	fn := HCRand(p, mix*n*d, 1/math.Sqrt(float64(n*d)))
	base := HCRand(p, mix, 0.5)
	if mix > n {
		for j := range n {
			base[2*n+j*n+(j+1)%n] += 3
		}
	}
	g, err := p.G.NewHC(mix, n*d, fn, base, scale)
	p.Must(err)
	return cpu.NewHC(mix, n*d, fn, base, scale), g
}

// RandLinear makes a random weight of the given format (codes chosen finite).
func RandLinear(rng *rand.Rand, f checkpoint.Format, out, in int) *checkpoint.Linear {
	l := &checkpoint.Linear{Name: fmt.Sprintf("w_%v_%dx%d", f, out, in), Format: f, Out: out, In: in}
	n := out * in
	bytes := func(k int, gen func() byte) []byte {
		b := make([]byte, k)
		for i := range b {
			b[i] = gen()
		}
		return b
	}
	e4m3 := func() byte {
		for {
			b := byte(rng.IntN(256))
			if b&0x7f != 0x7f {
				return b
			}
		}
	}
	switch f {
	case checkpoint.FormatBF16:
		d := make([]byte, 2*n)
		for i := 0; i < n; i++ {
			binary.LittleEndian.PutUint16(d[2*i:], uint16(num.BF16FromF32(float32(rng.NormFloat64()*0.05))))
		}
		l.Weight = safetensors.Tensor{DType: safetensors.BF16, Shape: []int{out, in}, Data: d}
	case checkpoint.FormatF32:
		d := make([]byte, 4*n)
		for i := 0; i < n; i++ {
			binary.LittleEndian.PutUint32(d[4*i:], math.Float32bits(float32(rng.NormFloat64()*0.05)))
		}
		l.Weight = safetensors.Tensor{DType: safetensors.F32, Shape: []int{out, in}, Data: d}
	case checkpoint.FormatFP8Block:
		sc := (in + 127) / 128
		l.Weight = safetensors.Tensor{DType: safetensors.F8E4M3, Shape: []int{out, in}, Data: bytes(n, e4m3)}
		l.Scale = safetensors.Tensor{DType: safetensors.F8E8M0, Shape: []int{(out + 127) / 128, sc}, Data: bytes((out+127)/128*sc, func() byte { return byte(118 + rng.IntN(4)) })}
	case checkpoint.FormatMXFP4:
		l.Weight = safetensors.Tensor{DType: safetensors.I8, Shape: []int{out, in / 2}, Data: bytes(n/2, func() byte { return byte(rng.IntN(256)) })}
		l.Scale = safetensors.Tensor{DType: safetensors.F8E8M0, Shape: []int{out, in / 32}, Data: bytes(out*in/32, func() byte { return byte(121 + rng.IntN(4)) })}
	case checkpoint.FormatNVFP4:
		l.Weight = safetensors.Tensor{DType: safetensors.U8, Shape: []int{out, in / 2}, Data: bytes(n/2, func() byte { return byte(rng.IntN(256)) })}
		l.Scale = safetensors.Tensor{DType: safetensors.F8E4M3, Shape: []int{out, in / 16}, Data: bytes(out*in/16, func() byte { return byte(0x30 + rng.IntN(0x10)) })}
		l.Scale2 = 0.01
	}
	return l
}

// RandExperts makes E experts of format f (w1, w3: inter×dim; w2: dim×inter).
func RandExperts(p *Pair, f checkpoint.Format, E, dim, inter int) []checkpoint.Expert {
	ex := make([]checkpoint.Expert, E)
	for i := range ex {
		ex[i] = checkpoint.Expert{W1: *RandLinear(p.Rng, f, inter, dim), W2: *RandLinear(p.Rng, f, dim, inter), W3: *RandLinear(p.Rng, f, inter, dim)}
		if f == checkpoint.FormatNVFP4 {
			ex[i].W1.Scale2, ex[i].W2.Scale2, ex[i].W3.Scale2 = 0.01*float32(1+i%3), 0.02, 0.005*float32(1+i%5)
		}
	}
	return ex
}

// Routing picks K distinct experts per row: expert 0 never, expert 1 only in
// row 0 slot 0 (a single-pair expert), the rest at random.
func Routing(p *Pair, n, E, K int) ([]int32, []float32) {
	ids := make([]int32, n*K)
	w := make([]float32, n*K)
	for r := range n {
		used := map[int32]bool{}
		for k := range K {
			e := int32(1)
			if r != 0 || k != 0 {
				for e = int32(2 + p.Rng.IntN(E-2)); used[e]; e = int32(2 + p.Rng.IntN(E-2)) {
				}
			}
			used[e] = true
			ids[r*K+k] = e
			w[r*K+k] = float32(0.1 + p.Rng.Float64())
		}
	}
	return ids, w
}

// StepBatch builds a batch of sequences (slot i, blocks 4i..4i+3) with the
// given starts and row counts.
func StepBatch(starts, rows []int) *backend.Batch { return StepBatchBlocks(starts, rows, 4) }

// StepBatchBlocks is StepBatch with nb blocks per sequence (blocks nb·i…).
func StepBatchBlocks(starts, rows []int, nb int) *backend.Batch {
	bt := &backend.Batch{}
	r0 := 0
	for i := range starts {
		blocks := make([]int32, nb)
		for k := range blocks {
			blocks[k] = int32(nb*i + k)
		}
		bt.Seqs = append(bt.Seqs, backend.SeqInfo{Slot: i, Blocks: blocks, Start: starts[i], Row0: r0, Rows: rows[i]})
		for k := range rows[i] {
			bt.Pos = append(bt.Pos, int32(starts[i]+k))
			bt.Seq = append(bt.Seq, int32(i))
		}
		r0 += rows[i]
	}
	return bt
}
