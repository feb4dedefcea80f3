"""Planning: what the engine derives from the MV query (kind, keys, incremental SQL)."""
