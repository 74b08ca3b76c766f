// Package kcheck runs the CUDA kernels of package cuda on fresh random inputs
// and compares them with their CPU twins (package cpuref). The cuda package
// tests use it with small shapes and cmd/gpucheck with the real DeepSeek-V4
// Flash/Pro dimensions. Outputs are poisoned with 0xFF bytes (bf16 NaN)
// before every launch, so unwritten elements show as non-finite.
package kcheck

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sort"
	"sync"

	"github.com/megamoe/megamoe/cuda"
	"github.com/megamoe/megamoe/cuda/cpuref"
)

// Thresholds, from the arithmetic of each path (relative L2 error against the
// twin's result rounded to bf16):
//   - fp32 paths (rmsnorm, swiglu): GPU and twin differ only in fp32 vs float64
//     summation order, so only rare one-ulp bf16 flips: 1e-3 is far above that.
//   - fp8/fp4 GEMMs: identical quantized operands; tensor-core fp32 accumulation
//     (which on Hopper may align products to fewer bits) per 128-K block, then
//     one bf16 rounding (2^-9 relative): 5e-3 allows about one ulp everywhere.
//   - quantisation: exact arithmetic on both sides, so codes and scales must match.
const (
	LimitFP32 = 1e-3
	LimitGEMM = 5e-3
)

// Env is what a case runs with.
type Env struct {
	Ctx  *cuda.Context
	S    *cuda.Stream
	Reps int    // timed launches (median reported); 0 skips timing
	Seed uint64 // inputs are fresh per case: Seed plus a per-case counter
	mu   sync.Mutex
	n    uint64
	// flush is written (or read: Flush) before every timed launch: it evicts
	// the inputs from the L2 (a decode step reads its weights cold) and keeps
	// the stream busy while the launch is queued, so host launch latency stays
	// out of the time.
	flush *cuda.Buffer
	Flush Flush
	rf    *readFlush
	// ShareWeights lets MoE cases of one expert shape reuse one set of
	// random weights (every expert filled), generated and uploaded once:
	// benchmarks time many token counts per shape. Without it every case
	// draws its own and leaves the experts without rows poisoned.
	ShareWeights bool
	weights      map[string]*moeWeights
}

// moeWeights is one expert shape's weights, on the host and on the device.
type moeWeights struct {
	w, ws   []byte
	gs      []float32
	dw, dws *cuda.Buffer
	dgs     *cuda.Buffer
}

// flushBytes is twice the H200's 60 MB L2.
const flushBytes = 128 << 20

// Close frees the environment's own buffers.
func (e *Env) Close() {
	if e.flush != nil {
		e.flush.Free()
		e.flush = nil
	}
	if e.rf != nil {
		e.rf.free()
		e.rf = nil
	}
	for k, mw := range e.weights {
		for _, b := range []*cuda.Buffer{mw.dw, mw.dws, mw.dgs} {
			if b != nil {
				b.Free()
			}
		}
		delete(e.weights, k)
	}
}

func (e *Env) rng() *rand.Rand {
	e.mu.Lock()
	e.n++
	n := e.n
	e.mu.Unlock()
	return rand.New(rand.NewPCG(e.Seed, n))
}

// Result is one case's outcome.
type Result struct {
	Component string
	Shape     string
	Cos       float64
	RelErr    float64
	MaxAbs    float64
	NonFinite int     // NaN/Inf among checked outputs (poison left = unwritten)
	Mismatch  int     // exact-match cases: differing codes; MoE: clobbered rows
	Checked   int     // outputs compared
	TimeUs    float64 // median kernel time
	GBs       float64 // minimum bytes moved / time
	TFLOPs    float64 // useful flops / time
	Limit     float64
	Pass      bool
	Err       error
}

// Case is a named check.
type Case struct {
	Component string
	Shape     string
	Run       func(env *Env) Result
	MoE       cuda.MoEShape // moe_fp4 cases: the grouped GEMM's shape
}

// ---- helpers ----

// bufs tracks device buffers of one case.
type bufs struct {
	env  *Env
	list []*cuda.Buffer
	err  error
}

func (b *bufs) alloc(n int) cuda.DevicePtr {
	if b.err != nil {
		return 0
	}
	buf, err := b.env.Ctx.Alloc(max(n, 1))
	if err != nil {
		b.err = err
		return 0
	}
	b.list = append(b.list, buf)
	return buf.Ptr
}

// buffer is alloc for callers that keep the Buffer.
func (b *bufs) buffer(n int) *cuda.Buffer {
	if b.err != nil {
		return &cuda.Buffer{}
	}
	buf, err := b.env.Ctx.Alloc(max(n, 1))
	if err != nil {
		b.err = err
		return &cuda.Buffer{}
	}
	b.list = append(b.list, buf)
	return buf
}

func (b *bufs) upload(data []byte) cuda.DevicePtr {
	p := b.alloc(len(data))
	if b.err == nil {
		b.err = b.env.S.CopyHtoD(p, data)
	}
	return p
}

func (b *bufs) poison(p cuda.DevicePtr, n int) {
	if b.err == nil {
		b.err = b.env.S.Memset8(p, 0xFF, n)
	}
}

func (b *bufs) download(dst []byte, p cuda.DevicePtr) {
	if b.err == nil {
		b.err = b.env.S.CopyDtoH(dst, p)
	}
	if b.err == nil {
		b.err = b.env.S.Synchronize()
	}
}

func (b *bufs) free() {
	for _, x := range b.list {
		x.Free()
	}
}

// timeIt returns the median time in microseconds of reps runs of f, each
// after an L2 flush.
func timeIt(env *Env, f func() error) (float64, error) {
	if env.Reps <= 0 {
		return 0, nil
	}
	if err := f(); err != nil { // warm-up
		return 0, err
	}
	start, err := env.Ctx.NewEvent()
	if err != nil {
		return 0, err
	}
	defer start.Close()
	end, err := env.Ctx.NewEvent()
	if err != nil {
		return 0, err
	}
	defer end.Close()
	ts := make([]float64, 0, env.Reps)
	for i := 0; i < env.Reps; i++ {
		if err := env.flushL2(i); err != nil {
			return 0, err
		}
		if err := start.Record(env.S); err != nil {
			return 0, err
		}
		if err := f(); err != nil {
			return 0, err
		}
		if err := end.Record(env.S); err != nil {
			return 0, err
		}
		if err := end.Synchronize(); err != nil {
			return 0, err
		}
		ms, err := end.ElapsedMs(start)
		if err != nil {
			return 0, err
		}
		ts = append(ts, float64(ms)*1000)
	}
	sort.Float64s(ts)
	return ts[len(ts)/2], nil
}

// compareBF16 compares GPU bf16 outputs with the twin (rounded to bf16) at
// the given indices (all when idx is nil).
func compareBF16(r *Result, got []uint16, ref []float64, idx []int) {
	var st ErrStats
	check := func(i int) {
		g := float64(cpuref.BF16ToF32(got[i]))
		want := float64(cpuref.BF16ToF32(cpuref.F32ToBF16(float32(ref[i]))))
		r.Checked++
		if math.IsNaN(g) || math.IsInf(g, 0) {
			r.NonFinite++
			return
		}
		st.Add(want, g)
	}
	if idx == nil {
		for i := range got {
			check(i)
		}
	} else {
		for _, i := range idx {
			check(i)
		}
	}
	r.Cos, r.RelErr, r.MaxAbs = st.Cos(), st.Rel(), st.MaxAbs
}

func finish(r Result, b *bufs) Result {
	if r.Err == nil && b.err != nil {
		r.Err = b.err
	}
	r.Pass = r.Err == nil && r.NonFinite == 0 && r.Mismatch == 0 && r.Checked > 0 && r.RelErr <= r.Limit
	if r.TimeUs > 0 {
		r.GBs /= r.TimeUs * 1e3    // bytes -> GB/s
		r.TFLOPs /= r.TimeUs * 1e6 // flops -> TFLOP/s
	} else {
		r.GBs, r.TFLOPs = 0, 0
	}
	return r
}

// randBF16 fills n bf16 values, normal with per-row scale and rare outliers.
// Blocks of 64 rows draw in parallel from their own generators (a 4096-token
// expert case has 10^8 values: seconds of device time on one core).
func randBF16(rng *rand.Rand, rows, cols int) []uint16 {
	out := make([]uint16, rows*cols)
	seed := rng.Uint64()
	parallelBlocks(rows, 64, func(r0, r1 int) {
		g := rand.New(rand.NewPCG(seed, uint64(r0)))
		for r := r0; r < r1; r++ {
			sc := math.Ldexp(1, g.IntN(8)-4)
			for c := 0; c < cols; c++ {
				v := g.NormFloat64() * sc
				if g.IntN(1000) == 0 {
					v *= 50
				}
				out[r*cols+c] = cpuref.F32ToBF16(float32(v))
			}
		}
	})
	return out
}

// parallelBlocks runs f(lo, hi) over [0, n) in blocks of block, at most
// GOMAXPROCS at once.
func parallelBlocks(n, block int, f func(lo, hi int)) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for lo := 0; lo < n; lo += block {
		wg.Add(1)
		sem <- struct{}{}
		go func(lo int) {
			defer wg.Done()
			defer func() { <-sem }()
			f(lo, min(lo+block, n))
		}(lo)
	}
	wg.Wait()
}

// fillParallel fills b with random bytes from per-chunk generators.
func fillParallel(b []byte, seed uint64, f func(rng *rand.Rand, chunk []byte)) {
	parallelBlocks(len(b), 1<<20, func(lo, hi int) { f(rand.New(rand.NewPCG(seed, uint64(lo))), b[lo:hi]) })
}

func randomBytes(rng *rand.Rand, b []byte, f func(x byte) byte) {
	fillParallel(b, rng.Uint64(), func(r *rand.Rand, c []byte) {
		for i := 0; i < len(c); i += 8 {
			v := r.Uint64()
			for j := 0; j < 8 && i+j < len(c); j++ {
				c[i+j] = f(byte(v >> (8 * j)))
			}
		}
	})
}

// e4m3 weight codes with |v| < 2 (exponent <= 7) and no NaN.
func weightCode(x byte) byte { return x & 0xBF }

func shapeStr(format string, a ...any) string { return fmt.Sprintf(format, a...) }

// Time is the median time in microseconds of env.Reps runs of f (after one
// warm-up), from CUDA events on env.S.
func Time(env *Env, f func() error) (float64, error) { return timeIt(env, f) }

// FirstDiff is the index of the first byte where a and b differ (len(a)
// where b only runs longer), or -1 where they are equal.
func FirstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if i >= len(b) || a[i] != b[i] {
			return i
		}
	}
	return len(a)
}
