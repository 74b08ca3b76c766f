package train_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// python returns an interpreter that has PyTorch and numpy ($MEGAMOE_PYTHON,
// python3, /usr/bin/python3), or skips: CI installs Debian's python3-torch.
func python(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("MEGAMOE_PYTHON"), "python3", "/usr/bin/python3"} {
		if p == "" {
			continue
		}
		if exec.CommandContext(t.Context(), p, "-c", "import torch, numpy").Run() == nil {
			return p
		}
	}
	t.Skip("no python3 with torch and numpy (Debian: apt-get install python3-torch)")
	return ""
}

// TestTrainerParity: the trainer's PyTorch model (train/model.py) and the
// engine in exact numerics compute the same logits on the embedded model,
// whole prefill and chunked, with decode steps (train/parity.py exits 1 over
// a max relative error of 1e-4).
func TestTrainerParity(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the engine and PyTorch on 300 tokens")
	}
	py := python(t)
	model, err := filepath.Abs("../models/small")
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--tokens", "300", "--steps", "4"},
		{"--tokens", "300", "--steps", "2", "--chunk", "70", "--seed", "2"},
	} {
		cmd := exec.CommandContext(t.Context(), py, append([]string{"parity.py", "--model", model}, args...)...)
		out, err := cmd.CombinedOutput()
		t.Logf("%v:\n%s", args, out)
		if err != nil {
			t.Errorf("parity %v: %v", args, err)
		}
	}
}
