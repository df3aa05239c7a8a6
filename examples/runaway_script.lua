-- A plugin script that never ends, and tries to survive the host's
-- instruction budget by catching its error: host_plugin must stop it with
-- "instruction budget ... exceeded".
local q = ...
local fa = flashattn
local x = fa.zeros(4)
while true do
  pcall(function()
    while true do x = x + 1 end
  end)
  -- and in the message handler too
  xpcall(function() while true do end end, function() while true do end end)
end
