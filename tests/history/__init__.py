"""Recorded histories of sqlqueue runs and the checker of SPEC §7/§10's invariants on
them (docs/internals.md, "The history checker")."""
