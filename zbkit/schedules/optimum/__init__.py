"""How good a schedule can be: certified lower bounds and the exact optimum.

`bounds` (instant lower bounds; `lower_bound`), `walk` (the earliest-start walk with the
waits memory forces), `cpsat` (the CP-SAT model of the ordering problem) and `exact` (its
solve from a given warm start, `Solution`, `bound_for`). Nothing here imports the search.
"""
