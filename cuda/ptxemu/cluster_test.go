package ptxemu

import "testing"

// Each block of a 4-block cluster writes rank*100+tid into its shared
// array; after the cluster barrier every thread reads the next rank's
// element tid through mapa + ld.shared::cluster. Without the barrier, or
// with mapa pointing at the wrong block, the values differ.
const clusterPTX = `
.shared .align 4 .b8 sh[256];

.visible .entry ring(.param .u64 ring_param_0)
.maxntid 64, 1, 1
.explicitcluster
.reqnctapercluster 4, 1, 1
{
	.reg .b32 %r<16>;
	.reg .b64 %rd<8>;

	ld.param.u64 %rd1, [ring_param_0];
	cvta.to.global.u64 %rd2, %rd1;
	mov.u32 %r1, %tid.x;
	mov.u32 %r2, %cluster_ctarank;
	mov.u32 %r3, %cluster_nctarank;
	mad.lo.s32 %r4, %r2, 100, %r1;
	mov.u32 %r5, sh;
	shl.b32 %r6, %r1, 2;
	add.s32 %r7, %r5, %r6;
	st.shared.u32 [%r7], %r4;
	barrier.cluster.arrive.release.aligned;
	barrier.cluster.wait.acquire.aligned;
	add.s32 %r8, %r2, 1;
	rem.u32 %r9, %r8, %r3;
	mapa.shared::cluster.u32 %r10, %r7, %r9;
	ld.shared::cluster.u32 %r11, [%r10];
	mov.u32 %r12, %ctaid.x;
	mad.lo.s32 %r13, %r12, 64, %r1;
	mul.wide.u32 %rd3, %r13, 4;
	add.s64 %rd4, %rd2, %rd3;
	st.global.u32 [%rd4], %r11;
	ret;
}
`

func TestCluster(t *testing.T) {
	d := NewDevice()
	m := loadPTX(t, d, clusterPTX)
	const blocks = 8
	out, ob := devBuf(t, d, 4*64*blocks)
	mustLaunch(t, d, m, "ring", Dim{blocks, 1, 1}, Dim{64, 1, 1}, 0, params(out))
	got := u32s(ob)
	for b := 0; b < blocks; b++ {
		for tid := 0; tid < 64; tid++ {
			want := uint32(((b%4)+1)%4*100 + tid)
			if g := got[b*64+tid]; g != want {
				t.Fatalf("block %d thread %d read %d, want %d", b, tid, g, want)
			}
		}
	}
	if err := launch(t, d, m, "ring", Dim{6, 1, 1}, Dim{64, 1, 1}, 0, params(out)); err == nil {
		t.Error("a grid of 6 blocks in clusters of 4 launched")
	}
}
