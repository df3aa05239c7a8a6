/* Tile sizes of the CPU "flash" and "two_pass" attention.  The dispatch
 * resolves opts->tile_q/tile_k = 0 to these defaults and rejects sizes
 * outside [FA_CPU_TILE_MIN, FA_CPU_TILE_MAX]. */
#ifndef FA_CPU_ATTENTION_TILES_H
#define FA_CPU_ATTENTION_TILES_H

/* Large tiles amortise each BLAS call's overhead; a Br x Bc f32 score
 * tile (128 KiB) plus the K/V tiles still fit a 1 MiB L2. */
#define FA_CPU_DEFAULT_TILE_Q 128
#define FA_CPU_DEFAULT_TILE_K 256
/* The fewest keys a key chunk of opts.splits "auto" holds on the CPU
 * (attention_query_tile_impl.h): two default key tiles, so that a chunk's
 * gemms outweigh its share of the merge. */
#define FA_CPU_SPLIT_MIN_KEYS (2 * FA_CPU_DEFAULT_TILE_K)
/* GQA packing (attention_query_tile_impl.h) whatever the threads for calls
 * of at most this many query rows a head: their products are too few to
 * hide the reads of K and V that packing saves (2 threads, one key head,
 * 8k keys, D 128, f32: 8 query heads at Lq 1 0.85 ms packed against 2.83
 * a head a thread, at Lq 4 2.2 against 2.8; at Lq 8 3.9 against 3.7). */
#define FA_CPU_PACK_ANY_ROWS 4
#define FA_CPU_TILE_MIN 1
#define FA_CPU_TILE_MAX 4096

#endif
