package ptxemu

import (
	"fmt"
	"math"
)

// Bulk stores from shared to global memory (PTX ISA "cp.async.bulk",
// "cp.async.bulk.commit_group", "cp.async.bulk.wait_group"): the 1-D
// cp.async.bulk.global.shared::cta.bulk_group and the tensor store
// cp.async.bulk.tensor.Nd.global.shared::cta.bulk_group join the issuing
// thread's bulk async-groups. A store reads its shared source at issue (a
// copy kept with it) and writes global memory at the latest point the ISA
// allows: the wait_group (without .read) that completes its group, or the
// thread's exit. Until the group's reads complete (a wait_group or
// wait_group.read that covers it) the source must not change: the wait
// compares it with the copy and fails the launch if it did, as the wgmma
// operand checks do.

// bulkThread is one thread's bulk-store state.
type bulkThread struct {
	issued []*bulkOp   // since the last commit_group
	groups [][]*bulkOp // committed, oldest first
}

// bulkOp is one issued store: the image of its shared source (unswizzled)
// and the global ranges it writes from that image.
type bulkOp struct {
	text string // the instruction, for errors
	src  uint64 // shared address
	span uint64 // swizzle span of the source (0: none)
	img  []byte
	read bool // its reads are complete: the source may change
	segs []bulkSeg
}

// bulkSeg is one contiguous global range and its offset in the image.
type bulkSeg struct {
	dst []byte // aliases global memory
	off int
}

// sharedImage reads n bytes of shared memory at src through the swizzle.
func (t *thread) sharedImage(src uint64, n int, span uint64) []byte {
	if span == 0 {
		return append([]byte(nil), t.mem(spShared, src, n)...)
	}
	img := make([]byte, n)
	for i := range img {
		img[i] = t.mem(spShared, swizzle(src+uint64(i), span), 1)[0]
	}
	return img
}

// bulkIssue queues op in the thread's current (uncommitted) group.
func (t *thread) bulkIssue(op *bulkOp) { t.bk.issued = append(t.bk.issued, op) }

// bulkCheck fails the launch if op's source changed since its issue.
func (t *thread) bulkCheck(op *bulkOp) {
	if op.read {
		return
	}
	now := t.sharedImage(op.src, len(op.img), op.span)
	for i := range now {
		if now[i] != op.img[i] {
			t.panicf("bulk store %q: its shared source byte %d (at %#x) changed before the cp.async.bulk.wait_group{.read} that completes its group",
				op.text, i, swizzle(op.src+uint64(i), op.span))
		}
	}
	op.read = true
}

func (op *bulkOp) write() {
	for _, s := range op.segs {
		copy(s.dst, op.img[s.off:])
	}
}

// bulkWait completes the thread's committed groups until at most keep
// remain: their reads (readOnly), or their reads and writes.
func (t *thread) bulkWait(keep int, readOnly bool) {
	bk := &t.bk
	n := len(bk.groups) - keep
	if n <= 0 {
		return
	}
	for _, g := range bk.groups[:n] {
		for _, op := range g {
			t.bulkCheck(op)
			if !readOnly {
				op.write()
			}
		}
	}
	if !readOnly {
		bk.groups = bk.groups[n:]
	}
}

// bulkExit completes every store of an exiting thread, committed or not:
// the GPU finishes them before the kernel completes.
func (t *thread) bulkExit() {
	bk := &t.bk
	for _, g := range append(bk.groups, bk.issued) {
		for _, op := range g {
			t.bulkCheck(op)
			op.write()
		}
	}
	*bk = bulkThread{}
}

// decBulkGroup decodes cp.async.bulk.commit_group and
// cp.async.bulk.wait_group{.read} N.
func (f *Function) decBulkGroup(in *inst, rest string) error {
	if in.has("commit_group") {
		in.exec = func(t *thread, _ *inst) { // an empty group counts too
			t.bk.groups = append(t.bk.groups, t.bk.issued)
			t.bk.issued = nil
		}
		return nil
	}
	o, err := f.operand(rest)
	if err != nil || o.kind != oImm || o.imm > math.MaxInt32 {
		return fmt.Errorf("%s: takes an integer constant", in.text)
	}
	keep, readOnly := int(o.imm), in.has("read")
	in.exec = func(t *thread, _ *inst) { t.bulkWait(keep, readOnly) }
	return nil
}

// bulkAlign checks the PTX ISA's rules for a 1-D bulk copy: both addresses
// 16-byte aligned, the size a multiple of 16.
func (t *thread) bulkAlign(in *inst, dst, src uint64, n int) {
	switch {
	case n%16 != 0:
		t.illegal(fmt.Errorf("%s: size %d bytes is not a multiple of 16", in.text, n))
	case src%16 != 0:
		t.illegal(fmt.Errorf("%s: source address %#x is not 16-byte aligned", in.text, src))
	case dst%16 != 0:
		t.illegal(fmt.Errorf("%s: destination address %#x is not 16-byte aligned", in.text, dst))
	}
}

// bulkStore is cp.async.bulk.global.shared::cta.bulk_group [dst], [src], size.
func (t *thread) bulkStore(in *inst) {
	dst, src := t.addr(&in.args[0]), t.addr(&in.args[1])
	n := int(uint32(t.get(&in.args[2])))
	t.bulkAlign(in, dst, src, n)
	t.bulkIssue(&bulkOp{text: in.text, src: src, img: t.sharedImage(src, n, 0),
		segs: []bulkSeg{{dst: t.mem(spGlobal, dst, n)}}})
}
