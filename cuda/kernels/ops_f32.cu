// Element-wise and per-row ops of the GPU backend on fp32 activations
// (backend/gpu). `rnd` = 1 rounds results to bf16 like the faithful CPU
// reference (backend/cpu); 0 keeps fp32 (exact mode).
#include "rowops.cuh"
#include "hc_post.cuh"

// One block per segment of d values: y = w * (x * rsqrt(mean(x^2) + eps))
// (rowops.cuh).
extern "C" __global__ void __launch_bounds__(256) rmsnorm_f32(
	float* __restrict__ y, const float* __restrict__ x, const float* __restrict__ w, int d, float eps, int rnd)
{
	PDL_ENTRY();
	__shared__ float red[32];
	rmsnorm_seg(y, x, w, blockIdx.x, d, eps, rnd, red);
}

// rmsnorm_f32 of rows of d values that also writes the FP8 input of the
// linear that takes them (quant_fp8_f32's codes q [rows, d] and e8m0 scales
// qs [rows, d/128], bit for bit), saving that linear's quantisation launch.
// d % 128 == 0, x, y and w 16-byte aligned (the float4 path).
extern "C" __global__ void __launch_bounds__(256) rmsnorm_quant_f32(
	float* __restrict__ y, u8* __restrict__ q, u8* __restrict__ qs, const float* __restrict__ x,
	const float* __restrict__ w, int d, float eps, int rnd)
{
	PDL_ENTRY();
	__shared__ float red[32];
	const size_t row = blockIdx.x;
	float4* y4 = reinterpret_cast<float4*>(y + row * d);
	const float4* x4 = reinterpret_cast<const float4*>(x + row * d);
	u8* qr = q + row * d;
	u8* qsr = qs + row * (d >> 7);
	// A warp's 32 float4s of one step are one 128-value block (d % 128 == 0).
	auto put = [&](int i, float4 o) {
		y4[i] = o;
		const float v[4] = {o.x, o.y, o.z, o.w};
		quant128(v, threadIdx.x & 31, qr + (i >> 5) * 128, qsr + (i >> 5));
	};
	rms_row4_put<0>(put, [&](int i) { return x4[i]; }, reinterpret_cast<const float4*>(w), d >> 2, d, eps, rnd, red,
		threadIdx.x, blockDim.x);
}

// Embedding gather: out[r, s*d + i] = table[ids[r], i] for every stream s.
extern "C" __global__ void embed_f32(
	float* __restrict__ out, const void* __restrict__ table, int bf16, const int* __restrict__ ids, int d, int streams)
{
	PDL_ENTRY();
	const int r = blockIdx.x;
	const size_t id = (size_t)ids[r];
	for (int i = threadIdx.x; i < d; i += blockDim.x) {
		float v = bf16 ? bf16_to_f32(((const u16*)table)[id * d + i]) : ((const float*)table)[id * d + i];
		for (int s = 0; s < streams; s++) out[((size_t)r * streams + s) * d + i] = v;
	}
}

// x[r, j] = rnd(x[r, j] + e[r, j % d]) over n = rows*cols elements.
extern "C" __global__ void add_streams_f32(float* __restrict__ x, const float* __restrict__ e, int cols, int d, long long n, int rnd)
{
	PDL_ENTRY();
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
		long long r = i / cols;
		int j = (int)(i - r * cols);
		x[i] = rbf(x[i] + e[r * d + j % d], rnd);
	}
}

extern "C" __global__ void scale_f32(float* __restrict__ x, float s, long long n, int rnd)
{
	PDL_ENTRY();
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
		x[i] = rbf(x[i] * s, rnd);
}

extern "C" __global__ void add_f32(float* __restrict__ out, const float* __restrict__ a, const float* __restrict__ b, long long n, int rnd)
{
	PDL_ENTRY();
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
		out[i] = rbf(a[i] + b[i], rnd);
}

// Clamped SwiGLU (spec §6.2) exactly as the CPU: w * (g * sigmoid(g) * u).
// limit <= 0 disables the clamp.
DEV float swiglu1(float gv, float uv, float limit, int rnd)
{
	if (limit > 0.0f) {
		uv = fminf(fmaxf(uv, -limit), limit);
		gv = fminf(gv, limit);
	}
	float sig = (float)(1.0 / (1.0 + exp(-(double)gv)));
	return rbf(gv * sig * uv, rnd);
}

extern "C" __global__ void swiglu_f32(float* __restrict__ out, const float* __restrict__ g, const float* __restrict__ u, long long n, float limit, int rnd)
{
	PDL_ENTRY();
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
		out[i] = swiglu1(g[i], u[i], limit, rnd);
}

// swiglu_f32 on [rows, inter] that also writes the FP8 input of the linear
// that takes h (quant_fp8_f32's codes q [rows, inter] and e8m0 scales qs
// [rows, inter/128], bit for bit): one warp per (row, 128-value block), four
// values a lane. inter % 128 == 0, pointers 16-byte aligned.
extern "C" __global__ void __launch_bounds__(256) swiglu_quant_f32(
	float* __restrict__ h, u8* __restrict__ q, u8* __restrict__ qs, const float* __restrict__ g,
	const float* __restrict__ u, int rows, int inter, float limit, int rnd)
{
	PDL_ENTRY();
	const long long blk = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
	if (blk >= (long long)rows * (inter >> 7)) return;
	const int lane = threadIdx.x & 31;
	const size_t o = (size_t)blk * 128 + 4 * lane; // rows are contiguous
	const float4 a = *reinterpret_cast<const float4*>(g + o), c = *reinterpret_cast<const float4*>(u + o);
	const float v[4] = {swiglu1(a.x, c.x, limit, rnd), swiglu1(a.y, c.y, limit, rnd), swiglu1(a.z, c.z, limit, rnd),
		swiglu1(a.w, c.w, limit, rnd)};
	*reinterpret_cast<float4*>(h + o) = make_float4(v[0], v[1], v[2], v[3]);
	quant128(v, lane, q + (size_t)blk * 128, qs + blk);
}

// bf16 bits -> fp32 (outputs of the tensor-core linears).
extern "C" __global__ void bf16_to_f32_k(float* __restrict__ out, const u16* __restrict__ in, long long n)
{
	PDL_ENTRY();
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
		out[i] = bf16_to_f32(in[i]);
}

// Per-block FP8 activation quantisation of fp32 x (spec §3.3), one warp per
// block of `blk` values (blk % 32 == 0): scale 2^ceil(log2(max(amax,1e-4)/448)),
// e4m3 round-to-nearest-even. Writes codes q + e8m0 scales (q may be null) and,
// if sim != null, the simulated values q*s as fp32.
extern "C" __global__ void quant_fp8_f32(
	u8* __restrict__ q, u8* __restrict__ scales, float* __restrict__ sim, const float* __restrict__ x,
	int rows, int cols, int width, int blk)
{
	PDL_ENTRY();
	const int lane = threadIdx.x & 31;
	const int nb = (width + blk - 1) / blk;
	const long long gw = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
	if (gw >= (long long)rows * nb) return;
	const int r = (int)(gw / nb), b = (int)(gw % nb);
	const int bl = min(blk, width - b * blk); // the last block may be partial
	fp8_block(q, scales, sim, x, r, b, bl, cols, width, blk, nb, lane);
}

// Interleaved RoPE on the last rd dims of every head (rope_pair): one thread
// per (row, head, pair).
extern "C" __global__ void rope_f32(
	float* __restrict__ x, const int* __restrict__ pos, const float* __restrict__ f32, const double* __restrict__ f64,
	int rows, int heads, int headDim, int rd, int inverse, int faithful)
{
	PDL_ENTRY();
	const int pairs = rd / 2;
	const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
	if (i >= (long long)rows * heads * pairs) return;
	const int p = (int)(i % pairs);
	const int h = (int)((i / pairs) % heads);
	const int r = (int)(i / ((long long)pairs * heads));
	float* v = x + (size_t)r * heads * headDim + (size_t)h * headDim + headDim - rd + 2 * p;
	rope_pair(v, pos[r], f32, f64, p, inverse, faithful);
}

// The attention's kv epilogue in one launch, bit for bit rmsnorm_f32 (one
// segment of d a row), rope_f32 (one head of d) and, if rnd, quant_fp8_f32's
// simulation of the first nope values in place: one block a row. After the
// norm's writes are visible to the block, the quantisation's warps and the
// RoPE's threads (from the last warp down) work at once on disjoint values
// (nope + rd <= d, nope % blk == 0).
extern "C" __global__ void __launch_bounds__(256) rmsnorm_rope_kvq_f32(
	float* __restrict__ y, const float* __restrict__ x, const float* __restrict__ w, const int* __restrict__ pos,
	const float* __restrict__ f32, const double* __restrict__ f64, int d, int rd, int nope, int blk, float eps,
	int inverse, int rnd)
{
	PDL_ENTRY();
	__shared__ float red[32];
	const int r = blockIdx.x;
	rmsnorm_seg(y, x, w, r, d, eps, rnd, red);
	__syncthreads();
	float* ys = y + (size_t)r * d;
	for (int p = blockDim.x - 1 - threadIdx.x; p < rd / 2; p += blockDim.x)
		rope_pair(ys + d - rd + 2 * p, pos[r], f32, f64, p, inverse, rnd);
	if (!rnd) return;
	const int nb = nope / blk;
	for (int b = threadIdx.x >> 5; b < nb; b += blockDim.x >> 5)
		fp8_block(nullptr, nullptr, y, y, r, b, blk, d, nope, blk, nb, threadIdx.x & 31);
}

// The attention's q epilogue in one launch, bit for bit head_norm_f32 and
// rope_f32 on heads of hd values: one warp a head, which rotates its rope
// pairs once the norm's writes are visible to the warp.
extern "C" __global__ void __launch_bounds__(256) head_norm_rope_f32(
	float* __restrict__ x, const int* __restrict__ pos, const float* __restrict__ f32, const double* __restrict__ f64,
	long long segs, int heads, int hd, int rd, float eps, int inverse, int rnd)
{
	PDL_ENTRY();
	__shared__ __align__(16) float ts[8][HN_CHUNK];
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const long long seg = blockIdx.x * 8LL + warp;
	if (seg >= segs) return; // whole warps only: the block never syncs
	float* q = x + seg * hd;
	head_norm_seg(q, hd, eps, rnd, ts[warp], lane);
	__syncwarp();
	const int t = pos[seg / heads];
	for (int p = lane; p < rd / 2; p += 32)
		rope_pair(q + hd - rd + 2 * p, t, f32, f64, p, inverse, rnd);
}

// hc post (spec §4.2): out[k*d+i] = rnd(post[k]*o[i] + sum_j comb[j][k]*x[j*d+i]).
// mix row = post[n] | comb[n*n]. out may alias x (each thread reads its n
// inputs before writing its n outputs).
extern "C" __global__ void hc_post_f32(
	float* out, const float* x, const float* __restrict__ o, const float* __restrict__ mix, int n, int d, int rnd)
{
	PDL_ENTRY();
	const int r = blockIdx.y;
	const int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= d) return;
	const float* m = mix + (size_t)r * (n + n * n);
	float res[8];
	for (int j = 0; j < n; j++) res[j] = x[(size_t)r * n * d + (size_t)j * d + i];
	const float ov = o[(size_t)r * d + i];
	for (int k = 0; k < n; k++) {
		float s = 0.0f;
		for (int j = 0; j < n; j++) s += m[n + j * n + k] * res[j];
		out[(size_t)r * n * d + (size_t)k * d + i] = rbf(m[k] * ov + s, rnd);
	}
}

// hc_post_f32 for n = N, unrolled (hc_post_at: hc_post_f32 keeps res on the
// stack and loads each mix value in the add chain that uses it), the same
// expressions, contracted alike: the same bits.
template <int N>
DEV void hc_post_n(float* out, const float* x, const float* __restrict__ o, const float* __restrict__ mix, int d, int rnd)
{
	const int r = blockIdx.y;
	const int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= d) return;
	const size_t row = (size_t)r * N * d;
	hc_post_at<N>(out + row, x + row, o[(size_t)r * d + i], mix + (size_t)r * (N + N * N), d, i, rnd);
}

#define HC_POST_N(N)                                                                                           \
	extern "C" __global__ void hc_post_f32_n##N(                                                              \
		float* out, const float* x, const float* __restrict__ o, const float* __restrict__ mix, int d, int rnd) \
	{                                                                                                          \
		PDL_ENTRY();                                                                                           \
		hc_post_n<N>(out, x, o, mix, d, rnd);                                                                  \
	}
HC_POST_N(1)
HC_POST_N(2)
HC_POST_N(4)
HC_POST_N(8)

// Row copies of 32-bit words: dst row (dsti ? dsti[i] : i) = src row srci[i]
// for row i = blockIdx.y. One launch gathers the rows of many sequences
// (GatherRows) or copies many state slots (CopySlots) instead of a copy each.
// dst and src may be one buffer (distinct rows).
extern "C" __global__ void copy_rows_u32(unsigned* dst, const unsigned* src,
	const int* __restrict__ dsti, const int* __restrict__ srci, long long words)
{
	PDL_ENTRY();
	const int i = blockIdx.y;
	const size_t d = (size_t)(dsti ? dsti[i] : i) * words, s = (size_t)srci[i] * words;
	for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < words; j += (long long)gridDim.x * blockDim.x)
		dst[d + j] = src[s + j];
}
