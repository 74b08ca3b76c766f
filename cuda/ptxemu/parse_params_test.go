package ptxemu

import "testing"

// NVRTC 13 marks kernel pointer parameters `.ptr .align N`: N is the
// pointee's alignment, not the parameter's (PTX ISA, "Kernel Function
// Parameter Attribute: .ptr").
func TestParseParams(t *testing.T) {
	for _, c := range []struct {
		in       string
		offs     []int
		size     int
		wantFail bool
	}{
		{in: ".param .u64 a, .param .u32 b", offs: []int{0, 8}, size: 12},
		{in: ".param .u32 a, .param .u64 .ptr .align 1 b", offs: []int{0, 8}, size: 16},
		{in: ".param .u64 .ptr .global .align 16 a, .param .f32 b", offs: []int{0, 8}, size: 12},
		{in: ".param .align 64 .b8 tm[128], .param .u32 n", offs: []int{0, 128}, size: 132},
		{in: ".param .u64 .ptr .align a", wantFail: true},
	} {
		ps, size, err := parseParams(c.in)
		if c.wantFail {
			if err == nil {
				t.Errorf("%q parsed", c.in)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", c.in, err)
			continue
		}
		var offs []int
		for _, p := range ps {
			offs = append(offs, p.off)
		}
		if size != c.size || len(offs) != len(c.offs) || offs[len(offs)-1] != c.offs[len(c.offs)-1] || offs[0] != c.offs[0] {
			t.Errorf("%q: offsets %v size %d, want %v %d", c.in, offs, size, c.offs, c.size)
		}
	}
}
