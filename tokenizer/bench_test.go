package tokenizer

import (
	"os"
	"strings"
	"testing"
)

// BenchmarkEncode1MB encodes about 1 MB of mixed text (the parity corpus and
// this package's sources, repeated) on one goroutine; reports tokens/s.
func BenchmarkEncode1MB(b *testing.B) {
	tok, err := LoadFile("testdata/deepseek_v3_tokenizer.json.gz")
	if err != nil {
		b.Fatal(err)
	}
	var sb strings.Builder
	for _, f := range []string{"testdata/gen/corpus.json", "tokenizer.go", "chat.go", "parse.go"} {
		data, err := os.ReadFile(f)
		if err != nil {
			b.Fatal(err)
		}
		sb.Write(data)
	}
	unit := sb.String()
	text := strings.Repeat(unit, 1<<20/len(unit)+1)
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	n := 0
	for i := 0; i < b.N; i++ {
		n += len(tok.Encode(text))
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "tokens/s")
}
