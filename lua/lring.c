/* Sequence shards and ring attention (API §11; docs/ring.md):
 * fa.shard(t, n [, opts]), fa.unshard(shards [, opts]) and
 * fa.ring_attention(qs, ks, vs [, opts]).  Tables of tensors in, tables of
 * tensors out; the core (src/ring.c) checks every value. */
#include <limits.h>

#include "lbinding.h"

static const char *const layouts[] = {"contiguous", "zigzag", NULL}; /* = fa_shard_layout */
static const char *const shard_keys[] = {"dim", "layout", "device", NULL};
static const char *const unshard_keys[] = {"dim", "layout", NULL};
static const char *const ring_keys[] = {"algo",     "scale",   "causal",  "softcap",   "tile",   "return_lse",
                                        "layout",   "window",  "mask",    "kv_lens",   "alibi",  "splits",
                                        "kernel",   "score_mod", "mask_mod", "out", "lse_out", "block_mask", NULL};

/* opts.dim (1-based, negative from the end; default -2: the sequence of
 * (..., L, D)) as the core's dim (0-based, negative from the end). */
static int read_dim(lua_State *L, int idx) {
  int64_t dim = -2;
  if (lua_istable(L, idx)) fal_opt_int(L, idx, "dim", &dim);
  if (dim == 0 || dim < -FA_MAX_DIMS || dim > FA_MAX_DIMS)
    fal_error(L, "opts.dim: expected 1 to %d, or -1 to -%d from the end, got %I", FA_MAX_DIMS, FA_MAX_DIMS,
              (lua_Integer)dim);
  return dim > 0 ? (int)dim - 1 : (int)dim;
}

/* The layout fa.shard cut each shard by (and that fa.ring_attention's
 * outputs keep), in a weak-keyed registry table: a call on shards that
 * does not name opts.layout takes theirs, so that zig-zag shards attended
 * with causal = true are read as zig-zag (API §11) without being told. */
static const char layout_tags_key = 0;

static void tag_layout(lua_State *L, int tbl, int n, int layout) {
  tbl = lua_absindex(L, tbl);
  fal_push_weak_keyed(L, &layout_tags_key);
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, tbl, i);
    lua_pushinteger(L, layout);
    lua_rawset(L, -3);
  }
  lua_pop(L, 1);
}

/* The tag of tbl[1], or -1 (not a shard of fa.shard's, or not a tensor). */
static int tagged_layout(lua_State *L, int tbl) {
  tbl = lua_absindex(L, tbl);
  int layout = -1;
  if (lua_rawgetp(L, LUA_REGISTRYINDEX, &layout_tags_key) == LUA_TTABLE) {
    lua_rawgeti(L, tbl, 1);
    if (lua_rawget(L, -2) == LUA_TNUMBER) layout = (int)lua_tointeger(L, -1);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return layout;
}

/* layout, or the shards' tag at shards_idx where the opts at opts_idx do
 * not name one (raw: no __index runs twice). */
static int layout_or_tag(lua_State *L, int opts_idx, int shards_idx, int layout) {
  if (lua_istable(L, opts_idx)) {
    lua_pushliteral(L, "layout");
    const int named = lua_rawget(L, opts_idx) != LUA_TNIL;
    lua_pop(L, 1);
    if (named) return layout;
  }
  const int tag = tagged_layout(L, shards_idx);
  return tag >= 0 ? tag : layout;
}

static fa_shard_layout read_layout(lua_State *L, int idx) {
  int layout = FA_SHARD_CONTIGUOUS;
  if (lua_istable(L, idx)) fal_opt_enum(L, idx, "layout", layouts, &layout);
  return (fa_shard_layout)layout;
}

/* n as an int (the core checks the range against L). */
static int check_count(lua_State *L, int idx, const char *name) {
  int64_t n = fal_checkint(L, idx, name);
  if (n < 1 || n > INT_MAX / 4)
    fal_argerror(L, idx, name, "expected an integer from 1 to %d, got %I", INT_MAX / 4, (lua_Integer)n);
  return (int)n;
}

/* Pushes a table of n fresh boxes and returns the n slots (a userdata
 * buffer pushed below the table: stack ... slots table). */
static fa_tensor ***push_boxes(lua_State *L, int n) {
  fa_tensor ***slots = (fa_tensor ***)fal_newbuffer(L, n, sizeof *slots, "shards");
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    slots[i] = fal_newbox(L);
    lua_rawseti(L, -2, i + 1);
  }
  return slots;
}

/* The core's results (tmp, n entries) into the boxes: no Lua runs between
 * the core call and this. */
static void fill_boxes(fa_tensor ***slots, fa_tensor **tmp, int n) {
  for (int i = 0; i < n; i++) *slots[i] = tmp[i], tmp[i] = NULL;
}

/* fa.shard(t, n [, opts]): opts.dim, opts.layout, opts.device (only t's own). */
static int l_shard(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  lua_settop(L, 3);
  fal_pins *pins = fal_pins_open(L); /* 4 */
  fa_tensor *t = fal_pin(L, pins, 1, "t");
  const int n = check_count(L, 2, "n");
  int dim = -2;
  fa_shard_layout layout = FA_SHARD_CONTIGUOUS;
  if (fal_opts(L, 3, "fa.shard", shard_keys)) {
    dim = read_dim(L, 3);
    layout = read_layout(L, 3);
    fa_device d;
    if (fal_opt_device(L, 3, "device", &d) && d != fa_tensor_device(t))
      fal_error(L, "opts.device: '%s': the shards stay on the tensor's device (%s) in this version (placing shards on "
                   "other devices, \"cuda:N\", is not there yet)",
                fa_device_name(d), fa_device_name(fa_tensor_device(t)));
  }
  /* an n past every length of t is refused by the core before it writes a shard: its error,
   * without first making n boxes (n = 2^29 took gigabytes and a minute) */
  int64_t widest = 0;
  for (int i = 0; i < fa_tensor_ndim(t); i++) {
    const int64_t len = fa_tensor_size(t, i);
    if (len > widest) widest = len;
  }
  if (n > widest) {
    fa_tensor *none[1] = {NULL};
    FAL_CALL(L, ctx, fa_shard(ctx, t, n, dim, layout, none)); /* raises */
  }
  fa_tensor **tmp = (fa_tensor **)fal_newbuffer(L, n, sizeof *tmp, "shards"); /* 5 */
  fa_tensor ***slots = push_boxes(L, n);                                      /* 6, 7 */
  FAL_CALL(L, ctx, fa_shard(ctx, t, n, dim, layout, tmp));
  fill_boxes(slots, tmp, n);
  tag_layout(L, -1, n, layout);
  return 1;
}

/* The tensors of the table at idx (exactly n of them, or its length when n
 * is 0), pinned, into a buffer pushed on the stack.  *count gets n. */
static fa_tensor **read_table(lua_State *L, int idx, const char *name, fal_pins *pins, int n, int *count) {
  if (lua_type(L, idx) != LUA_TTABLE) fal_typeerror(L, idx, name, "a table of tensors");
  const lua_Unsigned len = lua_rawlen(L, idx);
  if (n == 0 && (len < 1 || len > (lua_Unsigned)(INT_MAX / 4)))
    fal_argerror(L, idx, name, "expected a table of at least one tensor, got %I entries", (lua_Integer)len);
  if (n && len != (lua_Unsigned)n)
    fal_argerror(L, idx, name, "expected %d tensors (as qs), got %I", n, (lua_Integer)len);
  n = (int)len;
  fa_tensor **ts = (fa_tensor **)fal_newbuffer(L, n, sizeof *ts, name);
  for (int i = 0; i < n; i++) {
    const char *label = lua_pushfstring(L, "%s[%d]", name, i + 1); /* may collect: before the read */
    lua_rawgeti(L, idx, i + 1);
    ts[i] = fal_pin(L, pins, -1, label);
    lua_pop(L, 2);
  }
  *count = n;
  return ts;
}

/* fa.unshard(shards [, opts]): opts.dim, opts.layout. */
static int l_unshard(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  lua_settop(L, 2);
  if (lua_type(L, 1) != LUA_TTABLE) fal_typeerror(L, 1, "shards", "a table of tensors");
  lua_Unsigned len = lua_rawlen(L, 1);
  if (len < 1 || len > (lua_Unsigned)(INT_MAX / 4))
    fal_argerror(L, 1, "shards", "expected a table of at least one tensor, got %I entries", (lua_Integer)len);
  int dim = -2, n;
  fa_shard_layout layout = FA_SHARD_CONTIGUOUS;
  if (fal_opts(L, 2, "fa.unshard", unshard_keys)) {
    dim = read_dim(L, 2);
    layout = read_layout(L, 2);
  }
  layout = (fa_shard_layout)layout_or_tag(L, 2, 1, layout);
  len = lua_rawlen(L, 1); /* again: the opts' __index may have run */
  if (len < 1 || len > (lua_Unsigned)(INT_MAX / 4))
    fal_argerror(L, 1, "shards", "expected a table of at least one tensor, got %I entries", (lua_Integer)len);
  fa_tensor **out = fal_newbox(L);               /* 3 */
  fal_pins *pins = fal_pins_open_n(L, (int)len); /* 4 */
  fa_tensor **ts = read_table(L, 1, "shards", pins, 0, &n); /* 5 */
  FAL_CALL(L, ctx, fa_unshard(ctx, n, ts, dim, layout, out));
  fal_pins_close(L, 4);
  lua_settop(L, 3);
  return 1;
}

/* fa.ring_attention(qs, ks, vs [, opts]) -> outs [, lses]. */
static int l_ring_attention(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  fa_attention_opts o;
  int layout = FA_SHARD_CONTIGUOUS, opts = 4;
  lua_settop(L, 4);
  if (lua_type(L, 1) != LUA_TTABLE) fal_typeerror(L, 1, "qs", "a table of tensors");
  /* the options the ring does not take are read as fa.attention's and refused by the core (src/ring.c,
   * check_ring_opts), which says why */
  if (fal_opts(L, 4, "fa.ring_attention", ring_keys)) { /* a plain table from here on */
    layout = (int)read_layout(L, 4);
    fal_opts_without(L, 4, "layout"); /* 5: for fa.attention's reader */
    opts = 5;
  } else {
    lua_pushnil(L); /* 5 */
  }
  layout = layout_or_tag(L, 4, 1, layout); /* fa.shard's where the opts name none */
  { /* shards cut by different layouts would be read as one: positions permuted, a wrong causal result */
    static const char *const names[3] = {"qs", "ks", "vs"};
    int tags[3];
    for (int i = 0; i < 3; i++) tags[i] = lua_type(L, i + 1) == LUA_TTABLE ? tagged_layout(L, i + 1) : -1;
    for (int i = 1; i < 3; i++)
      if (tags[0] >= 0 && tags[i] >= 0 && tags[i] != tags[0])
        fal_error(L, "fa.ring_attention: %s: cut by fa.shard's %s layout, qs by %s: the shards of q, k and v must "
                     "share one layout",
                  names[i], layouts[tags[i]], layouts[tags[0]]);
  }
  const lua_Unsigned len = lua_rawlen(L, 1);
  if (len < 1 || len > (lua_Unsigned)(INT_MAX / 4))
    fal_argerror(L, 1, "qs", "expected a table of at least one tensor, got %I entries", (lua_Integer)len);
  fal_pins *pins = fal_pins_open_n(L, 3 * (int)len + FAL_MAX_PINS); /* 6 */
  int n, nk, nv;
  fa_tensor **qs = read_table(L, 1, "qs", pins, 0, &n);    /* 7 */
  fa_tensor **ks = read_table(L, 2, "ks", pins, n, &nk);   /* 8 */
  fa_tensor **vs = read_table(L, 3, "vs", pins, n, &nv);   /* 9 */
  read_attn_opts(L, opts, "fa.ring_attention", &o, pins); /* may push arrays */
  fa_tensor **tmp = (fa_tensor **)fal_newbuffer(L, 2 * (int64_t)n, sizeof *tmp, "outputs");
  const int want_lse = o.return_lse;
  fa_tensor ***oslots = push_boxes(L, n);
  const int otab = lua_gettop(L);
  fa_tensor ***lslots = want_lse ? push_boxes(L, n) : NULL;
  const int ltab = lua_gettop(L);
  FAL_CALL(L, ctx, fa_ring_attention(ctx, n, qs, ks, vs, &o, layout, tmp, want_lse ? tmp + n : NULL));
  fill_boxes(oslots, tmp, n);
  if (want_lse) fill_boxes(lslots, tmp + n, n);
  tag_layout(L, otab, n, layout); /* the outputs are the queries' shards */
  if (want_lse) tag_layout(L, ltab, n, layout);
  lua_pushvalue(L, otab);
  if (!want_lse) return 1;
  lua_pushvalue(L, ltab);
  return 2;
}

const luaL_Reg fal_ring_funcs[] = {
    {"shard", l_shard}, {"unshard", l_unshard}, {"ring_attention", l_ring_attention}, {NULL, NULL}};
