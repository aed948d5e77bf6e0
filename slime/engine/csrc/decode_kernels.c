/* fp32 kernels for the native decode step (slime/engine/native_forward.py).
 *
 * Plain C with OpenMP, compiled at first use by slime/engine/kernels.py and called through
 * ctypes with tensor data pointers. Linked against libgomp.so.1, the soname torch's own OpenMP
 * runtime has, so these kernels share torch's thread pool and its torch.set_num_threads.
 *
 * Each kernel does in one pass what the torch version (the reference in
 * tests/engine/test_decode_kernels.py) does in several, and the attention kernel reads every
 * row's keys and values only up to that row's own length.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Parallelise only when there is enough work: a thread team costs a few microseconds. */
#define PAR_MIN 32768

/* e^x for float, vectorisable (libm's expf is a scalar call in these loops and made SiLU and the
 * softmax the slowest parts of a decode step). Range reduction x = n ln2 + r with ln2 split in
 * two (Cody-Waite), a degree-6 polynomial for e^r (Cephes' expf coefficients), and 2^n built in
 * the exponent bits. Relative error about 2e-7 on [-87, 88]; inputs outside are clamped, so
 * e^x never overflows to inf (the results here are softmax terms and SiLU gates, for which
 * that is harmless: e^-87 = 1.6e-38). */
static inline float exp_f32(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float n = floorf(x * 1.44269504088896341f + 0.5f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

/* x[r] += delta[r] (when delta is not NULL), then out[r] = w * (x[r] * rsqrt(mean(x[r]^2) + eps)),
 * for rows r of n floats: the residual add and the RMSNorm after it, as HF's Llama/Qwen2 do them. */
void add_rms_norm_f32(float *x, const float *delta, const float *w, float *out, int64_t rows, int64_t n,
                      float eps) {
#pragma omp parallel for if (rows * n >= PAR_MIN) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    float *xr = x + r * n;
    float *orow = out + r * n;
    float acc = 0.f;
    if (delta) {
      const float *dr = delta + r * n;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < n; i++) {
        float v = xr[i] + dr[i];
        xr[i] = v;
        acc += v * v;
      }
    } else {
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < n; i++) acc += xr[i] * xr[i];
    }
    float scale = 1.0f / sqrtf(acc / (float)n + eps);
#pragma omp simd
    for (int64_t i = 0; i < n; i++) orow[i] = w[i] * (xr[i] * scale);
  }
}

/* gate = silu(gate) * up, elementwise over n floats, in place. */
void silu_mul_f32(float *gate, const float *up, int64_t n) {
  const int64_t chunk = 4096;
#pragma omp parallel for if (n >= PAR_MIN) schedule(static)
  for (int64_t c = 0; c < n; c += chunk) {
    const int64_t end = c + chunk < n ? c + chunk : n;
#pragma omp simd
    for (int64_t i = c; i < end; i++) {
      const float g = gate[i];
      gate[i] = (g / (1.0f + exp_f32(-g))) * up[i];
    }
  }
}

/* Rotary embedding (HF's rotate_half convention) of one head vector x[d] at table rows c, s. */
static inline void rotate(const float *x, float *out, const float *c, const float *s, int64_t d) {
  const int64_t half = d / 2;
#pragma omp simd
  for (int64_t i = 0; i < half; i++) {
    const float a = x[i], b = x[i + half];
    out[i] = a * c[i] - b * s[i];
    out[i + half] = b * c[i + half] + a * s[i + half];
  }
}

/* Key layout: [slots, hk, cap / 16, d, 16]: blocks of 16 positions, each block transposed
 * (feature-major), so 16 consecutive positions of one feature are one 64-byte vector. */
#define KEY_AT(keys, slot_head, p, i, d, cap) ((keys) + (slot_head) * (d) * (cap) + ((p) / 16) * (d) * 16 + (i) * 16 + (p) % 16)

/* The decode step's RoPE and KV write in one pass: row r (slot r) is at position pos[r]; its
 * q [rows, hq, d] heads are rotated in place, its k [rows, hk, d] heads rotated and stored at
 * position pos[r] of keys (blocked layout above), its v [rows, hk, d] stored at values
 * [slots, hk, cap, d]. cos/sin tables [positions, d]. */
void rope_store_f32(float *q, const float *k, const float *v, const float *cos_t, const float *sin_t,
                    const int64_t *pos, float *keys, float *values, int64_t rows, int64_t hq, int64_t hk, int64_t d,
                    int64_t cap) {
#pragma omp parallel for if (rows * (hq + 2 * hk) * d >= PAR_MIN) schedule(static)
  for (int64_t r = 0; r < rows; r++) {
    const int64_t p = pos[r];
    const float *c = cos_t + p * d;
    const float *s = sin_t + p * d;
    float tmp[512];
    for (int64_t h = 0; h < hq; h++) {
      float *x = q + (r * hq + h) * d;
      rotate(x, tmp, c, s, d);
      for (int64_t i = 0; i < d; i++) x[i] = tmp[i];
    }
    for (int64_t h = 0; h < hk; h++) {
      rotate(k + (r * hk + h) * d, tmp, c, s, d);
      float *kt = KEY_AT(keys, r * hk + h, p, 0, d, cap);
      for (int64_t i = 0; i < d; i++) kt[i * 16] = tmp[i];
      const float *vs = v + (r * hk + h) * d;
      float *vt = values + ((r * hk + h) * cap + p) * d;
      for (int64_t i = 0; i < d; i++) vt[i] = vs[i];
    }
  }
}

/* One decode step of attention, grouped-query: row b (slot b of the pools) has lens[b] + 1
 * visible positions (its new token's keys/values are already written at lens[b]).
 * q [rows, hk * g, d]; keys in the blocked layout above (a query's scores over a block of 16
 * positions are 16-wide FMAs with no horizontal sums); values [slots, hk, cap, d]; out [rows,
 * hk * g, d]; cap a multiple of 16. The g query heads of one KV head read its keys and values
 * once. Softmax in fp32 with the max subtracted. Positions past lens[b] are never read into a
 * result (whole 16-position blocks are loaded, the tail lanes ignored). */
#if defined(__AVX512F__)
#include <immintrin.h>

static inline __m512 exp512(__m512 x) { /* exp_f32, 16 lanes */
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

/* up to 4 query heads of one KV head: scores [4][lp], then softmax, then the weighted sum */
static void attend_group_avx512(const float *qb, int gn, const float *kb, const float *vb, float *ob, int64_t n,
                                int64_t d, int64_t cap, float scale, float *scores, int64_t lp) {
  float qs[4][256];
  for (int gi = 0; gi < 4; gi++)
    for (int64_t i = 0; i < d; i++) qs[gi][i] = gi < gn ? qb[gi * d + i] * scale : 0.f;
  for (int64_t j0 = 0; j0 < n; j0 += 32) { /* two 16-position blocks: 8 independent FMA chains */
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, c0 = a0, c1 = a0, c2 = a0, c3 = a0;
    const int two = j0 + 16 < n;
    for (int64_t i = 0; i < d; i++) {
      const float *kr = kb + (j0 / 16) * d * 16 + i * 16;
      const __m512 k0 = _mm512_loadu_ps(kr);
      a0 = _mm512_fmadd_ps(_mm512_set1_ps(qs[0][i]), k0, a0);
      a1 = _mm512_fmadd_ps(_mm512_set1_ps(qs[1][i]), k0, a1);
      a2 = _mm512_fmadd_ps(_mm512_set1_ps(qs[2][i]), k0, a2);
      a3 = _mm512_fmadd_ps(_mm512_set1_ps(qs[3][i]), k0, a3);
      if (two) {
        const __m512 k1 = _mm512_loadu_ps(kr + d * 16);
        c0 = _mm512_fmadd_ps(_mm512_set1_ps(qs[0][i]), k1, c0);
        c1 = _mm512_fmadd_ps(_mm512_set1_ps(qs[1][i]), k1, c1);
        c2 = _mm512_fmadd_ps(_mm512_set1_ps(qs[2][i]), k1, c2);
        c3 = _mm512_fmadd_ps(_mm512_set1_ps(qs[3][i]), k1, c3);
      }
    }
    _mm512_store_ps(scores + 0 * lp + j0, a0);
    _mm512_store_ps(scores + 1 * lp + j0, a1);
    _mm512_store_ps(scores + 2 * lp + j0, a2);
    _mm512_store_ps(scores + 3 * lp + j0, a3);
    _mm512_store_ps(scores + 0 * lp + j0 + 16, c0);
    _mm512_store_ps(scores + 1 * lp + j0 + 16, c1);
    _mm512_store_ps(scores + 2 * lp + j0 + 16, c2);
    _mm512_store_ps(scores + 3 * lp + j0 + 16, c3);
  }
  float inv[4];
  for (int gi = 0; gi < gn; gi++) {
    float *sg = scores + gi * lp;
    float m = sg[0];
    for (int64_t j = 1; j < n; j++) m = sg[j] > m ? sg[j] : m;
    const __m512 mv = _mm512_set1_ps(m);
    __m512 total = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 mk = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1);
      const __m512 e = _mm512_maskz_mov_ps(mk, exp512(_mm512_sub_ps(_mm512_maskz_load_ps(mk, sg + j), mv)));
      _mm512_store_ps(sg + j, e);
      total = _mm512_add_ps(total, e);
    }
    inv[gi] = 1.0f / _mm512_reduce_add_ps(total);
  }
  for (int gi = gn; gi < 4; gi++) { /* unused heads of the block: zero weights */
    for (int64_t j = 0; j < n; j++) scores[gi * lp + j] = 0.f;
    inv[gi] = 0.f;
  }
  for (int64_t i0 = 0; i0 < d; i0 += 64) {
    const int nc = d - i0 >= 64 ? 4 : (int)((d - i0) / 16);
    __m512 o[4][4];
    for (int gi = 0; gi < 4; gi++)
      for (int c = 0; c < 4; c++) o[gi][c] = _mm512_setzero_ps();
    if (nc == 4) {
      for (int64_t j = 0; j < n; j++) {
        const float *vj = vb + j * d + i0;
        const __m512 v0 = _mm512_loadu_ps(vj), v1 = _mm512_loadu_ps(vj + 16);
        const __m512 v2 = _mm512_loadu_ps(vj + 32), v3 = _mm512_loadu_ps(vj + 48);
        for (int gi = 0; gi < 4; gi++) {
          const __m512 p = _mm512_set1_ps(scores[gi * lp + j]);
          o[gi][0] = _mm512_fmadd_ps(p, v0, o[gi][0]);
          o[gi][1] = _mm512_fmadd_ps(p, v1, o[gi][1]);
          o[gi][2] = _mm512_fmadd_ps(p, v2, o[gi][2]);
          o[gi][3] = _mm512_fmadd_ps(p, v3, o[gi][3]);
        }
      }
    } else {
      for (int64_t j = 0; j < n; j++) {
        const float *vj = vb + j * d + i0;
        for (int c = 0; c < nc; c++) {
          const __m512 v = _mm512_loadu_ps(vj + 16 * c);
          for (int gi = 0; gi < 4; gi++) o[gi][c] = _mm512_fmadd_ps(_mm512_set1_ps(scores[gi * lp + j]), v, o[gi][c]);
        }
      }
    }
    for (int gi = 0; gi < gn; gi++) {
      const __m512 s = _mm512_set1_ps(inv[gi]);
      for (int c = 0; c < nc; c++) _mm512_storeu_ps(ob + gi * d + i0 + 16 * c, _mm512_mul_ps(o[gi][c], s));
    }
  }
}
#endif

/* one query head, portable C */
static void attend_one(const float *qg, const float *kb, const float *vb, float *og, int64_t n, int64_t d,
                       int64_t cap, float scale, float *sg) {
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    float acc[16] = {0.f};
    for (int64_t i = 0; i < d; i++) {
      const float qv = qg[i] * scale;
      const float *kr = kb + (j0 / 16) * d * 16 + i * 16;
#pragma omp simd
      for (int jj = 0; jj < 16; jj++) acc[jj] += qv * kr[jj];
    }
    for (int jj = 0; jj < 16 && j0 + jj < n; jj++) sg[j0 + jj] = acc[jj];
  }
  float m = sg[0];
  for (int64_t j = 1; j < n; j++) m = sg[j] > m ? sg[j] : m;
  float total = 0.f;
#pragma omp simd reduction(+ : total)
  for (int64_t j = 0; j < n; j++) {
    sg[j] = exp_f32(sg[j] - m);
    total += sg[j];
  }
  const float inv = 1.0f / total;
#pragma omp simd
  for (int64_t i = 0; i < d; i++) og[i] = 0.f;
  for (int64_t j = 0; j < n; j++) {
    const float p = sg[j] * inv;
    const float *vj = vb + j * d;
#pragma omp simd
    for (int64_t i = 0; i < d; i++) og[i] += p * vj[i];
  }
}

void decode_attention_f32(const float *q, const float *keys, const float *values, float *out, const int64_t *lens,
                          int64_t rows, int64_t hk, int64_t g, int64_t d, int64_t cap, float scale) {
  int64_t longest = 0;
  for (int64_t b = 0; b < rows; b++)
    if (lens[b] + 1 > longest) longest = lens[b] + 1;
  const int64_t lp = (longest + 31) / 32 * 32;
#pragma omp parallel if (rows * hk * longest * d >= PAR_MIN)
  {
    float *scores = (float *)aligned_alloc(64, sizeof(float) * (size_t)(4 * lp));
#pragma omp for schedule(dynamic, 4)
    for (int64_t t = 0; t < rows * hk; t++) {
      const int64_t b = t / hk, h = t % hk, n = lens[b] + 1;
      const float *kb = keys + (b * hk + h) * d * cap;
      const float *vb = values + (b * hk + h) * cap * d;
      const float *qb = q + (b * hk + h) * g * d;
      float *ob = out + (b * hk + h) * g * d;
#if defined(__AVX512F__)
      if (d % 16 == 0 && d <= 256) {
        for (int64_t g0 = 0; g0 < g; g0 += 4)
          attend_group_avx512(qb + g0 * d, (int)(g - g0 < 4 ? g - g0 : 4), kb, vb, ob + g0 * d, n, d, cap, scale,
                              scores, lp);
        continue;
      }
#endif
      for (int64_t gi = 0; gi < g; gi++) attend_one(qb + gi * d, kb, vb, ob + gi * d, n, d, cap, scale, scores);
    }
    free(scores);
  }
}
