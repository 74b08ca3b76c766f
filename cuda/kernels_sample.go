package cuda

import (
	"fmt"
	"math"
)

// Launchers of kernels/sample.cu: token sampling on the device, one block of
// 1024 threads per row of fp32 logits [rows, vocab] (ld = vocab). The rules
// are engine/sampler.go's choose given the same uniform; cpuref.SampleDraw is
// the bit-exact twin and documents them.

const (
	sampleThreads = 1024
	// SampleMaxVocab bounds the vocabulary: masses are u64 fixed point with
	// 2^40 per unit of probability, so vocab·2^40 must stay below 2^64.
	SampleMaxVocab = 1 << 23
)

func sampleShape(name string, rows, vocab int) error {
	if rows < 0 || rows > 1<<31-1 || vocab <= 0 || vocab > SampleMaxVocab {
		return fmt.Errorf("cuda: %s: bad shape rows=%d vocab=%d (vocab in [1, %d])", name, rows, vocab, SampleMaxVocab)
	}
	return nil
}

// SampleDraw writes ids[r] (int32 [rows]) = one token of logits row r drawn
// with the per-row device arrays temp (f32; <= 0 greedy), topK (i32; <= 0 or
// >= vocab off), topP (f32; <= 0 or >= 1 off), minP (f32; <= 0 off) and the
// uniform u (f32 in [0, 1), from the sequence's RNG: see Uniform32), over the
// tokens mask allows: u32 [rows, SampleMaskWords(vocab)], bit i%32 of word i/32
// set = token i allowed (structured outputs); 0 allows every token.
func SampleDraw(s *Stream, ids, logits, temp, topK, topP, minP, u, mask DevicePtr, rows, vocab int) error {
	if err := sampleShape("sample_draw", rows, vocab); err != nil {
		return err
	}
	if rows == 0 {
		return nil
	}
	for _, p := range []struct {
		name string
		ptr  DevicePtr
	}{{"ids", ids}, {"logits", logits}, {"temp", temp}, {"top_k", topK}, {"top_p", topP}, {"min_p", minP}, {"u", u}} {
		if p.ptr == 0 {
			return fmt.Errorf("cuda: sample_draw: nil %s", p.name)
		}
	}
	a := new(Args).Ptr(ids).Ptr(logits).I32(vocab).Ptr(temp).Ptr(topK).Ptr(topP).Ptr(minP).Ptr(u).Ptr(mask)
	return launch(s, "sample", "sample_draw", Dim3{uint32(rows), 1, 1}, Dim3{sampleThreads, 1, 1}, 0, a)
}

// SampleMaskWords is the number of u32 words of one row of SampleDraw's mask.
func SampleMaskWords(vocab int) int { return (vocab + 31) / 32 }

// Uniform32 narrows a uniform float64 in [0, 1) (rand.Rand.Float64) to the
// float32 SampleDraw takes, keeping it below 1 (float32 rounding can reach 1).
func Uniform32(u float64) float32 {
	f := float32(u)
	if !(f >= 0) {
		return 0
	}
	if f >= 1 {
		return math.Nextafter32(1, 0)
	}
	return f
}

// AddArgmax writes ids[r] (int32 [rows]) = the greedy token of row r of a
// (lda floats apart) plus row r of b [rows, vocab], summed in fp32: NaN as
// -inf, ties to the lowest id, 0 for a row of -inf (SampleDraw's greedy
// rule). DSpark's Markov chain: a base logits row plus the bias of the
// previous token.
func AddArgmax(s *Stream, ids, a DevicePtr, lda int, b DevicePtr, rows, vocab int) error {
	if err := sampleShape("add_argmax", rows, vocab); err != nil {
		return err
	}
	if lda < vocab {
		return fmt.Errorf("cuda: add_argmax: rows %d apart, vocab %d", lda, vocab)
	}
	if rows == 0 {
		return nil
	}
	if ids == 0 || a == 0 || b == 0 {
		return fmt.Errorf("cuda: add_argmax: nil operand")
	}
	args := new(Args).Ptr(ids).Ptr(a).I64(int64(lda)).Ptr(b).I32(vocab)
	return launch(s, "sample", "add_argmax", Dim3{uint32(rows), 1, 1}, Dim3{sampleThreads, 1, 1}, 0, args)
}

// StrideI32 writes dst[r] = src[r·stride] for r < n (int32).
func StrideI32(s *Stream, dst, src DevicePtr, stride, n int) error {
	if n < 0 || stride < 1 || n > 1<<24 {
		return fmt.Errorf("cuda: stride_i32: bad shape n=%d stride=%d", n, stride)
	}
	if n == 0 {
		return nil
	}
	args := new(Args).Ptr(dst).Ptr(src).I32(stride).I32(n)
	return launch(s, "sample", "stride_i32", Dim3{uint32((n + 255) / 256), 1, 1}, Dim3{256, 1, 1}, 0, args)
}
