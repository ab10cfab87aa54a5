"""Everything that reads or writes Redis: key names, Lua scripts, and the stores built on them."""
