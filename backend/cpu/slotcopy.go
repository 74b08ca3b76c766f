package cpu

import (
	"fmt"

	"github.com/megamoe/megamoe/backend"
)

// copyFrom copies every buffer of a layer's state; a new field of layerState
// must be copied here too (TestCopySlot compares whole slots).
func (l *layerState) copyFrom(src *layerState) {
	copy(l.win, src.win)
	copy(l.winC, src.winC)
	copy(l.comp.A, src.comp.A)
	copy(l.comp.Z, src.comp.Z)
	copy(l.idx.A, src.idx.A)
	copy(l.idx.Z, src.idx.Z)
}

// CopySlot implements backend.Backend.
func (b *Backend) CopySlot(s backend.KVStore, src, dst int) error {
	if err := backend.CheckCopySlot(s, src, dst); err != nil {
		return err
	}
	k, err := store(s)
	if err != nil {
		return err
	}
	if src == dst {
		return nil
	}
	k.mu.Lock()
	fresh := k.slots[dst] == nil
	k.mu.Unlock()
	if fresh { // allocate dst's buffers
		if err := b.ResetSlot(s, dst); err != nil {
			return err
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	from := k.slots[src]
	if from == nil {
		return fmt.Errorf("copy slot %d to %d: slot %d not initialised", src, dst, src)
	}
	to := k.slots[dst]
	for i := range to.layers {
		to.layers[i].copyFrom(&from.layers[i])
	}
	return nil
}
