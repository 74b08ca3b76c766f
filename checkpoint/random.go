package checkpoint

import (
	_ "embed"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/megamoe/megamoe/num"
)

// The released architectures (verbatim config.json files).
var (
	//go:embed testdata/flash-config.json
	flashConfigJSON []byte
	//go:embed testdata/pro-config.json
	proConfigJSON []byte
)

// PresetConfig returns a named architecture: "small" (SmallConfig), "flash"
// (DeepSeek-V4-Flash) or "pro" (DeepSeek-V4-Pro), the latter two parsed from
// the official config.json.
func PresetConfig(name string) (*Config, error) {
	var data []byte
	switch name {
	case "small":
		return SmallConfig(), nil
	case "small-tp":
		return SmallTPConfig(), nil
	case "flash":
		data = flashConfigJSON
	case "pro":
		data = proConfigJSON
	default:
		return nil, fmt.Errorf("unknown preset %q (want small, small-tp, flash or pro)", name)
	}
	c, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("preset %s: %w", name, err)
	}
	return c, nil
}

// CutLayers returns a copy of c with only its first layers main layers (the
// compression ratios and hash layers truncated to match) and, if mtp is
// false, without the MTP block.
func CutLayers(c *Config, layers int, mtp bool) (*Config, error) {
	if layers < 1 || layers > c.Layers {
		return nil, fmt.Errorf("cut layers: %d outside [1, %d]", layers, c.Layers)
	}
	out := *c
	out.Layers = layers
	out.HashLayers = min(c.HashLayers, layers)
	out.CompressRatios = slices.Clone(c.CompressRatios[:layers])
	if mtp {
		out.CompressRatios = append(out.CompressRatios, c.CompressRatios[c.Layers:]...)
	} else {
		out.MTPLayers = 0
	}
	if err := out.Validate(); err != nil {
		return nil, fmt.Errorf("cut layers: %w", err)
	}
	return &out, nil
}

// Pool sizes: how many distinct random matrices one (shape, format) gets.
const (
	expertPool = 8
	linearPool = 2
)

// RandomWeights builds in-memory weights of architecture c in format
// (GenOfficial or GenNVFP4) for benchmarks and stability tests at any size:
// GenWeights' generator with a pool. Non-linear tensors follow the
// small-checkpoint rules (tensorValues); every linear dequantises to
// rms ≈ 1/sqrt(in) like GenWeights' N(0, 1/in), but linears of one shape and
// format share the bytes of a small pool of random matrices (picked by a hash
// of the name), so host memory stays a few GB even for the full Flash or Pro
// stack. The same arguments give the same values.
func RandomWeights(c *Config, format string, seed uint64) (*Weights, error) {
	w, err := drawWeights(c, format, seed, true)
	if err != nil {
		return nil, fmt.Errorf("random weights: %w", err)
	}
	return w, nil
}

type poolKey struct {
	out, in int
	format  Format
	idx     int
}

// pooled is one random matrix in a linear format.
type pooled struct {
	w, scale []byte
	scale2   float32 // NVFP4 only
}

// pooled returns the pool's matrix for linear l in format f, drawing it on
// first use.
func (g *genVisitor) pooled(l LinearSpec, f Format) *pooled {
	size := linearPool
	if l.Kind == KindExpert {
		size = expertPool
	}
	key := poolKey{l.Out, l.In, f, int(subSeed(0, l.Name) % uint64(size))}
	m := g.pool[key]
	if m == nil {
		m = randMatrix(l.Out, l.In, f, subSeed(g.seed, fmt.Sprint("pool", key)))
		g.pool[key] = m
	}
	return m
}

// randMatrix draws an out×in matrix in format f with rms ≈ 1/sqrt(in): random
// codes (every e2m1 nibble; e4m3 bytes with bit 6 clear, which excludes NaN
// and keeps |code| < 2) times block scales chosen so the mean square is
// right on average.
func randMatrix(out, in int, f Format, seed uint64) *pooled {
	target := 1 / float64(in) // wanted mean square
	n := out * in
	switch f {
	case FormatBF16, FormatF32:
		return &pooled{w: normalBytes(n, math.Sqrt(target), f == FormatBF16, seed)}
	case FormatFP8Block:
		w := randBytes(n, 0xBF, 0, seed)
		scale := e8m0Mix(ceilDiv(out, 128)*ceilDiv(in, 128), target/fp8CodeMS)
		return &pooled{w: w, scale: scale}
	case FormatMXFP4:
		w := randBytes(n/2, 0xFF, 0, seed)
		return &pooled{w: w, scale: e8m0Mix(out*ceilDiv(in, 32), target/fp4CodeMS)}
	case FormatNVFP4:
		w := randBytes(n/2, 0xFF, 0, seed)
		// e4m3 block scales in [1, 2); the fp32 global scale (a function of
		// the shape only, so w1 and w3 share it) makes the mean square exact.
		scale := randBytes(out*ceilDiv(in, 16), 0x07, 0x38, subSeed(seed, "scale"))
		g := float32(math.Sqrt(target / (fp4CodeMS * nvScaleMS)))
		return &pooled{w: w, scale: scale, scale2: g}
	}
	panic(fmt.Sprintf("random matrix: format %v", f))
}

// Mean squares of the random codes: every e2m1 code, the e4m3 codes with bit
// 6 clear, and the NVFP4 block scales 0x38..0x3f (1 + m/8).
var fp4CodeMS, fp8CodeMS, nvScaleMS = func() (a, b, s float64) {
	for _, v := range num.E2M1Table {
		a += float64(v*v) / 16
	}
	for c := range 256 {
		if c&0x40 == 0 {
			v := float64(num.E4M3Table[c])
			b += v * v / 128
		}
	}
	for c := 0x38; c < 0x40; c++ {
		v := float64(num.E4M3Table[c])
		s += v * v / 8
	}
	return
}()

// e8m0Mix returns n power-of-two scales whose squares average q: scale 2^k
// or 2^(k+1) with 4^k <= q < 4^(k+1), the larger for a low-discrepancy
// fraction p of the blocks (4^k·(1+3p) = q).
func e8m0Mix(n int, q float64) []byte {
	k := int(math.Floor(math.Log(q) / math.Log(4)))
	p := (q/math.Pow(4, float64(k)) - 1) / 3
	lo, hi := num.E8M0FromExp(k), num.E8M0FromExp(k+1)
	out := make([]byte, n)
	for j := range out {
		out[j] = lo
		if _, frac := math.Modf(float64(j+1) * 0.6180339887498949); frac < p {
			out[j] = hi
		}
	}
	return out
}

// chunkBytes is the work unit of the parallel generators.
const chunkBytes = 1 << 20

// parallel runs fn over [0, n) in chunks of size on all cores.
func parallel(n, size int, fn func(chunk, lo, hi int)) {
	chunks := ceilDiv(n, size)
	workers := min(runtime.GOMAXPROCS(0), chunks)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				ch := int(next.Add(1) - 1)
				if ch >= chunks {
					return
				}
				fn(ch, ch*size, min(n, (ch+1)*size))
			}
		})
	}
	wg.Wait()
}

func chunkRNG(seed uint64, chunk int) *rand.PCG { return rand.NewPCG(seed, uint64(chunk)+1) }

// randBytes returns n random bytes b&mask | or.
func randBytes(n int, mask, or byte, seed uint64) []byte {
	b := make([]byte, n)
	parallel(n, chunkBytes, func(ch, lo, hi int) {
		src := chunkRNG(seed, ch)
		for i := lo; i < hi; i += 8 {
			u := src.Uint64()
			for j := i; j < min(i+8, hi); j++ {
				b[j] = byte(u)&mask | or
				u >>= 8
			}
		}
	})
	return b
}

// normalBytes returns n N(0, std²) values encoded as bf16 or f32.
func normalBytes(n int, std float64, bf16 bool, seed uint64) []byte {
	es := 4
	if bf16 {
		es = 2
	}
	b := make([]byte, es*n)
	parallel(n, chunkBytes/4, func(ch, lo, hi int) {
		rng := rand.New(chunkRNG(seed, ch))
		v := make([]float32, hi-lo)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * std)
		}
		if bf16 {
			num.EncodeBF16(v, b[2*lo:2*hi])
		} else {
			num.EncodeF32(v, b[4*lo:4*hi])
		}
	})
	return b
}

// parDrawer draws in parallel chunks, each from its own stream.
type parDrawer struct{ seed uint64 }

func (d parDrawer) fill(n int, f func(r *rand.Rand) float64) []float32 {
	v := make([]float32, n)
	parallel(n, chunkBytes/4, func(ch, lo, hi int) {
		r := rand.New(chunkRNG(d.seed, ch))
		for i := lo; i < hi; i++ {
			v[i] = float32(f(r))
		}
	})
	return v
}

func (d parDrawer) normal(n int, mean, std float64) []float32 {
	return d.fill(n, func(r *rand.Rand) float64 { return mean + r.NormFloat64()*std })
}

func (d parDrawer) uniform(n int, lo float64) []float32 {
	return d.fill(n, func(r *rand.Rand) float64 { return lo + r.Float64() })
}

func (d parDrawer) perms(rows, n, k int) []int64 {
	out := make([]int64, rows*k)
	parallel(rows, 4096, func(ch, lo, hi int) {
		r := rand.New(chunkRNG(d.seed, ch))
		for row := lo; row < hi; row++ {
			for j, p := range r.Perm(n)[:k] {
				out[row*k+j] = int64(p)
			}
		}
	})
	return out
}

// subSeed derives an independent stream seed from seed and a name.
func subSeed(seed uint64, name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	x := h.Sum64() ^ seed*0x9e3779b97f4a7c15
	// splitmix64 finaliser: nearby names must not give correlated streams.
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
