"""Checking and simulating a finished schedule.

`engine` walks every rank's program by the readiness rule (the simulator's times, the
validator's deadlock report); `validate` checks a schedule can run (`torch_checks` checks
torch's transfers and FSDP actions on a loaded one); `simulate` times it under `Costs`.
"""
