/* Internal declarations shared by the Lua binding's files (the .c files in lua/).
 *
 * The binding only translates arguments: Lua values in, public C API
 * calls (include/flashattn.h), Lua values out.  Shape, dtype, device and
 * option-value checks live in the core, whose messages already start with
 * "flashattn:"; the binding raises them unchanged.
 *
 * Ownership rule: every fa_tensor the binding receives from the core goes
 * straight into a Lua userdata box that was pushed *before* the call
 * (fal_newbox), so the garbage collector owns it even when a later Lua
 * error unwinds the C stack.  Temporary arrays are Lua userdata for the
 * same reason.  Nothing needs freeing on an error path. */
#ifndef FA_LBINDING_H
#define FA_LBINDING_H

#include <stddef.h>
#include <stdint.h>

#include <lauxlib.h>
#include <lua.h>

#include "flashattn.h"

#define FAL_TENSOR_MT "flashattn.Tensor"

/* ---- per-lua_State state (lstate.c) ----------------------------------- */

/* Every tensor box and pin list is linked into its state's list from birth
 * to its __gc.  lua_close does not finalize objects that finalizers create
 * while the state closes, so the state's own __gc (the last of the
 * module's to run) drops whatever is still linked. */
typedef struct fal_link {
  struct fal_link *prev, *next; /* NULL when not linked */
  void (*drop)(struct fal_link *); /* releases the tensor references held */
} fal_link;

typedef struct {
  fal_link live;          /* list head of the live boxes and pin lists */
  int closed;             /* the state's __gc ran: lua_close is under way */
  fa_context *own;        /* the module's context, created lazily; destroyed on close */
  fa_context *host;       /* a host's context (fa_lua_set_context); not owned */
  uint64_t seed_counter;  /* random fills without opts.seed */
  unsigned char *flush;   /* fa.bench host cache-flush buffer, allocated lazily */
  size_t flush_bytes;
  unsigned flush_round;
  size_t gc_base[2];      /* engine bytes per device after the last forced collection */
} fal_state;

fal_state *fal_state_get(lua_State *L);
/* The state, or an error when it is closing (nothing new may outlive it). */
fal_state *fal_live_state(lua_State *L);
/* Links l into the state's list (s from fal_live_state); fal_unlink takes
 * it out (idempotent). */
void fal_link_in(fal_state *s, fal_link *l, void (*drop)(fal_link *));
void fal_unlink(fal_link *l);
/* A new box's link: on the state's list only when the box is made inside a
 * finalizer (Lua 5.4.4+ answers -1 to LUA_GCISRUNNING there; earlier ones
 * 0, as for a collector the script stopped: built against those, both are
 * linked), where it may get no __gc of its own (at lua_close).  Other boxes stay
 * off the list, so that a box Lua frees without its __gc (the debug
 * library took its metatable away) leaves nothing pointing into it: what
 * it held then leaks, the process goes on.  Call it before anything else
 * can raise. */
void fal_link_box(lua_State *L, fal_state *s, fal_link *l, void (*drop)(fal_link *));
/* luaL_testudata's userdata at idx when it is also `size` bytes long (the
 * debug library can give any userdata one of the module's metatables:
 * the callers check a magic field of their own too where it matters). */
void *fal_testudata(lua_State *L, int idx, const char *mt, size_t size);
/* On the metatable at the top: __gc and __close (either NULL: none),
 * __name and __metatable = name, so that getmetatable gives the string and
 * a script cannot reach the table (to remove __gc, or call it by hand). */
void fal_guard_metatable(lua_State *L, const char *name, lua_CFunction gc, lua_CFunction close);
/* The magic number a userdata of the module at p of the given kind carries:
 * the kind and p's address mixed with a secret drawn when the library
 * loads, so that a script cannot forge one in a buffer whose bytes it
 * chose (kv_lens') and then give that buffer a module metatable; nor is one
 * kind taken for another. */
enum { FAL_MAGIC_TENSOR = 1, FAL_MAGIC_KVCACHE, FAL_MAGIC_PINS, FAL_MAGIC_LOAD, FAL_MAGIC_HOLDER, FAL_MAGIC_BLOCK };
uint64_t fal_magic(const void *p, int kind);
/* Each file's metatables, made when the module opens (luaopen_flashattn):
 * made on first use instead, a finalizer running inside the making (its
 * allocations step the collector) could make the same metatable again, and
 * the outer call's would replace it, leaving the inner call's objects
 * unrecognised. */
void fal_pins_metatable_make(lua_State *L);
void fal_kvcache_metatable_make(lua_State *L);
void fal_io_metatable_make(lua_State *L);
/* The context scripts run on (the host's, else the module's own); raises
 * when the module's context cannot be created. */
fa_context *fal_ctx(lua_State *L);
/* Creates the module's own context on `device` when it does not exist yet
 * (fa.set_default_device before any other call). */
fa_status fal_make_own_context(lua_State *L, fa_device device);
/* A fresh seed for random fills without opts.seed. */
uint64_t fal_next_seed(lua_State *L);
/* Writes through the host flush buffer so later reads miss the caches. */
void fal_flush_host_cache(lua_State *L);
/* Runs a full collection when the engine's memory has grown a lot since
 * the last one: Lua cannot see the bytes a tensor box holds. */
void fal_gc_pressure(lua_State *L);
/* A full collection now (used before retrying an allocation). */
void fal_collect(lua_State *L);
/* Calls the host's poll callback, if any (fa_lua_set_poll; lbench.c). */
void fal_poll(lua_State *L);

/* ---- errors (lstate.c) ------------------------------------------------- */

/* Raises "flashattn: " followed by the lua_pushfstring-formatted text
 * (%s %d %I %f %c %p only). */
int fal_error(lua_State *L, const char *fmt, ...);
/* Raises the context's last error (already "flashattn: ..."). */
int fal_fail(lua_State *L, fa_context *ctx);
/* Raises "flashattn: argument #n (name): <text>", numbering as Lua does
 * for method calls (self not counted). */
int fal_argerror(lua_State *L, int idx, const char *name, const char *fmt, ...);
/* "expected <what>, got <type of idx>". */
int fal_typeerror(lua_State *L, int idx, const char *name, const char *what);
/* The type name used in messages (__name for userdata). */
const char *fal_typename(lua_State *L, int idx);
/* Pushes the registry's weak-keyed table at the light key `key`, made on first use. */
void fal_push_weak_keyed(lua_State *L, const void *key);
/* Pushes a description of the value at idx for messages, without running
 * any of its metamethods: 'text' for strings, the number, true/false, else
 * "a <type>".  Returns it. */
const char *fal_describe(lua_State *L, int idx);
/* The arguments given: lua_gettop less trailing nils (f(a, nil) passes one),
 * for calls that refuse more than they take rather than drop them. */
int fal_nargs(lua_State *L);
/* Pushes the label "argument #n (name)" as fal_argerror writes it. */
const char *fal_arglabel(lua_State *L, int idx, const char *name);

/* A call into the core: on out-of-memory, collect garbage (unreferenced
 * tensors give their memory back) and try once more; on failure raise
 * the context's message. */
#define FAL_CALL(L, ctx, call)                                                                                         \
  do {                                                                                                                 \
    fa_status fal_st_ = (call);                                                                                        \
    if (fal_st_ == FA_ERR_OUT_OF_MEMORY) {                                                                             \
      fal_collect(L);                                                                                                  \
      fal_st_ = (call);                                                                                                \
    }                                                                                                                  \
    if (fal_st_ != FA_OK) fal_fail((L), (ctx));                                                                        \
  } while (0)

/* ---- argument helpers (lstate.c) --------------------------------------- */

/* An integral number (float values with no fraction accepted). */
int64_t fal_checkint(lua_State *L, int idx, const char *name);
double fal_checknum(lua_State *L, int idx, const char *name);
/* A 1-based index (an integer >= 1) as the core's 0-based one. */
int64_t fal_checkindex(lua_State *L, int idx, const char *name);
/* A number or a boolean (true = 1) as an element value. */
double fal_checkvalue(lua_State *L, int idx, const char *name);
/* Lua's 1-based dimension to the core's 0-based one (clamped into int). */
int fal_dim0(int64_t dim1);
/* A userdata buffer of n elements of `size` bytes, pushed on the stack. */
void *fal_newbuffer(lua_State *L, int64_t n, size_t size, const char *what);

/* ---- tensors (ltensor.c) ----------------------------------------------- */

/* magic: fal_magic(box, FAL_MAGIC_TENSOR), so that a userdata given the
 * tensor metatable by the debug library is not taken for a box; link:
 * fal_link_box's. */
typedef struct {
  uint64_t magic;
  fa_tensor *t; /* one reference; NULL once freed */
  fal_link link;
} fal_box;

/* Pushes the tensor metatable, creating it (methods included) on first use. */
void fal_tensor_metatable(lua_State *L);
/* Pushes an empty box and returns its slot for a core call's out-parameter. */
fa_tensor **fal_newbox(lua_State *L);
/* The live tensor at idx, or an error naming the argument. */
fa_tensor *fal_tensor(lua_State *L, int idx, const char *name);
/* NULL when idx does not hold a tensor box (freed or not) of this copy of
 * the module: another copy's boxes (another build of the engine loaded in
 * the same state) are not ours to free. */
fal_box *fal_tobox(lua_State *L, int idx);
/* Returns the box at `slot_idx` unless it holds `orig`, the tensor at
 * `orig_idx`: then that Lua value itself is returned (t:to() of nothing to
 * change gives t, opts.out comes back as the same object). */
void fal_prefer_same(lua_State *L, int slot_idx, int orig_idx);
/* Releases a box's tensor now (temporaries: do not wait for the GC). */
void fal_box_release(lua_State *L, int idx);

/* Pins.  A script can run in the middle of a binding function: a finalizer
 * (__gc) at any Lua allocation, an __index metamethod of an opts table, the
 * finalizers of the full collection FAL_CALL runs on out-of-memory.  Such
 * code may free a tensor (t:free()) whose fa_tensor the function holds, or
 * drop the last reference to a tensor that only an __index call returned.
 * So a function either takes the fa_tensor from its box inside the core
 * call's own expression (no Lua code runs in between; FAL_CALL's retry takes
 * it again), or pins it: fal_pin takes a reference of its own, held in a
 * to-be-closed userdata that fal_pins_open pushes and Lua closes (releasing
 * the references) when the function returns or raises, or when lua_settop
 * pops it. */
#define FAL_MAX_PINS 8
typedef struct {
  uint64_t magic; /* fal_magic(pins, FAL_MAGIC_PINS) */
  int n, cap, gced; /* gced: its __gc ran (then it is never the spare) */
  fal_link link;
  fa_tensor *t[]; /* cap entries */
} fal_pins;

/* Pushes an empty pin list (one stack slot, to-be-closed) of FAL_MAX_PINS
 * entries, or of cap (a call taking a table of tensors). */
fal_pins *fal_pins_open(lua_State *L);
fal_pins *fal_pins_open_n(lua_State *L, int cap);
/* Releases the pins at idx now (before a lua_settop below them: Lua 5.4.4's
 * lua_settop may use a stale stack pointer when it closes a slot itself). */
void fal_pins_close(lua_State *L, int idx);
/* The live tensor at idx (an error naming the argument otherwise), pinned. */
fa_tensor *fal_pin(lua_State *L, fal_pins *pins, int idx, const char *name);

/* The string at idx when it is a Lua string without NUL bytes (a C
 * string means all of it), else NULL (lopts.c); fal_describe shows the
 * others with their NUL bytes as \0. */
const char *fal_cstring(lua_State *L, int idx);

/* Reads a shape from the arguments first..last: either numbers or one
 * table of numbers (lconstruct.c).  Returns the number of dimensions. */
int fal_read_shape(lua_State *L, int first, int last, int64_t shape[FA_MAX_DIMS], const char *name);

/* ---- options (lopts.c) ------------------------------------------------- */

/* The opts table at idx (absent or nil = none): checks that every key is
 * one of `allowed` (NULL-terminated) and returns 1, or 0 when absent. */
int fal_opts(lua_State *L, int idx, const char *fname, const char *const *allowed);
/* Getters: 1 and *out set when the option is present (not nil), else 0. */
int fal_opt_int(lua_State *L, int idx, const char *key, int64_t *out);
int fal_opt_num(lua_State *L, int idx, const char *key, double *out);
int fal_opt_bool(lua_State *L, int idx, const char *key, int *out);
/* One of names[] (NULL-terminated): *out = its index. */
int fal_opt_enum(lua_State *L, int idx, const char *key, const char *const *names, int *out);
int fal_opt_dtype(lua_State *L, int idx, const char *key, fa_dtype *out);
int fal_opt_device(lua_State *L, int idx, const char *key, fa_device *out);
/* A live tensor or NULL, pinned in `pins` (the value may come from an
 * __index metamethod that nothing else keeps alive). */
fa_tensor *fal_opt_tensor(lua_State *L, int idx, const char *key, fal_pins *pins);
/* {a, b}: a table of exactly 2 integers. */
int fal_opt_pair(lua_State *L, int idx, const char *key, int64_t *a, int64_t *b);
/* opts[key] as a string, left pushed on the stack (it stays alive there
 * while the call runs, whatever the opts table becomes); NULL when absent
 * (nothing pushed); an error naming the option for another type. */
const char *fal_opt_string(lua_State *L, int idx, const char *key);
/* The same for a pair of sizes (tile): a 0 the script wrote reaches the core
 * as FA_TILE_ZERO, an error naming the range, not the C API's "default". */
int fal_opt_size_pair(lua_State *L, int idx, const char *key, int64_t *a, int64_t *b);
/* opts[key] as one square size: an integer, {n} or {n, n} (attention's
 * tile written for a kernel that takes square ones); 0 when absent. */
int fal_opt_square(lua_State *L, int idx, const char *key, int64_t *n);
/* A table or a tensor of numbers: pushes a userdata buffer of doubles and
 * returns it with *n entries; NULL (nothing pushed) when absent. */
double *fal_opt_numbers(lua_State *L, int idx, const char *key, int64_t *n);
/* Parses a dtype or device name for messages "flashattn: <what>: ...". */
int fal_parse_dtype(lua_State *L, int idx, const char *what, fa_dtype *out);
int fal_parse_device(lua_State *L, int idx, const char *what, fa_device *out);

/* Pushes a raw copy of the opts table at idx without `key` (and with idx's
 * metatable), for a reader that rejects keys it does not know (fa.attention's
 * options plus a function's own: lbackward.c, lring.c). */
void fal_opts_without(lua_State *L, int idx, const char *key);

/* The options of fa.attention at idx into o (lkernels.c): fname names the
 * function in messages; kv_lens and alibi arrays are pushed as userdata and
 * must stay on the stack until the call is done. */
void read_attn_opts(lua_State *L, int idx, const char *fname, fa_attention_opts *o, fal_pins *pins);

/* ---- attention variants (ltrace.c; API §9) ---------------------------- */

/* opts[key] ("score_mod" or "mask_mod") traced into an expression: NULL
 * when absent (nothing pushed); else a holder userdata that owns it is left
 * pushed (keep it on the stack until the call is done). */
const fa_expr *fal_trace_opt(lua_State *L, int idx, const char *key);
/* opts.block_mask (a fa.block_mask result, left pushed) or NULL; when
 * *mask_mod is NULL it becomes the block mask's own mask_mod. */
const fa_block_mask *fal_trace_block_mask(lua_State *L, int idx, const fa_expr **mask_mod);
/* t[expr] while tracing (ltensor.c's __index, tensor at 1, key at 2): 1 and
 * the expression pushed when the key is an expression, else 0. */
int fal_trace_index(lua_State *L);
/* fa.where into the module table at the top; remembers the table. */
void fal_trace_open(lua_State *L);

/* Keeps the module's shared library loaded for the process (lpin.c). */
void fal_pin_module(void);

/* ---- function tables registered by luaopen_flashattn (lmodule.c) ------- */

extern const luaL_Reg fal_construct_funcs[]; /* lconstruct.c */
extern const luaL_Reg fal_compare_funcs[];   /* ltensor_ops.c */
extern const luaL_Reg fal_kernel_funcs[];    /* lkernels.c */
extern const luaL_Reg fal_cost_funcs[];      /* lkernels.c */
extern const luaL_Reg fal_bench_funcs[];     /* lbench.c */
extern const luaL_Reg fal_io_funcs[];        /* lio.c: fa.load, fa.save */
extern const luaL_Reg fal_kvcache_funcs[];   /* lkvcache.c: fa.kv_cache */
/* opts.splits (lkernels.c): a number >= 1 or "auto" (0) into *out; 0 when absent. */
int fal_opt_splits(lua_State *L, int idx, int64_t *out);
extern const luaL_Reg fal_backward_funcs[];  /* lbackward.c: fa.attention_backward(_reference) */
/* Tensor methods and metamethods from other files than ltensor.c. */
extern const luaL_Reg fal_tensor_op_methods[]; /* ltensor_ops.c */
extern const luaL_Reg fal_tensor_op_meta[];    /* ltensor_ops.c */
/* Sets the metamethods of the operators tensors do not define (% ^ // & |
 * ~ << >> .. < <=) on the table on top: each a flashattn: error naming it. */
void fal_tensor_unsupported_ops(lua_State *L);
int fal_tensor_tostring(lua_State *L);         /* ltostring.c */

#endif
