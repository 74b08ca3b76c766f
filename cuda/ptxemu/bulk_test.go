package ptxemu

import (
	"encoding/binary"
	"strings"
	"testing"
)

// bulkGroupPTX fills 512 bytes of shared memory with words i + 0x11000000,
// then runs BODY, which bulk-stores them to out and records what it reads
// back from out in probe.
const bulkGroupPTX = `
.shared .align 16 .b8 sm[512];

.visible .entry bst(.param .u64 out, .param .u64 probe, .param .u32 n)
{
	.reg .b32 %r<16>;
	.reg .b64 %rd<8>;
	.reg .pred %p<2>;

	ld.param.u64 %rd1, [out];
	ld.param.u64 %rd2, [probe];
	ld.param.u32 %r4, [n];
	mov.u32 %r3, sm;
	mov.u32 %r5, 0;
FILL:
	shl.b32 %r6, %r5, 2;
	add.s32 %r7, %r3, %r6;
	add.s32 %r8, %r5, 285212672;
	st.shared.u32 [%r7], %r8;
	add.s32 %r5, %r5, 1;
	setp.lt.u32 %p1, %r5, 128;
	@%p1 bra FILL;
	BODY
	ret;
}
`

// Pieces of BODY: stores of the first (S0, n bytes) and second (S1) 256
// bytes, a probe of out's word 0 (P0) or 64 (P64) into probe word j, and an
// overwrite of the source's word 0 (OV).
const (
	bS0  = "cp.async.bulk.global.shared::cta.bulk_group [%rd1], [%r3], %r4;\n"
	bS1  = "cp.async.bulk.global.shared::cta.bulk_group [%rd1+256], [%r3+256], 256;\n"
	bC   = "cp.async.bulk.commit_group;\n"
	bW0  = "cp.async.bulk.wait_group 0;\n"
	bR0  = "cp.async.bulk.wait_group.read 0;\n"
	bOV  = "st.shared.u32 [%r3], %r5;\n"
	bP0a = "ld.global.u32 %r9, [%rd1];\nst.global.u32 [%rd2], %r9;\n"
	bP0b = "ld.global.u32 %r9, [%rd1];\nst.global.u32 [%rd2+4], %r9;\n"
	bP64 = "ld.global.u32 %r9, [%rd1+256];\nst.global.u32 [%rd2+4], %r9;\n"
)

// TestBulkStoreGroups: the 1-D bulk store's global writes appear at the
// wait_group (not .read) that completes its group, or at the thread's exit;
// wait_group N leaves the N newest groups (empty ones too) pending; a source
// changed before its group's reads complete, or misaligned operands, fail
// the launch.
func TestBulkStoreGroups(t *testing.T) {
	const poison = 0xffffffff
	for _, tc := range []struct {
		name   string
		body   string
		n      uint32
		out    int       // words of out written from the pattern
		probe  [2]uint32 // what the probes read (poison: not yet written)
		errSub string
	}{
		{"wait_group", bS0 + bC + bP0a + bW0 + bP0b, 256, 64, [2]uint32{poison, 0x11000000}, ""},
		{"read, then overwrite the source", bS0 + bC + bR0 + bP0a + bOV + bW0 + bP0b, 256, 64, [2]uint32{poison, 0x11000000}, ""},
		{"wait_group 1 keeps the newest", bS0 + bC + bS1 + bC + "cp.async.bulk.wait_group 1;\n" + bP0a + bP64, 256, 128, [2]uint32{0x11000000, poison}, ""},
		{"an empty group counts", bC + bS0 + bC + "cp.async.bulk.wait_group.read 1;\ncp.async.bulk.wait_group 1;\n" + bP0a, 256, 64, [2]uint32{poison, poison}, ""},
		{"uncommitted, done at exit", bS0 + bP0a, 256, 64, [2]uint32{poison, poison}, ""},
		{"zero bytes", bS0 + bC + bW0, 0, 0, [2]uint32{poison, poison}, ""},
		{"source overwritten before wait_group.read", bS0 + bC + bOV + bR0, 256, 0, [2]uint32{}, "changed before"},
		{"source overwritten before wait_group", bS0 + bC + bS1 + bC + bOV + bW0, 256, 0, [2]uint32{}, "byte 0 (at 0x"},
		{"source overwritten, no wait", bS0 + bC + bOV, 256, 0, [2]uint32{}, "changed before"},
		{"size not a multiple of 16", bS0, 24, 0, [2]uint32{}, "size 24 bytes is not a multiple of 16"},
		{"source misaligned", "cp.async.bulk.global.shared::cta.bulk_group [%rd1], [%r3+8], 16;\n", 16, 0, [2]uint32{}, "source address"},
		{"destination misaligned", "cp.async.bulk.global.shared::cta.bulk_group [%rd1+8], [%r3], 16;\n", 16, 0, [2]uint32{}, "destination address"},
		{"past the allocation", "cp.async.bulk.global.shared::cta.bulk_group [%rd1+272], [%r3], 256;\n", 256, 0, [2]uint32{}, "illegal address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDevice()
			mod := loadPTX100(t, d, strings.Replace(bulkGroupPTX, "BODY", tc.body, 1))
			out, ob := devBuf(t, d, 512)
			probe, pb := devBuf(t, d, 8)
			err := launch(t, d, mod, "bst", Dim{1, 1, 1}, Dim{1, 1, 1}, 0, params(out, probe, tc.n))
			if tc.errSub != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errSub) {
					t.Fatalf("launch: %v, want an error containing %q", err, tc.errSub)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i, w := range u32s(ob) {
				want := uint32(poison)
				if i < tc.out {
					want = uint32(i) + 0x11000000
				}
				if w != want {
					t.Fatalf("out word %d = %#x, want %#x", i, w, want)
				}
			}
			for j := range 2 {
				if g := binary.LittleEndian.Uint32(pb[4*j:]); g != tc.probe[j] {
					t.Errorf("probe %d = %#x, want %#x", j, g, tc.probe[j])
				}
			}
		})
	}
}
