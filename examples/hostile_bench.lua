-- A plugin script whose work hides in fa.bench: its fn is a table whose
-- __call is pcall, so every repetition is a chain of C calls that runs no
-- Lua instruction.  host_plugin must stop it (the engine polls the host
-- every repetition; the hook counts calls) within its time limit.
local fa = flashattn
fa.bench(setmetatable({}, {__call = pcall}), {warmup = 1000000, rep = 1000000})
