package cuda

import "fmt"

// Split-K tile counters of the in-kernel fixups (splitk_last in
// kernels/common.cuh): moe_fp4_dec's, one int per (column block, tile) of a
// launch, and linear_bf16_dec's, one per row tile; zero between launches
// (the last CTA of a tile resets its counter). A stream's kernels run one after another, so one
// array serves all of them. A graph captured on a stream keeps that stream's
// counters: replay it on that stream (or never while the stream runs
// another user of them).

// fixupSlots is the counters of a stream on a device of sms SMs: a tile of
// every split-K launch, planMoE's (below decCTAsPerSM CTAs an SM) and
// planBF16Dec's (up to bf16DecSplitTiles row tiles).
func fixupSlots(sms int) int { return max(bf16DecSplitTiles, decCTAsPerSM*sms) }

func (c *Context) fixupSlots() int { return fixupSlots(c.dev.SMs) }

// fixupCounters returns the stream's counters, allocated on first use. They
// are zeroed by a memset on the stream; inside a capture that memset is a
// graph node (each replay zeroes them first), so the next eager use zeroes
// them again.
func (s *Stream) fixupCounters() (DevicePtr, error) {
	slots := s.ctx.fixupSlots()
	if s.fix == nil {
		b, err := s.ctx.Alloc(4 * slots)
		if err != nil {
			return 0, fmt.Errorf("cuda: split-K counters: %w", err)
		}
		s.fix, s.fixZero = b, false
	}
	if !s.fixZero {
		if err := s.Memset32(s.fix.Ptr, 0, slots); err != nil {
			return 0, fmt.Errorf("cuda: split-K counters: %w", err)
		}
		s.fixZero = !s.capturing
	}
	return s.fix.Ptr, nil
}
