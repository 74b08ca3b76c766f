package backend

import (
	"strings"
	"testing"

	"github.com/megamoe/megamoe/checkpoint"
	"github.com/megamoe/megamoe/safetensors"
)

// st is a checkpoint tensor of dtype dt and shape with zero data.
func st(dt safetensors.DType, shape ...int) safetensors.Tensor {
	n := 1
	for _, s := range shape {
		n *= s
	}
	return safetensors.Tensor{Name: "t", DType: dt, Shape: shape, Data: make([]byte, n*dt.Size())}
}

func lin8(name string, out, in int) checkpoint.Linear {
	return checkpoint.Linear{Name: name, Format: checkpoint.FormatFP8Block, Out: out, In: in,
		Weight: st(safetensors.F8E4M3, out, in), Scale: st(safetensors.F8E8M0, (out+127)/128, (in+127)/128)}
}

func TestCheckPrepare(t *testing.T) {
	bf := &checkpoint.Linear{Name: "wo", Format: checkpoint.FormatBF16, Out: 4, In: 8, Weight: st(safetensors.BF16, 4, 8)}
	short := &checkpoint.Linear{Name: "wo", Format: checkpoint.FormatBF16, Out: 4, In: 8, Weight: st(safetensors.BF16, 4, 7)}
	fp8 := lin8("wq", 200, 300)
	fp8bad := lin8("wq", 200, 300)
	fp8bad.Scale = st(safetensors.F8E8M0, 1, 3)
	mx := &checkpoint.Linear{Name: "w1", Format: checkpoint.FormatMXFP4, Out: 4, In: 48, Weight: st(safetensors.U8, 4, 24)}
	ex := checkpoint.Expert{W1: lin8("w1", 32, 64), W2: lin8("w2", 64, 32), W3: lin8("w3", 32, 64)}
	exBad := checkpoint.Expert{W1: lin8("w1", 32, 64), W2: lin8("w2", 64, 32), W3: lin8("w3", 16, 64)}
	hc := checkpoint.HC{Fn: st(safetensors.F32, 24, 64), Base: st(safetensors.F32, 24), Scale: st(safetensors.F32, 3)}
	hcHead := checkpoint.HC{Fn: st(safetensors.F32, 4, 64), Base: st(safetensors.F32, 4), Scale: st(safetensors.F32, 1)}
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"linear bf16", func() error { _, _, err := CheckPrepareLinear(bf); return err }(), ""},
		{"linear fp8", func() error { _, _, err := CheckPrepareLinear(&fp8); return err }(), ""},
		{"linear nil", func() error { _, _, err := CheckPrepareLinear(nil); return err }(), "nil weight"},
		{"linear shape", func() error { _, _, err := CheckPrepareLinear(&checkpoint.Linear{Name: "wo", In: 1}); return err }(), "linear wo: shape 0x1"},
		{"linear bytes", func() error { _, _, err := CheckPrepareLinear(short); return err }(), "wo: 56 bytes, want 64"},
		{"linear scale", func() error { _, _, err := CheckPrepareLinear(&fp8bad); return err }(), "wq.scale: 3 bytes, want 6"},
		{"linear fp4 in", func() error { _, _, err := CheckPrepareLinear(mx); return err }(), "linear w1: in 48 not a multiple of 32"},
		{"linear format", func() error {
			_, _, err := CheckPrepareLinear(&checkpoint.Linear{Name: "wo", Format: checkpoint.Format(99), Out: 1, In: 1})
			return err
		}(), "linear wo: unsupported format"},
		{"expert", CheckPrepareExpert("moe", 3, &ex, 64, 32), ""},
		{"expert shapes", CheckPrepareExpert("moe", 3, &exBad, 64, 32), "moe expert 3: shapes w1 32x64 w2 64x32 w3 16x64, want inter 32 dim 64"},
		{"expert dim", CheckPrepareExpert("moe", 0, &ex, 32, 64), "moe expert 0: shapes"},
		{"floats", func() error { _, err := Floats("n", st(safetensors.BF16, 8), 8); return err }(), ""},
		{"floats missing", func() error { _, err := Floats("n", safetensors.Tensor{}, 8); return err }(), "n: missing tensor"},
		{"floats count", func() error { _, err := Floats("n", st(safetensors.F32, 7), 8); return err }(), "n: 7 elements ([7]), want 8"},
		{"hc", func() error { _, _, _, err := HCParams("hc_attn", hc, 24, 64); return err }(), ""},
		{"hc head", func() error { _, _, _, err := HCParams("hc_head", hcHead, 4, 64); return err }(), ""},
		{"hc fn", func() error { _, _, _, err := HCParams("hc_attn", hc, 24, 32); return err }(), "hc_attn_fn: 1536 elements"},
		{"embedding bf16", func() error { _, _, err := EmbeddingData(st(safetensors.BF16, 10, 4), 10, 4); return err }(), ""},
		{"embedding f32", func() error { _, _, err := EmbeddingData(st(safetensors.F32, 10, 4), 10, 4); return err }(), ""},
		{"embedding bf16 size", func() error { _, _, err := EmbeddingData(st(safetensors.BF16, 10, 4), 11, 4); return err }(), "embed.weight: 80 bytes, want 88"},
		{"ids", func() error { _, err := IDs("tid2eid", st(safetensors.I64, 10, 2), 10, 2); return err }(), ""},
		{"ids count", func() error { _, err := IDs("tid2eid", st(safetensors.I64, 10, 2), 10, 3); return err }(), "tid2eid: 20 elements ([10 2]), want 10x3"},
	} {
		t.Run(c.name, func(t *testing.T) {
			switch {
			case c.want == "" && c.err != nil:
				t.Errorf("error %v, want none", c.err)
			case c.want != "" && (c.err == nil || !strings.Contains(c.err.Error(), c.want)):
				t.Errorf("error %v, want one with %q", c.err, c.want)
			}
		})
	}
	if sCols, quant, err := CheckPrepareLinear(&fp8); err != nil || sCols != 3 || !quant {
		t.Errorf("fp8 200x300: scale columns %d, quant %v, %v; want 3, true", sCols, quant, err)
	}
	if bf16, f, err := EmbeddingData(st(safetensors.F32, 10, 4), 10, 4); err != nil || bf16 != nil || len(f) != 40 {
		t.Errorf("f32 embedding: %d bf16 bytes, %d values, %v; want 0, 40", len(bf16), len(f), err)
	}
}
