-- A plugin script that hands fa.tensor nested tables whose rows are shared:
-- 32 KiB of tables that claim 2^40 elements must be refused before any
-- walk, and the largest shape fa.tensor takes (2^27 elements, a walk of
-- seconds) again and again must be stopped by the host's limits.
local fa = flashattn
local row = {}
for i = 1, 1024 do row[i] = 1 end
local function nest(t, levels, width)
  for _ = 1, levels do
    local up = {}
    for i = 1, width do up[i] = t end
    t = up
  end
  return t
end
local ok, err = pcall(fa.tensor, nest(row, 3, 1024))
assert(not ok and tostring(err):find("^flashattn: argument #1 %(data%)"), tostring(err))
local big = nest(row, 1, 1 << 17) -- 2^17 x 2^10
while true do fa.tensor(big):free() end
