package ptxemu

import (
	"sort"
	"testing"
)

// Barriers and shared memory

const reversePTX = `
.visible .entry reverse(
	.param .u64 reverse_param_0,
	.param .u64 reverse_param_1
)
{
	.reg .b32 	%r<20>;
	.reg .b64 	%rd<8>;
	.shared .align 4 .b8 _ZZ7reverseE3buf[512];

	ld.param.u64 	%rd1, [reverse_param_0];
	ld.param.u64 	%rd2, [reverse_param_1];
	cvta.to.global.u64 	%rd3, %rd1;
	cvta.to.global.u64 	%rd4, %rd2;
	mov.u32 	%r1, %tid.x;
	mov.u32 	%r2, %tid.y;
	mov.u32 	%r3, %ntid.x;
	mad.lo.s32 	%r4, %r2, %r3, %r1;
	mul.wide.u32 	%rd5, %r4, 4;
	add.s64 	%rd6, %rd3, %rd5;
	ld.global.u32 	%r5, [%rd6];
	mov.u32 	%r6, _ZZ7reverseE3buf;
	shl.b32 	%r7, %r4, 2;
	add.s32 	%r8, %r6, %r7;
	st.shared.u32 	[%r8], %r5;
	bar.sync 	0;
	sub.s32 	%r9, 127, %r4;
	shl.b32 	%r10, %r9, 2;
	add.s32 	%r11, %r6, %r10;
	ld.shared.u32 	%r12, [%r11];
	barrier.sync 	0;
	add.s32 	%r12, %r12, 1000;
	st.shared.u32 	[%r8], %r12;
	bar.sync 	0;
	ld.shared.u32 	%r13, [%r11];
	add.s64 	%rd7, %rd4, %rd5;
	st.global.u32 	[%rd7], %r13;
	ret;
}
`

func TestBarrierReverse(t *testing.T) {
	d := NewDevice()
	m := loadPTX(t, d, reversePTX)
	in := make([]uint32, 128)
	for i := range in {
		in[i] = uint32(i*i + 17)
	}
	for iter := 0; iter < 5; iter++ {
		pi, bi := devBuf(t, d, 512)
		putU32s(bi, in)
		po, bo := devBuf(t, d, 512)
		mustLaunch(t, d, m, "reverse", Dim{1, 1, 1}, Dim{64, 2, 1}, 0, params(pi, po))
		// round 1: s[i] = in[127-i] + 1000; round 2: out[i] = s[127-i] = in[i] + 1000
		for i, got := range u32s(bo) {
			if want := in[i] + 1000; got != want {
				t.Fatalf("iteration %d: out[%d] = %d, want %d", iter, i, got, want)
			}
		}
	}
}

// dynsmem uses a static array and the dynamic (extern) one, through generic
// addresses; out[i] = dyn[(i+1)%n] + stat[i%16], and the last word is
// %dynamic_smem_size.
const dynSmemPTX = `
.extern .shared .align 16 .b8 dsmem[];

.visible .entry dynsmem(
	.param .u64 dynsmem_param_0
)
{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<20>;
	.reg .b64 	%rd<12>;
	.shared .align 4 .b8 stat[64];

	ld.param.u64 	%rd1, [dynsmem_param_0];
	cvta.to.global.u64 	%rd2, %rd1;
	mov.u32 	%r1, %tid.x;
	mov.u32 	%r2, %ntid.x;
	mov.u64 	%rd3, dsmem;
	cvta.shared.u64 	%rd4, %rd3;
	mul.wide.u32 	%rd5, %r1, 4;
	add.s64 	%rd6, %rd4, %rd5;
	mul.lo.s32 	%r3, %r1, %r1;
	st.u32 	[%rd6], %r3;
	and.b32 	%r4, %r1, 15;
	shl.b32 	%r5, %r4, 2;
	mov.u32 	%r6, stat;
	add.s32 	%r7, %r6, %r5;
	shl.b32 	%r8, %r4, 8;
	setp.lt.u32 	%p2, %r1, 16;
	@%p2 st.shared.u32 	[%r7], %r8;
	bar.sync 	0;
	add.s32 	%r9, %r1, 1;
	rem.u32 	%r10, %r9, %r2;
	mul.wide.u32 	%rd7, %r10, 4;
	add.s64 	%rd8, %rd4, %rd7;
	ld.u32 	%r11, [%rd8];
	ld.shared.u32 	%r12, [%r7];
	add.s32 	%r13, %r11, %r12;
	add.s64 	%rd9, %rd2, %rd5;
	st.global.u32 	[%rd9], %r13;
	setp.ne.s32 	%p1, %r1, 0;
	@%p1 bra 	$L__BB0_2;
	mov.u32 	%r14, %dynamic_smem_size;
	mul.wide.u32 	%rd10, %r2, 4;
	add.s64 	%rd11, %rd2, %rd10;
	st.global.u32 	[%rd11], %r14;
$L__BB0_2:
	ret;
}
`

func TestDynamicShared(t *testing.T) {
	d := NewDevice()
	m := loadPTX(t, d, dynSmemPTX)
	const n = 96
	po, bo := devBuf(t, d, 4*(n+1))
	mustLaunch(t, d, m, "dynsmem", Dim{1, 1, 1}, Dim{n, 1, 1}, 4*n, params(po))
	out := u32s(bo)
	for i := 0; i < n; i++ {
		j := uint32((i + 1) % n)
		if want := j*j + uint32(i%16)<<8; out[i] != want {
			t.Errorf("out[%d] = %d, want %d", i, out[i], want)
		}
	}
	if out[n] != 4*n {
		t.Errorf("%%dynamic_smem_size = %d, want %d", out[n], 4*n)
	}
	f, _ := m.Function("dynsmem")
	if f.StaticShared() != 64 {
		t.Errorf("StaticShared = %d, want 64", f.StaticShared())
	}
	// too little dynamic shared memory: the last threads' stores fault
	err := launch(t, d, m, "dynsmem", Dim{1, 1, 1}, Dim{n, 1, 1}, 4*n-64, params(po))
	if le := asLaunchError(t, err); !le.Illegal {
		t.Errorf("short dynamic shared memory: %v, want an illegal address", err)
	}
}

// Atomics

const atomPTX = `
.visible .entry atoms(
	.param .u64 atoms_param_0,
	.param .u64 atoms_param_1,
	.param .u64 atoms_param_2,
	.param .u64 atoms_param_3
)
{
	.reg .b32 	%r<12>;
	.reg .b64 	%rd<12>;

	ld.param.u64 	%rd1, [atoms_param_0];
	ld.param.u64 	%rd2, [atoms_param_1];
	ld.param.u64 	%rd3, [atoms_param_2];
	ld.param.u64 	%rd4, [atoms_param_3];
	mov.u32 	%r1, %ctaid.x;
	mov.u32 	%r2, %ntid.x;
	mov.u32 	%r3, %tid.x;
	mad.lo.s32 	%r4, %r1, %r2, %r3;
	rem.u32 	%r5, %r4, 7;
	add.s32 	%r6, %r5, 1;
	atom.global.add.u32 	%r7, [%rd1], %r6;
	mul.wide.u32 	%rd5, %r4, 4;
	add.s64 	%rd6, %rd2, %rd5;
	st.global.u32 	[%rd6], %r7;
	add.s32 	%r8, %r4, 1;
	atom.global.cas.b32 	%r9, [%rd3], 0, %r8;
	add.s64 	%rd7, %rd4, %rd5;
	st.global.u32 	[%rd7], %r9;
	red.global.add.u32 	[%rd1+4], 2;
	ret;
}
`

func TestAtomics(t *testing.T) {
	d := NewDevice()
	d.Parallel = 4
	m := loadPTX(t, d, atomPTX)
	const blocks, threads = 16, 64
	const n = blocks * threads
	pc, bc := devBuf(t, d, 8)
	putU32s(bc, []uint32{0, 0})
	pold, bold := devBuf(t, d, 4*n)
	pw, bw := devBuf(t, d, 4)
	putU32s(bw, []uint32{0})
	pcas, bcas := devBuf(t, d, 4*n)
	mustLaunch(t, d, m, "atoms", Dim{blocks, 1, 1}, Dim{threads, 1, 1}, 0, params(pc, pold, pw, pcas))
	// The old values, ordered, must chain: each is the previous plus its increment.
	olds := u32s(bold)
	order := make([]int, n)
	var total uint32
	for i := range order {
		order[i] = i
		total += uint32(i%7 + 1)
	}
	sort.Slice(order, func(a, b int) bool { return olds[order[a]] < olds[order[b]] })
	run := uint32(0)
	for _, i := range order {
		if olds[i] != run {
			t.Fatalf("atom.add: thread %d saw %d, want %d in the chain", i, olds[i], run)
		}
		run += uint32(i%7 + 1)
	}
	if c := u32s(bc); c[0] != total || c[1] != 2*n {
		t.Errorf("counters = %d, %d; want %d, %d", c[0], c[1], total, 2*n)
	}
	// Exactly one thread wins the CAS; everyone else sees its value.
	word := u32s(bw)[0]
	winners := 0
	for i, old := range u32s(bcas) {
		switch old {
		case 0:
			winners++
			if word != uint32(i+1) {
				t.Errorf("cas winner %d, word %d", i, word)
			}
		default:
			if old != word {
				t.Errorf("cas: thread %d saw %d, want %d", i, old, word)
			}
		}
	}
	if winners != 1 {
		t.Errorf("%d cas winners, want 1", winners)
	}
}

// atomf: atom.add.f32 flushes subnormals on global memory but keeps them on
// shared memory (directly and through a generic address); f16x2 and bf16
// atom.add.noftz add as floats; cp.async's fourth operand as the predicate
// ignore-src (true: zero-fill, false: copy).
const atomFloatPTX = `
.visible .entry atomf(
	.param .u64 atomf_param_0
)
{
	.reg .pred 	%p<3>;
	.reg .b16 	%rs<3>;
	.reg .b32 	%r<8>;
	.reg .f32 	%f<6>;
	.reg .b64 	%rd<5>;
	.shared .align 16 .b8 sm[32];

	ld.param.u64 	%rd1, [atomf_param_0];
	atom.global.add.f32 	%f1, [%rd1], 0f00000001;
	mov.u32 	%r1, sm;
	st.shared.u32 	[%r1], 0;
	atom.shared.add.f32 	%f2, [%r1], 0f00000001;
	ld.shared.f32 	%f3, [%r1];
	st.global.f32 	[%rd1+4], %f3;
	mov.u64 	%rd2, sm;
	cvta.shared.u64 	%rd3, %rd2;
	st.u32 	[%rd3+4], 0;
	atom.add.f32 	%f4, [%rd3+4], 0f00000001;
	ld.shared.f32 	%f5, [%r1+4];
	st.global.f32 	[%rd1+8], %f5;
	mov.b32 	%r2, 0x3C003C00;
	atom.global.add.noftz.f16x2 	%r3, [%rd1+12], %r2;
	mov.b16 	%rs1, 0x3F80;
	atom.global.add.noftz.bf16 	%rs2, [%rd1+16], %rs1;
	st.shared.u32 	[%r1+16], -1;
	st.shared.u32 	[%r1+20], -1;
	add.s64 	%rd4, %rd1, 32;
	setp.eq.s32 	%p1, %r1, %r1;
	setp.ne.s32 	%p2, %r1, %r1;
	add.s32 	%r4, %r1, 16;
	cp.async.ca.shared.global 	[%r4], [%rd4], 4, %p1;
	add.s32 	%r5, %r1, 20;
	cp.async.ca.shared.global 	[%r5], [%rd4], 4, %p2;
	cp.async.wait_all;
	ld.shared.u32 	%r6, [%r1+16];
	st.global.u32 	[%rd1+40], %r6;
	ld.shared.u32 	%r7, [%r1+20];
	st.global.u32 	[%rd1+44], %r7;
	ret;
}
`

func TestAtomicFloatsAndIgnoreSrc(t *testing.T) {
	d := NewDevice()
	m := loadPTX(t, d, atomFloatPTX)
	p, b := devBuf(t, d, 48)
	putU32s(b, []uint32{0})
	putU32s(b[12:], []uint32{0x3c004000, 0x3f80}) // f16x2 {2, 1}; bf16 1 (and poison above it)
	putU32s(b[32:], []uint32{0xdeadbeef})
	mustLaunch(t, d, m, "atomf", Dim{1, 1, 1}, Dim{1, 1, 1}, 0, params(p))
	w := u32s(b)
	for _, c := range []struct {
		name      string
		got, want uint32
	}{
		{"atom.global.add.f32 of a subnormal (flushed)", w[0], 0},
		{"atom.shared.add.f32 of a subnormal (kept)", w[1], 1},
		{"generic atom.add.f32 on shared (kept)", w[2], 1},
		{"atom.global.add.noftz.f16x2 {2,1} + {1,1}", w[3], 0x40004200},
		{"atom.global.add.noftz.bf16 1 + 1", w[4] & 0xffff, 0x4000},
		{"cp.async ignore-src true", w[10], 0},
		{"cp.async ignore-src false", w[11], 0xdeadbeef},
	} {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
}

// cpwait: two cp.async groups; the destination holds its old value until a
// wait completes the copy's group (wait_group 1 completes only the older).
const cpWaitPTX = `
.visible .entry cpwait(
	.param .u64 cpwait_param_0
)
{
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<2>;
	.shared .align 16 .b8 cs[16];

	ld.param.u64 	%rd1, [cpwait_param_0];
	mov.u32 	%r1, cs;
	st.shared.u32 	[%r1], 0;
	st.shared.u32 	[%r1+4], 0;
	cp.async.ca.shared.global 	[%r1], [%rd1], 4;
	cp.async.commit_group;
	add.s32 	%r2, %r1, 4;
	cp.async.ca.shared.global 	[%r2], [%rd1+4], 4;
	cp.async.commit_group;
	ld.shared.u32 	%r3, [%r1];
	cp.async.wait_group 	1;
	ld.shared.u32 	%r4, [%r1];
	ld.shared.u32 	%r5, [%r1+4];
	cp.async.wait_group 	0;
	ld.shared.u32 	%r6, [%r1+4];
	st.global.v4.u32 	[%rd1+16], {%r3, %r4, %r5, %r6};
	ret;
}
`

func TestCpAsyncCompletesAtWait(t *testing.T) {
	d := NewDevice()
	m := loadPTX(t, d, cpWaitPTX)
	p, b := devBuf(t, d, 32)
	putU32s(b, []uint32{0x11111111, 0x22222222})
	mustLaunch(t, d, m, "cpwait", Dim{1, 1, 1}, Dim{1, 1, 1}, 0, params(p))
	got := u32s(b[16:])
	if want := []uint32{0, 0x11111111, 0, 0x22222222}; got[0] != want[0] || got[1] != want[1] || got[2] != want[2] || got[3] != want[3] {
		t.Errorf("before any wait, after wait_group 1 (both words), after wait_group 0 = %#x, want %#x", got, want)
	}
}
