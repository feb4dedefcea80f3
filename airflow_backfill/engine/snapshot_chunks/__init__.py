"""The snapshot phase, shared by one-upstream and join snapshots: its one sequence
(`skeleton`), and its chunks, planned from the pinned epoch's files (`plan`), recorded as
they commit (`progress`), run, reconciled with the log and committed as the MV (`run`)."""
