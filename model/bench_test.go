package model

import (
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
)

// BenchmarkPrefill reports prefill tokens/s of a 256-token prompt on the small synthetic model.
func BenchmarkPrefill(b *testing.B) {
	m := newSynth(b, checkpoint.SmallConfig(), "faithful")
	toks := prompt(256, 512, 1)
	b.ResetTimer()
	for range b.N {
		s := m.Cache().NewSequence()
		if _, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: toks}}}); err != nil {
			b.Fatal(err)
		}
		m.FreeSequence(s)
	}
	b.ReportMetric(float64(b.N*len(toks))/b.Elapsed().Seconds(), "tok/s")
}

// BenchmarkDecode reports single-sequence decode tokens/s after a 128-token prompt.
func BenchmarkDecode(b *testing.B) {
	m := newSynth(b, checkpoint.SmallConfig(), "faithful")
	s := m.Cache().NewSequence()
	if _, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: prompt(128, 512, 1)}}}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		if _, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: []int32{int32(i % 512)}}}}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tok/s")
}

// BenchmarkDecodeBatch8 reports aggregate decode tokens/s of 8 sequences per step.
func BenchmarkDecodeBatch8(b *testing.B) {
	m := newSynth(b, checkpoint.SmallConfig(), "faithful")
	var items []BatchItem
	for k := range 8 {
		s := m.Cache().NewSequence()
		if _, err := m.Forward(&Batch{Items: []BatchItem{{Seq: s, Tokens: prompt(64, 512, uint64(k))}}}); err != nil {
			b.Fatal(err)
		}
		items = append(items, BatchItem{Seq: s, Tokens: []int32{1}})
	}
	b.ResetTimer()
	for range b.N {
		if _, err := m.Forward(&Batch{Items: items}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(8*b.N)/b.Elapsed().Seconds(), "tok/s")
}
