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
// are zeroed by an eager memset on the stream, before it starts or joins a
// capture (zeroFixup); were they not, the memset would be a graph node
// (each replay zeroes them first), and the next eager use zeroes them again.
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

// zeroFixup allocates and zeroes the stream's counters by an eager memset,
// unless they are known zero, before the stream starts or joins a capture: a
// memset node in the graph would stand between two kernels and cut their
// programmatic dependent launch (the split-K launch after it could not start
// early). The kernels leave the counters zero, so every replay finds them so.
func (s *Stream) zeroFixup() error {
	if s.capturing || s.fix != nil && s.fixZero {
		return nil
	}
	_, err := s.fixupCounters()
	return err
}
