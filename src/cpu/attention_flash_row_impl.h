/* Body of attention_flash_row.c for one compute type (attention_instantiate.h).
 *
 * The seeds' one-pass recurrence for one query row, over its allowed keys:
 *   m' = max(m, s_j)
 *   d  = d·e^(m - m') + e^(s_j - m')
 *   o  = o·e^(m - m') + e^(s_j - m')·v_j
 * and finally o / d.  Dot products go through a small buffer only so that
 * the shared score routine sees row segments. */

#define FA_ROW_CHUNK 64

static void FA_R(flash_row)(const fa_attn_problem *p, int64_t b, int64_t h, int64_t i) {
  const int64_t D = p->D, Dv = p->Dv, hk = fa_attn_kv_head(p, h), ldk = p->k_st.s, ldv = p->v_st.s;
  const REAL *q = (const REAL *)p->q + fa_attn_row_at(p->q_st, b, h, i);
  const REAL *k = (const REAL *)p->k + fa_attn_row_at(p->k_st, b, hk, 0);
  const REAL *v = (const REAL *)p->v + fa_attn_row_at(p->v_st, b, hk, 0);
  REAL *o = (REAL *)p->o + fa_attn_row_at(p->o_st, b, h, i);
  REAL s[FA_ROW_CHUNK];
  REAL m = -(REAL)INFINITY, d = 0;
  int64_t lo, hi;
  fa_attn_key_range(p, b, i, &lo, &hi);
  memset(o, 0, (size_t)Dv * sizeof *o);
  for (int64_t j0 = lo; j0 < hi; j0 += FA_ROW_CHUNK) {
    const int64_t n = hi - j0 < FA_ROW_CHUNK ? hi - j0 : FA_ROW_CHUNK;
    for (int64_t c = 0; c < n; c++) {
      const REAL *kj = k + (j0 + c) * ldk;
      REAL dot = 0;
      for (int64_t e = 0; e < D; e++) dot += q[e] * kj[e];
      s[c] = dot;
    }
    FA_R(fa_attn_scores)(p, b, h, i, j0, n, lo, hi, s);
    for (int64_t c = 0; c < n; c++) {
      const REAL sj = s[c];
      if (sj == -(REAL)INFINITY) continue; /* masked: weight 0, and e^(-inf - -inf) is NaN */
      REAL m_new = sj > m ? sj : m;
      if (sj != sj) m_new = sj; /* a NaN score makes the row NaN */
      const REAL corr = FA_EXP(m - m_new), pj = FA_EXP(sj - m_new);
      const REAL *vj = v + (j0 + c) * ldv;
      d = d * corr + pj;
      for (int64_t e = 0; e < Dv; e++) o[e] = o[e] * corr + pj * vj[e];
      m = m_new;
    }
  }
  FA_R(fa_attn_finish)(o, Dv, 1, Dv, &m, &d, fa_lse_rows_at(p, fa_attn_row_at(p->lse_st, b, h, i)), 1);
}

static fa_status FA_R(flash_row_all)(const fa_attn_problem *p) {
  const int64_t rows = p->B * p->Hq * p->Lq;
#pragma omp parallel for schedule(dynamic, 16) num_threads(fa_cpu_threads_for(rows, fa_attn_flops(p)))
  for (int64_t r = 0; r < rows; r++) FA_R(flash_row)(p, r / (p->Hq * p->Lq), r / p->Lq % p->Hq, r % p->Lq);
  return FA_OK;
}

#undef FA_ROW_CHUNK
