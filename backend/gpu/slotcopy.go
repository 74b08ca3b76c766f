package gpu

import (
	"fmt"

	"github.com/megamoe/megamoe/backend"
	"github.com/megamoe/megamoe/cuda"
)

// slotBuffers lists the store's slot-major buffers ([MaxSlots][per-slot
// bytes]): everything a state slot holds, in whatever format it is kept. A
// new per-slot buffer must be listed here (opcheck's copy slot case).
func (k *kvStore) slotBuffers() []*cuda.Buffer {
	var bufs []*cuda.Buffer
	for i := range k.layers {
		kl := &k.layers[i]
		bufs = append(bufs, kl.win)
		for _, c := range []compBufs{kl.comp, kl.idx} {
			if c.a != nil {
				bufs = append(bufs, c.a, c.z)
			}
		}
	}
	return bufs
}

// CopySlot implements backend.Backend: a device-to-device copy of each
// per-slot buffer's share, ordered on the stream with the steps around it.
func (b *Backend) CopySlot(s backend.KVStore, src, dst int) error {
	if err := backend.CheckCopySlot(s, src, dst); err != nil {
		return err
	}
	k, err := b.store(s)
	if err != nil {
		return err
	}
	if !k.ready[src] {
		return fmt.Errorf("copy slot %d to %d: slot %d not initialised", src, dst, src)
	}
	if src == dst {
		return nil
	}
	n := k.spec.MaxSlots
	for _, buf := range k.slotBuffers() {
		if buf.Size%n != 0 {
			return fmt.Errorf("copy slot %d to %d: buffer of %d bytes is not %d slots", src, dst, buf.Size, n)
		}
		per := buf.Size / n
		if err := b.s.CopyDtoD(buf.Ptr.Add(dst*per), buf.Ptr.Add(src*per), per); err != nil {
			return fmt.Errorf("copy slot %d to %d: %w", src, dst, err)
		}
	}
	k.ready[dst] = true
	return nil
}
