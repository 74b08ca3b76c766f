package num

import (
	"fmt"
	"math"
)

// Hadamard applies x <- (x · H_n) · n^(-1/2) in place, with H_n the Sylvester
// Walsh-Hadamard matrix in natural order (H_1 = [1], H_2k = [[H_k, H_k], [H_k, -H_k]])
// and n = len(x) a power of two. Like fast_hadamard_transform it runs the butterfly
// stages with increasing stride in float32 (lo+hi, lo-hi) and multiplies by
// float32(n^-1/2) at the end; the caller rounds to bf16 if the reference does.
func Hadamard(x []float32) {
	n := len(x)
	if n == 0 {
		return
	}
	if n&(n-1) != 0 {
		panic(fmt.Sprintf("num: Hadamard length %d is not a power of two", n))
	}
	for h := 1; h < n; h *= 2 {
		for i := 0; i < n; i += 2 * h {
			lo, hi := x[i:i+h], x[i+h:i+2*h]
			for j := range lo {
				a, b := lo[j], hi[j]
				lo[j], hi[j] = a+b, a-b
			}
		}
	}
	s := float32(math.Pow(float64(n), -0.5))
	for i := range x {
		x[i] *= s
	}
}
