/* Body of attention_flash_row.c for one compute type (attention_instantiate.h).
 *
 * The seeds' one-pass recurrence for one query row, over its allowed keys:
 *   m' = max(m, s_j)
 *   d  = d·e^(m - m') + e^(s_j - m')
 *   o  = o·e^(m - m') + e^(s_j - m')·v_j
 * and finally o / d.  Dot products go through a small buffer only so that
 * the shared score routine sees row segments. */

#define FA_ROW_CHUNK 64

/* stage: NULL when p->storage and p->o_dtype are REAL, else room for the
 * query row, the output row and a chunk's keys and values widened
 * (flash_row_stage), the parts of another dtype staged. */
static void FA_R(flash_row)(const fa_attn_problem *p, int64_t b, int64_t h, int64_t i, REAL *stage) {
  const int64_t D = p->D, Dv = p->Dv, hk = fa_attn_kv_head(p, h);
  const fa_dtype at = p->storage;
  const void *q_at = fa_cpu_elem(p->q, at, fa_attn_row_at(p->q_st, b, h, i));
  const void *k_at = fa_cpu_elem(p->k, at, fa_attn_row_at(p->k_st, b, hk, 0));
  const void *v_at = fa_cpu_elem(p->v, at, fa_attn_row_at(p->v_st, b, hk, 0));
  void *o_at = (void *)fa_cpu_elem(p->o, p->o_dtype, fa_attn_row_at(p->o_st, b, h, i));
  const REAL *q = q_at;
  REAL *o = o_at, *kc = NULL, *vc = NULL;
  int64_t ldk = p->k_st.s, ldv = p->v_st.s;
  const int in = p->storage != p->compute, out = p->o_dtype != p->compute; /* which parts are staged */
  if (in) {
    REAL *qs = stage;
    kc = qs + D + Dv, vc = kc + FA_ROW_CHUNK * D;
    fa_cpu_stage_rows(p->compute, qs, D, at, q_at, D, 1, D);
    q = qs, ldk = D, ldv = Dv;
  }
  if (out) o = stage + D;
  REAL s[FA_ROW_CHUNK];
  REAL m = -(REAL)INFINITY, d = 0;
  int64_t lo, hi;
  fa_attn_key_range(p, b, i, &lo, &hi);
  memset(o, 0, (size_t)Dv * sizeof *o);
  for (int64_t j0 = lo; j0 < hi; j0 += FA_ROW_CHUNK) {
    const int64_t n = hi - j0 < FA_ROW_CHUNK ? hi - j0 : FA_ROW_CHUNK;
    /* the chunk's keys and values, from key j0 (widened when staged) */
    const REAL *k = (const REAL *)fa_cpu_elem(k_at, at, j0 * p->k_st.s);
    const REAL *v = (const REAL *)fa_cpu_elem(v_at, at, j0 * p->v_st.s);
    if (in) {
      fa_cpu_stage_rows(p->compute, kc, D, at, k, p->k_st.s, n, D);
      fa_cpu_stage_rows(p->compute, vc, Dv, at, v, p->v_st.s, n, Dv);
      k = kc, v = vc;
    }
    for (int64_t c = 0; c < n; c++) {
      const REAL *kj = k + c * ldk;
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
      const REAL *vj = v + c * ldv;
      d = d * corr + pj;
      for (int64_t e = 0; e < Dv; e++) o[e] = o[e] * corr + pj * vj[e];
      m = m_new;
    }
  }
  FA_R(fa_attn_finish)(o, Dv, 1, Dv, &m, &d, fa_lse_rows_at(p, fa_attn_row_at(p->lse_st, b, h, i)), 1);
  if (out) fa_cpu_stage_rows(p->o_dtype, o_at, Dv, p->compute, o, Dv, 1, Dv);
}

/* Bytes of flash_row's staging room (0 when p->storage and p->o_dtype are
 * REAL). */
static size_t FA_R(flash_row_stage)(const fa_attn_problem *p) {
  if (p->storage == p->compute && p->o_dtype == p->compute) return 0;
  return (size_t)(p->D + p->Dv) * (1 + FA_ROW_CHUNK) * sizeof(REAL);
}

static fa_status FA_R(flash_row_all)(fa_context *ctx, const fa_attn_problem *p) {
  const int64_t rows = p->B * p->Hq * p->Lq;
  const size_t stage = FA_R(flash_row_stage)(p);
  fa_attn_workspace ws = {0};
  ws.threads = fa_cpu_threads_for(rows, fa_attn_flops(p));
  fa_status st;
  if (stage && (st = fa_attn_workspace_init(ctx, &ws, rows, fa_attn_flops(p), stage))) return st;
#pragma omp parallel for schedule(dynamic, 16) num_threads(ws.threads)
  for (int64_t r = 0; r < rows; r++)
    FA_R(flash_row)(p, r / (p->Hq * p->Lq), r / p->Lq % p->Hq, r % p->Lq,
                    stage ? fa_attn_workspace_slice(&ws, omp_get_thread_num()) : NULL);
  fa_attn_workspace_free(&ws);
  return FA_OK;
}

#undef FA_ROW_CHUNK
