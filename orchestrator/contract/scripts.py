"""Lua the scheduler's and the workers' Redis scripts share."""

from __future__ import annotations

from typing import Final

__all__ = ["MOVE_UP_TO"]

# Moves up to ARGV[1] elements from list KEYS[1] to list KEYS[2] (RIGHT to LEFT, so the oldest
# first, as LPUSHed) and leaves them in ``taken``, in that order: a reliable pop of several.
MOVE_UP_TO: Final = """
local taken = {}
for i = 1, tonumber(ARGV[1]) do
  local item = redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'LEFT')
  if not item then break end
  taken[#taken + 1] = item
end
"""
