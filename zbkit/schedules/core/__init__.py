"""The data every layer shares (pure Python, no torch).

`action` (Action, Overlap, the `KINDS` table and the readiness rule), `costs` (Costs, the
one cost table and the one tolerance), `placement`, `schedule` (Schedule, its text forms,
`derive_plan`, `Proof`), `plan` (the communication plan), `events` (the event form and the
memory rule), `registry` (the records of named schedules), `torch_ops` and
`torch_schedules` (torch's formats), `grid` (the text grid), `recent` (a small cache).
Nothing here imports another sub-package.
"""
