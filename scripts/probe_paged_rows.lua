-- Decoding through the paged cache against the same call on contiguous K/V, by packed query rows a key head
-- (bf16, D = 128, pages of 16, causal), with the chunks chosen (auto) and with one chunk a (batch, key head):
-- where the paged copies cost more than the contiguous ones.  Device time (fa.bench, caches flushed).
-- Usage (GPU machine): flashattn-lua scripts/probe_paged_rows.lua
local fa = require "flashattn"
if fa.device_info().backend ~= "cuda" then error("probe_paged_rows.lua: needs the cuda backend (the decode kernel)", 0) end
for _, c in ipairs({{8, 32, 8, 1}, {8, 32, 8, 4}, {8, 32, 8, 8}, {8, 32, 8, 16}, {8, 64, 8, 8}, {8, 64, 8, 16}}) do
  local B, Hq, Hkv, Lq = table.unpack(c)
  for _, Lk in ipairs({4096, 32768}) do
    local k = fa.randn({B, Hkv, Lk, 128}, {dtype = "bf16", seed = 2})
    local v = fa.randn({B, Hkv, Lk, 128}, {dtype = "bf16", seed = 3})
    local q = fa.randn({B, Hq, Lq, 128}, {dtype = "bf16", seed = 1})
    local cache = fa.kv_cache{batch = B, heads = Hkv, dim = 128, capacity = Lk, page_size = 16, dtype = "bf16"}
    cache:append(k, v)
    local o = {causal = true}
    local d = fa.bench(function() fa.attention(q, k, v, o) end, {warmup = 3, rep = 20, flush_cache = true}).median_ms
    local p = fa.bench(function() cache:attend(q, o) end, {warmup = 3, rep = 20, flush_cache = true}).median_ms
    local p1 = fa.bench(function() cache:attend(q, {causal = true, splits = 1}) end, {warmup = 2, rep = 5, flush_cache = true}).median_ms
    local d1 = fa.bench(function() fa.attention(q, k, v, {causal = true, splits = 1}) end, {warmup = 2, rep = 5, flush_cache = true}).median_ms
    print(("B%d Hq%d Hkv%d Lq%2d rows %3d Lk%6d  dense %.4f paged %.4f x %.2f   splits=1: dense %.4f paged %.4f x %.2f"):format(
      B, Hq, Hkv, Lq, Hq // Hkv * Lq, Lk, d, p, p / d, d1, p1, p1 / d1))
    cache:free(); k:free(); v:free(); collectgarbage()
  end
end
