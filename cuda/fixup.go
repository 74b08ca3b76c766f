package cuda

import "fmt"

// Split-K tile counters of the in-kernel fixups (splitk_last in
// kernels/common.cuh): moe_fp4_dec's, one int per (column block, tile) of a
// launch, and linear_bf16_dec's, one per row tile; zero between launches
// (the last CTA of a tile resets its counter). A stream's kernels run one after another, so one
// array serves all of them. A graph captured on a stream keeps that stream's
// counters: replay it on that stream (or never while the stream runs
// another user of them).

// fixupSlots bounds the tiles of a split-K launch: planMoE splits K only
// below decCTATarget CTAs, planBF16Dec only up to fixupSlots row tiles.
const fixupSlots = decCTATarget

// fixupCounters returns the stream's counters, allocated on first use. They
// are zeroed by a memset on the stream; inside a capture that memset is a
// graph node (each replay zeroes them first), so the next eager use zeroes
// them again.
func (s *Stream) fixupCounters() (DevicePtr, error) {
	if s.fix == nil {
		b, err := s.ctx.Alloc(4 * fixupSlots)
		if err != nil {
			return 0, fmt.Errorf("cuda: split-K counters: %w", err)
		}
		s.fix, s.fixZero = b, false
	}
	if !s.fixZero {
		if err := s.Memset32(s.fix.Ptr, 0, fixupSlots); err != nil {
			return 0, fmt.Errorf("cuda: split-K counters: %w", err)
		}
		s.fixZero = !s.capturing
	}
	return s.fix.Ptr, nil
}
