"""Fuzz an engine's real KV manager : hypothesis state machines drive it
with random schedules in the engine's own step order, check every state with the fast
in-memory check, and shrink a failure to the shortest schedule. Needs the ``fuzz`` extra
(hypothesis) and the engine itself; both are imported only when a run starts."""
