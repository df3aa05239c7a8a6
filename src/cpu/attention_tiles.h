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
#define FA_CPU_TILE_MIN 1
#define FA_CPU_TILE_MAX 4096

#endif
